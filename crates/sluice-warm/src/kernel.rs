//! The real [`PageCache`]: prefetch with WILLNEED or MADV_POPULATE_READ,
//! evict with DONTNEED plus MADV_PAGEOUT on readers' mappings, memory from
//! the service's cgroup, NUMA placement per target.
//!
//! **Mechanism.** `willneed` queues a chunk (≤ `read_ahead_kb`) and returns
//! before the I/O completes, so one thread keeps the device queue full; the
//! window of chunks in flight is bounded by probing the last page of the
//! oldest chunk with `preadv2(RWF_NOWAIT)` before submitting a new one, so
//! a jump of the reader takes effect within one window (research notes:
//! 32-64 MiB kept 75-95% of unbounded throughput). `populate` reads each
//! chunk synchronously into 2 MiB folios, which evict and read back faster
//! (DONTNEED of 2 GiB: 5-20 ms against 200-575 ms for WILLNEED's 4 KiB
//! folios) but needs threads for depth. Which wins depends on the device;
//! `make bench-warm` measures both.
//!
//! **Mapped pages.** DONTNEED skips pages a process has mapped, and
//! safetensors maps its files, so eviction also pages out the range from
//! each known reader's mapping (`process_madvise(MADV_PAGEOUT)`).

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::WarmError;
use crate::manager::{Memory, PageCache};
use crate::policy::{FileRange, Target};
use crate::sys::{self, Cgroup, NumaMap};

/// How prefetch reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mechanism {
    /// `posix_fadvise(WILLNEED)` with a bounded in-flight window.
    WillNeed,
    /// `madvise(MADV_POPULATE_READ)` on a temporary mapping, synchronous.
    Populate,
    /// `pread` into a scratch buffer, synchronous: the read path's
    /// readahead builds large folios, as `cat` does.
    Read,
}

impl std::str::FromStr for Mechanism {
    type Err = WarmError;

    fn from_str(s: &str) -> Result<Mechanism, WarmError> {
        match s {
            "willneed" => Ok(Mechanism::WillNeed),
            "populate" => Ok(Mechanism::Populate),
            "read" => Ok(Mechanism::Read),
            other => Err(WarmError::Config(format!(
                "unknown prefetch mechanism {other:?}: use willneed, read or populate"
            ))),
        }
    }
}

/// Where memory usage and limit are read.
pub enum MemorySource {
    /// A cgroup the runtime created, with its limit.
    Cgroup { cgroup: Cgroup, limit: u64 },
    /// The cgroup (or machine) of a process.
    Pid(i32),
}

/// Page-cache operations on the running kernel.
pub struct KernelCache {
    mechanism: Mechanism,
    chunk: u64,
    /// Most WILLNEED chunks in flight.
    window: usize,
    files: HashMap<PathBuf, File>,
    in_flight: VecDeque<(PathBuf, u64)>,
    memory: MemorySource,
    numa: NumaMap,
    bound_node: Option<u32>,
    /// Processes whose mappings eviction pages out.
    readers: Vec<i32>,
    /// Scratch buffer of the `read` mechanism.
    scratch: Vec<u8>,
}

impl KernelCache {
    /// `chunk` is the per-call read size (the device's `read_ahead_kb`);
    /// `in_flight_bytes` bounds WILLNEED's queue (64 MiB is a good start).
    pub fn new(
        mechanism: Mechanism,
        chunk: u64,
        in_flight_bytes: u64,
        memory: MemorySource,
        numa: NumaMap,
    ) -> KernelCache {
        let chunk = chunk.max(sys::page_size());
        KernelCache {
            mechanism,
            chunk,
            window: (in_flight_bytes / chunk).max(1) as usize,
            files: HashMap::new(),
            in_flight: VecDeque::new(),
            memory,
            numa,
            bound_node: None,
            readers: Vec::new(),
            scratch: Vec::new(),
        }
    }

    /// Eviction will also page the range out of this process's mappings.
    pub fn add_reader(&mut self, pid: i32) {
        if !self.readers.contains(&pid) {
            self.readers.push(pid);
        }
    }

    fn file(&mut self, path: &Path) -> Result<&File, WarmError> {
        if !self.files.contains_key(path) {
            let f = File::open(path).map_err(WarmError::io(path))?;
            self.files.insert(path.to_path_buf(), f);
        }
        self.files
            .get(path)
            .ok_or_else(|| WarmError::Config(format!("{}: not open", path.display())))
    }

    fn place(&mut self, target: Target) {
        let node = match target {
            Target::Any => return,
            Target::NumaNode(n) => Some(n),
            Target::Accelerator(a) => self.numa.node_of(a),
        };
        let Some(node) = node else { return };
        if self.bound_node == Some(node) {
            return;
        }
        match sys::bind_thread_to_node(node) {
            Ok(()) => self.bound_node = Some(node),
            Err(err) => {
                tracing::debug!("NUMA placement on node {node} skipped: {err}");
                self.bound_node = Some(node);
            }
        }
    }

    /// Waits until the oldest chunk in flight is readable (at most 2 s, so a
    /// lost probe never stalls prefetch for good).
    fn wait_for_window(&mut self) {
        while self.in_flight.len() >= self.window {
            let Some((path, last_page)) = self.in_flight.pop_front() else {
                return;
            };
            let Some(file) = self.files.get(&path) else {
                continue;
            };
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                match sys::probe_ready(file, last_page) {
                    Ok(true) | Err(_) => break,
                    Ok(false) => std::thread::sleep(Duration::from_micros(500)),
                }
            }
        }
    }
}

