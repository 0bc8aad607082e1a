//! Page-cache primitives and system facts: the few kernel interfaces the
//! warm plane is built on, each wrapped once with typed errors that name the
//! file, process or value at fault.
//!
//! - [`cachestat`](mod@cachestat): how much of a range is in the page cache.
//!   `cachestat(2)` (Linux 6.5) answers in microseconds and counts pages
//!   whose read is still in flight, so it measures what was *requested*;
//!   [`resident_bytes_mincore`] (only up-to-date pages) and
//!   [`probe_ready`] (`preadv2(RWF_NOWAIT)`) measure what is *ready*.
//!   cachestat needs the caller to own the file, have it open for writing or
//!   hold `CAP_FOWNER`; mincore never fails for lack of permission but then
//!   reports every page resident, so its answer is only trusted where
//!   cachestat would have been allowed.
//! - [`advise`]: prefetch and evict. `posix_fadvise(WILLNEED)` reads at most
//!   about `read_ahead_kb` per call and returns 0 for the rest, so
//!   [`willneed`] loops in chunks no larger than [`read_ahead_limit`].
//!   WILLNEED builds 4 KiB folios, while `read()` and `MADV_POPULATE_READ`
//!   ([`populate_read`]) build 2 MiB ones on ext4 (6.16+), which evict and
//!   measure 10-50x faster; populate is synchronous, WILLNEED is not.
//!   [`dontneed`] silently skips dirty, locked and *mapped* pages (a
//!   safetensors mmap keeps them), so callers confirm with cachestat and use
//!   [`pageout`] (`process_madvise(MADV_PAGEOUT)`) on the reader's mapping.
//! - [`memory`]: the budget. The memory limit that applies to a process
//!   (cgroup v1 or v2, the tightest ancestor, else `/proc/meminfo`), a
//!   [`Watermark`] over it, and creation of a cgroup for the daemon or its
//!   workers. Page cache is charged to the cgroup that first touched it, not
//!   the one that reads it later: a daemon that prefetches for a job must be
//!   limited itself, or prefetch from a worker inside the job's cgroup.
//! - [`numa`]: accelerator index → NUMA node from PCI sysfs, and
//!   [`bind_thread_to_node`]. Page-cache folios land on the node of the
//!   thread that first reads or faults them (the VMA policy of a shared file
//!   mapping is ignored), so each prefetch thread sets its own policy before
//!   touching a chunk.
//!
//! Ranges are `(offset, len)` in bytes, clamped to the file's size: pass
//! `u64::MAX` for "to the end". For the prefetch and evict calls `len` 0 is
//! an empty range and a no-op; for the residency calls it means "to the
//! end", as in `cachestat(2)`.

pub mod advise;
pub mod cachestat;
pub mod memory;
pub mod numa;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::error::WarmError;

pub use advise::{
    dontneed, pageout, populate_read, probe_ready, read_ahead_limit, read_ahead_limit_in, willneed,
    DEFAULT_READ_AHEAD_BYTES,
};
pub use cachestat::{cachestat, resident_bytes, resident_bytes_mincore, CacheStat};
pub use memory::{
    create_cgroup, create_cgroup_at, memory_cgroup_of, memory_limit_for_pid, memory_limit_in,
    own_cgroup_memory_limit, Cgroup, CgroupVersion, MemoryLimit, Watermark,
};
pub use numa::{bind_thread_to_node, pin_thread_to_node_cpus, NumaMap};

/// Size of a base page in bytes (the engine's, as a `u64`).
pub fn page_size() -> u64 {
    sluice_engine::page_size() as u64
}

/// The size of `file` in bytes, errors naming `path`.
pub(crate) fn file_size(file: &File, path: &Path) -> Result<u64, WarmError> {
    Ok(file.metadata().map_err(WarmError::io(path))?.len())
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
pub(crate) fn to_off(value: u64, path: &Path) -> Result<libc::off_t, WarmError> {
    libc::off_t::try_from(value).map_err(|_| WarmError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("offset {value} does not fit off_t"),
        ),
    })
}

/// The path an open file was opened by, for error messages of calls that
/// take no path; `/proc/self/fd/N` when the link cannot be read.
pub(crate) fn fd_path(file: &File) -> PathBuf {
    let link = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    std::fs::read_link(&link).unwrap_or(link)
}

/// The last OS error, for calls that return -1 and set errno.
pub(crate) fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

#[cfg(test)]
pub(crate) mod test_util {
    use std::fs::File;

    pub use sluice_testkit::{disk_tempdir, is_root, synced_file};

    /// A mapping of the first `len` bytes of `file`, which must all be
    /// cached, with every page mapped (MADV_POPULATE_READ maps cached pages
    /// and allocates none), for tests that look at the pages behind it.
    pub fn map_cached(
        file: &File,
        path: &std::path::Path,
        len: u64,
    ) -> crate::sys::cachestat::Mapping {
        let map = crate::sys::cachestat::Mapping::new(file, path, 0, len).expect("mmap");
        // SAFETY: advising exactly the live mapping; its pages are cached, so
        // this only maps them.
        let rc = unsafe { libc::madvise(map.addr.cast(), len as usize, libc::MADV_POPULATE_READ) };
        assert_eq!(rc, 0, "{}", super::errno());
        map
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_size_is_a_power_of_two() {
        let size = page_size();
        assert!(size >= 4096 && size.is_power_of_two(), "{size}");
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
