//! The KV plane of Sluice: a tiered store for LLM KV-cache blocks.
//!
//! Engines (vLLM, SGLang, LMCache) keep KV blocks beyond GPU memory keyed by a
//! prefix-chained hash. [`KvStore`] holds such blocks in two tiers:
//! - a DRAM arena of fixed slots, allocated once ([`dram_tier`]);
//! - a log-structured segment store on local SSD ([`ssd_tier`]): blocks appended into large
//!   segment files, a compact in-memory index, space reclaimed by dropping or compacting
//!   segments, and the index rebuilt from the records at open ([`recovery`]).
//!
//! Which blocks each tier keeps is decided by a `sluice-policy` policy chosen by name, the
//! same code `sluice sim` runs, so the simulator's hit ratio predicts the live store's.
//! Every record carries a BLAKE3 checksum of its bytes and its full key; a read that does
//! not verify is a miss, never bytes. The on-disk format lives in `sluice_formats::kv`;
//! docs/design/kv.md explains the design and docs/FORMATS.md the bytes.
//!
//! Imports point one way: `error`, `namespace`, `config`, `segment_io` ← `dram_tier`,
//! `ssd_tier` ← `recovery`, `reclaimer` ← `store` ← `io_path`, `jobs`, `stats`, `fsck`.

pub mod block_store;
pub mod config;
pub mod dram_tier;
pub mod error;
pub mod foreign;
pub mod fsck;
mod io_path;
pub mod jobs;
mod lower;
pub mod manifest;
pub mod namespace;
mod reclaimer;
mod recovery;
pub mod segment_io;
pub mod serve;
pub mod ssd_tier;
pub mod stats;
pub mod store;

pub use block_store::BlockStore;
pub use config::{DirectIo, Durability, KvConfig, RecomputeModel, WriteMode};
pub use error::KvError;
pub use jobs::{JobBuffer, JobKind, KvJob};
pub use namespace::{Fingerprint, Namespace};
pub use segment_io::{
    open_foreign_segment, FaultyDir, FsSegmentDir, KvFault, SegmentDir, SegmentFile,
};
pub use serve::{KvClient, KvClientConfig, KvServer, KvServerConfig};
pub use stats::{KvStats, TierStats};
pub use store::{KvStore, LoadModel};
