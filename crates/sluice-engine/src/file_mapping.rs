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

use crate::mapping::Mapping;
use crate::source_file::SourceFile;

/// `len` bytes of a file from `offset`, mapped copy-on-write.
pub struct FileMapping {
    map: Mapping,
    len: usize,
}

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
        let fd = file.buffered_fd().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "{}: a remote object cannot be mapped",
                    file.path().display()
                ),
            )
        })?;
        let map = Mapping::file_private(fd, offset, len)?;
        Ok(FileMapping { map, len })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.map.as_ptr()
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` bytes are mapped for the life of `self`, inside the
        // file (checked at map time).
        unsafe { std::slice::from_raw_parts(self.map.as_ptr(), self.len) }
    }
}

impl std::fmt::Debug for FileMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileMapping")
            .field("len", &self.len)
            .finish()
    }
}
