//! Page-aligned byte buffers backed by anonymous memory mappings.
//!
//! O_DIRECT reads need the destination address aligned to the device's DMA
//! alignment (at most a page on every Linux block device), so buffers come
//! straight from `mmap(MAP_ANONYMOUS)`: always page-aligned, zero-filled by the
//! kernel, and returned to the system on drop instead of lingering in a malloc
//! arena.
//!
//! Buffers deliberately do not ask for transparent huge pages. It looks like a
//! win (512× fewer faults), but with the common `defrag=madvise` setting every
//! huge-page fault may compact memory synchronously: a cold 4.3 GB load spent
//! 7 s of system time and ran 2.7× slower with `MADV_HUGEPAGE` than without
//! (docs/design/loader.md).
//!
//! Several readers (I/O threads, the kernel via io_uring) write disjoint
//! ranges of one buffer at the same time, so the buffer hands out raw
//! pointers; the ranges' disjointness is the caller's contract.

use std::io;

use crate::mapping::{page_size, Mapping};

/// A page-aligned, zero-initialised, fixed-size byte buffer.
pub struct AlignedBuf {
    map: Mapping,
    len: usize,
}

impl AlignedBuf {
    /// Maps `len` bytes (rounded up to a page) of zeroed anonymous memory.
    pub fn new(len: usize) -> io::Result<AlignedBuf> {
        Ok(AlignedBuf {
            map: Mapping::anonymous(len)?,
            len,
        })
    }

    /// As [`AlignedBuf::new`], with every page already mapped writable: for a buffer that
    /// is filled once by copies (a socket's bytes) rather than by the kernel's reads.
    /// Faulting fresh pages one at a time inside the copy cost more CPU than the copy.
    pub fn populated(len: usize) -> io::Result<AlignedBuf> {
        let mut buf = AlignedBuf::new(len)?;
        populate_write(buf.as_mut_slice());
        Ok(buf)
    }

    /// Usable length in bytes (what was asked for, not the page-rounded size).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Base address; page-aligned.
    pub fn as_ptr(&self) -> *const u8 {
        self.map.as_ptr()
    }

    /// Raw pointer to `offset`, or `None` if `offset + len` leaves the buffer.
    ///
    /// Writers through the pointer must not overlap one another, nor any
    /// reader, while they run.
    pub fn ptr_range(&self, offset: usize, len: usize) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        // SAFETY: offset <= len, so the result stays inside the mapping.
        Some(unsafe { self.map.as_ptr().add(offset) })
    }

    /// The whole buffer as a byte slice.
    ///
    /// Only sound once no writer is active, which the I/O engines guarantee by
    /// reporting a completion after the last byte of a read has landed.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is `len` readable bytes for the life of `self`.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr(), self.len) }
    }

    /// Mutable view, for tests and single-owner fills.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `&mut self` proves exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_ptr(), self.len) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .finish()
    }
}

/// Maps every whole page inside `buf` writable in one call (`MADV_POPULATE_WRITE`, Linux
/// 5.14+) without changing a byte, so a copy into fresh memory does not fault a page at a
/// time: on this VM 0.6 s per GiB touched against 0.3 s populated (docs/design/remote.md).
/// Best effort: on an older kernel the copy faults as before.
pub fn populate_write(buf: &mut [u8]) {
    let page = page_size();
    let start = (buf.as_mut_ptr() as usize).next_multiple_of(page);
    let end = (buf.as_mut_ptr() as usize + buf.len()) & !(page - 1);
    if end > start {
        // SAFETY: the range lies inside `buf`, memory this call borrows mutably; populating
        // maps its pages without changing a byte of them.
        unsafe {
            libc::madvise(
                start as *mut libc::c_void,
                end - start,
                libc::MADV_POPULATE_WRITE,
            )
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_buffer_is_page_aligned_and_zeroed() {
        let buf = AlignedBuf::new(10_000).unwrap();
        assert_eq!(buf.as_ptr() as usize % page_size(), 0);
        assert_eq!(buf.len(), 10_000);
        assert!(buf.as_slice().iter().all(|b| *b == 0));
    }

    #[test]
    fn ptr_range_refuses_ranges_past_the_end() {
        let buf = AlignedBuf::new(4096).unwrap();
        assert!(buf.ptr_range(0, 4096).is_some());
        assert!(buf.ptr_range(4095, 2).is_none());
        assert!(buf.ptr_range(usize::MAX, 2).is_none());
    }

    #[test]
    fn zero_length_buffer_is_valid() {
        let buf = AlignedBuf::new(0).unwrap();
        assert!(buf.is_empty());
        assert!(buf.as_slice().is_empty());
    }
}