impl PageCache for KernelCache {
    fn prefetch(&mut self, range: &FileRange) -> Result<u64, WarmError> {
        // Residency from cachestat: a range already cached (read by the
        // service, or left by an earlier run) costs no I/O. Where cachestat
        // is refused the range is simply prefetched.
        let file = self.file(&range.path)?;
        if let Ok(stat) = sys::cachestat(file, range.offset, range.len) {
            let page = sys::page_size();
            let pages = range.len.div_ceil(page);
            if stat.cache >= pages {
                return Ok(0);
            }
        }
        self.place(range.target);
        match self.mechanism {
            Mechanism::Populate => {
                let file = self.file(&range.path)?;
                sys::populate_read(file, &range.path, range.offset, range.len)
            }
            Mechanism::Read => {
                use std::os::unix::fs::FileExt;
                let chunk = self.chunk as usize;
                if self.scratch.len() < chunk {
                    self.scratch = vec![0u8; chunk];
                }
                let mut scratch = std::mem::take(&mut self.scratch);
                let outcome = (|| {
                    let file = self.file(&range.path)?;
                    let mut at = range.offset;
                    while at < range.end() {
                        let n = (range.end() - at).min(chunk as u64) as usize;
                        match file.read_at(&mut scratch[..n], at) {
                            Ok(0) => break,
                            Ok(got) => at += got as u64,
                            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                            Err(e) => return Err(WarmError::io(&range.path)(e)),
                        }
                    }
                    Ok(at - range.offset)
                })();
                self.scratch = scratch;
                outcome
            }
            Mechanism::WillNeed => {
                let chunk = self.chunk;
                let mut at = range.offset;
                while at < range.end() {
                    let n = chunk.min(range.end() - at);
                    self.wait_for_window();
                    let file = self.file(&range.path)?;
                    sys::willneed(file, &range.path, at, n, chunk)?;
                    let last_page = (at + n - 1) / sys::page_size() * sys::page_size();
                    self.in_flight.push_back((range.path.clone(), last_page));
                    at += n;
                }
                Ok(range.len)
            }
        }
    }

    fn evict(&mut self, range: &FileRange) -> Result<(), WarmError> {
        let file = self.file(&range.path)?;
        sys::dontneed(file, &range.path, range.offset, range.len)?;
        for &pid in &self.readers {
            for (addr, len) in mapped_addresses(pid, &range.path, range.offset, range.len) {
                if let Err(err) = sys::pageout(pid, addr, len) {
                    tracing::debug!("pageout in pid {pid}: {err}");
                }
            }
        }
        Ok(())
    }

    fn memory(&mut self) -> Result<Memory, WarmError> {
        match &self.memory {
            MemorySource::Cgroup { cgroup, limit } => Ok(Memory {
                usage: cgroup.usage()?,
                limit: *limit,
            }),
            MemorySource::Pid(pid) => {
                let m = sys::memory_limit_for_pid(*pid)?;
                Ok(Memory {
                    usage: m.usage,
                    limit: m.limit,
                })
            }
        }
    }
}

/// The virtual addresses at which `pid` maps `[offset, offset + len)` of
/// `path`, from `/proc/PID/maps`; empty when it maps none of it (or exited).
pub fn mapped_addresses(pid: i32, path: &Path, offset: u64, len: u64) -> Vec<(u64, u64)> {
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return Vec::new();
    };
    parse_mapped(&maps, path, offset, len)
}

fn parse_mapped(maps: &str, path: &Path, offset: u64, len: u64) -> Vec<(u64, u64)> {
    let want = path.to_string_lossy();
    let end = offset.saturating_add(len);
    let mut out = Vec::new();
    for line in maps.lines() {
        // start-end perms offset dev inode path
        let mut fields = line.split_whitespace();
        let (Some(span), _, Some(file_off), _, _) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            continue;
        };
        let rest: Vec<&str> = fields.collect();
        if rest.join(" ") != want {
            continue;
        }
        let Some((a, b)) = span.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(stop), Ok(map_off)) = (
            u64::from_str_radix(a, 16),
            u64::from_str_radix(b, 16),
            u64::from_str_radix(file_off, 16),
        ) else {
            continue;
        };
        let map_end = map_off + (stop - start);
        let lo = offset.max(map_off);
        let hi = end.min(map_end);
        if lo < hi {
            out.push((start + (lo - map_off), hi - lo));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_ranges_translate_file_offsets_to_addresses() {
        let maps = "\
7f0000000000-7f0000400000 r--s 00000000 08:01 123 /m/a b.safetensors
7f0000800000-7f0000a00000 r--s 00200000 08:01 124 /m/c.safetensors
7f0000c00000-7f0000c01000 r-xp 00000000 08:01 9 /usr/lib/libc.so
garbage line
";
        let a = parse_mapped(maps, Path::new("/m/a b.safetensors"), 0x1000, 0x2000);
        assert_eq!(a, [(0x7f0000001000, 0x2000)]);
        // Mapping of c starts at file offset 2 MiB: bytes before it are not mapped.
        let c = parse_mapped(maps, Path::new("/m/c.safetensors"), 0x100000, 0x200000);
        assert_eq!(c, [(0x7f0000800000, 0x100000)]);
        assert!(parse_mapped(maps, Path::new("/m/none"), 0, 100).is_empty());
        assert!(mapped_addresses(i32::MAX, Path::new("/x"), 0, 1).is_empty());
    }

    #[test]
    fn mechanism_names_parse_and_bad_ones_are_named() {
        assert_eq!(
            "willneed".parse::<Mechanism>().unwrap(),
            Mechanism::WillNeed
        );
        let err = "mmap".parse::<Mechanism>().unwrap_err().to_string();
        assert!(err.contains("mmap") && err.contains("populate"), "{err}");
    }
}
