//! The cache manager: turns a policy's recommendations into page-cache work
//! the machine can take.
//!
//! - **Chunks.** Prefetches are cut into pieces no larger than the kernel's
//!   per-call readahead cap (`read_ahead_kb`, 8 MiB here): a larger WILLNEED
//!   is silently truncated.
//! - **Interruptible.** Each stream (a loader worker) has one queue. A new
//!   answer for a stream replaces that queue, so when the reader jumps ahead
//!   the stale remainder is dropped, never read.
//! - **No double work.** What was prefetched is remembered per file (until
//!   evicted), so re-planning from a reader position that prefetch already
//!   covered costs nothing.
//! - **Watermark.** Before each chunk the manager reads memory usage; over
//!   the watermark it asks the policy what to evict, evicts it, and pauses
//!   prefetch until usage falls back under.
//!
//! The manager is single-threaded and synchronous; the runtime drives it
//! from its event loop and loader threads. All I/O goes through
//! [`PageCache`], so tests drive it with a fake.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};

use crate::error::WarmError;
use crate::policy::{AccessEvent, FileRange, Guarded, PolicyContext, Prefetch};

/// Share of the memory limit above which prefetch pauses and the policy is
/// asked to evict. 0.8, seed 000's threshold: it leaves a fifth of the
/// limit for the service's own allocations and the reads in flight when it
/// is crossed, before the kernel starts reclaiming on its own.
pub const DEFAULT_WATERMARK: f64 = 0.8;

/// The page-cache operations the manager performs.
pub trait PageCache {
    /// Brings `range` into the page cache (placing it per its target);
    /// returns the bytes read.
    fn prefetch(&mut self, range: &FileRange) -> Result<u64, WarmError>;
    /// Drops `range` from the page cache.
    fn evict(&mut self, range: &FileRange) -> Result<(), WarmError>;
    /// Memory usage and limit of the service's cgroup (or the machine).
    fn memory(&mut self) -> Result<Memory, WarmError>;
    /// Prefetches that failed on loader threads since the last call (they
    /// were counted as prefetched when handed over; each is logged where it
    /// failed).
    fn take_errors(&mut self) -> u64 {
        0
    }
    /// `pid` reads the model: eviction also drops the pages it has mapped.
    /// The default ignores it.
    fn add_reader(&mut self, pid: i32) {
        let _ = pid;
    }
}

/// Memory usage against its limit, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Memory {
    pub usage: u64,
    pub limit: u64,
}

/// Manager knobs.
#[derive(Clone, Debug)]
pub struct ManagerConfig {
    /// Largest prefetch call: the device's `read_ahead_kb`. 8 MiB when
    /// unknown: the `read_ahead_kb` of this machine kind's virtio disk.
    pub chunk_bytes: u64,
    /// Share of the memory limit above which prefetch pauses and the policy
    /// is asked to evict: [`DEFAULT_WATERMARK`].
    pub watermark: f64,
    /// Memory usage is re-read after this many prefetched bytes (and while
    /// paused). 32 MiB: a few chunks past the watermark at most.
    pub memory_check_bytes: u64,
}

impl Default for ManagerConfig {
    fn default() -> ManagerConfig {
        ManagerConfig {
            chunk_bytes: 8 << 20,
            watermark: DEFAULT_WATERMARK,
            memory_check_bytes: 32 << 20,
        }
    }
}

/// What the manager did, for `sluice warm status` and the live summary.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub events: u64,
    /// Bytes prefetch asked the kernel to read (ranges already in the page
    /// cache cost nothing and do not count).
    pub prefetched_bytes: u64,
    /// Queued bytes, not yet prefetched, that a newer answer for their
    /// stream no longer asked for (the reader jumped past them).
    pub superseded_bytes: u64,
    /// Bytes skipped because they were already prefetched.
    pub skipped_bytes: u64,
    /// Bytes a policy asked for that are not the model's: ranges on other
    /// files, or past a file's end (cut off, never read or counted).
    pub refused_bytes: u64,
    pub evicted_bytes: u64,
    pub prefetch_errors: u64,
    pub evict_errors: u64,
    /// Times prefetch paused over the watermark.
    pub pauses: u64,
    /// The latest reader position seen, per path.
    pub last_reader: Option<(PathBuf, u64)>,
}

/// Per-stream prefetch queues.
#[derive(Default)]
struct Queues {
    streams: BTreeMap<u32, VecDeque<FileRange>>,
    /// The stream served last, for round robin.
    last: Option<u32>,
}

