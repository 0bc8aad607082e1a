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
//! thread reclaims SSD space between the watermarks, so puts rarely wait for it. The
//! shared state is [`StoreState`]; the data path is `io_path`; this file is the API and
//! what only an owner holds: the directory lock, the reclaim thread and the job queue.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::args::{check_buffers, check_keys};
use crate::call_gate::Call;
use crate::config::{KvConfig, RecomputeModel};
use crate::error::KvError;
use crate::fork_guard::ForkGuard;
use crate::io_path;
use crate::jobs::{BatchRunner, JobBuffer, JobKind, JobQueue, KvJob};
use crate::manifest::{self, StoreLock};
use crate::namespace::{Fingerprint, Namespace};
use crate::reclaimer::Reclaimer;
use crate::segment_io::{FsSegmentDir, SegmentDir};
use crate::state::{StoreState, View};
use crate::stats::KvStats;
use crate::sync::{add, lock};
use crate::tiers::{Tier, Tiers};

/// What every handle on one store shares: its state, and what only the owner holds.
struct Inner {
    state: StoreState,
    reclaimer: Option<Reclaimer>,
    /// The shared tier in an object store: the thread of its uploads and listings.
    remote: Option<Reclaimer>,
    owner_lock: Mutex<Option<StoreLock>>,
    jobs: Arc<JobQueue>,
    /// The process that opened the store: a forked child's copy refuses every call.
    fork: ForkGuard,
}

