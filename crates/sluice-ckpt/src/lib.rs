//! The checkpoint plane of Sluice: grouped checkpoint I/O with content dedup.
//!
//! A store is a directory of checkpoints that share one pool of content-addressed chunks
//! ([`chunk_store`]): every tensor is cut into chunks named by their BLAKE3 digest
//! ([`chunking`]), so bytes that repeat (across data-parallel ranks, tied weights, zeros,
//! or a tensor that did not change since the last save) are stored once. A checkpoint is a
//! manifest of entries and their chunks ([`manifest`]), published last, whole or not at
//! all, so a save that dies leaves nothing half visible. For a grouped save, [`planner`]
//! decides which rank writes each new chunk, balancing the ranks' write bandwidths.
//! [`store`] ties them together: save, load, list, verify, diff and garbage collection.
//! docs/design/ckpt.md explains the design; docs/FORMATS.md the bytes.

pub mod chunk_store;
pub mod chunking;
pub mod error;
pub mod manifest;
pub mod planner;
pub mod store;
pub mod writer;

pub use chunk_store::ChunkStore;
pub use chunking::{chunk, ChunkRef, Digest};
pub use error::CkptError;
pub use manifest::{Entry, EntryKind, Manifest};
pub use planner::{PlanInput, WritePlan, WritePlanner};
pub use store::{
    diff, CheckpointInfo, CkptStore, DiffReport, GcReport, SaveItem, SaveReport, VerifyReport,
};
pub use writer::{JobReport, StagingPool, WriteJob, WriteTask};
