//! [`KvStore`]: the tiers, the policies and the engine-shaped API over them.
//!
//! - `lookup(keys)` answers from the indexes alone: how many keys, from the start of the
//!   chain, are resident in some tier. It leases what it found.
//! - `put_batch` offers each block to the DRAM policy (copying it into a slot when
//!   admitted) and, write-through, to the SSD policy (appending a record); a batch's SSD
//!   writes run in parallel and share one `fdatasync` per segment.
//! - `get_batch_into` serves each key from DRAM, else from SSD (verifying the record's key
//!   and checksum, promoting the block to DRAM), in parallel, then applies prefix
//!   semantics: after the first key that failed, every later key of the batch is a miss.
//!
//! Locks are held for bookkeeping only; copies and I/O run outside them. A background
//! thread reclaims SSD space between the watermarks, so puts rarely wait for it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sluice_engine::{BufferPool, BufferPoolConfig};
use sluice_formats::kv::MAX_KEY_BYTES;

use crate::config::{KvConfig, RecomputeModel, WriteMode};
use crate::dram_tier::DramTier;
use crate::error::KvError;
use crate::foreign::ForeignIndex;
use crate::io_path::{self, GetTiers};
use crate::jobs::{JobBuffer, JobKind, JobQueue, KvJob};
use crate::lower::{Lower, RecordLoc};
use crate::manifest::{self, StoreLock};
use crate::namespace::{fp_map, Fingerprint, FpMap, Namespace};
use crate::reclaimer::{Reclaimer, Tended};
use crate::segment_io::{FsSegmentDir, SegmentDir};
use crate::ssd_tier::{SsdLoc, SsdTier};
use crate::stats::{Counters, KvStats};

/// A lease taken by `lookup`: what the later get may read even if the block is evicted.
pub(crate) struct Lease {
    pub dram_slot: Option<u32>,
    /// The record in a lower tier, when DRAM does not hold the block.
    pub lower: Option<RecordLoc>,
    pub count: u32,
    pub expires: Instant,
}

pub(crate) struct Inner {
    pub config: KvConfig,
    pub root: PathBuf,
    pub dram: Option<Mutex<DramTier>>,
    /// Shared with the reclaim thread (which holds nothing else of the store).
    pub ssd: Option<Arc<Mutex<SsdTier>>>,
    /// This store's own segments in the shared directory.
    pub shared: Option<Arc<Mutex<SsdTier>>>,
    /// Other stores' segments in the shared directory.
    pub foreign: Option<Arc<Mutex<ForeignIndex>>>,
    pub leases: Mutex<FpMap<Lease>>,
    /// Write-back: blocks DRAM evicted whose SSD copy is not published yet. Entered under
    /// the DRAM lock in the same step as the eviction, left after the SSD publish, so a
    /// get that checks DRAM, then this, then SSD always finds such a block.
    pub demoting: Mutex<FpMap<Arc<crate::dram_tier::Demoted>>>,
    pub counters: Counters,
    /// Aligned staging for SSD records (writes, unaligned reads, record headers): one slot
    /// per I/O thread, reused, so the data path maps no memory per block.
    pub staging: BufferPool,
    pub closed: AtomicBool,
    reclaimer: Option<Reclaimer>,
    owner_lock: Mutex<Option<StoreLock>>,
    pub jobs: Arc<JobQueue>,
    /// Measured seconds per block served from each tier, for `lookup_worth_loading`.
    pub load_model: Mutex<LoadModel>,
}

/// Seconds per block a get spends on each tier: moving averages of what gets measured,
/// starting from conservative guesses (DRAM at 4 GB/s, SSD at 0.5 GB/s) until the first
/// gets of each tier are timed.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct LoadModel {
    pub dram_block_s: f64,
    pub ssd_block_s: f64,
    pub shared_block_s: f64,
}

impl LoadModel {
    /// Weight of a new measurement in the moving averages.
    const ALPHA: f64 = 0.25;

    fn new(block_bytes: u64) -> LoadModel {
        LoadModel {
            dram_block_s: block_bytes as f64 / 4e9,
            ssd_block_s: block_bytes as f64 / 0.5e9,
            // A network file system, until measured.
            shared_block_s: block_bytes as f64 / 0.1e9,
        }
    }