/// An open KV block store, seen through one namespace. Cheap to clone; every clone is
/// the same store. [`KvStore::with_namespace`] gives a handle on the same tiers for another
/// namespace (a sidecar serves every client's namespace from one store).
#[derive(Clone)]
pub struct KvStore {
    inner: Arc<Inner>,
    /// The digest of this handle's namespace: in every fingerprint and record it writes,
    /// compared on every read.
    namespace_id: [u8; 16],
    /// The engine's prefill model, for [`KvStore::lookup_worth_loading`].
    recompute: Option<RecomputeModel>,
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
        manifest::create_dir(&seg_root)?;
        let store_id = manifest
            .store_id_bytes()
            .expect("read() checked the store id");
        let tiers = Tiers::open(&config, root, dir, seg_root, store_id)?;
        let refresh = Duration::from_millis(config.shared_refresh_ms);
        let start = |tended| Reclaimer::start(tended).map_err(KvError::io(root));
        let reclaimer = tiers.tended(refresh).map(start).transpose()?;
        let remote = tiers.remote_tended(refresh).map(start).transpose()?;
        let namespace_id = config.namespace.id();
        let recompute = config.recompute;
        let inner = Arc::new(Inner {
            state: StoreState::new(config, root, tiers),
            reclaimer,
            remote,
            owner_lock: Mutex::new(Some(owner)),
            jobs: Arc::new(JobQueue::default()),
            fork: ForkGuard::this_process(),
        });
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
        self.state().config()
    }

    pub fn root(&self) -> &Path {
        self.state().root()
    }

    fn state(&self) -> &StoreState {
        &self.inner.state
    }

    /// The store seen through this handle's namespace, for the data path.
    fn view(&self) -> View<'_> {
        View {
            state: self.state(),
            namespace_id: self.namespace_id,
        }
    }

    /// Enters the store for one call, which holds the returned guard until it is done
    /// (`close()` waits for it): `Closed` once `close()` began, `Forked` in a child forked
    /// from the owner.
    fn enter(&self) -> Result<Call<'_>, KvError> {
        self.inner.fork.check(self.root())?;
        self.state().enter().ok_or(KvError::Closed)
    }

    /// What a lookup checks: the store is open, the keys are valid.
    fn check_lookup(&self, keys: &[&[u8]]) -> Result<Call<'_>, KvError> {
        let call = self.enter()?;
        check_keys(keys, self.config().key_bytes)?;
        Ok(call)
    }

    /// What a checked lookup does first: ends expired leases, counts itself, and hashes
    /// the chain (before any tier is locked; each is then locked once for all of it).
    fn start_lookup(&self, keys: &[&[u8]]) -> Vec<Fingerprint> {
        let state = self.state();
        state.expire_leases();
        add(&state.counters().lookups, 1);
        keys.iter()
            .map(|k| Fingerprint::of(&self.namespace_id, k))
            .collect()
    }

    /// The number of keys, from the first, resident in some tier. No I/O. With `lease`,
    /// the blocks found stay readable (not reused, not torn) until a get of them finishes
    /// or `lease_timeout_ms` passes.
    pub fn lookup(&self, keys: &[&[u8]], lease: bool) -> Result<usize, KvError> {
        let _call = self.check_lookup(keys)?;
        let fps = self.start_lookup(keys);
        let state = self.state();
        if lease {
            return Ok(state.lease_prefix(&self.namespace_id, keys, &fps));
        }
        let tiers = state.tiers().residency();
        Ok(fps.iter().take_while(|fp| tiers.contains(**fp)).count())
    }

    /// Like [`KvStore::lookup`], but only the prefix that loads sooner than the engine
    /// would recompute it (the handle's recompute model): the load is estimated per block from the
    /// tier each block is in and the seconds per block gets measured on that tier, the
    /// recompute from the prefill rate. The answer is the longest such prefix, so a hit
    /// slower than recomputing is reported as a miss. Only that prefix is leased.
    pub fn lookup_worth_loading(&self, keys: &[&[u8]], lease: bool) -> Result<usize, KvError> {
        let _call = self.check_lookup(keys)?;
        let Some(model) = self.recompute else {
            return Err(KvError::arg(
                "lookup_worth_loading",
                "the store was opened without a recompute model (recompute_tokens_per_s)",
            ));
        };
        let fps = self.start_lookup(keys);
        let state = self.state();
        let load = state.load_model();
        let recompute_block_s = model.block_tokens as f64 / model.tokens_per_s;
        let (mut load_s, mut best) = (0.0, 0);
        let tiers = state.tiers().residency();
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
            true => state.lease_prefix(&self.namespace_id, &keys[..best], &fps[..best]),
            false => best,
        })
    }

    /// Stores blocks. `true` for a key means the block is in the store at the end of the
    /// batch; writing through (the default), also that its record is on the SSD tier
    /// (synced, in `batch` durability). In write-back it means DRAM residency: the block
    /// survives a crash once demoted or written by [`KvStore::sync`]. `false`: no tier
    /// kept it (a policy declined it, the batch was larger than a tier, or I/O failed;
    /// `stats()` counts `put_declined` and `put_failures` apart).
    pub fn put_batch(&self, keys: &[&[u8]], blocks: &[&[u8]]) -> Result<Vec<bool>, KvError> {
        let _call = self.check_batch(keys, blocks.iter().map(|b| b.len()))?;
        Ok(self.run_put(keys, blocks))
    }

    /// Deletes blocks: each key's block leaves every tier of this store (DRAM, SSD, this
    /// store's shared segments) and its lease ends, so a later lookup or get misses; its
    /// DRAM slot is free at once (or when a get copying it finishes), its SSD record is
    /// dead space, and a segment left with no live record is removed. A delete is not
    /// recorded on disk: a record whose segment was not reclaimed yet is found again
    /// after a restart (docs/design/kv.md, "Deletes"). Returns how many keys the store
    /// held; an absent key is not an error.
    pub fn delete(&self, keys: &[&[u8]]) -> Result<usize, KvError> {
        let _call = self.check_lookup(keys)?;
        let fps: Vec<Fingerprint> = keys
            .iter()
            .map(|k| Fingerprint::of(&self.namespace_id, k))
            .collect();
        let n = self.state().delete(&fps);
        self.wake_reclaimer();
        Ok(n)
    }

    /// Loads blocks into `bufs`. `true` for key `i` means `bufs[i]` holds exactly the bytes
    /// stored under it; after the first `false`, every later key is `false` too (prefix
    /// semantics) and its buffer's contents are unspecified.
    pub fn get_batch_into(
        &self,
        keys: &[&[u8]],
        bufs: &mut [&mut [u8]],
    ) -> Result<Vec<bool>, KvError> {
        let _call = self.check_batch(keys, bufs.iter().map(|b| b.len()))?;
        Ok(self.run_get(keys, bufs))
    }

    /// What every batch call checks before it runs: the store is open, the keys and the
    /// buffers (one per key, each a block long) are valid.
    fn check_batch(
        &self,
        keys: &[&[u8]],
        lens: impl Iterator<Item = usize>,
    ) -> Result<Call<'_>, KvError> {
        let call = self.enter()?;
        let config = self.config();
        check_keys(keys, config.key_bytes)?;
        let lens: Vec<usize> = lens.collect();
        check_buffers(keys.len(), &lens, config.block_bytes)?;
        Ok(call)
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
        drop(self.check_batch(&refs, bufs.iter().map(|b| b.bytes().len()))?);
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
        let _call = self.enter()?;
        flush_and_sync(self.state())
    }

    pub fn stats(&self) -> KvStats {
        self.state().stats()
    }

    /// Waits for queued jobs and for calls running on other threads, syncs (in
    /// write-back, writing DRAM-only blocks to SSD first, as [`KvStore::sync`]), stops the
    /// reclaimer and releases the store's files and lock. Calls made once `close()` began
    /// fail with [`KvError::Closed`].
    pub fn close(&self) -> Result<(), KvError> {
        if self.inner.fork.is_forked() {
            // A forked child lets go of its copy (every call there fails already): the
            // files, the lock and the threads are its parent's.
            return Ok(());
        }
        self.inner.jobs.drain();
        if self.state().mark_closed() {
            return Ok(());
        }
        // No reclaim pass may run once the lock is released to the next owner.
        if let Some(r) = &self.inner.reclaimer {
            r.stop();
        }
        let synced = flush_and_sync(self.state());
        // Then what is sealed goes up, in one last pass.
        if let Some(r) = &self.inner.remote {
            let tiers = self.state().tiers();
            r.stop_unless_stalled(REMOTE_STALL, || tiers.remote_progress());
        }
        // Its files go with it, those leases hold too (a closed store still referenced
        // must not keep its file system busy); only then does the next owner get the lock.
        self.state().end_leases();
        self.state().tiers().release_files();
        lock(&self.inner.owner_lock).take();
        synced
    }

    /// Whether a `close()` is waiting for calls still running on other threads (what
    /// tests wait for).
    #[cfg(any(test, feature = "testing"))]
    pub fn close_is_waiting_for_calls(&self) -> bool {
        self.state().closer_waiting()
    }

    fn wake_reclaimer(&self) {
        let Some(r) = &self.inner.reclaimer else {
            return;
        };
        if self.state().tiers().needs_reclaim() {
            r.wake();
        }
    }
}