impl Queues {
    /// Replaces the queue of each stream `plan` names; returns what the old
    /// queues held that the new plan no longer asks for.
    fn submit(&mut self, plan: Vec<Prefetch>) -> Vec<FileRange> {
        let mut fresh: BTreeMap<u32, VecDeque<FileRange>> = BTreeMap::new();
        for p in plan {
            // A stream named with nothing left to fetch still replaces its queue.
            let queue = fresh.entry(p.stream).or_default();
            if p.range.len > 0 {
                queue.push_back(p.range);
            }
        }
        let mut dropped = Vec::new();
        for (stream, ranges) in fresh {
            let mut wanted: HashMap<&Path, Vec<(u64, u64)>> = HashMap::new();
            for r in &ranges {
                wanted.entry(&r.path).or_default().push((r.offset, r.end()));
            }
            let mut wanted: HashMap<PathBuf, Vec<(u64, u64)>> = wanted
                .into_iter()
                .map(|(p, mut v)| {
                    v.sort_unstable();
                    (p.to_path_buf(), v)
                })
                .collect();
            if let Some(old) = self.streams.insert(stream, ranges) {
                for r in old {
                    let keep = wanted.entry(r.path.clone()).or_default();
                    for (a, b) in subtract_sorted((r.offset, r.end()), keep) {
                        dropped.push(FileRange {
                            offset: a,
                            len: b - a,
                            ..r.clone()
                        });
                    }
                }
            }
        }
        dropped
    }

    /// The next piece of at most `chunk` bytes, streams served in turn.
    fn next(&mut self, chunk: u64) -> Option<FileRange> {
        self.streams.retain(|_, q| !q.is_empty());
        let stream = match self.last {
            Some(last) => self
                .streams
                .range(last + 1..)
                .next()
                .or_else(|| self.streams.iter().next())
                .map(|(s, _)| *s)?,
            None => *self.streams.keys().next()?,
        };
        self.last = Some(stream);
        let queue = self.streams.get_mut(&stream)?;
        let front = queue.front_mut()?;
        if front.len <= chunk {
            return queue.pop_front();
        }
        let piece = FileRange {
            len: chunk,
            ..front.clone()
        };
        front.offset += chunk;
        front.len -= chunk;
        Some(piece)
    }

    fn pending_bytes(&self) -> u64 {
        self.streams.values().flatten().map(|r| r.len).sum()
    }

    fn is_empty(&self) -> bool {
        self.streams.values().all(VecDeque::is_empty)
    }
}

/// `range` minus the sorted, possibly overlapping `holes`.
fn subtract_sorted(range: (u64, u64), holes: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let (mut at, end) = range;
    let first = holes.partition_point(|&(_, b)| b <= at);
    for &(a, b) in &holes[first..] {
        if a >= end {
            break;
        }
        if a > at {
            out.push((at, a));
        }
        at = at.max(b);
        if at >= end {
            break;
        }
    }
    if at < end {
        out.push((at, end));
    }
    out
}

/// Intervals of each file known to be in the page cache by our doing.
#[derive(Default)]
pub(crate) struct Resident {
    files: HashMap<PathBuf, Vec<(u64, u64)>>,
}

impl Resident {
    /// The parts of `range` not yet prefetched.
    fn missing(&self, range: &FileRange) -> Vec<(u64, u64)> {
        let have = self.files.get(&range.path).map_or(&[][..], Vec::as_slice);
        let mut out = Vec::new();
        let mut at = range.offset;
        let end = range.end();
        for &(a, b) in have {
            if b <= at {
                continue;
            }
            if a >= end {
                break;
            }
            if a > at {
                out.push((at, a));
            }
            at = at.max(b);
        }
        if at < end {
            out.push((at, end));
        }
        out
    }

    fn add(&mut self, path: &Path, a: u64, b: u64) {
        let v = self.files.entry(path.to_path_buf()).or_default();
        v.push((a, b));
        v.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(v.len());
        for &(x, y) in v.iter() {
            match merged.last_mut() {
                Some(last) if x <= last.1 => last.1 = last.1.max(y),
                _ => merged.push((x, y)),
            }
        }
        *v = merged;
    }