    /// A get batch served `tiers` in `elapsed`. A batch with SSD hits is charged to SSD
    /// (its reads dominate), one with only DRAM hits to DRAM. Per block, amortized over
    /// the batch's parallel reads: what a prefix of that many blocks costs to load.
    fn record(&mut self, tiers: &GetTiers, elapsed: Duration) {
        let t = elapsed.as_secs_f64();
        let ewma = |old: f64, new: f64| old + Self::ALPHA * (new - old);
        if tiers.shared > 0 {
            self.shared_block_s = ewma(self.shared_block_s, t / tiers.shared as f64);
        } else if tiers.ssd > 0 {
            self.ssd_block_s = ewma(self.ssd_block_s, t / tiers.ssd as f64);
        } else if tiers.dram > 0 {
            self.dram_block_s = ewma(self.dram_block_s, t / tiers.dram as f64);
        }
    }
}

/// An open KV block store, seen through one namespace. Cheap to clone; every clone is
/// the same store. [`KvStore::with_namespace`] gives a handle on the same tiers for another
/// namespace (a sidecar serves every client's namespace from one store).
#[derive(Clone)]
pub struct KvStore {
    pub(crate) inner: Arc<Inner>,
    /// The digest of this handle's namespace: in every fingerprint and record it writes,
    /// compared on every read.
    pub(crate) namespace_id: [u8; 16],
    /// The engine's prefill model, for [`KvStore::lookup_worth_loading`].
    recompute: Option<RecomputeModel>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl KvStore {
    /// Opens (or creates) the store at `root`, recovering the SSD tier's blocks.
    pub fn open(root: &Path, config: KvConfig) -> Result<KvStore, KvError> {
        let dir = FsSegmentDir::new(&root.join("segments"), config.direct)
            .with_io_uring(config.use_io_uring()?);
        Self::open_with_dir(root, config, Arc::new(dir))
    }

    /// Opens a store over any segment directory (tests pass a fault-injecting one).
    pub fn open_with_dir(
        root: &Path,
        config: KvConfig,
        dir: Arc<dyn SegmentDir>,
    ) -> Result<KvStore, KvError> {
        config.validate()?;
        let manifest = manifest::open_or_create(root, config.block_bytes)?;
        let owner = manifest::lock(root)?;
        let seg_root = root.join("segments");
        std::fs::create_dir_all(&seg_root).map_err(KvError::io(&seg_root))?;
        let store_id = manifest
            .store_id_bytes()
            .expect("read() checked the store id");
        let dram = match config.dram_bytes {
            0 => None,
            b => Some(Mutex::new(DramTier::new(
                b,
                config.block_bytes,
                &config.dram_policy,
            )?)),
        };
        let ssd = match config.ssd_bytes {
            0 => None,
            _ => Some(Arc::new(Mutex::new(SsdTier::open(
                dir, seg_root, store_id, &config,
            )?))),
        };
        let (shared, foreign) = crate::lower::open_shared(&config, store_id)?;
        let load_model = LoadModel::new(config.block_bytes);
        let staging = BufferPool::new(BufferPoolConfig::bounded(
            config.io_threads as u64 * config.slot_bytes(),
        ));
        let tended = Tended {
            tiers: ssd.iter().chain(shared.iter()).cloned().collect(),
            shared: shared.clone(),
            foreign: foreign.clone(),
            refresh: Duration::from_millis(config.shared_refresh_ms),
        };
        let reclaimer = match tended.tiers.is_empty() && tended.foreign.is_none() {
            true => None,
            false => Some(Reclaimer::start(tended).map_err(KvError::io(root))?),
        };
        let inner = Arc::new(Inner {
            config,
            root: root.to_path_buf(),
            dram,
            ssd,
            shared,
            foreign,
            leases: Mutex::new(fp_map(0)),
            demoting: Mutex::new(fp_map(0)),
            counters: Counters::default(),
            staging,
            closed: AtomicBool::new(false),
            reclaimer,
            owner_lock: Mutex::new(Some(owner)),
            jobs: Arc::new(JobQueue::default()),
            load_model: Mutex::new(load_model),
        });
        let namespace_id = inner.config.namespace.id();
        let recompute = inner.config.recompute;
        Ok(KvStore {
            inner,
            namespace_id,
            recompute,
        })
    }

    /// A handle on the same store and tiers for `namespace`, with the engine's prefill
    /// model for [`KvStore::lookup_worth_loading`]. Blocks of different namespaces never
    /// see each other; budgets and policies are shared.
    pub fn with_namespace(
        &self,
        namespace: &Namespace,
        recompute: Option<RecomputeModel>,
    ) -> KvStore {
        KvStore {
            inner: Arc::clone(&self.inner),
            namespace_id: namespace.id(),
            recompute,
        }
    }

    pub fn config(&self) -> &KvConfig {
        &self.inner.config
    }

    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    pub(crate) fn check_open(&self) -> Result<(), KvError> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(KvError::Closed);
        }
        Ok(())
    }

    /// Checks every key of a batch against the store's rules.
    fn check_keys(&self, keys: &[&[u8]]) -> Result<(), KvError> {
        check_keys(keys, self.inner.config.key_bytes)
    }

    fn check_buffers(&self, keys: usize, lens: &[usize]) -> Result<(), KvError> {
        check_buffers(keys, lens, self.inner.config.block_bytes)
    }

    pub(crate) fn fingerprint(&self, key: &[u8]) -> Fingerprint {
        Fingerprint::of(&self.namespace_id, key)
    }

    /// The number of keys, from the first, resident in some tier. No I/O. With `lease`,
    /// the blocks found stay readable (not reused, not torn) until a get of them finishes
    /// or `lease_timeout_ms` passes.
    pub fn lookup(&self, keys: &[&[u8]], lease: bool) -> Result<usize, KvError> {
        self.check_open()?;
        self.check_keys(keys)?;
        self.expire_leases();
        self.inner.counters.lookups.fetch_add(1, Ordering::Relaxed);
        if lease {
            return Ok(self.lease_prefix(keys));
        }
        // Without leases: hash first, then hold each tier's lock once for the whole chain.
        let fps: Vec<Fingerprint> = keys.iter().map(|k| self.fingerprint(k)).collect();
        let tiers = self.residency();
        Ok(fps.iter().take_while(|fp| tiers.contains(**fp)).count())
    }

    /// Leases `keys` from the first until one is found in no tier; returns how many. The
    /// chain is hashed first, then the lease table and each tier are locked once for all
    /// of it (in the store's lock order: leases, DRAM, SSD).
    fn lease_prefix(&self, keys: &[&[u8]]) -> usize {
        let inner = &self.inner;
        let fps: Vec<Fingerprint> = keys.iter().map(|k| self.fingerprint(k)).collect();
        let expires = Instant::now() + Duration::from_millis(inner.config.lease_timeout_ms);
        let mut leases = lock(&inner.leases);
        let mut dram = inner.dram.as_ref().map(lock);
        let ssd = inner.ssd.as_deref().map(lock);
        let shared = inner.shared.as_deref().map(lock);
        let mut foreign = inner.foreign.as_deref().map(lock);
        let mut n = 0;
        for (fp, key) in fps.into_iter().zip(keys) {
            if let Some(l) = leases.get_mut(&fp) {
                l.count += 1;
                l.expires = expires;
                n += 1;
                continue;
            }
            let dram_slot = dram
                .as_mut()
                .and_then(|d| d.pin(fp, &self.namespace_id, key));
            let lower = match dram_slot {
                Some(_) => None,
                None => {
                    let at = |tier, t: Option<(SsdLoc, _)>| {
                        t.map(|(loc, file)| RecordLoc { tier, loc, file })
                    };
                    at(Lower::Ssd, ssd.as_ref().and_then(|s| s.locate(fp)))
                        .or_else(|| at(Lower::Shared, shared.as_ref().and_then(|s| s.locate(fp))))
                        .or_else(|| {
                            let (slot, file) = foreign.as_mut()?.locate(fp)?;
                            at(Lower::Foreign, Some((SsdLoc { segment: 0, slot }, file)))
                        })
                }
            };
            if dram_slot.is_none() && lower.is_none() {
                break;
            }
            let lease = Lease {
                dram_slot,
                lower,
                count: 1,
                expires,
            };
            leases.insert(fp, lease);
            n += 1;
        }
        n
    }

    /// Every tier's index, locked (DRAM first) for a run of residency checks.
    pub(crate) fn residency(&self) -> Residency<'_> {
        let inner = &self.inner;
        Residency {
            dram: inner.dram.as_ref().map(lock),
            ssd: inner.ssd.as_deref().map(lock),
            shared: inner.shared.as_deref().map(lock),
            foreign: inner.foreign.as_deref().map(lock),
        }
    }

    /// Like [`KvStore::lookup`], but only the prefix that loads sooner than the engine
    /// would recompute it (the handle's recompute model): the load is estimated per block from the
    /// tier each block is in and the seconds per block gets measured on that tier, the
    /// recompute from the prefill rate. The answer is the longest such prefix, so a hit
    /// slower than recomputing is reported as a miss. Only that prefix is leased.
    pub fn lookup_worth_loading(&self, keys: &[&[u8]], lease: bool) -> Result<usize, KvError> {
        self.check_open()?;
        self.check_keys(keys)?;
        let Some(model) = self.recompute else {
            return Err(KvError::arg(
                "lookup_worth_loading",
                "the store was opened without a recompute model (recompute_tokens_per_s)",
            ));
        };
        self.expire_leases();
        self.inner.counters.lookups.fetch_add(1, Ordering::Relaxed);
        let load = *lock(&self.inner.load_model);
        let recompute_block_s = model.block_tokens as f64 / model.tokens_per_s;
        let fps: Vec<Fingerprint> = keys.iter().map(|k| self.fingerprint(k)).collect();
        let (mut load_s, mut best) = (0.0, 0);
        let tiers = self.residency();
        for (i, fp) in fps.iter().enumerate() {
            load_s += match tiers.tier_of(*fp) {
                Some(Tier::Dram) => load.dram_block_s,
                Some(Tier::Ssd) => load.ssd_block_s,
                Some(Tier::Shared) => load.shared_block_s,
                None => break,
            };
            if load_s < (i + 1) as f64 * recompute_block_s {
                best = i + 1;
            }
        }
        drop(tiers);
        Ok(match lease {
            true => self.lease_prefix(&keys[..best]),
            false => best,
        })
    }

    /// A get batch's timing, for the load model.
    pub(crate) fn record_load(&self, tiers: &GetTiers, elapsed: Duration) {
        lock(&self.inner.load_model).record(tiers, elapsed);
    }

    /// Releases one lease count of `fp` (after its get).
    pub(crate) fn release_lease(&self, fp: Fingerprint) {
        let mut leases = lock(&self.inner.leases);
        let Some(l) = leases.get_mut(&fp) else { return };
        l.count = l.count.saturating_sub(1);
        if l.count == 0 {
            let l = leases.remove(&fp).expect("just found");
            self.unpin_lease(l);
        }
    }

    /// Ends every lease past its timeout (once per call, not per key).
    fn expire_leases(&self) {
        let now = Instant::now();
        let mut leases = lock(&self.inner.leases);
        let expired: Vec<Fingerprint> = leases
            .iter()
            .filter(|(_, l)| l.expires <= now)
            .map(|(fp, _)| *fp)
            .collect();
        for fp in expired {
            if let Some(l) = leases.remove(&fp) {
                self.unpin_lease(l);
            }
        }
    }

    fn unpin_lease(&self, lease: Lease) {
        if let (Some(slot), Some(d)) = (lease.dram_slot, self.inner.dram.as_ref()) {
            lock(d).unpin(slot);
        }
    }

    /// Stores blocks. `true` for a key means the block is in the store now (written, or
    /// already there); `false` that no tier took it (the policy declined, or I/O failed).
    pub fn put_batch(&self, keys: &[&[u8]], blocks: &[&[u8]]) -> Result<Vec<bool>, KvError> {
        self.check_batch(keys, blocks.iter().map(|b| b.len()))?;
        Ok(self.run_put(keys, blocks))
    }

    /// Loads blocks into `bufs`. `true` for key `i` means `bufs[i]` holds exactly the bytes
    /// stored under it; after the first `false`, every later key is `false` too (prefix
    /// semantics) and its buffer's contents are unspecified.
    pub fn get_batch_into(
        &self,
        keys: &[&[u8]],
        bufs: &mut [&mut [u8]],
    ) -> Result<Vec<bool>, KvError> {
        self.check_batch(keys, bufs.iter().map(|b| b.len()))?;
        Ok(self.run_get(keys, bufs))
    }

    /// What every batch call checks before it runs: the store is open, the keys and the
    /// buffers (one per key, each a block long) are valid.
    fn check_batch(
        &self,
        keys: &[&[u8]],
        lens: impl Iterator<Item = usize>,
    ) -> Result<(), KvError> {
        self.check_open()?;
        self.check_keys(keys)?;
        let lens: Vec<usize> = lens.collect();
        self.check_buffers(keys.len(), &lens)
    }

    /// A put of a checked batch (blocking, or a job's: `close` waits for queued jobs, so
    /// they run even once the store is closing).
    pub(crate) fn run_put(&self, keys: &[&[u8]], blocks: &[&[u8]]) -> Vec<bool> {
        self.expire_leases();
        let out = io_path::put_batch(self, keys, blocks);
        self.wake_reclaimer();
        out
    }

    /// A get of a checked batch.
    pub(crate) fn run_get(&self, keys: &[&[u8]], bufs: &mut [&mut [u8]]) -> Vec<bool> {
        self.expire_leases();
        io_path::get_batch(self, keys, bufs).0
    }

    /// Queues a put batch and returns at once; see [`crate::jobs`]. Keys and buffers are
    /// checked now (errors here, not in the job).
    pub fn submit_put(
        &self,
        keys: Vec<Vec<u8>>,
        blocks: Vec<Box<dyn JobBuffer>>,
    ) -> Result<KvJob, KvError> {
        self.submit(JobKind::Put, keys, blocks)
    }

    /// Queues a get batch into `bufs` and returns at once. When the job is done, its
    /// result has the semantics of [`KvStore::get_batch_into`] and
    /// [`KvJob::take_buffers`] returns the filled buffers.
    pub fn submit_get(
        &self,
        keys: Vec<Vec<u8>>,
        bufs: Vec<Box<dyn JobBuffer>>,
    ) -> Result<KvJob, KvError> {
        self.submit(JobKind::Get, keys, bufs)
    }

    fn submit(
        &self,
        kind: JobKind,
        keys: Vec<Vec<u8>>,
        bufs: Vec<Box<dyn JobBuffer>>,
    ) -> Result<KvJob, KvError> {
        let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
        self.check_batch(&refs, bufs.iter().map(|b| b.bytes().len()))?;
        let n = keys.len();
        let work = crate::jobs::batch_work(self.clone(), kind, keys);
        self.inner
            .jobs
            .submit(kind, n, bufs, work)
            .ok_or(KvError::Closed)
    }

    /// Finished jobs not reported yet (by an earlier `poll` or a `wait`), each once.
    pub fn poll(&self) -> Vec<KvJob> {
        self.inner.jobs.poll()
    }

    /// Makes every acknowledged put durable: syncs the segments (`durability = none`) and,
    /// in write-back, first writes every block only DRAM holds to the SSD tier (a block
    /// the SSD policy declines stays only in DRAM; a warning counts them).
    pub fn sync(&self) -> Result<(), KvError> {
        self.check_open()?;
        self.flush_and_sync()
    }

    fn flush_and_sync(&self) -> Result<(), KvError> {
        let declined = io_path::flush_dram(self);
        if declined > 0 {
            tracing::warn!(
                "kv sync: the SSD policy declined {declined} block(s) only DRAM holds; they are not durable"
            );
        }
        self.inner.sync_segments()
    }

    pub fn stats(&self) -> KvStats {
        KvStats::collect(&self.inner)
    }

    /// Syncs (in write-back, writing DRAM-only blocks to SSD first, as [`KvStore::sync`]),
    /// stops the reclaimer and releases the store's lock once the last clone and job are
    /// gone. Later calls fail with [`KvError::Closed`].
    pub fn close(&self) -> Result<(), KvError> {
        self.inner.jobs.drain();
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        // No reclaim pass may run once the lock is released to the next owner.
        if let Some(r) = &self.inner.reclaimer {
            r.stop();
        }
        let synced = self.flush_and_sync();
        lock(&self.inner.owner_lock).take();
        synced
    }

    fn wake_reclaimer(&self) {
        let inner = &self.inner;
        let Some(r) = &inner.reclaimer else {
            return;
        };
        let mut tiers = inner.ssd.iter().chain(inner.shared.iter());
        if tiers.any(|s| lock(s).needs_reclaim()) {
            r.wake();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.jobs.shutdown();
        if let Some(r) = &self.reclaimer {
            r.stop();
        }
        let _ = self.sync_segments();
    }
}

