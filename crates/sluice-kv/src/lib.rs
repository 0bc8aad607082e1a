//! The KV plane of Sluice: a tiered store for LLM KV-cache blocks.
//!
//! Engines (vLLM, SGLang, LMCache) keep KV blocks beyond GPU memory keyed by a
//! prefix-chained hash. [`KvStore`] holds such blocks in tiers:
//! - a DRAM arena of fixed slots, allocated once (`dram_tier`);
//! - a log-structured segment store on local SSD (`ssd_tier`): blocks appended into large
//!   segment files, a compact in-memory index, space reclaimed by dropping or compacting
//!   segments, and the index rebuilt from the records at open (`ssd_tier::recovery`);
//! - optionally a shared tier other nodes read: a directory they mount too, or an object
//!   store prefix (`tiers`, `foreign`, `remote_tier`).
//!
//! Which blocks each tier keeps is decided by a `sluice-policy` policy chosen by name, the
//! same code `sluice sim` runs, so the simulator's hit ratio predicts the live store's.
//! Every record carries a BLAKE3 checksum of its bytes and its full key; a read that does
//! not verify is a miss, never bytes. The on-disk format lives in `sluice_formats::kv`;
//! docs/design/kv.md explains the design and docs/FORMATS.md the bytes.
//!
//! Every module is private; this file re-exports the public API. Imports point one way
//! (`scripts/module_cycles.py`, run by `make lint`, fails on a cycle), each layer only
//! using the ones below it:
//! - leaves: `sync`, `error`, `fork_guard`, `args`, `load_model`, then `namespace`,
//!   `config`, `stats`, `manifest`;
//! - storage: `segment_io` (the trait; `fs_dir`, and `faulty` for tests), `dram_tier`,
//!   `ssd_tier` (with `compaction` and `recovery`), `remote_tier` (the shared tier in an
//!   object store), `foreign`, `reclaimer`;
//! - the store: `tiers` (all tiers together), `call_gate` (the calls running, and
//!   closing), `state` (what handles share), `io_path`
//!   (puts and gets), `jobs`, then `store` ([`KvStore`]);
//! - over it: `block_store`, `serve` (the sidecar and its client), `fsck`, `defaults`
//!   (every option's default, for the CLI and Python).

mod args;
mod block_store;
mod call_gate;
mod config;
mod defaults;
mod dram_tier;
mod error;
mod foreign;
mod fork_guard;
mod fsck;
mod io_path;
mod jobs;
mod load_model;
mod manifest;
mod namespace;
mod reclaimer;
mod remote_tier;
mod segment_io;
mod serve;
mod ssd_tier;
mod state;
mod stats;
mod store;
mod sync;
mod tiers;

pub use block_store::BlockStore;
pub use config::{DirectIo, Durability, KvConfig, RecomputeModel, WriteMode, MIN_SEGMENT_SLOTS};
pub use defaults::{kv_defaults, KvDefaults};
pub use error::KvError;
pub use fsck::{fsck, store_summary, FsckProblem, FsckReport, StoreSummary};
pub use jobs::{JobBuffer, JobKind, KvJob};
pub use load_model::LoadModel;
pub use manifest::{check_store_closed, read_manifest, Manifest, MANIFEST_NAME};
pub use namespace::{Fingerprint, Namespace};
#[cfg(any(test, feature = "testing"))]
pub use segment_io::{FaultyDir, KvFault};
pub use segment_io::{FsSegmentDir, SegmentDir, SegmentFile};
pub use serve::{KvClient, KvClientConfig, KvServer, KvServerConfig};
pub use stats::{ForeignCounters, ForeignStats, KvStats, RemoteStats, TierStats};
pub use store::KvStore;