    fn remove(&mut self, range: &FileRange) {
        if let Some(v) = self.files.get_mut(&range.path) {
            let (a, b) = (range.offset, range.end());
            let mut out = Vec::with_capacity(v.len() + 1);
            for &(x, y) in v.iter() {
                if y <= a || x >= b {
                    out.push((x, y));
                    continue;
                }
                if x < a {
                    out.push((x, a));
                }
                if b < y {
                    out.push((b, y));
                }
            }
            *v = out;
        }
    }
}

/// A policy, its queues and the page cache it acts on.
pub struct Manager<C: PageCache> {
    policy: Guarded,
    cache: C,
    config: ManagerConfig,
    queues: Queues,
    resident: Resident,
    stats: Stats,
    paused: bool,
    /// Bytes prefetched since memory usage was last read.
    since_check: u64,
    /// The model's files and sizes (from [`Manager::start`]): what a plan
    /// may name, and where each range is cut.
    files: HashMap<PathBuf, u64>,
}

impl<C: PageCache> Manager<C> {
    pub fn new(policy: Guarded, cache: C, config: ManagerConfig) -> Manager<C> {
        Manager {
            policy,
            cache,
            config,
            queues: Queues::default(),
            resident: Resident::default(),
            stats: Stats::default(),
            paused: false,
            since_check: u64::MAX,
            files: HashMap::new(),
        }
    }

    /// Starts the policy; queues what it wants prefetched at once.
    pub fn start(&mut self, ctx: &PolicyContext) {
        self.files = ctx.files.iter().cloned().collect();
        let plan = self.policy.init(ctx);
        self.submit(plan);
    }

    /// `plan` with every range cut to its file (a policy may ask for
    /// `len = 2^63`), and ranges on files that are not the model's dropped:
    /// what a policy asks is a recommendation, never a licence to read other
    /// files or to count bytes that do not exist. Before `start` (no files
    /// known) the plan passes as it is.
    fn within_model(&mut self, plan: Vec<Prefetch>) -> Vec<Prefetch> {
        if self.files.is_empty() {
            return plan;
        }
        let mut kept = Vec::with_capacity(plan.len());
        for mut p in plan {
            let Some(&size) = self.files.get(&p.range.path) else {
                self.stats.refused_bytes = self.stats.refused_bytes.saturating_add(p.range.len);
                tracing::warn!(
                    "policy {}: prefetch of {} refused: not a model file",
                    self.policy.name(),
                    p.range.path.display()
                );
                continue;
            };
            let end = p.range.end().min(size);
            let len = end.saturating_sub(p.range.offset);
            self.stats.refused_bytes = self.stats.refused_bytes.saturating_add(p.range.len - len);
            p.range.len = len;
            kept.push(p);
        }
        kept
    }

    /// Whether the policy needs exact read ranges (pre-content events).
    pub fn needs_read_ranges(&self) -> bool {
        self.policy.needs_read_ranges()
    }

    /// Whether the service should wait for [`Manager::drain`] before it starts.
    pub fn wait_for_init(&self) -> bool {
        self.policy.wait_for_init()
    }

    /// Feeds one access to the policy and queues its answer.
    pub fn on_event(&mut self, event: &AccessEvent) {
        self.stats.events += 1;
        self.stats.last_reader = Some((event.path.clone(), event.offset + event.len));
        let plan = self.policy.on_access(event);
        self.submit(plan);
        // Same rule as the pump: memory is read while paused or after
        // `memory_check_bytes` of prefetch, not on every event.
        if self.paused || self.since_check >= self.config.memory_check_bytes {
            self.check_memory(Some(event));
        }
    }

    /// Queues a plan; what it drops from older plans and was not prefetched
    /// yet counts as superseded.
    fn submit(&mut self, plan: Vec<Prefetch>) {
        let plan = self.within_model(plan);
        // Queue only what is not prefetched yet: a re-plan from a reader
        // position inside prefetched data then costs one interval pass.
        let mut missing_plan = Vec::with_capacity(plan.len());
        for p in plan {
            let pieces = self.resident.missing(&p.range);
            let needed: u64 = pieces.iter().map(|(a, b)| b - a).sum();
            self.stats.skipped_bytes += p.range.len - needed;
            if pieces.is_empty() {
                missing_plan.push(Prefetch {
                    stream: p.stream,
                    range: FileRange {
                        len: 0,
                        ..p.range.clone()
                    },
                });
            }
            for (a, b) in pieces {
                missing_plan.push(Prefetch {
                    stream: p.stream,
                    range: FileRange {
                        offset: a,
                        len: b - a,
                        ..p.range.clone()
                    },
                });
            }
        }
        for r in self.queues.submit(missing_plan) {
            let missing: u64 = self.resident.missing(&r).iter().map(|(a, b)| b - a).sum();
            self.stats.superseded_bytes += missing;
        }
    }

