//! Residency: how much of a file range sits in the page cache.
//!
//! [`cachestat`] is the `cachestat(2)` system call (Linux 6.5, number 451 on
//! both x86_64 and arm64, no glibc wrapper). It walks the page-cache tree
//! without touching data: 0.55 us for an 8 MiB range, and on large folios a
//! whole 2 GiB file in well under a millisecond. It counts pages whose read
//! is still in flight, so right after a WILLNEED it reports more than is
//! readable; use [`resident_bytes_mincore`] or [`super::probe_ready`] when
//! the question is "can the reader have it without blocking".
//!
//! Permission: cachestat returns `EPERM` unless the caller owns the file,
//! has it open for writing, or holds `CAP_FOWNER` (it would otherwise leak
//! which pages of someone else's file were read). That becomes
//! [`OsError::Unsupported`] so callers can fall back.
//!
//! [`resident_bytes_mincore`] is the fallback for kernels before 6.5: map the
//! range read-only, ask `mincore(2)` which pages are up to date, unmap. It
//! never touches the data, but where the caller could not have written the
//! file the kernel hides residency and reports *every* page resident, even
//! after `drop_caches`; treat its answer as an upper bound there.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use super::{cachestat_fd, clamp_range, errno, fd_path, file_size, page_bytes, CacheStat};
use crate::mapping::Mapping;
use crate::os_error::OsError;

/// Page-cache state of `[offset, offset + len)` of `file`; `len` 0 means to
/// the end of the file, as in the system call.
///
/// Errors: [`OsError::Unsupported`] on kernels before 6.5 (`ENOSYS`) and
/// where the caller may not see residency (`EPERM`); [`OsError::Io`]
/// naming the file otherwise (a bad descriptor, an offset past `i64`).
pub fn cachestat(file: &File, offset: u64, len: u64) -> Result<CacheStat, OsError> {
    cachestat_fd(file.as_raw_fd(), offset, len).map_err(|err| match err.raw_os_error() {
        Some(libc::ENOSYS) => OsError::Unsupported {
            feature: "cachestat",
            reason: "kernel < 6.5".to_string(),
        },
        Some(libc::EPERM) => OsError::Unsupported {
            feature: "cachestat",
            reason: format!(
                "{}: EPERM: the caller must own the file, have it open for writing, \
                     or hold CAP_FOWNER",
                fd_path(file).display()
            ),
        },
        _ => OsError::Io {
            path: fd_path(file),
            source: err,
        },
    })
}

/// Bytes of `[offset, offset + len)` in the page cache according to
/// [`cachestat`]: cached pages × page size, clamped to the part of the range
/// inside the file. `len` 0 means to the end of the file. Includes pages
/// whose read is still in flight.
pub fn resident_bytes(file: &File, path: &Path, offset: u64, len: u64) -> Result<u64, OsError> {
    let size = file_size(file, path)?;
    let len = if len == 0 { u64::MAX } else { len };
    let (offset, len) = clamp_range(offset, len, size);
    if len == 0 {
        return Ok(0);
    }
    let stat = cachestat(file, offset, len).map_err(|e| name_io(e, path))?;
    Ok(stat.cache.saturating_mul(page_bytes()).min(len))
}

/// Replaces the `/proc/self/fd` guess in an I/O error with the caller's path.
fn name_io(err: OsError, path: &Path) -> OsError {
    match err {
        OsError::Io { source, .. } => OsError::Io {
            path: path.to_path_buf(),
            source,
        },
        other => other,
    }
}

/// Pages asked of `mincore` per call: bounds the residency vector to 64 KiB
/// whatever the range.
const MINCORE_PAGES_PER_CALL: usize = 64 * 1024;

