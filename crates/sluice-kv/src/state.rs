//! [`StoreState`]: what every handle on one open store shares (its configuration, its
//! tiers, the lookups' leases, the counters, the staging buffers and the load model),
//! behind methods. The data path (`io_path`) works on a [`View`] of it: the state seen
//! through one namespace. The public [`KvStore`](crate::KvStore) wraps both, with the
//! parts only an owner has (the directory lock, the reclaim thread, the job queue).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sluice_engine::{BufferPool, BufferPoolConfig};

use crate::call_gate::{Call, CallGate};
use crate::config::KvConfig;
use crate::load_model::{GetTiers, LoadModel};
use crate::namespace::{fp_map, Fingerprint, FpMap};
use crate::stats::{Counters, KvStats};
use crate::sync::lock;
use crate::tiers::{RecordLoc, Tiers};

/// A lease taken by `lookup`: what the later get may read even if the block is evicted.
pub(crate) struct Lease {
    pub dram_slot: Option<u32>,
    /// The record in a lower tier, when DRAM does not hold the block.
    pub lower: Option<RecordLoc>,
    pub count: u32,
    pub expires: Instant,
}

/// The state of one open store, shared by every handle (namespace) on it.
pub(crate) struct StoreState {
    config: KvConfig,
    root: PathBuf,
    tiers: Tiers,
    leases: Mutex<FpMap<Lease>>,
    counters: Counters,
    /// Aligned staging for SSD records (writes, unaligned reads, record headers): one slot
    /// per I/O thread, reused, so the data path maps no memory per block.
    staging: BufferPool,
    /// The calls running, and whether `close()` began.
    gate: CallGate,
    /// Measured seconds per block served from each tier, for `lookup_worth_loading`.
    load_model: Mutex<LoadModel>,
    /// Write-back blocks whose SSD write failed since the last `sync()`, and the last
    /// failure: what the next `sync()` reports.
    not_durable: Mutex<(u64, Option<std::io::Error>)>,
}

impl StoreState {
    pub(crate) fn new(config: KvConfig, root: &Path, tiers: Tiers) -> StoreState {
        let staging = BufferPool::new(BufferPoolConfig::bounded(
            config.io_threads as u64 * config.slot_bytes(),
        ));
        StoreState {
            load_model: Mutex::new(LoadModel::new(config.block_bytes)),
            config,
            root: root.to_path_buf(),
            tiers,
            leases: Mutex::new(fp_map(0)),
            counters: Counters::default(),
            staging,
            gate: CallGate::default(),
            not_durable: Mutex::new((0, None)),
        }
    }

    /// Counts write-back blocks, acknowledged in DRAM, whose SSD write failed with `error`.
    pub(crate) fn write_back_failed(&self, blocks: u64, error: std::io::Error) {
        crate::sync::add(&self.counters.write_back_failures, blocks);
        let mut g = lock(&self.not_durable);
        g.0 += blocks;
        g.1 = Some(error);
    }

    /// The write-back failures since the last call: how many blocks, and the last error.
    pub(crate) fn take_not_durable(&self) -> Option<(u64, std::io::Error)> {
        let (blocks, error) = std::mem::take(&mut *lock(&self.not_durable));
        Some((blocks, error?)).filter(|(n, _)| *n > 0)
    }