    /// Periodic check: evicts when over the watermark.
    pub fn tick(&mut self) {
        self.check_memory(None);
    }

    /// Performs up to `max_chunks` prefetch pieces; returns how many ran.
    /// Stops early when over the watermark or out of work.
    pub fn pump(&mut self, max_chunks: usize) -> usize {
        self.stats.prefetch_errors += self.cache.take_errors();
        let mut done = 0;
        while done < max_chunks {
            // Nothing queued: no need to read memory usage (a no-op policy
            // must cost nothing).
            if self.queues.is_empty() {
                break;
            }
            // Reading memory usage parses cgroup files: do it when paused
            // (to resume) and after every `memory_check_bytes` prefetched.
            if (self.paused || self.since_check >= self.config.memory_check_bytes)
                && self.check_memory(None)
            {
                break;
            }
            if self.since_check >= self.config.memory_check_bytes {
                self.since_check = 0;
            }
            let Some(piece) = self.queues.next(self.config.chunk_bytes) else {
                break;
            };
            let missing = self.resident.missing(&piece);
            let needed: u64 = missing.iter().map(|(a, b)| b - a).sum();
            self.stats.skipped_bytes += piece.len - needed;
            for (a, b) in missing {
                let part = FileRange {
                    offset: a,
                    len: b - a,
                    ..piece.clone()
                };
                match self.cache.prefetch(&part) {
                    Ok(bytes) => {
                        self.stats.prefetched_bytes += bytes;
                        self.since_check += bytes;
                        self.resident.add(&part.path, a, b);
                    }
                    Err(err) => {
                        self.stats.prefetch_errors += 1;
                        tracing::warn!("prefetch {}: {err}", part.path.display());
                    }
                }
            }
            done += 1;
        }
        done
    }

    /// Runs every queued prefetch (for `precache`), pausing only for memory.
    pub fn drain(&mut self) {
        while self.pump(64) > 0 {}
    }

    /// Whether prefetch is paused over the watermark.
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Whether any prefetch is queued (cheaper than [`Manager::pending_bytes`]).
    pub fn has_pending(&self) -> bool {
        !self.queues.is_empty()
    }

