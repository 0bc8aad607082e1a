//! Page-cache control and residency: the few kernel interfaces the loader
//! and the warm plane are built on, each wrapped once with typed errors
//! ([`OsError`]) that name the file or process at fault, and each degrading
//! to "unknown" or [`OsError::Unsupported`] where the kernel lacks it.
//!
//! - Residency ([`residency`]): how much of a range is cached.
//!   `cachestat(2)` (Linux 6.5, syscall 451) answers in microseconds and
//!   counts pages whose read is still in flight, so it measures what was
//!   *requested*; [`resident_bytes_mincore`] (only up-to-date pages) and
//!   [`probe_ready`] (`preadv2(RWF_NOWAIT)`) measure what is *ready*.
//!   cachestat needs the caller to own the file, have it open for writing or
//!   hold `CAP_FOWNER`; mincore never fails for lack of permission but then
//!   reports every page resident, so its answer is only trusted where
//!   cachestat would have been allowed. [`cached_fraction`] and
//!   [`range_is_cached`] are the loader's cheap questions ("is this file
//!   warm?"), `None`/`false` where cachestat is missing.
//! - Prefetch and evict ([`advise`]). `posix_fadvise(WILLNEED)` reads at
//!   most about `read_ahead_kb` per call and returns 0 for the rest, so
//!   [`willneed`] loops in chunks no larger than [`read_ahead_limit`].
//!   WILLNEED builds 4 KiB folios, while `read()` and `MADV_POPULATE_READ`
//!   ([`populate_read`]) build 2 MiB ones on ext4 (6.16+), which evict and
//!   measure 10-50x faster; populate is synchronous, WILLNEED is not.
//!   [`dontneed`] silently skips dirty, locked and *mapped* pages (a
//!   safetensors mmap keeps them), so callers confirm with cachestat and use
//!   [`pageout`] (`process_madvise(MADV_PAGEOUT)`) on the reader's mapping.
//!   [`drop_range`] is the loader's "burn after reading": DONTNEED as
//!   advice, errors ignored.
//! - Direct I/O: [`dio_alignment`] (`statx(STATX_DIOALIGN)`, Linux 6.1+)
//!   reports the alignment O_DIRECT needs, or 0 where the file system has
//!   none.
//!
//! Ranges are `(offset, len)` in bytes, clamped to the file's size: pass
//! `u64::MAX` for "to the end". For the prefetch and evict calls `len` 0 is
//! an empty range and a no-op; for the residency calls it means "to the
//! end", as in `cachestat(2)`.

mod advise;
mod residency;

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use crate::mapping::page_size;
use crate::os_error::OsError;

pub use advise::{
    dontneed, pageout, populate_read, probe_ready, read_ahead_limit, read_ahead_limit_in, willneed,
    DEFAULT_READ_AHEAD_BYTES,
};
pub use residency::{cachestat, resident_bytes, resident_bytes_mincore};

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
pub(crate) fn cachestat_fd(fd: RawFd, off: u64, len: u64) -> std::io::Result<CacheStat> {
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
    cachestat_fd(fd, off, len).ok().map(|s| s.cache)
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

/// Drops the cached pages of `[offset, offset + len)` (`len` 0: to the
/// end); errors are ignored because this is advice, never required for
/// correctness. [`dontneed`] is the checked form.
pub fn drop_range(fd: RawFd, offset: u64, len: u64) {
    let _ = fadvise_fd(fd, offset, len, libc::POSIX_FADV_DONTNEED);
}

/// `posix_fadvise(advice)` over `[offset, offset + len)` of `fd`.
fn fadvise_fd(fd: RawFd, offset: u64, len: u64, advice: libc::c_int) -> std::io::Result<()> {
    let to_off = |v: u64| {
        libc::off_t::try_from(v).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("offset {v} does not fit off_t"),
            )
        })
    };
    let (off, len) = (to_off(offset)?, to_off(len)?);
    // SAFETY: fadvise only reads its integer arguments.
    match unsafe { libc::posix_fadvise(fd, off, len, advice) } {
        0 => Ok(()),
        rc => Err(std::io::Error::from_raw_os_error(rc)),
    }
}

/// The size of `file` in bytes, errors naming `path`.
pub(crate) fn file_size(file: &File, path: &Path) -> Result<u64, OsError> {
    Ok(file.metadata().map_err(OsError::io(path))?.len())
}

/// `[offset, offset + len)` clamped to a file of `size` bytes, as
/// `(offset, len)`; `len` is 0 when nothing of the range lies in the file.
pub(crate) fn clamp_range(offset: u64, len: u64, size: u64) -> (u64, u64) {
    if offset >= size {
        return (offset, 0);
    }
    (offset, len.min(size - offset))
}

/// A byte count as the kernel's `off_t`, or an error naming `path` and the
/// value.
pub(crate) fn to_off(value: u64, path: &Path) -> Result<libc::off_t, OsError> {
    libc::off_t::try_from(value).map_err(|_| OsError::InvalidArgument {
        what: format!("{}: offset", path.display()),
        value: value.to_string(),
        expected: "must fit off_t (below 2^63)",
    })
}

/// The path an open file was opened by, for error messages of calls that
/// take no path; `/proc/self/fd/N` when the link cannot be read.
pub(crate) fn fd_path(file: &File) -> PathBuf {
    let link = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    std::fs::read_link(&link).unwrap_or(link)
}

/// The page size in bytes, as the `u64` file offsets are counted in.
pub(crate) fn page_bytes() -> u64 {
    page_size() as u64
}

/// A shared mapping of `[offset, offset + len)` of `file`, all of which
/// must be cached, with every page mapped in (`MADV_POPULATE_READ` maps
/// cached pages and allocates none), and the file offset it starts at: for
/// looking at the pages behind a range (`/proc/self/pagemap`,
/// `move_pages`). Errors name `path`.
pub fn map_resident(
    file: &File,
    path: &Path,
    offset: u64,
    len: u64,
) -> Result<(crate::mapping::Mapping, u64), OsError> {
    let (map, start) = residency::map_range(file, path, offset, len)?;
    map.advise(libc::MADV_POPULATE_READ)
        .map_err(OsError::io(path))?;
    Ok((map, start))
}

/// The last OS error, for calls that return -1 and set errno.
pub(crate) fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
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

    #[test]
    fn clamp_range_cuts_at_end_of_file() {
        assert_eq!(clamp_range(0, 100, 50), (0, 50));
        assert_eq!(clamp_range(10, 20, 50), (10, 20));
        assert_eq!(clamp_range(50, 20, 50), (50, 0));
        assert_eq!(clamp_range(70, u64::MAX, 50), (70, 0));
        assert_eq!(clamp_range(1, u64::MAX, 50), (1, 49));
    }
}
