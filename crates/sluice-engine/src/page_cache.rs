//! Page-cache control and residency queries, each a thin wrapper over one
//! upstream syscall that degrades to "unknown" where the kernel lacks it.
//!
//! - `cachestat(2)` (Linux 6.5+, syscall 451) counts a file's cached pages
//!   without mapping it, which is how `DirectMode::Auto` spots a warm file.
//! - `statx(STATX_DIOALIGN)` (Linux 6.1+) reports the alignment O_DIRECT
//!   needs, or 0 where the file system has no direct I/O.
//! - `posix_fadvise(DONTNEED)` drops clean cached pages of a range: "burn
//!   after reading" for buffered loads, so a 100 GB model does not push the
//!   rest of the machine out of memory.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};

use crate::aligned_buf::page_size;

/// `cachestat` on x86_64 and arm64 (both use the generic table from 451 on).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const SYS_CACHESTAT: libc::c_long = 451;

/// `struct cachestat_range` of the UAPI.
#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

/// Pages of a range by page-cache state, as `cachestat(2)` reports them
/// (the UAPI's `struct cachestat`). Counts are in base pages.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStat {
    /// Pages in the page cache, including those with a read in flight.
    pub cache: u64,
    /// Cached pages that are dirty.
    pub dirty: u64,
    /// Cached pages being written back.
    pub writeback: u64,
    /// Pages evicted by reclaim (DONTNEED leaves no shadow entry, so it does
    /// not count here).
    pub evicted: u64,
    /// Evicted pages that would still be in memory with a bit more of it
    /// (refaults in the making).
    pub recently_evicted: u64,
}

/// Page-cache state of `[off, off + len)` of `fd`; `len` 0 means to the end
/// of the file. `ENOSYS` before Linux 6.5 (or on other architectures),
/// `EPERM` where the caller may not see residency.
pub fn cachestat(fd: RawFd, off: u64, len: u64) -> std::io::Result<CacheStat> {
    let range = CachestatRange { off, len };
    let mut out = CacheStat::default();
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    // SAFETY: both pointers refer to live `repr(C)` structs laid out as the
    // UAPI's; the kernel reads `range` and writes `out` only; flags must be 0.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            fd,
            &range as *const CachestatRange,
            &mut out as *mut CacheStat,
            0 as libc::c_uint,
        )
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let rc: libc::c_long = {
        let _ = (fd, &range);
        return Err(std::io::Error::from_raw_os_error(libc::ENOSYS));
    };
    if rc == 0 {
        Ok(out)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Pages of `fd` in the page cache, or `None` where cachestat is missing.
pub fn cached_pages(fd: RawFd, len: u64) -> Option<u64> {
    cached_pages_in(fd, 0, len)
}

/// True when every page of `[offset, offset + len)` is cached (and `false`
/// where cachestat is missing, so callers fall back to reading).
pub fn range_is_cached(fd: RawFd, offset: u64, len: u64) -> bool {
    let page = page_size() as u64;
    let first = offset / page;
    let last = (offset + len).div_ceil(page);
    cached_pages_in(fd, first * page, (last - first) * page).is_some_and(|n| n >= last - first)
}

fn cached_pages_in(fd: RawFd, off: u64, len: u64) -> Option<u64> {
    cachestat(fd, off, len).ok().map(|s| s.cache)
}

/// Fraction of the first `len` bytes of `file` that are cached, if known.
pub fn cached_fraction(file: &File, len: u64) -> Option<f64> {
    if len == 0 {
        return Some(1.0);
    }
    let pages = cached_pages(file.as_raw_fd(), len)?;
    let total = len.div_ceil(page_size() as u64);
    Some((pages as f64 / total as f64).min(1.0))
}

/// O_DIRECT offset alignment for `file`: `Some(0)` means unsupported,
/// `None` means the kernel could not say.
pub fn dio_alignment(file: &File) -> Option<usize> {
    // SAFETY: statx is plain old data; zeroed is a valid initial state.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: empty path with AT_EMPTY_PATH queries the descriptor itself;
    // `stx` is a valid out-pointer.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if rc != 0 || stx.stx_mask & libc::STATX_DIOALIGN == 0 {
        return None;
    }
    let offset_align = stx.stx_dio_offset_align as usize;
    let mem_align = stx.stx_dio_mem_align as usize;
    if offset_align == 0 || mem_align == 0 {
        return Some(0);
    }
    Some(offset_align.max(mem_align))
}

/// Drops the cached pages of `[offset, offset + len)`; errors are ignored
/// because this is advice, never required for correctness.
pub fn drop_range(fd: RawFd, offset: u64, len: u64) {
    let (Ok(off), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return;
    };
    // SAFETY: fadvise only reads its integer arguments.
    unsafe { libc::posix_fadvise(fd, off, len, libc::POSIX_FADV_DONTNEED) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn written_file_is_reported_cached_and_drops_out() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&vec![7u8; 1 << 20]).unwrap();
        f.as_file().sync_all().unwrap();
        let file = f.as_file();
        let Some(before) = cached_fraction(file, 1 << 20) else {
            eprintln!("cachestat unavailable on this kernel; skipping");
            return;
        };
        assert!(
            before > 0.9,
            "freshly written file should be cached: {before}"
        );
        drop_range(file.as_raw_fd(), 0, 1 << 20);
        let after = cached_fraction(file, 1 << 20).unwrap();
        assert!(after < 0.1, "DONTNEED after fsync should evict: {after}");
    }

    #[test]
    fn empty_file_counts_as_cached() {
        let f = tempfile::NamedTempFile::new().unwrap();
        assert_eq!(cached_fraction(f.as_file(), 0), Some(1.0));
    }
}
