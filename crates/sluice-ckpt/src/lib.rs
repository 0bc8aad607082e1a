//! The checkpoint plane of Sluice: grouped checkpoint I/O with content dedup.
//!
//! A store is a directory of checkpoints that share one pool of content-addressed chunks
//! ([`ChunkStore`]): every tensor is cut into chunks named by their BLAKE3 digest
//! ([`chunk`]), so bytes that repeat (across data-parallel ranks, tied weights, zeros, or
//! a tensor that did not change since the last save) are stored once; small entries share
//! packs ([`Share`]). A checkpoint is a manifest of entries and their chunks
//! ([`Manifest`]), published last, whole or not at all, so a save that dies leaves nothing
//! half visible.
//!
//! A save, in one process or across the ranks of a group:
//! - [`CkptPath`] checks `STORE/NAME` once for every front;
//! - [`Share`] hashes a rank's state; its [`ShareTable`] travels to the other ranks;
//! - [`Saver`] plans on rank 0 who writes each new chunk ([`WritePlanner`], balancing the
//!   ranks' write bandwidths) and hands out the save's token;
//! - [`SaveJob`] stages and writes a rank's share ([`WriteJob`]) and commits
//!   ([`Commit`]: markers in the store, liveness locks, a deadline), removing what a
//!   failed save created.
//!
//! A load is a [`Fetch`] per rank; [`ReadPlan`] picks one reader per chunk of a group.
//! [`CkptStore`] lists, verifies, diffs and collects garbage. The front ends (Python,
//! the CLI) only convert and run the group's collectives. docs/design/ckpt.md explains
//! the design; docs/FORMATS.md the bytes.
//!
//! Imports point one way: `error`, `chunking`, `path`, `steps` ← `chunk_store`, `manifest`,
//! `share` ← `store` ← `planner`, `writer`, `fetch`, `commit`, `saver` ← `save`.

mod chunk_store;
mod chunking;
mod commit;
mod error;
mod fetch;
mod manifest;
mod object;
mod path;
mod planner;
mod save;
mod saver;
mod share;
mod steps;
mod store;
mod writer;

pub use chunk_store::ChunkStore;
pub use chunking::{chunk, hash_all, ChunkRef, Digest};
pub use commit::{Commit, STALE as HEARTBEAT_STALE};
pub use error::{ChunkDamage, CkptError};
pub use fetch::{decode_needs, encode_needs, Fetch, FetchReport, ReadPlan, Transfer};
pub use manifest::{Entry, EntryKind, Manifest, PackRef, MANIFEST_FILE};
pub use object::ObjectRoot;
pub use path::{check_name, check_store_path, is_url, CkptPath};
pub use planner::{PlanInput, WritePlan, WritePlanner};
pub use save::{totals, write_share, Replica, SaveJob, SaveOptions, SaveSummary};
pub use saver::{SavePlan, Saver, DEFAULT_BANDWIDTH};
pub use share::{
    manifest_of, pack_below, EntryHead, HostTask, Layout, Share, ShareTable, Source, StreamedTask,
};
#[cfg(any(test, feature = "testing"))]
pub use steps::FailAt;
pub use steps::{RealSteps, Step, StoreSteps};
pub use store::{
    diff, CheckpointInfo, CkptStore, Cleanup, DiffReport, GcReport, SaveItem, SaveReport,
    VerifyReport, DEFAULT_GRACE,
};
pub use writer::{JobReport, StagingPool, WriteJob, WriteTask};
