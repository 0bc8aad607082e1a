//! Counters and the snapshot `stats()` returns.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::foreign::ForeignCounters;
use crate::ssd_tier::SsdTier;
use crate::store::{lock, Inner};

/// Live counters, bumped without locks.
#[derive(Default)]
pub(crate) struct Counters {
    pub lookups: AtomicU64,
    pub puts: AtomicU64,
    pub put_failures: AtomicU64,
    pub put_declined: AtomicU64,
    pub gets: AtomicU64,
    pub hits_dram: AtomicU64,
    pub hits_ssd: AtomicU64,
    pub hits_shared: AtomicU64,
    pub misses: AtomicU64,
    pub put_hits_dram: AtomicU64,
    pub put_hits_ssd: AtomicU64,
    pub staged_writes: AtomicU64,
}

/// One tier's occupancy.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TierStats {
    pub policy: String,
    pub blocks: u64,
    /// Bytes the policy holds resident.
    pub used_bytes: u64,
    /// The budget the store was given; the tier holds `capacity_blocks` blocks.
    pub budget_bytes: u64,
    /// Blocks the tier holds: `budget_bytes / block_bytes`.
    pub capacity_blocks: u64,
    /// DRAM: the arena (the budget and a sixteenth of spare slots); SSD: segment files on
    /// disk (never above `disk_bytes_limit`).
    pub allocated_bytes: u64,
    /// SSD: the most bytes the segment files take, the budget plus the on-disk overhead
    /// (record and segment headers, a spare segment, dead space between the watermarks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_bytes_limit: Option<u64>,
    /// Approximate bytes of the in-memory index.
    pub index_bytes: u64,
}

/// A snapshot of a store's counters.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct KvStats {
    pub lookups: u64,
    pub puts: u64,
    /// Puts not acknowledged because a write or a sync failed (or a segment could not be
    /// created): real failures, which `write_errors` details.
    pub put_failures: u64,
    /// Puts not acknowledged by a tier's choice: its policy declined the block, the batch
    /// was larger than the tier (it keeps the batch's first keys), or a later key of the
    /// same batch evicted it again.
    pub put_declined: u64,
    pub gets: u64,
    pub hits_dram: u64,
    pub hits_ssd: u64,
    /// Blocks read from the shared directory (ours there, or another store's).
    pub hits_shared: u64,
    /// Gets that returned no bytes (absent, after a failed key, corrupt or unreadable).
    pub misses: u64,
    /// Puts of blocks DRAM already held (a hit for its policy; the put is a no-op).
    pub put_hits_dram: u64,
    /// Puts of blocks the SSD tier already held (a hit for its policy).
    pub put_hits_ssd: u64,
    /// Records that failed verification on read (dropped, served as misses).
    pub corrupt_blocks: u64,
    pub read_errors: u64,
    pub write_errors: u64,
    /// SSD records written through a staging copy because their block was not 4 KiB-aligned
    /// under O_DIRECT. Aligned blocks go to disk from the caller's memory; a count that
    /// grows with every put means the engine's buffers cost a copy each.
    pub staged_writes: u64,
    /// Blocks found in the segment files at open.
    pub recovered_blocks: u64,
    /// Slots skipped at open: torn or unfinished writes.
    pub torn_slots_skipped: u64,
    /// Segments recovered at open from their summaries (one read each, not one per slot).
    pub summaries_read: u64,
    pub segments: u64,
    pub segments_dropped: u64,
    pub segments_compacted: u64,
    pub dram: Option<TierStats>,
    pub ssd: Option<TierStats>,
    /// This store's own segments in the shared directory.
    pub shared: Option<TierStats>,
    /// Other stores' blocks found in the shared directory.
    pub foreign: Option<ForeignStats>,
    /// Seconds per block a get spends on each tier (what `lookup_worth_loading` uses).
    pub load_model: crate::store::LoadModel,
}

/// What the shared directory holds from other stores.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ForeignStats {
    pub blocks: u64,
    pub index_bytes: u64,
    #[serde(flatten)]
    pub counters: ForeignCounters,
}

/// A segment tier's occupancy.
fn segment_tier_stats(s: &SsdTier) -> TierStats {
    TierStats {
        policy: s.policy_name().into(),
        blocks: s.len() as u64,
        used_bytes: s.used_bytes(),
        budget_bytes: s.budget_bytes(),
        capacity_blocks: s.capacity_blocks(),
        allocated_bytes: s.allocated_bytes(),
        disk_bytes_limit: Some(s.disk_bytes_limit()),
        index_bytes: s.index_bytes() as u64,
    }
}

impl KvStats {
    pub(crate) fn collect(inner: &Inner) -> KvStats {
        let c = &inner.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let dram = inner.dram.as_ref().map(|d| {
            let d = lock(d);
            TierStats {
                policy: d.policy_name().into(),
                blocks: d.len() as u64,
                used_bytes: d.used_bytes(),
                budget_bytes: inner.config.dram_bytes,
                capacity_blocks: inner.config.dram_policy_blocks(),
                allocated_bytes: d.arena_bytes() as u64,
                disk_bytes_limit: None,
                index_bytes: d.index_bytes() as u64,
            }
        });
        let (ssd, counters, segments) = match inner.ssd.as_ref() {
            Some(s) => {
                let s = lock(s);
                (
                    Some(segment_tier_stats(&s)),
                    s.counters,
                    s.segment_count() as u64,
                )
            }
            None => (None, Default::default(), 0),
        };
        let shared = inner.shared.as_ref().map(|s| segment_tier_stats(&lock(s)));
        let foreign = inner.foreign.as_ref().map(|f| {
            let f = lock(f);
            ForeignStats {
                blocks: f.len() as u64,
                index_bytes: f.index_bytes() as u64,
                counters: f.counters,
            }
        });
        KvStats {
            lookups: get(&c.lookups),
            puts: get(&c.puts),
            put_failures: get(&c.put_failures),
            put_declined: get(&c.put_declined),
            gets: get(&c.gets),
            hits_dram: get(&c.hits_dram),
            hits_ssd: get(&c.hits_ssd),
            hits_shared: get(&c.hits_shared),
            misses: get(&c.misses),
            put_hits_dram: get(&c.put_hits_dram),
            put_hits_ssd: get(&c.put_hits_ssd),
            corrupt_blocks: counters.corrupt_blocks,
            read_errors: counters.read_errors,
            write_errors: counters.write_errors,
            staged_writes: get(&c.staged_writes),
            recovered_blocks: counters.recovered_blocks,
            torn_slots_skipped: counters.torn_slots_skipped,
            summaries_read: counters.summaries_read,
            segments,
            segments_dropped: counters.segments_dropped,
            segments_compacted: counters.segments_compacted,
            dram,
            ssd,
            shared,
            foreign,
            load_model: *lock(&inner.load_model),
        }
    }
}
