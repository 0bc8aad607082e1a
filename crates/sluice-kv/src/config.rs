//! `KvConfig`: what a store is opened with, every default with its reason.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use sluice_engine::EngineChoice;
use sluice_formats::kv::{slot_bytes, MAX_KEY_BYTES};
use sluice_policy::PolicyConfig;

use crate::error::KvError;
use crate::namespace::Namespace;

const MIB: u64 = 1 << 20;

/// Slots a segment gets at least, budget permitting: the header takes a whole slot, so with
/// 256 MiB segments of 32 MiB blocks one slot in seven held 4 KiB of header (14% of the disk
/// budget gone, and a store sized for its data evicted blocks). 32 slots keep it near 3%.
pub const MIN_SEGMENT_SLOTS: u64 = 32;

/// When an acknowledged put survives power loss (for a write-through store; in
/// write-back a put acknowledges DRAM residency, see [`WriteMode::WriteBack`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// A put batch is acknowledged after its bytes are written and `fdatasync`ed: one sync
    /// per segment the batch touched, so the cost is shared by the whole batch. A block
    /// whose write or sync failed is not acknowledged.
    Batch,
    /// Acknowledged once written (O_DIRECT reaches the device, buffered I/O the page
    /// cache): survives the process being killed, not power loss. `sync()` makes every
    /// acknowledged put durable.
    None,
}

/// Whether a put goes to SSD at once or only when DRAM evicts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WriteMode {
    /// Every put is written to the SSD tier as well as DRAM, and acknowledged only once
    /// its record is there (synced, in [`Durability::Batch`]): every acknowledged block
    /// survives a crash unless evicted since. A block the SSD declines or cannot write is
    /// not acknowledged and not kept in DRAM either.
    WriteThrough,
    /// Puts land in DRAM and are acknowledged there: a block is written to SSD when DRAM
    /// evicts it (demoted, then synced), or by [`KvStore::sync`](crate::KvStore::sync) and
    /// `close`, which write every block only DRAM holds. Fewer SSD writes for
    /// short-lived prefixes, but a block acknowledged since the last demotion or `sync()`
    /// is lost if the process dies.
    WriteBack,
}

/// How a store opens its segment files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DirectIo {
    /// O_DIRECT where the file system takes it, else buffered with a log line.
    Auto,
    /// O_DIRECT or fail.
    On,
    /// Buffered I/O through the page cache.
    Off,
}

/// The names the CLI, Python and the docs use for each value of these options, and their
/// parsing: one place, so the fronts neither repeat nor drift.
macro_rules! named {
    ($ty:ident, $what:literal, $($value:ident => $name:literal),+) => {
        impl $ty {
            /// Every accepted name, in order.
            pub const NAMES: &'static [&'static str] = &[$($name),+];

            pub fn name(self) -> &'static str {
                match self {
                    $($ty::$value => $name),+
                }
            }
        }

        impl std::str::FromStr for $ty {
            type Err = KvError;
            fn from_str(s: &str) -> Result<Self, KvError> {
                match s {
                    $($name => Ok($ty::$value),)+
                    other => Err(KvError::config(
                        $what,
                        format!("{other:?}"),
                        format!("use one of {}", $ty::NAMES.join(", ")),
                    )),
                }
            }
        }
    };
}

named!(Durability, "durability", Batch => "batch", None => "none");
named!(WriteMode, "write_mode", WriteThrough => "write-through", WriteBack => "write-back");
named!(DirectIo, "direct", Auto => "auto", On => "on", Off => "off");

/// How fast the engine recomputes KV (its prefill), for
/// [`KvStore::lookup_worth_loading`](crate::KvStore::lookup_worth_loading).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecomputeModel {
    /// Prefill tokens per second of the engine this store serves.
    pub tokens_per_s: f64,
    /// Tokens per block.
    pub block_tokens: u64,
}

