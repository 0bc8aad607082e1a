//! Prefetch and evict primitives over a file's page cache.
//!
//! Prefetch comes in two kinds:
//! - [`willneed`]: `posix_fadvise(WILLNEED)`, asynchronous per chunk. The
//!   kernel reads at most `max(io_pages, ra_pages)` per call
//!   (`force_page_cache_ra()`) and silently drops the rest, so one call over
//!   1 GiB queues 8 MiB and returns 0. We loop in chunks no larger than
//!   [`read_ahead_limit`]. A call blocks on request tags when the device
//!   queue is full, and it builds 4 KiB folios.
//! - [`populate_read`]: `madvise(MADV_POPULATE_READ)` on a temporary
//!   mapping marked `MADV_HUGEPAGE`, synchronous. The hint makes each fault
//!   read a whole 2 MiB folio where the file system caches large folios
//!   (ext4 6.16+, xfs): these evict 10-50x faster, make cachestat cheap and
//!   cost the kernel far less to build. Without it a fault reads around in
//!   base or 16 KiB folios, and loader threads sharing one descriptor (one
//!   readahead state) never let the readahead ramp up: a 4 GiB model
//!   populated by two threads averaged 11 KiB folios and 0.55 s of system
//!   time, against 203 KiB and 0.04 s with the hint. Before 5.14 it falls
//!   back to `pread` into a 1 MiB buffer.
//!
//! [`probe_ready`] answers "would a read of this page block?" with
//! `preadv2(RWF_NOWAIT)`: the prefetcher bounds its in-flight window by
//! probing the last page of an earlier chunk. On a page never requested the
//! probe also starts a small readahead.
//!
//! Eviction: [`dontneed`] drops clean, unmapped, unlocked pages right away
//! and silently skips dirty, mapped, locked and writeback ones (the call
//! still succeeds: confirm with cachestat). Pages a reader has mapped go with
//! [`pageout`], `process_madvise(MADV_PAGEOUT)` on the reader's address
//! range (Linux 5.10+, `CAP_SYS_NICE` and ptrace-read access).

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::residency::map_range;
use super::{clamp_range, errno, fd_path, file_size, page_bytes, to_off};
use crate::os_error::OsError;

/// Per-call prefetch cap when the device's `read_ahead_kb` cannot be read:
/// the kernel's default `read_ahead_kb` (128 KiB).
pub const DEFAULT_READ_AHEAD_BYTES: u64 = 128 * 1024;

/// Buffer of the `pread` fallback of [`populate_read`]: 1 MiB is large
/// enough for the kernel to build large folios and keep a request of
/// `max_sectors_kb` in flight, small enough to sit on any stack of threads.
const PREAD_BUFFER_BYTES: usize = 1 << 20;

/// `process_madvise` and `pidfd_open` numbers, the same on x86_64 and
/// aarch64 (generic table).
const SYS_PIDFD_OPEN: libc::c_long = 434;
const SYS_PROCESS_MADVISE: libc::c_long = 440;

/// How many bytes one WILLNEED call on `path` really reads: the
/// `read_ahead_kb` of the file's block device, from
/// `/sys/class/bdi/<major:minor>/read_ahead_kb`, else
/// `/sys/dev/block/<major:minor>/queue/read_ahead_kb` (of the partition's
/// disk for a partition), else [`DEFAULT_READ_AHEAD_BYTES`]. The source is
/// logged at debug level.
pub fn read_ahead_limit(path: &Path) -> u64 {
    match std::fs::metadata(path) {
        Ok(meta) => read_ahead_limit_in(Path::new("/sys"), meta.dev()),
        Err(e) => {
            tracing::debug!(
                "read_ahead_limit: {}: {e}; using {DEFAULT_READ_AHEAD_BYTES} bytes",
                path.display()
            );
            DEFAULT_READ_AHEAD_BYTES
        }
    }
}

