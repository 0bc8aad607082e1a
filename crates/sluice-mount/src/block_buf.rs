//! [`BlockBuf`]: one block's memory, mapped with `MAP_POPULATE` so the kernel allocates and
//! maps every page in one call. A block is filled once and read many times; faulting its
//! pages in one at a time as the body's bytes land cost the daemon about as much CPU as
//! the copy itself (2048 faults per 8 MiB block).

use std::io;

pub struct BlockBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned by this value alone; shared access is read-only (`Deref`).
unsafe impl Send for BlockBuf {}
// SAFETY: as above.
unsafe impl Sync for BlockBuf {}

impl BlockBuf {
    /// `len` zeroed bytes, every page already mapped.
    pub fn new(len: usize) -> io::Result<BlockBuf> {
        if len == 0 {
            return Ok(BlockBuf {
                ptr: std::ptr::NonNull::dangling().as_ptr(),
                len: 0,
            });
        }
        // SAFETY: an anonymous private mapping of `len` bytes; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(BlockBuf {
            ptr: ptr.cast(),
            len,
        })
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr..ptr + len` is this value's own mapping, borrowed uniquely.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl std::ops::Deref for BlockBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr..ptr + len` is this value's own mapping, alive while `self` is.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for BlockBuf {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: unmaps exactly the mapping `new` made; nothing borrows it any more.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }
}