/// The configuration of one open store.
#[derive(Debug, Clone)]
pub struct KvConfig {
    /// Bytes of every block (the engine's KV block or chunk size). Fixed per store: it sets
    /// the slot size of every segment.
    pub block_bytes: u64,
    /// Byte budget of the DRAM tier (0: no DRAM tier): it holds `dram_bytes / block_bytes`
    /// blocks. The arena is allocated once at open and never grows; it has a sixteenth
    /// more slots than that, for blocks evicted while a lease or a copy pins them
    /// ([`KvConfig::dram_arena_slots`]), on top of the budget.
    pub dram_bytes: u64,
    /// Byte budget of the SSD tier (0: no SSD tier): it holds `ssd_bytes / block_bytes`
    /// blocks. The segment files take more than that on disk (record and segment headers,
    /// a spare segment for compaction, dead space between the reclaim watermarks), up to
    /// [`KvConfig::ssd_disk_bytes_limit`], which `stats()` reports.
    pub ssd_bytes: u64,
    /// Bytes per segment file. 256 MiB: large enough that a segment holds many blocks and
    /// appends stay sequential, small enough that dropping or compacting one frees space in
    /// useful steps. Raised to [`MIN_SEGMENT_SLOTS`] blocks for large blocks, lowered to an
    /// eighth of `ssd_bytes` for small budgets.
    pub segment_bytes: u64,
    /// Eviction and admission of the DRAM tier, by `sluice sim` name (`lru`, `arc`,
    /// `s3fifo`, `tinylfu(window=0.01)`, ...).
    pub dram_policy: PolicyConfig,
    /// Eviction and admission of the SSD tier.
    pub ssd_policy: PolicyConfig,
    pub write_mode: WriteMode,
    pub durability: Durability,
    pub direct: DirectIo,
    /// How O_DIRECT record reads run: `Auto` streams them through io_uring in pieces (the
    /// checksum then runs while the rest of the block is read) where the probe passes, else
    /// one `preadv` each, with a log line; `IoUring` requires it; `Threads` never uses it.
    pub engine: EngineChoice,
    /// Threads running block reads and writes. 8: a queue depth that keeps an NVMe or
    /// virtio disk busy with MiB-sized blocks, while the copies into and out of DRAM slots
    /// are spread over cores.
    pub io_threads: usize,
    /// How long blocks found by `lookup` stay leased (not reused) while their get is
    /// pending. 10 s, like Mooncake's read leases: longer than any sane load, short enough
    /// that a client that never loads does not pin memory for long.
    pub lease_timeout_ms: u64,
    /// When set, every key must be exactly this long (an engine's hash size). Keys are
    /// always 1 to 4000 bytes.
    pub key_bytes: Option<usize>,
    /// Which model, dtype and layout the blocks belong to.
    pub namespace: Namespace,
    /// Reclamation starts when segment files use this fraction of `ssd_bytes`, so puts
    /// find free space without waiting. 0.9 leaves room for a segment being filled.
    pub high_watermark: f64,
    /// The engine's prefill rate, for lookups that only report hits that load sooner than
    /// a recompute. `None`: such lookups are refused.
    pub recompute: Option<RecomputeModel>,
    /// Reclamation stops at this fraction. 0.8: a gap of a tenth of the budget keeps the
    /// reclaimer from running after every put.
    pub low_watermark: f64,
    /// A directory on a file system other nodes mount too (NFS, Lustre): the shared tier.
    /// This store appends its own segments under `<shared_dir>/<store id>/` and reads the
    /// sealed segments other stores wrote beside them. `None`: no shared tier.
    pub shared_dir: Option<PathBuf>,
    /// Budget of this store's own segments in `shared_dir` (0: only read other stores').
    pub shared_bytes: u64,
    /// Eviction and admission of this store's shared segments. FIFO by default: other
    /// nodes read them and cannot report their hits, so recency here means nothing.
    pub shared_policy: PolicyConfig,
    /// How often other stores' newly sealed segments are looked for, and how old this
    /// store's open shared segment may get before it is sealed so that others see its
    /// blocks: 2,000 ms, well under an engine's request time scale, and a directory
    /// listing per stride is cheap even on NFS.
    pub shared_refresh_ms: u64,
    /// An object-store prefix (`s3://bucket/prefix`, `gs://`, `az://`): the shared tier
    /// in an object store instead of `shared_dir` (one or the other). This store's sealed
    /// segments go up under `<remote>/<store id>/` in the background (written locally
    /// first, under the store's `remote/` directory), other stores' are found every
    /// `shared_refresh_ms` and read by ranged GETs. `shared_bytes`, `shared_policy` and
    /// `shared_refresh_ms` apply as they do to the directory.
    pub remote: Option<String>,
    /// How long one read of another store's block may take before it is a miss (each
    /// GET of it: blocks above 8 MiB are read in 8 MiB pieces at once). 1,000 ms: a load
    /// slower than that is one an engine would rather recompute, and no retry follows.
    pub remote_timeout_ms: u64,
}