    /// Queued prefetch bytes.
    pub fn pending_bytes(&self) -> u64 {
        self.queues.pending_bytes()
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    pub fn policy(&self) -> &Guarded {
        &self.policy
    }

    /// The run failed: the policy keeps nothing of it (see
    /// [`crate::policy::WarmPolicy::discard`]).
    pub fn discard(&mut self) {
        self.policy.discard();
    }

    pub fn cache(&self) -> &C {
        &self.cache
    }

    pub fn cache_mut(&mut self) -> &mut C {
        &mut self.cache
    }

    /// Stops the policy (templates are written here).
    pub fn stop(&mut self) {
        self.stats.prefetch_errors += self.cache.take_errors();
        self.policy.exit();
    }

    /// Returns whether memory is (still) over the watermark after evicting
    /// what the policy recommends.
    fn check_memory(&mut self, event: Option<&AccessEvent>) -> bool {
        let Ok(memory) = self.cache.memory() else {
            // Without a reading, prefetch goes on; the kernel still reclaims.
            return false;
        };
        if !self.over(memory) {
            self.paused = false;
            return false;
        }
        for range in self.policy.evict(event).into_iter().filter(|r| r.len > 0) {
            match self.cache.evict(&range) {
                Ok(()) => {
                    self.stats.evicted_bytes += range.len;
                    self.resident.remove(&range);
                }
                Err(err) => {
                    self.stats.evict_errors += 1;
                    tracing::warn!("evict {}: {err}", range.path.display());
                }
            }
        }
        let still = self.cache.memory().map(|m| self.over(m)).unwrap_or(false);
        if still && !self.paused {
            self.stats.pauses += 1;
        }
        self.paused = still;
        still
    }

    fn over(&self, memory: Memory) -> bool {
        memory.limit > 0 && memory.usage as f64 > self.config.watermark * memory.limit as f64
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::policy::{AccessKind, WarmPolicy};

    /// An in-memory page cache: what is resident per file, a memory limit
    /// that counts resident bytes plus a fixed base, and injectable faults.
    #[derive(Default)]
    pub struct FakeCache {
        pub resident: Resident,
        pub prefetches: Vec<FileRange>,
        pub evictions: Vec<FileRange>,
        pub base_usage: u64,
        pub limit: u64,
        pub fail_prefetch_on: Option<PathBuf>,
        pub fail_memory: bool,
        /// Failures a loader thread would report later.
        pub async_errors: u64,
    }

    impl FakeCache {
        pub fn resident_bytes(&self) -> u64 {
            self.resident
                .files
                .values()
                .flatten()
                .map(|(a, b)| b - a)
                .sum()
        }
    }

    impl PageCache for FakeCache {
        fn prefetch(&mut self, range: &FileRange) -> Result<u64, WarmError> {
            if self.fail_prefetch_on.as_ref() == Some(&range.path) {
                return Err(WarmError::Io {
                    path: range.path.clone(),
                    source: std::io::Error::from_raw_os_error(libc::EIO),
                });
            }
            self.prefetches.push(range.clone());
            self.resident.add(&range.path, range.offset, range.end());
            Ok(range.len)
        }

        fn evict(&mut self, range: &FileRange) -> Result<(), WarmError> {
            self.evictions.push(range.clone());
            self.resident.remove(range);
            Ok(())
        }

        fn memory(&mut self) -> Result<Memory, WarmError> {
            if self.fail_memory {
                return Err(WarmError::Unsupported {
                    feature: "memory reading",
                    reason: "injected by the test".into(),
                });
            }
            Ok(Memory {
                usage: self.base_usage + self.resident_bytes(),
                limit: self.limit,
            })
        }

        fn take_errors(&mut self) -> u64 {
            std::mem::take(&mut self.async_errors)
        }
    }

    /// Answers each access with "the rest of this 64-byte file", in stream 0,
    /// and evicts everything before the reader when asked.
    struct RestOfFile {
        reader: u64,
    }

    impl WarmPolicy for RestOfFile {
        fn name(&self) -> &str {
            "rest"
        }

        fn on_access(&mut self, e: &AccessEvent) -> Result<Vec<Prefetch>, WarmError> {
            self.reader = e.offset;
            Ok(vec![Prefetch {
                stream: 0,
                range: FileRange::new(&e.path, e.offset, 64 - e.offset),
            }])
        }

        fn evict(&mut self, _: Option<&AccessEvent>) -> Result<Vec<FileRange>, WarmError> {
            Ok(vec![FileRange::new("/m/a", 0, self.reader)])
        }
    }

    fn read(offset: u64) -> AccessEvent {
        AccessEvent {
            pid: 7,
            worker: None,
            path: "/m/a".into(),
            offset,
            len: 1,
            kind: AccessKind::Read,
        }
    }

    fn manager(cache: FakeCache) -> Manager<FakeCache> {
        let config = ManagerConfig {
            chunk_bytes: 8,
            watermark: DEFAULT_WATERMARK,
            memory_check_bytes: 0,
        };
        Manager::new(
            Guarded::new(Box::new(RestOfFile { reader: 0 })),
            cache,
            config,
        )
    }

    /// Asks for absurd ranges: 2^63 bytes of a model file, and another file.
    struct Greedy;

    impl WarmPolicy for Greedy {
        fn name(&self) -> &str {
            "greedy"
        }

        fn on_access(&mut self, event: &AccessEvent) -> Result<Vec<Prefetch>, WarmError> {
            Ok(vec![
                Prefetch {
                    stream: 0,
                    range: FileRange::new(&event.path, 10, 1 << 63),
                },
                Prefetch {
                    stream: 1,
                    range: FileRange::new("/etc/shadow", 0, 4096),
                },
            ])
        }
    }

    #[test]
    fn plans_are_cut_to_the_model_files_and_others_refused() {
        let mut m = Manager::new(
            Guarded::new(Box::new(Greedy)),
            FakeCache::default(),
            ManagerConfig {
                chunk_bytes: 8,
                ..ManagerConfig::default()
            },
        );
        m.start(&PolicyContext {
            model_dir: "/m".into(),
            files: vec![("/m/a".into(), 64)],
            memory_limited: false,
        });
        m.on_event(&read(0));
        m.drain();
        // 54 bytes of a (10..64), nothing of another file, and the rest counted as refused
        // (a policy's 2^63 used to be reported as prefetched).
        assert_eq!(m.stats().prefetched_bytes, 54);
        assert!(m
            .cache()
            .prefetches
            .iter()
            .all(|r| r.path == Path::new("/m/a")));
        assert_eq!(m.stats().refused_bytes, (1 << 63) - 54 + 4096);
    }

    #[test]
    fn prefetch_is_chunked_and_a_jump_supersedes_the_stale_remainder() {
        let mut m = manager(FakeCache::default());
        m.on_event(&read(0));
        assert_eq!(m.pending_bytes(), 64);
        assert_eq!(m.pump(2), 2);
        let done: Vec<(u64, u64)> = m
            .cache()
            .prefetches
            .iter()
            .map(|r| (r.offset, r.len))
            .collect();
        assert_eq!(
            done,
            [(0, 8), (8, 8)],
            "pieces of at most chunk_bytes, in order"
        );
        // The reader jumps to 40: 16..40 is never read.
        m.on_event(&read(40));
        assert_eq!(m.stats().superseded_bytes, 24, "16..40 is dropped unread");
        m.drain();
        let offsets: Vec<u64> = m.cache().prefetches.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, [0, 8, 40, 48, 56]);
        assert!(m.cache().prefetches.iter().all(|r| r.len <= 8));
    }

    #[test]
    fn replanning_over_prefetched_bytes_costs_nothing() {
        let mut m = manager(FakeCache::default());
        m.on_event(&read(0));
        m.drain();
        let before = m.cache().prefetches.len();
        m.on_event(&read(10));
        m.drain();
        assert_eq!(m.cache().prefetches.len(), before, "nothing read twice");
        assert_eq!(m.stats().skipped_bytes, 54);
        assert_eq!(m.stats().prefetched_bytes, 64);
    }

    #[test]
    fn over_the_watermark_the_policy_evicts_and_prefetch_pauses() {
        // Limit 40, watermark 0.8: over 32 bytes resident.
        let cache = FakeCache {
            limit: 40,
            ..FakeCache::default()
        };
        let mut m = manager(cache);
        m.on_event(&read(0));
        m.drain();
        // Resident 0..40 (five 8-byte pieces: 40 > 32 stops the pump).
        assert!(
            m.cache().resident_bytes() <= 40,
            "{}",
            m.cache().resident_bytes()
        );
        assert!(m.pending_bytes() > 0, "paused, not finished");
        // The reader reaches 24: eviction drops 0..24 and prefetch resumes.
        m.on_event(&read(24));
        m.drain();
        assert_eq!(m.cache().evictions[0], FileRange::new("/m/a", 0, 24));
        assert!(m.stats().pauses >= 1);
        assert_eq!(m.pending_bytes(), 0);
        assert!(m.cache().resident_bytes() <= 40);
    }

    #[test]
    fn io_faults_are_counted_and_do_not_stop_other_work() {
        let cache = FakeCache {
            fail_prefetch_on: Some("/m/a".into()),
            fail_memory: true,
            ..FakeCache::default()
        };
        let mut m = manager(cache);
        m.on_event(&read(0));
        m.drain();
        assert_eq!(m.stats().prefetch_errors, 8);
        assert_eq!(m.stats().prefetched_bytes, 0);
        assert_eq!(
            m.pending_bytes(),
            0,
            "failed pieces are dropped, not retried forever"
        );
    }

    #[test]
    fn failures_on_loader_threads_reach_the_stats() {
        let cache = FakeCache {
            async_errors: 2,
            ..FakeCache::default()
        };
        let mut m = manager(cache);
        m.on_event(&read(0));
        m.pump(1);
        assert_eq!(m.stats().prefetch_errors, 2);
        m.cache_mut().async_errors = 3;
        m.stop();
        assert_eq!(m.stats().prefetch_errors, 5, "counted at stop too");
    }

    #[test]
    fn resident_intervals_merge_and_split() {
        let mut r = Resident::default();
        let p = PathBuf::from("/f");
        r.add(&p, 10, 20);
        r.add(&p, 30, 40);
        r.add(&p, 18, 31);
        assert_eq!(r.files[&p], [(10, 40)]);
        r.remove(&FileRange::new("/f", 15, 5));
        assert_eq!(r.files[&p], [(10, 15), (20, 40)]);
        assert_eq!(
            r.missing(&FileRange::new("/f", 0, 50)),
            [(0, 10), (15, 20), (40, 50)]
        );
    }
}