    pub(crate) fn config(&self) -> &KvConfig {
        &self.config
    }

    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    pub(crate) fn tiers(&self) -> &Tiers {
        &self.tiers
    }

    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }

    pub(crate) fn staging(&self) -> &BufferPool {
        &self.staging
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.gate.is_shut()
    }

    /// Enters the store for one call (held until the call is done); `None` once
    /// `close()` began.
    pub(crate) fn enter(&self) -> Option<Call<'_>> {
        self.gate.enter()
    }

    /// Marks the store closed, so that every later call fails, and waits for the calls
    /// running; `true` if it was closed already.
    pub(crate) fn mark_closed(&self) -> bool {
        self.gate.shut()
    }

    /// Whether a `close()` waits for calls still running.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn closer_waiting(&self) -> bool {
        self.gate.closer_waiting()
    }

    /// The seconds per block gets measured on each tier.
    pub(crate) fn load_model(&self) -> LoadModel {
        *lock(&self.load_model)
    }

    /// A get batch's timing, for the load model.
    pub(crate) fn record_load(&self, tiers: &GetTiers, elapsed: Duration) {
        lock(&self.load_model).record(tiers, elapsed);
    }

    /// Leases `keys` (of `namespace_id`, fingerprints `fps`) from the first until one is
    /// found in no tier; returns how many. The lease table and each tier are locked once
    /// for the whole chain, in the store's lock order (leases, DRAM, SSD, ...).
    pub(crate) fn lease_prefix(
        &self,
        namespace_id: &[u8; 16],
        keys: &[&[u8]],
        fps: &[Fingerprint],
    ) -> usize {
        let expires = Instant::now() + Duration::from_millis(self.config.lease_timeout_ms);
        let mut leases = lock(&self.leases);
        let mut tiers = self.tiers.residency();
        let mut n = 0;
        for (fp, key) in fps.iter().zip(keys) {
            if let Some(l) = leases.get_mut(fp) {
                l.count += 1;
                l.expires = expires;
                n += 1;
                continue;
            }
            let (dram_slot, lower) = tiers.pin_or_locate(*fp, namespace_id, key);
            if dram_slot.is_none() && lower.is_none() {
                break;
            }
            let lease = Lease {
                dram_slot,
                lower,
                count: 1,
                expires,
            };
            leases.insert(*fp, lease);
            n += 1;
        }
        n
    }

    /// What a lease on `fp` holds, for a get that finds the block in no tier any more: a
    /// DRAM slot (pinned once more for the get) or a lower tier's record.
    pub(crate) fn leased(&self, fp: Fingerprint) -> Option<(Option<u32>, Option<RecordLoc>)> {
        let leases = lock(&self.leases);
        let lease = leases.get(&fp)?;
        if let (Some(slot), Some(d)) = (lease.dram_slot, self.tiers.dram()) {
            lock(d).pin_slot(slot);
            return Some((Some(slot), None));
        }
        Some((None, lease.lower.clone()))
    }

    /// Releases one lease count of `fp` (after its get).
    pub(crate) fn release_lease(&self, fp: Fingerprint) {
        let mut leases = lock(&self.leases);
        let Some(l) = leases.get_mut(&fp) else { return };
        l.count = l.count.saturating_sub(1);
        if l.count == 0 {
            let l = leases.remove(&fp).expect("just found");
            self.unpin_lease(l);
        }
    }

    /// Deletes `fps` from the store's tiers and ends their leases, holding the lease
    /// table throughout (the store's lock order), so no get after the delete is served
    /// from a lease taken before it. Returns how many some tier held.
    pub(crate) fn delete(&self, fps: &[Fingerprint]) -> usize {
        let mut leases = lock(&self.leases);
        for fp in fps {
            if let Some(l) = leases.remove(fp) {
                self.unpin_lease(l);
            }
        }
        let n = self.tiers.delete(fps);
        drop(leases);
        crate::sync::add(&self.counters.deletes, n as u64);
        n
    }

    /// Ends every lease (the store is closing): none may keep a slot pinned or a segment
    /// file open once the store let go of its files.
    pub(crate) fn end_leases(&self) {
        let leases = std::mem::replace(&mut *lock(&self.leases), fp_map(0));
        for (_, l) in leases {
            self.unpin_lease(l);
        }
    }

    /// Ends every lease past its timeout (once per call, not per key).
    pub(crate) fn expire_leases(&self) {
        let now = Instant::now();
        let mut leases = lock(&self.leases);
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
        if let (Some(slot), Some(d)) = (lease.dram_slot, self.tiers.dram()) {
            lock(d).unpin(slot);
        }
    }

    /// A snapshot of the counters and each tier's occupancy.
    pub(crate) fn stats(&self) -> KvStats {
        let (dram, ssd, shared, foreign) = self.tiers.stats(&self.config);
        let (counters, segments) = self.tiers.ssd_counters();
        KvStats::new(
            &self.counters,
            counters,
            segments,
            [dram, ssd, shared],
            foreign,
            self.tiers.remote_stats(),
            self.load_model(),
        )
    }
}

/// The store's state seen through one namespace: what the data path works on.
#[derive(Clone, Copy)]
pub(crate) struct View<'a> {
    pub state: &'a StoreState,
    /// The digest of the handle's namespace: in every fingerprint and record it writes,
    /// compared on every read.
    pub namespace_id: [u8; 16],
}

impl View<'_> {
    pub(crate) fn fingerprint(&self, key: &[u8]) -> Fingerprint {
        Fingerprint::of(&self.namespace_id, key)
    }
}