impl KvConfig {
    /// A configuration with the defaults above and no tiers sized.
    pub fn new(block_bytes: u64, namespace: Namespace) -> KvConfig {
        KvConfig {
            block_bytes,
            dram_bytes: 0,
            ssd_bytes: 0,
            segment_bytes: 256 * MIB,
            dram_policy: PolicyConfig::parse("lru").expect("lru is a built-in policy"),
            ssd_policy: PolicyConfig::parse("lru").expect("lru is a built-in policy"),
            write_mode: WriteMode::WriteThrough,
            durability: Durability::Batch,
            direct: DirectIo::Auto,
            engine: EngineChoice::Auto,
            io_threads: 8,
            lease_timeout_ms: 10_000,
            key_bytes: None,
            namespace,
            high_watermark: 0.9,
            low_watermark: 0.8,
            recompute: None,
            shared_dir: None,
            shared_bytes: 0,
            shared_policy: PolicyConfig::parse("fifo").expect("fifo is a built-in policy"),
            shared_refresh_ms: 2_000,
            remote: None,
            remote_timeout_ms: 1_000,
        }
    }

    /// Checks every field; the store calls it before touching the directory.
    pub fn validate(&self) -> Result<(), KvError> {
        self.namespace.validate()?;
        if self.block_bytes == 0 || self.block_bytes > 1 << 32 {
            return Err(KvError::config(
                "block_bytes",
                self.block_bytes,
                "must be 1 byte to 4 GiB",
            ));
        }
        let shared = self.shared_dir.is_some() || self.remote.is_some();
        if self.dram_bytes == 0 && self.ssd_bytes == 0 && !shared {
            return Err(KvError::config(
                "dram_bytes/ssd_bytes",
                0,
                "at least one tier needs a budget (or a shared_dir or remote to read)",
            ));
        }
        if self.shared_bytes != 0 && !shared {
            return Err(KvError::config(
                "shared_bytes",
                self.shared_bytes,
                "needs a shared_dir or a remote to write into",
            ));
        }
        if let (Some(dir), Some(url)) = (&self.shared_dir, &self.remote) {
            return Err(KvError::config(
                "remote",
                url,
                format!(
                    "the shared tier is either a directory or an object store, and \
                     shared_dir is set too ({})",
                    dir.display()
                ),
            ));
        }
        if let Some(url) = &self.remote {
            if let Err(e) = sluice_remote::ObjectUrl::parse(url) {
                return Err(KvError::config("remote", url, e.to_string()));
            }
        }
        if self.remote_timeout_ms == 0 || self.remote_timeout_ms > 3_600_000 {
            return Err(KvError::config(
                "remote_timeout_ms",
                self.remote_timeout_ms,
                "must be 1 ms to an hour",
            ));
        }
        if self.shared_bytes != 0 && self.shared_bytes < 8 * self.block_bytes {
            return Err(KvError::config(
                "shared_bytes",
                self.shared_bytes,
                format!(
                    "must hold at least 8 blocks of {} bytes, or be 0",
                    self.block_bytes
                ),
            ));
        }
        if self.shared_refresh_ms == 0 {
            return Err(KvError::config(
                "shared_refresh_ms",
                0,
                "must be at least 1 ms",
            ));
        }
        if self.dram_bytes != 0 && self.dram_bytes < self.block_bytes {
            return Err(KvError::config(
                "dram_bytes",
                self.dram_bytes,
                format!(
                    "must hold at least one block ({} bytes) or be 0",
                    self.block_bytes
                ),
            ));
        }
        if self.ssd_bytes != 0 && self.ssd_bytes < 8 * self.block_bytes {
            return Err(KvError::config(
                "ssd_bytes",
                self.ssd_bytes,
                format!(
                    "must hold at least 8 blocks of {} bytes, or be 0",
                    self.block_bytes
                ),
            ));
        }
        if self.io_threads == 0 || self.io_threads > 256 {
            return Err(KvError::config(
                "io_threads",
                self.io_threads,
                "must be 1 to 256",
            ));
        }
        if let Some(k) = self.key_bytes {
            if k == 0 || k > MAX_KEY_BYTES {
                return Err(KvError::config(
                    "key_bytes",
                    k,
                    format!("must be 1 to {MAX_KEY_BYTES}"),
                ));
            }
        }
        if let Some(r) = self.recompute {
            if !(r.tokens_per_s.is_finite() && r.tokens_per_s > 0.0) {
                return Err(KvError::config(
                    "recompute_tokens_per_s",
                    r.tokens_per_s,
                    "must be a positive number of tokens per second",
                ));
            }
            if r.block_tokens == 0 {
                return Err(KvError::config(
                    "block_tokens",
                    0,
                    "must be at least 1 token per block",
                ));
            }
        }
        let (lo, hi) = (self.low_watermark, self.high_watermark);
        if !(0.1..=1.0).contains(&hi) || !(0.0..hi).contains(&lo) {
            return Err(KvError::config(
                "low_watermark/high_watermark",
                format!("{lo}/{hi}"),
                "need 0 <= low < high <= 1 and high >= 0.1",
            ));
        }
        Ok(())
    }