impl Inner {
    /// Syncs every segment tier's unsealed segments.
    fn sync_segments(&self) -> Result<(), KvError> {
        for t in self.ssd.iter().chain(self.shared.iter()) {
            let t = lock(t);
            t.sync_all().map_err(KvError::io(t.root()))?;
        }
        Ok(())
    }
}

/// Checks every key of a batch: 1 to `MAX_KEY_BYTES` bytes, and exactly `key_bytes` when
/// the store fixes it. Shared by the store and its sidecar clients.
pub(crate) fn check_keys(keys: &[&[u8]], key_bytes: Option<usize>) -> Result<(), KvError> {
    for (i, key) in keys.iter().enumerate() {
        let what = || format!("key {i}");
        if key.is_empty() || key.len() > MAX_KEY_BYTES {
            return Err(KvError::arg(
                what(),
                format!(
                    "{} bytes, but keys are 1 to {MAX_KEY_BYTES} bytes",
                    key.len()
                ),
            ));
        }
        if let Some(k) = key_bytes.filter(|k| key.len() != *k) {
            return Err(KvError::arg(
                what(),
                format!("{} bytes, but this store's keys are {k} bytes", key.len()),
            ));
        }
    }
    Ok(())
}

/// Checks a batch's buffers: one per key, each exactly a block long.
pub(crate) fn check_buffers(keys: usize, lens: &[usize], block_bytes: u64) -> Result<(), KvError> {
    if keys != lens.len() {
        return Err(KvError::arg(
            "batch",
            format!("{keys} keys but {} buffers", lens.len()),
        ));
    }
    let want = block_bytes as usize;
    if let Some((i, len)) = lens.iter().enumerate().find(|(_, l)| **l != want) {
        return Err(KvError::arg(
            format!("buffer {i}"),
            format!("{len} bytes, but this store's blocks are {want} bytes"),
        ));
    }
    Ok(())
}

