//! The real [`PageCache`]: prefetch with MADV_POPULATE_READ, pread or
//! WILLNEED, evict with DONTNEED plus MADV_PAGEOUT on readers' mappings,
//! memory from the service's cgroup, NUMA placement per target.
//!
//! **Mechanism.** `populate` (the default) reads each chunk (≤
//! `read_ahead_kb`) synchronously into 2 MiB folios (see `sluice_engine::page_cache`),
//! which cost less CPU to build, evict faster (DONTNEED of 2 GiB: 5-20 ms
//! against 200-575 ms for 4 KiB folios) and map faster for mmap loaders;
//! depth comes from loader threads, one per chunk of the in-flight
//! window. `willneed` queues a
//! chunk and returns before the I/O completes, so one thread keeps the
//! device queue full; its window is bounded by probing the last page of
//! the oldest chunk with `preadv2(RWF_NOWAIT)` before submitting a new one.
//! Either way a jump of the reader takes effect within one window
//! (research notes: 32-64 MiB kept 75-95% of unbounded throughput). What
//! we measured is in docs/design/warm.md.
//!
//! **NUMA.** Folios land on the node of the thread that reads them in,
//! following its memory policy. On a machine with more than one node each
//! node a range targets gets its own loader threads, bound to the node's
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
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::WarmError;
use crate::manager::{Memory, PageCache};
use crate::page_size;
use crate::policy::{FileRange, Target};
use sluice_engine::cgroup::{self, Cgroup};
use sluice_engine::numa::{self, NumaMap};
use sluice_engine::page_cache;

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
    type Err = crate::error::WarmConfigError;

    fn from_str(s: &str) -> Result<Mechanism, Self::Err> {
        match s {
            "willneed" => Ok(Mechanism::WillNeed),
            "populate" => Ok(Mechanism::Populate),
            "read" => Ok(Mechanism::Read),
            other => Err(crate::error::WarmConfigError::Invalid {
                option: "mechanism",
                value: format!("{other:?}"),
                expected: "use populate, willneed or read",
            }),
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

/// One thread's prefetch state: its WILLNEED window and the `read`
/// mechanism's scratch buffer. Files are opened once, by [`KernelCache`],
/// and shared: a 160-shard model on 8 loader threads must not hold 1,280
/// descriptors (the default soft limit is 1,024).
struct PrefetchLoader {
    mechanism: Mechanism,
    chunk: u64,
    /// Most WILLNEED chunks in flight.
    window: usize,
    in_flight: VecDeque<(Arc<File>, u64)>,
    scratch: Vec<u8>,
}

impl PrefetchLoader {
    fn new(mechanism: Mechanism, chunk: u64, window: usize) -> PrefetchLoader {
        PrefetchLoader {
            mechanism,
            chunk,
            window,
            in_flight: VecDeque::new(),
            scratch: Vec::new(),
        }
    }

    /// Waits until the oldest chunk in flight is readable (at most 2 s, so a
    /// lost probe never stalls prefetch for good).
    fn wait_for_window(&mut self) {
        while self.in_flight.len() >= self.window {
            let Some((file, last_page)) = self.in_flight.pop_front() else {
                return;
            };
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                match page_cache::probe_ready(&file, last_page) {
                    Ok(true) | Err(_) => break,
                    Ok(false) => std::thread::sleep(Duration::from_micros(500)),
                }
            }
        }
    }

    /// Reads `range` of `file` into the page cache with this loader's
    /// mechanism; returns the bytes asked of the kernel.
    fn fetch(&mut self, file: &Arc<File>, range: &FileRange) -> Result<u64, WarmError> {
        match self.mechanism {
            Mechanism::Populate => Ok(page_cache::populate_read(
                file,
                &range.path,
                range.offset,
                range.len,
            )?),
            Mechanism::Read => {
                use std::os::unix::fs::FileExt;
                let chunk = self.chunk as usize;
                if self.scratch.len() < chunk {
                    self.scratch = vec![0u8; chunk];
                }
                let mut at = range.offset;
                while at < range.end() {
                    let n = (range.end() - at).min(chunk as u64) as usize;
                    match file.read_at(&mut self.scratch[..n], at) {
                        Ok(0) => break,
                        Ok(got) => at += got as u64,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(WarmError::io(&range.path)(e)),
                    }
                }
                Ok(at - range.offset)
            }
            Mechanism::WillNeed => {
                let chunk = self.chunk;
                let mut at = range.offset;
                while at < range.end() {
                    let n = chunk.min(range.end() - at);
                    self.wait_for_window();
                    page_cache::willneed(file, &range.path, at, n, chunk)?;
                    let last_page = (at + n - 1) / page_size() * page_size();
                    self.in_flight.push_back((file.clone(), last_page));
                    at += n;
                }
                Ok(range.len)
            }
        }
    }
}

/// Most loader threads per lane (a huge `--in-flight` asks for more).
const MAX_LANE_THREADS: usize = 32;

/// A chunk for a loader thread, with the file it is read from.
type Job = (Arc<File>, FileRange);

/// PrefetchLoader threads working for one NUMA node (or for none: a one-node
/// machine with a synchronous mechanism). Each sets its memory policy to
/// the node and runs on the node's CPUs once, at start, so every page it
/// reads in lands there. They share one queue; WILLNEED needs one thread
/// (it is asynchronous, its loader keeps a window in flight) and its queue
/// holds one chunk; `populate` and `read` are synchronous, so depth comes
/// from threads, and their queue holds one chunk too, staged while every
/// thread is busy: a thread that finishes takes it at once instead of
/// waiting for the runtime thread to be scheduled (on a busy 2-core
/// machine that hand-over gap cost a template replay 10% of its fill
/// rate). Either way a full lane holds the sender back (backpressure) and
/// what is committed stays within the window plus one chunk.
struct Lane {
    jobs: Option<SyncSender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl Lane {
    fn spawn(
        node: Option<u32>,
        loaders: Vec<PrefetchLoader>,
        queue: usize,
        errors: Arc<AtomicU64>,
        cancel: Arc<AtomicBool>,
    ) -> std::io::Result<Lane> {
        let (tx, rx) = sync_channel::<Job>(queue);
        let rx = Arc::new(Mutex::new(rx));
        let name = node.map_or("any".to_string(), |n| format!("node{n}"));
        let mut threads = Vec::new();
        for (k, loader) in loaders.into_iter().enumerate() {
            let (rx, errors, cancel) = (rx.clone(), errors.clone(), cancel.clone());
            let label = name.clone();
            let thread = std::thread::Builder::new()
                .name(format!("sluice-prefetch-{name}-{k}"))
                .spawn(move || lane_main(node, &label, loader, &rx, &errors, &cancel));
            match thread {
                Ok(t) => threads.push(t),
                // Some threads are better than none; with none, the caller
                // prefetches inline.
                Err(err) if threads.is_empty() => return Err(err),
                Err(err) => tracing::warn!("prefetch lane {name}: thread {k}: {err}"),
            }
        }
        Ok(Lane {
            jobs: Some(tx),
            threads,
        })
    }
}

fn lane_main(
    node: Option<u32>,
    name: &str,
    mut loader: PrefetchLoader,
    jobs: &Mutex<Receiver<Job>>,
    errors: &AtomicU64,
    cancel: &AtomicBool,
) {
    if let Some(node) = node {
        if let Err(err) = numa::bind_thread_to_node(node) {
            tracing::debug!("prefetch lane {node}: memory policy not set: {err}");
        }
        if let Err(err) = numa::pin_thread_to_node_cpus(node) {
            tracing::debug!("prefetch lane {node}: not pinned: {err}");
        }
    }
    loop {
        // The lock is held only while waiting for the next chunk.
        let next = match jobs.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok((file, range)) = next else { return };
        if cancel.load(Ordering::Relaxed) {
            continue;
        }
        if let Err(err) = loader.fetch(&file, &range) {
            errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("prefetch {} ({name}): {err}", range.path.display());
        }
    }
}

/// Page-cache operations on the running kernel.
///
/// WILLNEED prefetch runs on the caller's thread, or, on a machine with
/// more than one NUMA node, on a loader thread per node a range targets (a
/// [`Lane`]), so placement is a property of the thread and nodes load in
/// parallel. The synchronous mechanisms always run on lanes, with as many
/// threads per lane as the window has chunks.
pub struct KernelCache {
    /// The caller's thread (its mechanism, chunk and window are every
    /// loader's): WILLNEED on one-node machines and untargeted
    /// ranges.
    inline: PrefetchLoader,
    /// One descriptor per model file, shared by every loader thread.
    files: HashMap<PathBuf, Arc<File>>,
    /// By node (`None`: unbound, on a one-node machine).
    lanes: BTreeMap<Option<u32>, Lane>,
    /// Use lanes even on one node (tests).
    force_lanes: bool,
    /// Lane failures not yet reported to the manager.
    lane_errors: Arc<AtomicU64>,
    /// Set on drop: lanes skip what is still queued.
    cancel: Arc<AtomicBool>,
    memory: MemorySource,
    numa: NumaMap,
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
        let chunk = chunk.max(page_size());
        let window = (in_flight_bytes / chunk).max(1) as usize;
        KernelCache {
            inline: PrefetchLoader::new(mechanism, chunk, window),
            files: HashMap::new(),
            lanes: BTreeMap::new(),
            force_lanes: false,
            lane_errors: Arc::new(AtomicU64::new(0)),
            cancel: Arc::new(AtomicBool::new(false)),
            memory,
            numa,
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

    /// The nodes that have loader threads.
    pub fn lane_nodes(&self) -> Vec<u32> {
        self.lanes.keys().filter_map(|n| *n).collect()
    }

    /// PrefetchLoader threads running now, over all lanes.
    pub fn lane_threads(&self) -> usize {
        self.lanes.values().map(|l| l.threads.len()).sum()
    }

    /// The shared descriptor of `path`, opened on first use.
    fn file(&mut self, path: &Path) -> Result<Arc<File>, WarmError> {
        if let Some(f) = self.files.get(path) {
            return Ok(f.clone());
        }
        let f = Arc::new(File::open(path).map_err(WarmError::io(path))?);
        self.files.insert(path.to_path_buf(), f.clone());
        Ok(f)
    }

    fn node_of(&self, target: Target) -> Option<u32> {
        match target {
            Target::Any => None,
            Target::NumaNode(n) => Some(n),
            Target::Accelerator(a) => self.numa.node_of(a),
        }
    }

    /// The lane for `node`, started on first use; `None` when no thread
    /// can be started (logged; the caller prefetches inline).
    fn lane(&mut self, node: Option<u32>) -> Option<&SyncSender<Job>> {
        if !self.lanes.contains_key(&node) {
            let PrefetchLoader {
                mechanism,
                chunk,
                window,
                ..
            } = self.inline;
            let (threads, queue) = match mechanism {
                Mechanism::WillNeed => (1, 1),
                Mechanism::Populate | Mechanism::Read => (window.min(MAX_LANE_THREADS), 1),
            };
            let loaders = (0..threads)
                .map(|_| PrefetchLoader::new(mechanism, chunk, window))
                .collect();
            match Lane::spawn(
                node,
                loaders,
                queue,
                self.lane_errors.clone(),
                self.cancel.clone(),
            ) {
                Ok(lane) => {
                    self.lanes.insert(node, lane);
                }
                Err(err) => {
                    tracing::warn!("prefetch thread for {node:?}: {err}; prefetching inline");
                    return None;
                }
            }
        }
        self.lanes.get(&node)?.jobs.as_ref()
    }

    /// The lane a range goes to: `Some(node)` per target on a multi-node
    /// machine, `Some(None)` (unbound) for synchronous mechanisms
    /// otherwise, `None` for the caller's thread.
    fn route(&self, node: Option<u32>) -> Option<Option<u32>> {
        let numa = self.force_lanes || self.numa.nodes() > 1;
        match (numa, node, self.inline.mechanism) {
            (true, Some(n), _) => Some(Some(n)),
            (_, _, Mechanism::Populate | Mechanism::Read) => Some(None),
            _ => None,
        }
    }
}

impl Drop for KernelCache {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
        for lane in self.lanes.values_mut() {
            lane.jobs = None;
        }
        for lane in self.lanes.values_mut() {
            for t in lane.threads.drain(..) {
                let _ = t.join();
            }
        }
    }
}

impl PageCache for KernelCache {
    /// Eviction will also page the range out of this process's mappings.
    fn add_reader(&mut self, pid: i32) {
        if !self.readers.contains(&pid) {
            self.readers.push(pid);
        }
    }

    fn prefetch(&mut self, range: &FileRange) -> Result<u64, WarmError> {
        // Residency from cachestat: a range already cached (read by the
        // service, or left by an earlier run) costs no I/O. Where cachestat
        // is refused the range is simply prefetched.
        let file = self.file(&range.path)?;
        if let Ok(stat) = page_cache::cachestat(&file, range.offset, range.len) {
            let page = page_size();
            let pages = range.len.div_ceil(page);
            if stat.cache >= pages {
                return Ok(0);
            }
        }
        let node = self.node_of(range.target);
        if let Some(key) = self.route(node) {
            if let Some(jobs) = self.lane(key) {
                // Blocks while the lane is full: backpressure.
                if jobs.send((file.clone(), range.clone())).is_ok() {
                    return Ok(range.len);
                }
                tracing::warn!("prefetch threads for {key:?} are gone; prefetching inline");
                self.lanes.remove(&key);
            }
        }
        // Untargeted, or WILLNEED on one node: placement is moot.
        self.inline.fetch(&file, range)
    }

    fn take_errors(&mut self) -> u64 {
        self.lane_errors.swap(0, Ordering::Relaxed)
    }

    fn evict(&mut self, range: &FileRange) -> Result<(), WarmError> {
        let file = self.file(&range.path)?;
        page_cache::dontneed(&file, &range.path, range.offset, range.len)?;
        let shown = self.real_names.get(&range.path).unwrap_or(&range.path);
        for &pid in &self.readers {
            for (addr, len) in mapped_addresses(pid, shown, range.offset, range.len) {
                if let Err(err) = page_cache::pageout(pid, addr, len) {
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
                let m = cgroup::memory_limit_for_pid(*pid)?;
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
        page_cache::dontneed(&f, &path, 0, u64::MAX).unwrap();
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
            // mincore where the kernel has no cachestat (before 6.5).
            let cached = page_cache::resident_bytes(&f, path, 0, 0)
                .or_else(|_| page_cache::resident_bytes_mincore(&f, path, 0, 0));
            if cached.unwrap() >= len {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    #[test]
    fn targeted_ranges_load_on_their_nodes_thread_and_untargeted_inline() {
        let Some(dir) = sluice_testkit::disk_tempdir() else {
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
            // Cached already: nothing handed to the lane, where cachestat
            // (Linux 6.5+) tells; before, the range is simply read again.
            if page_cache::cachestat(&File::open(&a).unwrap(), 0, 1).is_ok() {
                assert_eq!(cache.prefetch(&ra).unwrap(), 0);
            }
            assert_eq!(cache.take_errors(), 0);
        }
    }

    /// The NUMA node of every page of `path`, which must be cached whole:
    /// move_pages(2) with no target nodes reports where each page is and
    /// moves nothing.
    fn page_nodes(path: &Path) -> Vec<i32> {
        let f = File::open(path).unwrap();
        let len = f.metadata().unwrap().len();
        // Mapping cached pages allocates nothing on this thread's node.
        let map = sluice_engine::page_cache::map_resident(&f, path, 0, len)
            .expect("mmap")
            .0;
        let page = page_size() as usize;
        let mut pages: Vec<*mut libc::c_void> = (0..len as usize)
            .step_by(page)
            // SAFETY: every offset is inside the mapping.
            .map(|at| unsafe { map.as_ptr().add(at) }.cast())
            .collect();
        let mut status = vec![i32::MIN; pages.len()];
        // SAFETY: pid 0 is this process; `pages` and `status` have the same
        // length, and a null node list asks for the status only.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_move_pages,
                0,
                pages.len(),
                pages.as_mut_ptr(),
                std::ptr::null::<i32>(),
                status.as_mut_ptr(),
                0,
            )
        };
        assert_eq!(rc, 0, "move_pages: {}", std::io::Error::last_os_error());
        status
    }

    /// Pages per node (or negative errno), for failure messages.
    fn by_node(nodes: &[i32]) -> BTreeMap<i32, usize> {
        let mut counts = BTreeMap::new();
        for &n in nodes {
            *counts.entry(n).or_insert(0) += 1;
        }
        counts
    }

    /// Needs two NUMA nodes: this machine has one, so it runs in a two-node
    /// VM (`scripts/numa-vm.sh`, docs/design/warm.md) and skips here.
    #[test]
    fn prefetched_pages_land_on_the_node_of_their_target() {
        if NumaMap::detect(None).nodes() < 2 {
            eprintln!("skipped: one NUMA node; scripts/numa-vm.sh runs this on two");
            return;
        }
        let Some(dir) = sluice_testkit::disk_tempdir() else {
            return;
        };
        for mechanism in [Mechanism::Populate, Mechanism::WillNeed, Mechanism::Read] {
            let a = cold_file(dir.path(), "a", 8 << 20);
            let b = cold_file(dir.path(), "b", 8 << 20);
            let mut cache = KernelCache::new(
                mechanism,
                1 << 20,
                2 << 20,
                MemorySource::Pid(std::process::id() as i32),
                NumaMap::from_spec("0:1,1:0").unwrap(),
            );
            let mut ra = FileRange::new(&a, 0, 8 << 20);
            ra.target = Target::Accelerator(0); // on node 1 by the map
            let mut rb = FileRange::new(&b, 0, 8 << 20);
            rb.target = Target::NumaNode(0);
            cache.prefetch(&ra).unwrap();
            cache.prefetch(&rb).unwrap();
            assert!(wait_cached(&a) && wait_cached(&b), "{mechanism:?}");
            assert_eq!(cache.lane_nodes(), [0, 1], "{mechanism:?}");
            assert_eq!(cache.take_errors(), 0, "{mechanism:?}");
            let (on_a, on_b) = (page_nodes(&a), page_nodes(&b));
            assert!(
                on_a.iter().all(|&n| n == 1) && on_b.iter().all(|&n| n == 0),
                "{mechanism:?}: a (accelerator 0, node 1) {:?}, b (node 0) {:?}",
                by_node(&on_a),
                by_node(&on_b)
            );
        }
    }

    #[test]
    fn a_lane_failure_is_counted_not_lost_and_one_node_machines_stay_inline() {
        let Some(dir) = sluice_testkit::disk_tempdir() else {
            return;
        };
        // A directory opens, but reading it fails on the loader thread: an
        // asynchronous failure, reported by take_errors.
        let mut cache = lane_cache(Mechanism::Read);
        let mut range = FileRange::new(dir.path(), 0, 2 << 20);
        range.target = Target::NumaNode(0);
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
    fn synchronous_mechanisms_get_a_thread_per_window_chunk_and_willneed_stays_inline() {
        let Some(dir) = sluice_testkit::disk_tempdir() else {
            return;
        };
        let one_node = |mechanism| {
            KernelCache::new(
                mechanism,
                1 << 20,
                3 << 20, // a window of 3 chunks
                MemorySource::Pid(std::process::id() as i32),
                NumaMap::from_spec("0:0").unwrap(),
            )
        };
        for mechanism in [Mechanism::Populate, Mechanism::Read] {
            let a = cold_file(dir.path(), "a", 6 << 20);
            let mut cache = one_node(mechanism);
            let mut handed = 0;
            for k in 0..6u64 {
                let mut piece = FileRange::new(&a, k << 20, 1 << 20);
                piece.target = Target::Accelerator(0);
                // A piece the kernel's readahead already brought in costs 0.
                handed += cache.prefetch(&piece).unwrap();
            }
            assert!(handed >= 1 << 20, "{mechanism:?}");
            assert_eq!(cache.lane_threads(), 3, "{mechanism:?}");
            assert_eq!(
                cache.files.len(),
                1,
                "one descriptor, shared by the threads"
            );
            assert!(cache.lane_nodes().is_empty(), "one node: threads unbound");
            assert!(wait_cached(&a), "{mechanism:?}");
            assert_eq!(cache.take_errors(), 0);
        }
        let b = cold_file(dir.path(), "b", 2 << 20);
        let mut cache = one_node(Mechanism::WillNeed);
        cache.prefetch(&FileRange::new(&b, 0, 2 << 20)).unwrap();
        assert_eq!(cache.lane_threads(), 0, "WILLNEED is asynchronous already");
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
