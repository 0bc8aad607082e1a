//! A private, populated mapping of a file range: zero-copy access to bytes
//! that are already in the page cache.
//!
//! When a window's bytes are all cached, reading them would only copy memory
//! to memory. Mapping them instead hands out the page cache's own pages, and
//! `MAP_PRIVATE` with write permission lets a caller modify a tensor without
//! touching the file (the kernel copies the page on first write).
//!
//! The mapping is deliberately not `MAP_POPULATE`d: populating walks the
//! pages one by one and took 2–4 s for a cached 4.3 GB checkpoint, while
//! first-touch faults map 16 pages at a time (fault-around) and the whole
//! consumer copy ran at 10–13 GB/s (docs/design/loader.md). A page evicted
//! between the residency check and first touch is simply read back in.
//!
//! The price is the one every mmap loader pays: if another process truncates
//! the file while the mapping is alive, touching the lost pages raises
//! SIGBUS. `map` checks the file's size first, so a file that was already
//! cut short fails with an error instead.

use std::io;
use std::ptr::NonNull;

use crate::source_file::SourceFile;

/// `len` bytes of a file from `offset`, mapped copy-on-write.
pub struct FileMapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; it is only read
// through shared references.
unsafe impl Send for FileMapping {}
// SAFETY: as above.
unsafe impl Sync for FileMapping {}

impl FileMapping {
    /// Maps `[offset, offset + len)` of `file`. `offset` must be page-aligned;
    /// the range must lie within the file as it is now.
    pub fn map(file: &SourceFile, offset: u64, len: usize) -> io::Result<FileMapping> {
        let current_len = file.current_len()?;
        let end = offset
            .checked_add(len as u64)
            .ok_or_else(|| io::Error::other("range overflows"))?;
        if end > current_len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("file is {current_len} bytes now, the range ends at {end}"),
            ));
        }
        let off =
            libc::off_t::try_from(offset).map_err(|_| io::Error::other("offset too large"))?;
        // SAFETY: a new private mapping of our own descriptor at no fixed
        // address; the result is checked before use.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len.max(1),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE,
                file.buffered_fd(),
                off,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(raw.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(FileMapping { ptr, len })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` bytes are mapped for the life of `self`, inside the
        // file (checked at map time).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping created in `map`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len.max(1)) };
    }
}

impl std::fmt::Debug for FileMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileMapping")
            .field("len", &self.len)
            .finish()
    }
}
