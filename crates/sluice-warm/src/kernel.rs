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
//! folios) but needs threads for depth. Which wins depends on the device
//! (what we measured is in docs/design/warm.md).
//!
//! **NUMA.** Folios land on the node of the thread that reads them in,
//! following its memory policy. On a machine with more than one node each
//! node a range targets gets its own loader thread, bound to the node's
//! memory and CPUs once at start: placement is then a property of the
//! thread, and nodes (each with its own PCIe root and often its own
//! drives) prefetch in parallel, each with its own bounded window.
//!
//! **Mapped pages.** DONTNEED skips pages a process has mapped, and
//! safetensors maps its files, so eviction also pages out the range from
//! each known reader's mapping (`process_madvise(MADV_PAGEOUT)`).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
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

/// One thread's prefetch state: its open files, its WILLNEED window and
/// the `read` mechanism's scratch buffer.
struct Loader {
    mechanism: Mechanism,
    chunk: u64,
    /// Most WILLNEED chunks in flight.
    window: usize,
    files: HashMap<PathBuf, File>,
    in_flight: VecDeque<(PathBuf, u64)>,
    scratch: Vec<u8>,
}

impl Loader {
    fn new(mechanism: Mechanism, chunk: u64, window: usize) -> Loader {
        Loader {
            mechanism,
            chunk,
            window,
            files: HashMap::new(),
            in_flight: VecDeque::new(),
            scratch: Vec::new(),
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

    /// Reads `range` into the page cache with this loader's mechanism;
    /// returns the bytes asked of the kernel.
    fn fetch(&mut self, range: &FileRange) -> Result<u64, WarmError> {
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
}

/// A loader thread working for one NUMA node: it sets its memory policy to
/// the node and runs on the node's CPUs once, at start, so every page it
/// reads in lands there. Its queue holds one chunk: with the loader's own
/// window that bounds what is committed per node, and a full queue holds
/// the sender back (backpressure).
struct Lane {
    jobs: Option<SyncSender<FileRange>>,
    thread: Option<JoinHandle<()>>,
}

impl Lane {
    fn spawn(
        node: u32,
        loader: Loader,
        errors: Arc<AtomicU64>,
        cancel: Arc<AtomicBool>,
    ) -> std::io::Result<Lane> {
        let (tx, rx) = sync_channel::<FileRange>(1);
        let thread = std::thread::Builder::new()
            .name(format!("sluice-prefetch-node{node}"))
            .spawn(move || {
                let mut loader = loader;
                if let Err(err) = sys::bind_thread_to_node(node) {
                    tracing::debug!("prefetch lane {node}: memory policy not set: {err}");
                }
                if let Err(err) = sys::pin_thread_to_node_cpus(node) {
                    tracing::debug!("prefetch lane {node}: not pinned: {err}");
                }
                for range in rx {
                    if cancel.load(Ordering::Relaxed) {
                        continue;
                    }
                    if let Err(err) = loader.fetch(&range) {
                        errors.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!("prefetch {} on node {node}: {err}", range.path.display());
                    }
                }
            })?;
        Ok(Lane {
            jobs: Some(tx),
            thread: Some(thread),
        })
    }
}

/// Page-cache operations on the running kernel.
///
/// Prefetch runs on the caller's thread, or, on a machine with more than
/// one NUMA node, on one loader thread per node a range targets (a
/// [`Lane`]), so placement is a property of the thread and nodes load in
/// parallel. Ranges with no target stay on the caller's thread.
pub struct KernelCache {
    mechanism: Mechanism,
    chunk: u64,
    window: usize,
    /// The caller's thread: untargeted ranges, one-node machines, and the
    /// file handles for residency and eviction.
    inline: Loader,
    lanes: BTreeMap<u32, Lane>,
    /// Use lanes even on one node (tests).
    force_lanes: bool,
    /// Lane failures not yet reported to the manager.
    lane_errors: Arc<AtomicU64>,
    /// Set on drop: lanes skip what is still queued.
    cancel: Arc<AtomicBool>,
    memory: MemorySource,
    numa: NumaMap,
    bound_node: Option<u32>,
    /// Processes whose mappings eviction pages out.
    readers: Vec<i32>,
    /// Model files that are symlinks → the file `/proc/PID/maps` names.
    real_names: HashMap<PathBuf, PathBuf>,
}

impl KernelCache {
    /// `chunk` is the per-call read size (the device's `read_ahead_kb`);
    /// `in_flight_bytes` bounds WILLNEED's queue per loader thread.
    pub fn new(
        mechanism: Mechanism,
        chunk: u64,
        in_flight_bytes: u64,
        memory: MemorySource,
        numa: NumaMap,
    ) -> KernelCache {
        let chunk = chunk.max(sys::page_size());
        let window = (in_flight_bytes / chunk).max(1) as usize;
        KernelCache {
            mechanism,
            chunk,
            window,
            inline: Loader::new(mechanism, chunk, window),
            lanes: BTreeMap::new(),
            force_lanes: false,
            lane_errors: Arc::new(AtomicU64::new(0)),
            cancel: Arc::new(AtomicBool::new(false)),
            memory,
            numa,
            bound_node: None,
            readers: Vec::new(),
            real_names: HashMap::new(),
        }
    }

    /// How the kernel names model files that are symlinks (model path →
    /// target), so eviction finds them in readers' mappings.
    pub fn set_real_names(&mut self, names: HashMap<PathBuf, PathBuf>) {
        self.real_names = names;
    }

    /// Prefetches targeted ranges on per-node loader threads even on a
    /// one-node machine (to exercise them in tests).
    pub fn force_lanes(&mut self) {
        self.force_lanes = true;
    }

    /// The nodes that have a loader thread.
    pub fn lane_nodes(&self) -> Vec<u32> {
        self.lanes.keys().copied().collect()
    }

    /// Eviction will also page the range out of this process's mappings.
    pub fn add_reader(&mut self, pid: i32) {
        if !self.readers.contains(&pid) {
            self.readers.push(pid);
        }
    }

    fn node_of(&self, target: Target) -> Option<u32> {
        match target {
            Target::Any => None,
            Target::NumaNode(n) => Some(n),
            Target::Accelerator(a) => self.numa.node_of(a),
        }
    }

    /// Binds the caller's thread for an inline prefetch (one-node machines:
    /// a no-op the kernel accepts).
    fn place(&mut self, node: Option<u32>) {
        let Some(node) = node else { return };
        if self.bound_node == Some(node) {
            return;
        }
        if let Err(err) = sys::bind_thread_to_node(node) {
            tracing::debug!("NUMA placement on node {node} skipped: {err}");
        }
        self.bound_node = Some(node);
    }

    /// The lane for `node`, started on first use; `None` when its thread
    /// cannot be started (logged; the caller prefetches inline).
    fn lane(&mut self, node: u32) -> Option<&SyncSender<FileRange>> {
        if !self.lanes.contains_key(&node) {
            let loader = Loader::new(self.mechanism, self.chunk, self.window);
            match Lane::spawn(node, loader, self.lane_errors.clone(), self.cancel.clone()) {
                Ok(lane) => {
                    self.lanes.insert(node, lane);
                }
                Err(err) => {
                    tracing::warn!("prefetch thread for node {node}: {err}; prefetching inline");
                    return None;
                }
            }
        }
        self.lanes.get(&node)?.jobs.as_ref()
    }
}

impl Drop for KernelCache {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
        for lane in self.lanes.values_mut() {
            lane.jobs = None;
        }
        for lane in self.lanes.values_mut() {
            if let Some(t) = lane.thread.take() {
                let _ = t.join();
            }
        }
    }
}

impl PageCache for KernelCache {
    fn prefetch(&mut self, range: &FileRange) -> Result<u64, WarmError> {
        // Residency from cachestat: a range already cached (read by the
        // service, or left by an earlier run) costs no I/O. Where cachestat
        // is refused the range is simply prefetched.
        let file = self.inline.file(&range.path)?;
        if let Ok(stat) = sys::cachestat(file, range.offset, range.len) {
            let page = sys::page_size();
            let pages = range.len.div_ceil(page);
            if stat.cache >= pages {
                return Ok(0);
            }
        }
        let node = self.node_of(range.target);
        if let Some(n) = node.filter(|_| self.force_lanes || self.numa.nodes() > 1) {
            if let Some(jobs) = self.lane(n) {
                // Blocks while the lane is a chunk behind: backpressure.
                if jobs.send(range.clone()).is_ok() {
                    return Ok(range.len);
                }
                tracing::warn!("prefetch thread for node {n} is gone; prefetching inline");
                self.lanes.remove(&n);
            }
        }
        self.place(node);
        self.inline.fetch(range)
    }

    fn take_errors(&mut self) -> u64 {
        self.lane_errors.swap(0, Ordering::Relaxed)
    }

    fn evict(&mut self, range: &FileRange) -> Result<(), WarmError> {
        let file = self.inline.file(&range.path)?;
        sys::dontneed(file, &range.path, range.offset, range.len)?;
        let shown = self.real_names.get(&range.path).unwrap_or(&range.path);
        for &pid in &self.readers {
            for (addr, len) in mapped_addresses(pid, shown, range.offset, range.len) {
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

    /// A synced file of `len` bytes dropped from the page cache, on disk.
    fn cold_file(dir: &Path, name: &str, len: usize) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, vec![7u8; len]).unwrap();
        let f = File::open(&path).unwrap();
        f.sync_all().unwrap();
        sys::dontneed(&f, &path, 0, u64::MAX).unwrap();
        path
    }

    fn lane_cache(mechanism: Mechanism) -> KernelCache {
        let mut cache = KernelCache::new(
            mechanism,
            1 << 20,
            2 << 20,
            MemorySource::Pid(std::process::id() as i32),
            NumaMap::from_spec("0:0,1:0").unwrap(),
        );
        cache.force_lanes();
        cache
    }

    /// Waits (at most 5 s) until all of `path` is cached.
    fn wait_cached(path: &Path) -> bool {
        let f = File::open(path).unwrap();
        let len = f.metadata().unwrap().len();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if sys::resident_bytes(&f, path, 0, 0).unwrap() >= len {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    #[test]
    fn targeted_ranges_load_on_their_nodes_thread_and_untargeted_inline() {
        let Some(dir) = sys::test_util::disk_tempdir() else {
            return;
        };
        for mechanism in [Mechanism::WillNeed, Mechanism::Read, Mechanism::Populate] {
            let a = cold_file(dir.path(), "a", 3 << 20);
            let b = cold_file(dir.path(), "b", 1 << 20);
            let mut cache = lane_cache(mechanism);
            let mut ra = FileRange::new(&a, 0, 3 << 20);
            ra.target = Target::Accelerator(1);
            assert_eq!(cache.prefetch(&ra).unwrap(), 3 << 20, "{mechanism:?}");
            assert_eq!(cache.lane_nodes(), [0], "accelerator 1 is on node 0");
            assert!(wait_cached(&a), "{mechanism:?}: the lane read a");
            // Untargeted: the caller's thread, no new lane.
            cache.prefetch(&FileRange::new(&b, 0, 1 << 20)).unwrap();
            assert!(wait_cached(&b), "{mechanism:?}");
            assert_eq!(cache.lane_nodes(), [0]);
            // Cached already: nothing handed to the lane.
            assert_eq!(cache.prefetch(&ra).unwrap(), 0);
            assert_eq!(cache.take_errors(), 0);
        }
    }

    #[test]
    fn a_lane_failure_is_counted_not_lost_and_one_node_machines_stay_inline() {
        let Some(dir) = sys::test_util::disk_tempdir() else {
            return;
        };
        let a = cold_file(dir.path(), "a", 2 << 20);
        let mut cache = lane_cache(Mechanism::Read);
        // The caller opened `a` (residency); the lane opens it by path after
        // it vanished: an asynchronous failure, reported by take_errors.
        let mut range = FileRange::new(&a, 0, 2 << 20);
        range.target = Target::NumaNode(0);
        cache.inline.file(&a).unwrap();
        std::fs::remove_file(&a).unwrap();
        assert_eq!(cache.prefetch(&range).unwrap(), 2 << 20);
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut errors = 0;
        while errors == 0 && Instant::now() < deadline {
            errors += cache.take_errors();
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(errors, 1);
        drop(cache); // joins the lane

        // Without forcing, a one-node map prefetches inline.
        let b = cold_file(dir.path(), "b", 1 << 20);
        let mut cache = KernelCache::new(
            Mechanism::WillNeed,
            1 << 20,
            2 << 20,
            MemorySource::Pid(std::process::id() as i32),
            NumaMap::from_spec("0:0").unwrap(),
        );
        let mut range = FileRange::new(&b, 0, 1 << 20);
        range.target = Target::Accelerator(0);
        cache.prefetch(&range).unwrap();
        assert!(cache.lane_nodes().is_empty());
        assert!(wait_cached(&b));
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