/// [`read_ahead_limit`] for device number `dev` under a sysfs root
/// (`/sys`, or a fake tree in tests).
pub fn read_ahead_limit_in(sys_root: &Path, dev: u64) -> u64 {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let id = format!("{major}:{minor}");
    let candidates: [PathBuf; 3] = [
        sys_root.join("class/bdi").join(&id).join("read_ahead_kb"),
        sys_root
            .join("dev/block")
            .join(&id)
            .join("queue/read_ahead_kb"),
        // A partition has no queue of its own; its disk is the parent.
        sys_root
            .join("dev/block")
            .join(&id)
            .join("../queue/read_ahead_kb"),
    ];
    for candidate in &candidates {
        let Ok(text) = std::fs::read_to_string(candidate) else {
            continue;
        };
        match text.trim().parse::<u64>() {
            Ok(kb) if kb > 0 => {
                tracing::debug!("read_ahead_limit: {kb} KiB from {}", candidate.display());
                return kb.saturating_mul(1024);
            }
            _ => tracing::debug!(
                "read_ahead_limit: {}: {:?} is not a positive KiB count",
                candidate.display(),
                text.trim()
            ),
        }
    }
    tracing::debug!("read_ahead_limit: no read_ahead_kb for device {id}; using 128 KiB");
    DEFAULT_READ_AHEAD_BYTES
}

/// Asks the kernel to read `[offset, offset + len)` of `file` into the page
/// cache, one `posix_fadvise(WILLNEED)` per `chunk` bytes (pass
/// [`read_ahead_limit`]: larger chunks are silently cut by the kernel).
/// Returns once every chunk is queued, not read.
///
/// A `chunk` of 0 is an [`OsError::InvalidArgument`] naming the path.
pub fn willneed(
    file: &File,
    path: &Path,
    offset: u64,
    len: u64,
    chunk: u64,
) -> Result<(), OsError> {
    if chunk == 0 {
        return Err(OsError::InvalidArgument {
            what: format!("willneed {}: chunk size", path.display()),
            value: "0".into(),
            expected: "must be at least one byte",
        });
    }
    let (offset, len) = clamp_range(offset, len, file_size(file, path)?);
    let end = offset + len;
    let mut at = offset;
    while at < end {
        let n = chunk.min(end - at);
        fadvise(file, path, at, n, libc::POSIX_FADV_WILLNEED)?;
        at += n;
    }
    Ok(())
}

/// Drops the clean, unmapped pages of `[offset, offset + len)` of `file`
/// from the page cache (`posix_fadvise(DONTNEED)`). Pages only partly in the
/// range stay, except the file's last page when the range reaches the end
/// (pass `u64::MAX` for "to the end"; `len` 0 is an empty range).
/// Mapped, dirty and locked pages are skipped without an error: check with
/// [`super::cachestat`].
pub fn dontneed(file: &File, path: &Path, offset: u64, len: u64) -> Result<(), OsError> {
    let size = file_size(file, path)?;
    let (offset, len) = clamp_range(offset, len, size);
    if len == 0 {
        return Ok(());
    }
    // Up to the end of the file: pass 0 ("to EOF") so the kernel also drops
    // the partial last page, which it keeps for an explicit length.
    let len = if offset + len == size { 0 } else { len };
    fadvise(file, path, offset, len, libc::POSIX_FADV_DONTNEED)
}

fn fadvise(
    file: &File,
    path: &Path,
    offset: u64,
    len: u64,
    advice: libc::c_int,
) -> Result<(), OsError> {
    // Checked here first, for an error that names the argument and the file.
    to_off(offset, path)?;
    to_off(len, path)?;
    super::fadvise_fd(file.as_raw_fd(), offset, len, advice).map_err(OsError::io(path))
}

/// Reads `[offset, offset + len)` of `file` into the page cache and returns
/// once it is there, as 2 MiB folios where the file system has them:
/// `madvise(MADV_POPULATE_READ)` over a temporary `MADV_HUGEPAGE` mapping
/// (see the module notes), or `pread` into a 1 MiB buffer on kernels without it
/// (before 5.14). Returns the bytes of the range inside the file, now
/// resident. Note `len` 0 is an empty range here, not "to the end".
pub fn populate_read(file: &File, path: &Path, offset: u64, len: u64) -> Result<u64, OsError> {
    let (offset, len) = clamp_range(offset, len, file_size(file, path)?);
    if len == 0 {
        return Ok(0);
    }
    let (map, _) = map_range(file, path, offset, len)?;
    // HUGEPAGE only changes how the mapping's faults read ahead (PMD-sized
    // folios), and failure changes nothing.
    let _ = map.advise(libc::MADV_HUGEPAGE);
    // POPULATE_READ only faults pages in; it changes no memory we observe.
    let Err(err) = map.advise(libc::MADV_POPULATE_READ) else {
        return Ok(len);
    };
    drop(map);
    if err.raw_os_error() == Some(libc::EINVAL) {
        tracing::debug!(
            "populate_read {}: MADV_POPULATE_READ unsupported (kernel < 5.14), using pread",
            path.display()
        );
        return populate_by_pread(file, path, offset, len);
    }
    Err(OsError::io(path)(err))
}

