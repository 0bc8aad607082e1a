//! Sluice load plane: safetensors checkpoints into memory at the speed of
//! the device, with bounded memory.
//!
//! [`Loader::open`] reads and validates headers (a file, a directory, or a
//! sharded index). [`Loader::load_all`] reads everything; [`Loader::stream`]
//! yields windows of tensors as their reads land, under a memory limit.
//! The reads come from a [`ReadPlan`] that coalesces tensors into large
//! aligned windows and are run by an engine from `sluice-engine`.

mod checkpoint_reader;
mod config;
mod error;
mod loader;
mod object_engine;
mod open_checkpoint;
mod open_shards;
mod read_plan;
mod remote_reader;
mod shard_file;
mod tensor_stream;

pub use checkpoint_reader::{
    open_checkpoint_files, read_checkpoint, read_shard, CheckpointFiles, ReadOptions,
    INDEX_FILE_NAME,
};
pub use config::{LoadConfig, DEFAULT_STREAM_MEMORY_LIMIT};
pub use error::LoadError;
pub use loader::{FileMode, LoadStats, LoadedCheckpoint, Loader, INTO_GATHER_BYTES};
pub use object_engine::ObjectEngine;
pub use open_checkpoint::{OpenCheckpoint, TensorBytes};
pub use open_shards::open_shard_files;
pub use read_plan::{window_chunks, PlanOptions, PlannedTensor, ReadPlan, WindowPlan};
pub use remote_reader::is_remote;
pub use shard_file::{RemoteObject, ShardFile};
pub use sluice_engine::ConfigError;
pub use sluice_formats::parse_bytes;
pub use tensor_stream::{LoadedWindow, Polled, Progress, TensorStream, WindowMemory};