    /// Blocks the DRAM tier holds: `dram_bytes / block_bytes`, what its policy may keep.
    pub fn dram_policy_blocks(&self) -> u64 {
        self.dram_bytes / self.block_bytes.max(1)
    }

    /// Slots of the DRAM arena: [`KvConfig::dram_policy_blocks`] plus the spare ones (see
    /// [`arena_slots`]), so the arena takes a little more memory than the budget.
    pub fn dram_arena_slots(&self) -> u64 {
        arena_slots(self.dram_policy_blocks())
    }

    /// Whether a put goes to the SSD tier at once: write-through, or a store without a
    /// DRAM tier.
    pub(crate) fn writes_through(&self, has_dram: bool) -> bool {
        self.write_mode == WriteMode::WriteThrough || !has_dram
    }

    /// Whether record reads go through io_uring: `Err` when it is required and missing.
    pub(crate) fn use_io_uring(&self) -> Result<bool, KvError> {
        let probe = sluice_engine::probe_io_uring();
        match (self.engine, probe) {
            (EngineChoice::Threads, _) => Ok(false),
            (_, Ok(())) => Ok(true),
            (EngineChoice::IoUring, Err(reason)) => Err(KvError::config(
                "engine",
                "io_uring",
                format!("unavailable: {reason}"),
            )),
            (EngineChoice::Auto, Err(reason)) => {
                tracing::info!("kv: io_uring unavailable ({reason}); record reads use preadv");
                Ok(false)
            }
        }
    }

    /// The configuration of this store's own segments in the shared directory: a segment
    /// store like the SSD tier's, with the shared budget and policy.
    pub(crate) fn shared_tier_config(&self) -> KvConfig {
        KvConfig {
            ssd_bytes: self.shared_bytes,
            ssd_policy: self.shared_policy.clone(),
            ..self.clone()
        }
    }

    /// Bytes of one segment slot (record header plus padded block).
    pub fn slot_bytes(&self) -> u64 {
        slot_bytes(self.block_bytes).unwrap_or(u64::MAX)
    }

    /// Blocks the SSD tier holds: `ssd_bytes / block_bytes`.
    pub fn ssd_blocks(&self) -> u64 {
        self.ssd_bytes / self.block_bytes.max(1)
    }

    /// Bytes the SSD policy may keep resident: [`KvConfig::ssd_blocks`] records (the policy
    /// counts a record as a whole slot: its header and its block padded to 4 KiB).
    pub fn ssd_policy_capacity(&self) -> u64 {
        self.ssd_blocks().saturating_mul(self.slot_bytes())
    }