/// The pre-5.14 path of [`populate_read`]: read the range through one
/// reused buffer.
fn populate_by_pread(file: &File, path: &Path, offset: u64, len: u64) -> Result<u64, OsError> {
    let mut buffer = vec![0u8; PREAD_BUFFER_BYTES];
    let end = offset + len;
    let mut at = offset;
    while at < end {
        let want = (end - at).min(PREAD_BUFFER_BYTES as u64) as usize;
        match file.read_at(&mut buffer[..want], at) {
            Ok(0) => break, // the file shrank under us
            Ok(n) => at += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(OsError::io(path)(e)),
        }
    }
    Ok(at - offset)
}

/// Pages out `[addr, addr + len)` of process `pid`'s address space:
/// `process_madvise(pidfd_open(pid), MADV_PAGEOUT)`. For file pages a
/// reader has mapped, which [`dontneed`] cannot drop. `addr` must be page
/// aligned.
///
/// Errors: [`OsError::Unsupported`] before Linux 5.10 (`ENOSYS`) or
/// without `CAP_SYS_NICE` and ptrace-read access to the process (`EPERM`);
/// [`OsError::Io`] naming `/proc/<pid>` otherwise (no such process, a
/// bad range).
pub fn pageout(pid: i32, addr: u64, len: u64) -> Result<(), OsError> {
    if len == 0 {
        return Ok(());
    }
    let proc_path = PathBuf::from(format!("/proc/{pid}"));
    let unsupported = |err: &std::io::Error| match err.raw_os_error() {
        Some(libc::ENOSYS) => Some(OsError::Unsupported {
            feature: "process_madvise",
            reason: "kernel < 5.10".to_string(),
        }),
        Some(libc::EPERM) => Some(OsError::Unsupported {
            feature: "process_madvise",
            reason: format!("pid {pid}: EPERM: needs CAP_SYS_NICE and ptrace read access"),
        }),
        _ => None,
    };
    // SAFETY: pidfd_open takes two integers and returns a new descriptor.
    let fd = unsafe { libc::syscall(SYS_PIDFD_OPEN, pid, 0 as libc::c_uint) };
    if fd < 0 {
        let err = errno();
        return Err(unsupported(&err).unwrap_or_else(|| OsError::io(&proc_path)(err)));
    }
    // SAFETY: `fd` is a descriptor the kernel just gave us and nobody else
    // owns; OwnedFd closes it.
    let pidfd = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
    let (Ok(base), Ok(size)) = (usize::try_from(addr), usize::try_from(len)) else {
        return Err(OsError::InvalidArgument {
            what: format!("pageout pid {pid}: range"),
            value: format!("{addr:#x}+{len}"),
            expected: "must fit this machine's addresses",
        });
    };
    let iov = libc::iovec {
        iov_base: base as *mut libc::c_void,
        iov_len: size,
    };
    // SAFETY: the kernel reads one iovec from `iov`, which outlives the call;
    // the range is in the target process, never dereferenced here.
    let rc = unsafe {
        libc::syscall(
            SYS_PROCESS_MADVISE,
            pidfd.as_raw_fd(),
            &iov as *const libc::iovec,
            1 as libc::size_t,
            libc::MADV_PAGEOUT,
            0 as libc::c_uint,
        )
    };
    if rc < 0 {
        let err = errno();
        return Err(unsupported(&err).unwrap_or_else(|| OsError::io(&proc_path)(err)));
    }
    Ok(())
}

