//! The formats layer of Sluice: pure parsing and validation of safetensors checkpoints and
//! of the warm I/O templates Sluice writes itself.
//!
//! Nothing here touches the file system or a clock. Callers read bytes and file sizes
//! themselves and hand them in; this crate turns them into validated descriptions:
//!
//! - [`parse_header_len`] and [`parse_header`] check the 8-byte prefix and the JSON header
//!   of one `.safetensors` file and return a [`Header`] whose tensor spans are known to tile
//!   its data section exactly (inside the file, no overlaps, gaps or trailing bytes), by
//!   the rules of the `safetensors` package;
//! - [`parse_index`] reads a `model.safetensors.index.json` into a [`ShardIndex`], refusing
//!   shard names that could escape the checkpoint directory;
//! - [`Checkpoint`] joins validated shards (and, for sharded checkpoints, the index) and
//!   checks that every tensor lives in exactly one place;
//! - [`template`] holds `sluice warm`'s MAIO I/O templates and their `.sluicetpl` codec:
//!   [`template::Template::encode`] and [`template::Template::decode`] over byte slices.
//!
//! Every safetensors failure is a [`FormatError`] naming the file, the tensor and the
//! offending value; every template failure a [`template::TemplateFormatError`] naming the
//! field, its byte offset and the value.
//! No input, however hostile, makes these functions panic or read out of bounds; the
//! property tests and the fuzz targets in `fuzz/` hold us to that.

mod byte_size;
mod checkpoint;
mod dtype;
mod error;
mod header;
mod index;
mod json_tree;
mod tensor_entry;
mod tensor_info;

pub mod kv;
pub mod kv_summary;
pub mod kv_wire;
pub mod template;

pub use byte_size::parse_bytes;
pub use checkpoint::{Checkpoint, CheckpointSource, Shard};
pub use dtype::Dtype;
pub use error::{FormatError, JsonDocument, UnsafeShardReason};
pub use header::{
    parse_file_bytes, parse_header, parse_header_len, Header, MAX_HEADER_BYTES, PREFIX_BYTES,
};
pub use index::{parse_index, ShardIndex};
pub use tensor_info::TensorInfo;
