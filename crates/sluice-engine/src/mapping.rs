//! [`Mapping`]: the one owner of every `mmap` the engine makes.
//!
//! Four kinds of mapping serve the planes, all unmapped on drop:
//! - [`Mapping::anonymous`]: zeroed private memory, page-aligned, returned
//!   to the system on drop instead of lingering in a malloc arena: the
//!   backing of [`crate::AlignedBuf`], the destination of O_DIRECT reads.
//! - [`Mapping::file_private`]: a copy-on-write view of a cached file range:
//!   [`crate::FileMapping`], tensors handed out without a copy.
//! - [`Mapping::file_shared_read`]: a read-only view of the page cache
//!   itself, for residency (`mincore`), `MADV_POPULATE_READ` and
//!   `MADV_PAGEOUT`, which must see the pages every reader shares.
//! - [`Mapping::file_shared_rw`]: a memfd two processes map alike, for
//!   [`crate::SharedMemory`].
//!
//! File mappings start at a page boundary; [`Mapping::file_range`] widens a
//! byte range to whole pages and says where the range starts inside it.

use std::io;
use std::os::fd::RawFd;
use std::ptr::NonNull;

/// A memory mapping of `len` bytes at `ptr`, unmapped on drop.
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; who may write
// through its pointer is the owner's contract (see `AlignedBuf`).
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// `len` bytes (rounded up to a page, at least one) of zeroed,
    /// read-write, private anonymous memory.
    pub fn anonymous(len: usize) -> io::Result<Mapping> {
        let map_len = round_up_to_page(len.max(1))?;
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        Mapping::new(
            map_len,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    }

    /// `len` bytes (at least one) of `fd` from page-aligned `offset`,
    /// private and writable: writes are copied, never reach the file.
    pub fn file_private(fd: RawFd, offset: u64, len: usize) -> io::Result<Mapping> {
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        Mapping::new(len.max(1), prot, libc::MAP_PRIVATE, fd, offset)
    }

    /// All `len` bytes of `fd` (a memfd), shared and writable: memory two
    /// processes see alike ([`crate::SharedMemory`]).
    pub fn file_shared_rw(fd: RawFd, len: usize) -> io::Result<Mapping> {
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        Mapping::new(len.max(1), prot, libc::MAP_SHARED, fd, 0)
    }

    /// `len` bytes (at least one) of `fd` from page-aligned `offset`,
    /// shared and read-only: the page cache's own pages.
    pub fn file_shared_read(fd: RawFd, offset: u64, len: usize) -> io::Result<Mapping> {
        Mapping::new(len.max(1), libc::PROT_READ, libc::MAP_SHARED, fd, offset)
    }

    /// A shared read-only mapping of `[offset, offset + len)` of `fd`,
    /// widened to start at a page boundary; returns it with the file offset
    /// of its first byte. A range that does not fit the address space is
    /// `InvalidInput`.
    pub fn file_range(fd: RawFd, offset: u64, len: u64) -> io::Result<(Mapping, u64)> {
        let page = page_size() as u64;
        let start = offset - offset % page;
        let too_big = |what: &str| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{what} does not fit this machine's address space"),
            )
        };
        let span = offset
            .checked_add(len)
            .ok_or_else(|| too_big("range end"))?
            - start;
        let span = usize::try_from(span).map_err(|_| too_big("range length"))?;
        Ok((Mapping::file_shared_read(fd, start, span)?, start))
    }

    fn new(len: usize, prot: i32, flags: i32, fd: RawFd, offset: u64) -> io::Result<Mapping> {
        let off = libc::off_t::try_from(offset).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, "offset does not fit off_t")
        })?;
        // SAFETY: a new mapping at no fixed address, so nothing else in this
        // process is affected; the result is checked before use and `Drop`
        // unmaps exactly what was mapped.
        let raw = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, off) };
        if raw == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(raw.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(Mapping { ptr, len })
    }

    /// First byte; page-aligned.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes mapped (page-rounded for anonymous mappings).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: a mapping holds at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `madvise(advice)` over the whole mapping.
    pub fn advise(&self, advice: libc::c_int) -> io::Result<()> {
        // SAFETY: advising exactly the live mapping this value owns.
        match unsafe { libc::madvise(self.ptr.as_ptr().cast(), self.len, advice) } {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `new`; nothing
        // borrows it past the owner's life.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapping").field("len", &self.len).finish()
    }
}

/// `len` rounded up to a whole number of pages.
pub(crate) fn round_up_to_page(len: usize) -> io::Result<usize> {
    len.checked_next_multiple_of(page_size())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "mapping size overflows"))
}

/// The system page size (4096 on x86-64).
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|s| *s > 0)
        .unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    #[test]
    fn anonymous_memory_is_page_aligned_zeroed_and_rounded_up() {
        let map = Mapping::anonymous(10_000).unwrap();
        assert_eq!(map.as_ptr() as usize % page_size(), 0);
        assert_eq!(map.len(), 10_000usize.next_multiple_of(page_size()));
        // SAFETY: reading inside the live mapping.
        let bytes = unsafe { std::slice::from_raw_parts(map.as_ptr(), map.len()) };
        assert!(bytes.iter().all(|b| *b == 0));
        assert!(Mapping::anonymous(usize::MAX).is_err());
    }

    #[test]
    fn file_ranges_widen_to_pages_and_private_writes_stay_private() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        let data: Vec<u8> = (0..3 * page_size()).map(|i| (i % 251) as u8).collect();
        f.write_all(&data).unwrap();
        let fd = f.as_file().as_raw_fd();
        let (map, start) = Mapping::file_range(fd, page_size() as u64 + 10, 100).unwrap();
        assert_eq!(start, page_size() as u64);
        assert_eq!(map.len(), 110);
        // SAFETY: reading inside the live mapping.
        assert_eq!(unsafe { *map.as_ptr().add(10) }, data[page_size() + 10]);
        assert!(Mapping::file_range(fd, u64::MAX - 1, 10).is_err());

        let private = Mapping::file_private(fd, 0, page_size()).unwrap();
        // SAFETY: writing inside the live, writable private mapping.
        unsafe { *private.as_ptr() = 0xAB };
        assert_eq!(
            std::fs::read(f.path()).unwrap()[0],
            data[0],
            "the file is untouched"
        );
    }
}