/// How long closing waits for the remote thread without a sign of progress (an 8 MiB part
/// handed on, a segment up or deleted, a pass): an upload that moves at 1 MB/s is waited
/// for, and a server that stopped answering does not hold `close()` for its requests'
/// timeouts.
const REMOTE_STALL: Duration = Duration::from_secs(10);

/// Writes every block only DRAM holds to the SSD tier (write-back), then syncs the
/// segments: what `sync()` and `close()` promise, and what letting go of the last handle
/// without `close()` does too.
fn flush_and_sync(state: &StoreState) -> Result<(), KvError> {
    // A flushed record carries its block's own namespace, so any view will do.
    let view = View {
        state,
        namespace_id: [0; 16],
    };
    let declined = io_path::flush_dram(view);
    if declined > 0 {
        tracing::warn!(
            "kv sync: the SSD policy declined {declined} block(s) only DRAM holds; they are not durable"
        );
    }
    state.tiers().sync_segments()?;
    match state.take_not_durable() {
        None => Ok(()),
        Some((blocks, source)) => Err(KvError::NotDurable {
            path: state.root().join("segments"),
            blocks,
            source,
        }),
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.jobs.shutdown();
        if self.fork.is_forked() {
            return; // the parent's files; the reclaimer forgets its thread by itself
        }
        if let Some(r) = &self.reclaimer {
            r.stop();
        }
        if self.state.is_closed() {
            return; // close() flushed and synced, and let go of the files
        }
        // Dropped without close() (a script's end, a collected object): what close()
        // would have made durable still is, and uploaded.
        if let Err(e) = flush_and_sync(&self.state) {
            tracing::warn!("kv: syncing the store as its last handle goes: {e}");
        }
        if let Some(r) = &self.remote {
            let tiers = self.state.tiers();
            r.stop_unless_stalled(REMOTE_STALL, || tiers.remote_progress());
        }
    }
}

/// A checked batch, blocking or a job's (`close` waits for queued jobs, so they run even
/// once the store is closing).
impl BatchRunner for KvStore {
    fn run_put(&self, keys: &[&[u8]], blocks: &[&[u8]]) -> Vec<bool> {
        self.state().expire_leases();
        let out = io_path::put_batch(self.view(), keys, blocks);
        self.wake_reclaimer();
        out
    }

    fn run_get(&self, keys: &[&[u8]], bufs: &mut [&mut [u8]]) -> Vec<bool> {
        self.state().expire_leases();
        io_path::get_batch(self.view(), keys, bufs).0
    }
}
