//! Counters and the snapshot `stats()` returns: plain data, built by the tiers
//! (`DramTier::tier_stats`, `SsdTier::tier_stats`, `ForeignIndex::stats`) and the store.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::load_model::LoadModel;

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
    pub write_back_failures: AtomicU64,
    pub deletes: AtomicU64,
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
    /// Write-back blocks, acknowledged in DRAM, whose SSD write failed (a full disk, EIO):
    /// lost when DRAM had evicted them (a demotion), still only in DRAM when `sync()` or
    /// `close()` could not write them. `sync()` reports them as an error.
    pub write_back_failures: u64,
    /// Blocks `delete` found and removed (from any tier of this store).
    pub deletes: u64,
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
    /// The shared tier in an object store: its uploads and deletes.
    pub remote: Option<RemoteStats>,
    /// Seconds per block a get spends on each tier (what `lookup_worth_loading` uses).
    pub load_model: LoadModel,
}

/// What the shared directory holds from other stores.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ForeignStats {
    pub blocks: u64,
    pub index_bytes: u64,
    #[serde(flatten)]
    pub counters: ForeignCounters,
}

/// What the index of other stores' blocks counts (in `stats()["foreign"]`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Serialize)]
pub struct ForeignCounters {
    /// Other stores seen in the shared directory at the last refresh.
    pub stores: u64,
    /// Their sealed segments indexed now.
    pub segments: u64,
    /// Summaries that did not decode or hold another block size (skipped).
    pub skipped_summaries: u64,
    /// Reads of their blocks that failed or did not verify (each a miss; block dropped).
    pub read_failures: u64,
    pub refreshes: u64,
    /// Listings of the object store that failed (the index kept what it had).
    pub refresh_failures: u64,
}

/// The remote thread's work on this store's segments in the object store.
#[derive(Debug, Default, Clone, Serialize, PartialEq)]
pub struct RemoteStats {
    /// Sealed segments put up (each with its summary), and their bytes.
    pub uploaded_segments: u64,
    pub uploaded_bytes: u64,
    /// Segments deleted from the object store after the local store dropped them.
    pub deleted_segments: u64,
    /// Sealed segments not up yet, as of the last pass.
    pub pending_segments: u64,
    pub passes: u64,
    /// Passes that stopped at an error (the next one tries again).
    pub failed_passes: u64,
    /// The last pass's error, until a pass goes through.
    pub last_error: Option<String>,
}

/// What the SSD tier counts.
#[derive(Debug, Default, Clone, Copy)]
pub struct SsdCounters {
    pub corrupt_blocks: u64,
    pub read_errors: u64,
    pub write_errors: u64,
    pub recovered_blocks: u64,
    pub torn_slots_skipped: u64,
    pub segments_dropped: u64,
    pub segments_compacted: u64,
    pub blocks_moved: u64,
    /// Sealed segments recovered from their summary, without reading their slots.
    pub summaries_read: u64,
}

impl KvStats {
    /// A snapshot from the store's counters, the SSD tier's (and its segment count), each
    /// tier's occupancy (DRAM, SSD, our shared segments), other stores' blocks, and the load
    /// model.
    pub(crate) fn new(
        c: &Counters,
        ssd: SsdCounters,
        segments: u64,
        [dram, ssd_tier, shared]: [Option<TierStats>; 3],
        foreign: Option<ForeignStats>,
        remote: Option<RemoteStats>,
        load_model: LoadModel,
    ) -> KvStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
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
            write_back_failures: get(&c.write_back_failures),
            deletes: get(&c.deletes),
            corrupt_blocks: ssd.corrupt_blocks,
            read_errors: ssd.read_errors,
            write_errors: ssd.write_errors,
            staged_writes: get(&c.staged_writes),
            recovered_blocks: ssd.recovered_blocks,
            torn_slots_skipped: ssd.torn_slots_skipped,
            summaries_read: ssd.summaries_read,
            segments,
            segments_dropped: ssd.segments_dropped,
            segments_compacted: ssd.segments_compacted,
            dram,
            ssd: ssd_tier,
            shared,
            foreign,
            remote,
            load_model,
        }
    }
}