impl crate::jobs::BatchRunner for KvStore {
    fn run_put(&self, keys: &[&[u8]], blocks: &[&[u8]]) -> Vec<bool> {
        KvStore::run_put(self, keys, blocks)
    }
    fn run_get(&self, keys: &[&[u8]], bufs: &mut [&mut [u8]]) -> Vec<bool> {
        KvStore::run_get(self, keys, bufs)
    }
}

/// Counter helper.
pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Which tier holds a block.
enum Tier {
    Dram,
    Ssd,
    /// The shared directory: our segments there, or another store's.
    Shared,
}

/// Every tier's lock, held for a run of residency checks (see [`KvStore::residency`]).
pub(crate) struct Residency<'a> {
    dram: Option<MutexGuard<'a, DramTier>>,
    ssd: Option<MutexGuard<'a, SsdTier>>,
    shared: Option<MutexGuard<'a, SsdTier>>,
    foreign: Option<MutexGuard<'a, ForeignIndex>>,
}

impl Residency<'_> {
    fn tier_of(&self, fp: Fingerprint) -> Option<Tier> {
        if self.dram.as_ref().is_some_and(|d| d.contains(fp)) {
            return Some(Tier::Dram);
        }
        if self.ssd.as_ref().is_some_and(|s| s.contains(fp)) {
            return Some(Tier::Ssd);
        }
        let shared = self.shared.as_ref().is_some_and(|s| s.contains(fp));
        if shared || self.foreign.as_ref().is_some_and(|f| f.contains(fp)) {
            return Some(Tier::Shared);
        }
        None
    }

    pub(crate) fn contains(&self, fp: Fingerprint) -> bool {
        self.tier_of(fp).is_some()
    }

    /// Whether one of this store's segment tiers (the SSD, our shared segments) holds a
    /// record of `fp`.
    pub(crate) fn in_segment_tier(&self, fp: Fingerprint) -> bool {
        self.ssd.as_ref().is_some_and(|s| s.contains(fp))
            || self.shared.as_ref().is_some_and(|s| s.contains(fp))
    }
}

/// Whether a put goes to SSD right away.
pub(crate) fn writes_through(config: &KvConfig, has_dram: bool) -> bool {
    config.write_mode == WriteMode::WriteThrough || !has_dram
}