/// Bytes of `[offset, offset + len)` whose pages are up to date in the page
/// cache, by `mincore(2)` over a temporary read-only mapping; `len` 0 means
/// to the end of the file. Works before Linux 6.5 and does not count reads
/// in flight.
///
/// Caveat: without write permission on the file (and without
/// `CAP_FOWNER`/`CAP_SYS_ADMIN`), the kernel reports every page resident, so
/// the answer is then the length of the range whatever is cached.
pub fn resident_bytes_mincore(
    file: &File,
    path: &Path,
    offset: u64,
    len: u64,
) -> Result<u64, OsError> {
    let size = file_size(file, path)?;
    let len = if len == 0 { u64::MAX } else { len };
    let (offset, len) = clamp_range(offset, len, size);
    if len == 0 {
        return Ok(0);
    }
    let page = page_bytes();
    let (map, map_start) = map_range(file, path, offset, len)?;
    let pages = (map.len() as u64).div_ceil(page);
    let mut vec = vec![0u8; MINCORE_PAGES_PER_CALL];
    let mut resident = 0u64;
    let mut first = 0u64;
    while first < pages {
        let n = (pages - first).min(MINCORE_PAGES_PER_CALL as u64);
        let start = map_start + first * page;
        // SAFETY: `map.addr + first*page .. + n*page` lies inside the live
        // mapping; `vec` holds at least `n` bytes.
        let rc = unsafe {
            libc::mincore(
                map.as_ptr().add((first * page) as usize).cast(),
                (n * page) as usize,
                vec.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(OsError::io(path)(errno()));
        }
        for (i, byte) in vec.iter().take(n as usize).enumerate() {
            if byte & 1 == 1 {
                let lo = (start + i as u64 * page).max(offset);
                let hi = (start + (i as u64 + 1) * page).min(offset + len);
                resident += hi.saturating_sub(lo);
            }
        }
        first += n;
    }
    Ok(resident)
}

/// A shared read-only mapping of `[offset, offset + len)` of `file`,
/// widened to whole pages, with the file offset it starts at; errors name
/// `path`. `len` must be non-zero.
pub(crate) fn map_range(
    file: &File,
    path: &Path,
    offset: u64,
    len: u64,
) -> Result<(Mapping, u64), OsError> {
    Mapping::file_range(file.as_raw_fd(), offset, len).map_err(OsError::io(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page_cache::{dontneed, populate_read};
    use sluice_testkit::{disk_tempdir, synced_file};

    const MIB: u64 = 1 << 20;

    #[test]
    fn cachestat_sees_populated_pages_and_not_dropped_ones() {
        let Some(dir) = disk_tempdir() else { return };
        let (file, path) = synced_file(&dir, 4 * MIB as usize);
        dontneed(&file, &path, 0, 4 * MIB).unwrap();
        let cold = match cachestat(&file, 0, 0) {
            Ok(stat) => stat,
            Err(OsError::Unsupported { reason, .. }) => {
                eprintln!("skipped: cachestat unsupported: {reason}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        assert!(cold.cache * page_bytes() < MIB / 4, "{cold:?}");
        populate_read(&file, &path, 0, 4 * MIB).unwrap();
        let warm = cachestat(&file, 0, 0).unwrap();
        assert_eq!(warm.cache * page_bytes(), 4 * MIB, "{warm:?}");
        assert_eq!(warm.dirty, 0);
    }

    #[test]
    fn resident_bytes_is_clamped_to_the_range_and_the_file() {
        let Some(dir) = disk_tempdir() else { return };
        // 10000 bytes: three pages, the last one partial.
        let (file, path) = synced_file(&dir, 10_000);
        populate_read(&file, &path, 0, 10_000).unwrap();
        let Ok(all) = resident_bytes(&file, &path, 0, 0) else {
            return;
        };
        assert_eq!(all, 10_000);
        assert_eq!(resident_bytes(&file, &path, 100, 50).unwrap(), 50);
        assert_eq!(resident_bytes(&file, &path, 9_000, 1 << 40).unwrap(), 1_000);
        assert_eq!(resident_bytes(&file, &path, 20_000, 10).unwrap(), 0);
    }

    #[test]
    fn mincore_sees_one_page_read_without_readahead() {
        use std::os::unix::fs::FileExt;
        let Some(dir) = disk_tempdir() else { return };
        let (file, path) = synced_file(&dir, 2 * MIB as usize + 123);
        dontneed(&file, &path, 0, u64::MAX).unwrap();
        let cold = resident_bytes_mincore(&file, &path, 0, 0).unwrap();
        assert!(cold < MIB / 4, "{cold}");
        // FADV_RANDOM turns readahead off: a 4 KiB read caches one page,
        // where a mapping fault would bring a whole 2 MiB folio.
        // SAFETY: posix_fadvise only reads its integer arguments.
        assert_eq!(
            unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) },
            0
        );
        let mut page = vec![0u8; 4096];
        file.read_exact_at(&mut page, MIB).unwrap();
        let warm = resident_bytes_mincore(&file, &path, 0, 0).unwrap();
        assert!((4096..MIB / 4).contains(&warm), "{warm}");
        assert_eq!(
            resident_bytes_mincore(&file, &path, MIB + 10, 100).unwrap(),
            100
        );
        assert_eq!(resident_bytes_mincore(&file, &path, 0, MIB).unwrap(), 0);
        assert_eq!(resident_bytes_mincore(&file, &path, 1 << 40, 1).unwrap(), 0);
        if let Ok(by_cachestat) = resident_bytes(&file, &path, 0, 0) {
            assert_eq!(by_cachestat, warm);
        }
        populate_read(&file, &path, 0, u64::MAX).unwrap();
        assert_eq!(
            resident_bytes_mincore(&file, &path, 0, 0).unwrap(),
            2 * MIB + 123
        );
    }

    #[test]
    fn unusable_descriptors_are_typed_errors_naming_the_file() {
        let Some(dir) = disk_tempdir() else { return };
        let (file, path) = synced_file(&dir, 4096);
        // A file opened for writing only cannot be mapped for reading.
        let write_only = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        match resident_bytes_mincore(&write_only, &path, 0, 0) {
            Err(OsError::Io { path: p, .. }) => assert_eq!(p, path),
            other => panic!("expected Io naming the file, got {other:?}"),
        }
        drop(file);
        // An O_PATH descriptor: cachestat refuses it, naming the file it
        // was opened by.
        let o_path = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH)
                .open(&path)
                .unwrap()
        };
        match cachestat(&o_path, 0, 0) {
            Err(OsError::Io { path: p, source }) => {
                assert_eq!(p, path);
                assert_eq!(source.raw_os_error(), Some(libc::EBADF));
            }
            Err(e @ OsError::Unsupported { .. }) => eprintln!("skipped: {e}"),
            other => panic!("expected EBADF naming the file, got {other:?}"),
        }
    }
}