    /// The most bytes the SSD tier's segment files take on disk: enough whole segments for
    /// [`KvConfig::ssd_blocks`] records (slot 0 of each is the segment header), one more
    /// being filled and a spare that only compaction writes into (so reclaiming can always
    /// move a segment's live records and drop it), and at least so much that those live
    /// segments and the one being filled fit under the low watermark (so the reclaimer can
    /// get there). Rounded up to whole segments; 0 without an SSD tier.
    ///
    /// At 256 KiB blocks and the default watermarks that is about 1.3 to 1.6 times
    /// `ssd_bytes` (the spare segment weighs more in a small budget).
    pub fn ssd_disk_bytes_limit(&self) -> u64 {
        let blocks = self.ssd_blocks();
        if blocks == 0 {
            return 0;
        }
        let per_segment = self.slots_per_segment();
        let seg = per_segment.saturating_mul(self.slot_bytes());
        let live = blocks.div_ceil(per_segment - 1).saturating_mul(seg);
        let by_spare = live.saturating_add(2 * seg);
        let by_watermark = match self.low_watermark > 0.0 {
            true => ((live + seg) as f64 / self.low_watermark).ceil() as u64,
            false => 0,
        };
        by_spare.max(by_watermark).div_ceil(seg).saturating_mul(seg)
    }

    /// Slots per segment file (slot 0 is the segment header): `segment_bytes`, raised to
    /// [`MIN_SEGMENT_SLOTS`] slots for large blocks, lowered to an eighth of the budget, in
    /// whole slots, at least 2 blocks.
    pub fn slots_per_segment(&self) -> u64 {
        let slot = self.slot_bytes();
        let cap = self
            .segment_bytes
            .max(slot.saturating_mul(MIN_SEGMENT_SLOTS))
            .min(self.ssd_bytes / 8)
            .max(slot * 3);
        (cap / slot).max(3)
    }
}

/// Slots of an arena whose policy keeps `blocks`: a sixteenth more (at least one, for two
/// blocks or more), out of the policy's reach. A block the policy evicts while a lease or
/// a copy pins it keeps its slot until the pin drops; without spare slots the next
/// admission would find no free slot, and the policy would count a block the tier does not
/// hold. The spares are on top of the budget, so a budget of N blocks holds N blocks.
pub fn arena_slots(blocks: u64) -> u64 {
    if blocks < 2 {
        return blocks;
    }
    blocks + blocks.div_ceil(16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_headers_cost_little_space_at_every_block_size() {
        for block in [256 << 10, 2 * MIB, 32 * MIB, 128 * MIB] {
            let mut c = KvConfig::new(block, Namespace::default());
            c.ssd_bytes = 1 << 40;
            let slots = c.slots_per_segment();
            assert!(
                slots >= MIN_SEGMENT_SLOTS,
                "{block}: {slots} slots per segment"
            );
        }
        // A small budget still gets at least eight segments.
        let mut c = KvConfig::new(32 * MIB, Namespace::default());
        c.ssd_bytes = 64 * c.slot_bytes();
        assert_eq!(c.slots_per_segment(), 8);
    }

    #[test]
    fn the_disk_limit_holds_the_blocks_the_budget_names_and_its_overhead() {
        for (block, blocks) in [(256 << 10, 256), (256 << 10, 40_000), (2 * MIB, 1000)] {
            let mut c = KvConfig::new(block, Namespace::default());
            c.ssd_bytes = blocks * block;
            let limit = c.ssd_disk_bytes_limit();
            let seg = c.slots_per_segment() * c.slot_bytes();
            let live = blocks.div_ceil(c.slots_per_segment() - 1) * seg;
            assert_eq!(limit % seg, 0);
            assert!(limit >= live + 2 * seg, "{block} x {blocks}");
            assert!(limit as f64 * c.low_watermark >= (live + seg) as f64);
            assert!(limit < 2 * c.ssd_bytes, "{block} x {blocks}: {limit}");
        }
    }
}