/// Whether the page holding `offset` is cached and up to date, so a read of
/// it would not block: `preadv2(RWF_NOWAIT)` of that page, `false` on
/// `EAGAIN`. At or past the end of the file the answer is `true` (a read
/// there returns at once). On a page nobody requested, the probe also
/// starts a small readahead.
///
/// Errors: [`OsError::Unsupported`] where the file system or kernel has
/// no `RWF_NOWAIT` for buffered reads; [`OsError::Io`] naming the file
/// otherwise.
pub fn probe_ready(file: &File, offset: u64) -> Result<bool, OsError> {
    let page = page_bytes();
    let start = offset - offset % page;
    let mut buffer = vec![0u8; page as usize];
    let iov = libc::iovec {
        iov_base: buffer.as_mut_ptr().cast(),
        iov_len: buffer.len(),
    };
    // fd_path is a readlink: only pay for it on the error path.
    let off = libc::off_t::try_from(start).or_else(|_| to_off(start, &fd_path(file)))?;
    // SAFETY: one iovec over `buffer`, which lives past the call and is
    // writable for its full length.
    let rc = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, off, libc::RWF_NOWAIT) };
    if rc >= 0 {
        return Ok(true);
    }
    let err = errno();
    match err.raw_os_error() {
        Some(libc::EAGAIN) => Ok(false),
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => Err(OsError::Unsupported {
            feature: "preadv2(RWF_NOWAIT)",
            reason: format!("{}: {err}", fd_path(file).display()),
        }),
        _ => Err(OsError::Io {
            path: fd_path(file),
            source: err,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page_cache::resident_bytes;
    use sluice_testkit::{disk_tempdir, synced_file};
    use std::time::{Duration, Instant};

    const MIB: u64 = 1 << 20;

    /// Resident bytes by cachestat, or `None` (the test skips) where it is
    /// unsupported.
    fn resident(file: &File, path: &Path) -> Option<u64> {
        match resident_bytes(file, path, 0, 0) {
            Ok(n) => Some(n),
            Err(OsError::Unsupported { reason, .. }) => {
                eprintln!("skipped: cachestat unsupported: {reason}");
                None
            }
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn dontneed_then_populate_read_round_trip() {
        let Some(dir) = disk_tempdir() else { return };
        let (file, path) = synced_file(&dir, 16 * MIB as usize);
        dontneed(&file, &path, 0, 16 * MIB).unwrap();
        let Some(cold) = resident(&file, &path) else {
            return;
        };
        assert!(cold < MIB, "after DONTNEED {cold} bytes still cached");
        assert!(!probe_ready(&file, 8 * MIB).unwrap());
        assert_eq!(populate_read(&file, &path, 0, 16 * MIB).unwrap(), 16 * MIB);
        assert_eq!(resident(&file, &path), Some(16 * MIB));
        assert!(probe_ready(&file, 8 * MIB + 5).unwrap());
        assert!(probe_ready(&file, 16 * MIB - 1).unwrap());
        dontneed(&file, &path, 0, u64::MAX).unwrap();
        assert!(resident(&file, &path).unwrap() < MIB);
    }

    #[test]
    fn willneed_in_chunks_fills_the_cache() {
        let Some(dir) = disk_tempdir() else { return };
        let (file, path) = synced_file(&dir, 16 * MIB as usize);
        dontneed(&file, &path, 0, u64::MAX).unwrap();
        let Some(cold) = resident(&file, &path) else {
            return;
        };
        assert!(cold < MIB, "{cold}");
        let chunk = read_ahead_limit(&path);
        willneed(&file, &path, 0, 16 * MIB, chunk).unwrap();
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut now = resident(&file, &path).unwrap();
        while now < 16 * MIB && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
            now = resident(&file, &path).unwrap();
        }
        assert_eq!(now, 16 * MIB, "chunk {chunk}");
    }

    #[test]
    fn one_oversized_willneed_is_cut_by_the_kernel_cap() {
        let Some(dir) = disk_tempdir() else { return };
        let (file, path) = synced_file(&dir, 16 * MIB as usize);
        dontneed(&file, &path, 0, u64::MAX).unwrap();
        if resident(&file, &path).is_none() {
            return;
        }
        let chunk = read_ahead_limit(&path);
        if chunk >= 16 * MIB {
            eprintln!("skipped: read_ahead_kb {chunk} bytes is not under the 16 MiB file");
            return;
        }
        willneed(&file, &path, 0, 16 * MIB, 16 * MIB).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let got = resident(&file, &path).unwrap();
        assert!(
            got < 16 * MIB,
            "one call read {got} bytes past a {chunk} cap"
        );
    }

    /// Folios holding the file's first `len` bytes, all cached: `None` where
    /// pagemap hides frame numbers (no `CAP_SYS_ADMIN`) or there is no
    /// /proc/kpageflags.
    fn folios(file: &File, path: &Path, len: u64) -> Option<u64> {
        const KPF_COMPOUND_TAIL: u64 = 1 << 16;
        let (map, _) = crate::page_cache::map_resident(file, path, 0, len).expect("mmap");
        let page = page_bytes();
        let pagemap = File::open("/proc/self/pagemap").ok()?;
        let flags = File::open("/proc/kpageflags").ok()?;
        let mut entries = vec![0u8; (len / page * 8) as usize];
        pagemap
            .read_exact_at(&mut entries, map.as_ptr() as u64 / page * 8)
            .ok()?;
        let mut count = 0;
        for entry in entries.chunks_exact(8) {
            let entry = u64::from_ne_bytes(entry.try_into().unwrap());
            let pfn = entry & ((1 << 55) - 1);
            if entry >> 63 == 0 || pfn == 0 {
                return None;
            }
            let mut word = [0u8; 8];
            flags.read_exact_at(&mut word, pfn * 8).ok()?;
            if u64::from_ne_bytes(word) & KPF_COMPOUND_TAIL == 0 {
                count += 1;
            }
        }
        Some(count)
    }

    #[test]
    fn populate_folios_average_at_least_half_the_size_of_a_sequential_reads() {
        let Some(dir) = disk_tempdir() else { return };
        let (len, chunk) = (32 * MIB, 8 * MIB);
        let (file, path) = synced_file(&dir, len as usize);
        dontneed(&file, &path, 0, u64::MAX).unwrap();
        if resident(&file, &path) != Some(0) {
            eprintln!("skipped: the file could not be dropped from the cache");
            return;
        }
        // The reference: one sequential reader, whose readahead grows folios.
        let mut buf = vec![0u8; MIB as usize];
        for at in (0..len).step_by(MIB as usize) {
            file.read_exact_at(&mut buf, at).unwrap();
        }
        let Some(by_read) = folios(&file, &path, len) else {
            eprintln!("skipped: no frame numbers in pagemap (not root?) or no kpageflags");
            return;
        };
        if by_read == len / page_bytes() {
            eprintln!("skipped: this file system caches only base pages");
            return;
        }
        dontneed(&file, &path, 0, u64::MAX).unwrap();
        assert_eq!(resident(&file, &path), Some(0));
        // As the loader threads do: chunks taken in turn by two threads
        // sharing one descriptor (and so one readahead state).
        std::thread::scope(|s| {
            for first in 0..2 {
                let (file, path) = (&file, &path);
                s.spawn(move || {
                    for at in (first * chunk..len).step_by(2 * chunk as usize) {
                        assert_eq!(populate_read(file, path, at, chunk).unwrap(), chunk);
                    }
                });
            }
        });
        let by_populate = folios(&file, &path, len).unwrap();
        // A factor of four, not an exact bound. The two threads share one
        // descriptor's readahead state, and how their faults interleave
        // decides where a neighbour's readahead cached smaller folios first:
        // this file came out in 16 folios in most runs, in 1,038 in some, and
        // in 2,060 once on a machine busy with a build (always with the whole
        // file cached, read() making 937). The regression pinned here is
        // populate without the hint: about 7,600 folios, nearly all base pages.
        assert!(
            by_populate <= 4 * by_read,
            "populate cached {len} bytes in {by_populate} folios, read() in {by_read}"
        );
    }

    #[test]
    fn empty_and_past_end_ranges_are_no_ops() {
        let Some(dir) = disk_tempdir() else { return };
        let (file, path) = synced_file(&dir, 8192);
        dontneed(&file, &path, 0, u64::MAX).unwrap();
        willneed(&file, &path, 1 << 40, 1 << 20, 4096).unwrap();
        willneed(&file, &path, 0, 0, 4096).unwrap();
        assert_eq!(populate_read(&file, &path, 0, 0).unwrap(), 0);
        assert_eq!(populate_read(&file, &path, 1 << 40, 10).unwrap(), 0);
        assert_eq!(populate_read(&file, &path, 4000, 1 << 40).unwrap(), 4192);
        dontneed(&file, &path, 1 << 40, 1).unwrap();
        assert!(probe_ready(&file, 1 << 40).unwrap());
    }

    #[test]
    fn errors_are_typed_and_name_the_file() {
        let Some(dir) = disk_tempdir() else { return };
        let (_file, path) = synced_file(&dir, 8192);
        match willneed(&_file, &path, 0, 10, 0) {
            Err(e @ OsError::InvalidArgument { .. }) => {
                assert!(e.to_string().contains("data.bin"), "{e}")
            }
            other => panic!("{other:?}"),
        }
        // An O_PATH descriptor has a size but cannot be read or advised.
        let o_path = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags_path()
            .open(&path)
            .unwrap();
        for result in [
            willneed(&o_path, &path, 0, 4096, 4096).map(|_| 0),
            dontneed(&o_path, &path, 0, 4096).map(|_| 0),
            populate_read(&o_path, &path, 0, 4096),
            resident_bytes(&o_path, &path, 0, 4096),
        ] {
            match result {
                Err(OsError::Io { path: p, source }) => {
                    assert_eq!(p, path);
                    assert_eq!(source.raw_os_error(), Some(libc::EBADF), "{source}");
                }
                // Before Linux 6.5 the missing system call is the answer.
                Err(OsError::Unsupported {
                    feature: "cachestat",
                    ..
                }) => {}
                other => panic!("expected EBADF naming the file, got {other:?}"),
            }
        }
        match probe_ready(&o_path, 0) {
            Err(OsError::Io { path: p, .. }) => assert_eq!(p, path),
            other => panic!("{other:?}"),
        }
    }

    /// `O_PATH` open, as an extension so the test reads as one chain.
    trait OPath {
        fn custom_flags_path(&mut self) -> &mut Self;
    }

    impl OPath for std::fs::OpenOptions {
        fn custom_flags_path(&mut self) -> &mut Self {
            use std::os::unix::fs::OpenOptionsExt;
            self.custom_flags(libc::O_PATH)
        }
    }

    #[test]
    fn pageout_of_own_mapping_is_ok_or_unsupported() {
        let Some(dir) = disk_tempdir() else { return };
        let (file, path) = synced_file(&dir, 2 * MIB as usize);
        let (map, _) = map_range(&file, &path, 0, 2 * MIB).unwrap();
        // Fault the pages in through the mapping.
        // SAFETY: reading inside the live read-only mapping.
        let sum: u64 = (0..2 * MIB as usize)
            .step_by(4096)
            .map(|i| u64::from(unsafe { *map.as_ptr().add(i) }))
            .sum();
        assert!(sum > 0);
        // DONTNEED returns 0 but skips pages someone has mapped.
        dontneed(&file, &path, 0, u64::MAX).unwrap();
        let before = resident_bytes(&file, &path, 0, 0).ok();
        if let Some(before) = before {
            assert_eq!(before, 2 * MIB, "DONTNEED dropped mapped pages");
        }
        match pageout(std::process::id() as i32, map.as_ptr() as u64, 2 * MIB) {
            // We own the file, so the kernel may page it out: the mapped
            // pages DONTNEED would skip are gone.
            Ok(()) => {
                if let (Some(before), Ok(after)) = (before, resident_bytes(&file, &path, 0, 0)) {
                    assert!(after < before, "pageout left {after} of {before} bytes");
                }
            }
            Err(OsError::Unsupported { reason, .. }) => eprintln!("skipped: {reason}"),
            Err(e) => panic!("{e}"),
        }
        assert!(pageout(std::process::id() as i32, map.as_ptr() as u64, 0).is_ok());
        match pageout(i32::MAX, 0, 4096) {
            Err(OsError::Io { path: p, .. }) => assert!(p.ends_with(i32::MAX.to_string())),
            Err(OsError::Unsupported { .. }) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn read_ahead_limit_reads_bdi_then_queue_then_default() {
        let root = tempfile::tempdir().unwrap();
        let dev = libc::makedev(254, 1);
        assert_eq!(
            read_ahead_limit_in(root.path(), dev),
            DEFAULT_READ_AHEAD_BYTES
        );
        // Partition 254:1 of disk 254:0: the disk's queue applies.
        let disk = root.path().join("devices/vda");
        std::fs::create_dir_all(disk.join("queue")).unwrap();
        std::fs::create_dir_all(disk.join("vda1")).unwrap();
        std::fs::write(disk.join("queue/read_ahead_kb"), "4096\n").unwrap();
        std::fs::create_dir_all(root.path().join("dev/block")).unwrap();
        std::os::unix::fs::symlink(disk.join("vda1"), root.path().join("dev/block/254:1")).unwrap();
        assert_eq!(read_ahead_limit_in(root.path(), dev), 4096 * 1024);
        let bdi = root.path().join("class/bdi/254:1");
        std::fs::create_dir_all(&bdi).unwrap();
        std::fs::write(bdi.join("read_ahead_kb"), "garbage").unwrap();
        assert_eq!(read_ahead_limit_in(root.path(), dev), 4096 * 1024);
        std::fs::write(bdi.join("read_ahead_kb"), "8192\n").unwrap();
        assert_eq!(read_ahead_limit_in(root.path(), dev), 8192 * 1024);
        assert!(read_ahead_limit(Path::new("/nonexistent/x")) == DEFAULT_READ_AHEAD_BYTES);
        assert!(read_ahead_limit(Path::new(env!("CARGO_MANIFEST_DIR"))) >= 4096);
    }
}
