//! The one error type of the formats layer.
//!
//! Every variant names the `file` it is about (the `.safetensors` shard, or the
//! `model.safetensors.index.json` for index and cross-shard problems) and, where one is
//! involved, the tensor and the offending value, so a message can be acted on without a
//! debugger: "model-00002.safetensors: tensor 'lm_head.weight' ends at byte 1048576 but the
//! data section holds 1048000 bytes".

use std::fmt;
use std::path::{Path, PathBuf};

use crate::dtype::Dtype;

/// Which kind of JSON document a JSON-level error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonDocument {
    /// The JSON header of a `.safetensors` file.
    Header,
    /// A sharded checkpoint's `model.safetensors.index.json`.
    Index,
}

impl fmt::Display for JsonDocument {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            JsonDocument::Header => "safetensors header",
            JsonDocument::Index => "shard index",
        })
    }
}

/// Why a shard file name from an index was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnsafeShardReason {
    /// The name is the empty string.
    Empty,
    /// The name is an absolute path (`/x`, `\x`, `C:x`).
    Absolute,
    /// A path component is `..`, which could escape the checkpoint directory.
    ParentComponent,
    /// The name contains a NUL byte, which no file system path can hold.
    ContainsNul,
}

impl fmt::Display for UnsafeShardReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UnsafeShardReason::Empty => "is empty",
            UnsafeShardReason::Absolute => "is an absolute path",
            UnsafeShardReason::ParentComponent => "contains a '..' component",
            UnsafeShardReason::ContainsNul => "contains a NUL byte",
        })
    }
}

/// A violation of the safetensors format, the shard index format, or checkpoint
/// consistency.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    // ---- the 8-byte prefix ----
    #[error("{}: file is {file_len} bytes, shorter than the 8-byte header-length prefix", .file.display())]
    FileTooShort { file: PathBuf, file_len: u64 },

    #[error("{}: only {prefix_len} prefix bytes were supplied; the header length needs 8", .file.display())]
    PrefixTooShort { file: PathBuf, prefix_len: usize },

    #[error("{}: header length {header_len} exceeds the safetensors limit of {max_header_bytes} bytes (corrupt prefix or not a safetensors file)", .file.display())]
    HeaderTooLarge {
        file: PathBuf,
        header_len: u64,
        max_header_bytes: u64,
    },

    #[error("{}: header claims {header_len} bytes after the 8-byte prefix but the file is only {file_len} bytes (truncated file?)", .file.display())]
    HeaderExceedsFile {
        file: PathBuf,
        header_len: u64,
        file_len: u64,
    },

    #[error("{}: header length is 0; a safetensors header must be a JSON object", .file.display())]
    EmptyHeader { file: PathBuf },

    // ---- JSON syntax, shared by headers and indexes ----
    #[error("{}: {document} is not valid UTF-8 at byte {byte_offset} of the JSON text", .file.display())]
    NotUtf8 {
        file: PathBuf,
        document: JsonDocument,
        byte_offset: usize,
    },

    #[error("{}: {document} is not valid JSON at line {line}, column {column}: {message}", .file.display())]
    InvalidJson {
        file: PathBuf,
        document: JsonDocument,
        line: usize,
        column: usize,
        message: String,
    },

    #[error("{}: {document} must be a JSON object, found {found}", .file.display())]
    NotAnObject {
        file: PathBuf,
        document: JsonDocument,
        found: String,
    },

    // ---- header entries ----
    #[error("{}: '__metadata__' appears twice in the header", .file.display())]
    DuplicateMetadataSection { file: PathBuf },

    #[error("{}: tensor '{tensor}' must be a JSON object with dtype, shape and data_offsets (or the array [dtype, shape, data_offsets]), found {found}", .file.display())]
    InvalidTensorEntry {
        file: PathBuf,
        tensor: String,
        found: String,
    },

    #[error("{}: tensor '{tensor}' has field '{field}' twice", .file.display())]
    DuplicateTensorField {
        file: PathBuf,
        tensor: String,
        field: String,
    },

    #[error("{}: tensor '{tensor}' is missing field '{field}'", .file.display())]
    MissingTensorField {
        file: PathBuf,
        tensor: String,
        field: &'static str,
    },

    #[error("{}: tensor '{tensor}' field '{field}' must be {expected}, found {found}", .file.display())]
    InvalidTensorField {
        file: PathBuf,
        tensor: String,
        field: &'static str,
        expected: &'static str,
        found: String,
    },

    #[error("{}: tensor '{tensor}' has unknown dtype '{dtype}'", .file.display())]
    UnknownDtype {
        file: PathBuf,
        tensor: String,
        dtype: String,
    },

    #[error("{}: tensor '{tensor}' of shape {shape:?} and dtype {dtype} has a size that overflows 64 bits", .file.display())]
    TensorSizeOverflow {
        file: PathBuf,
        tensor: String,
        dtype: Dtype,
        shape: Vec<u64>,
    },

    #[error("{}: tensor '{tensor}' of shape {shape:?} and dtype {dtype} has no elements, but its non-zero dimensions multiply past 2^63-1 elements or bytes, more than numpy or torch can describe", .file.display())]
    ShapeTooLarge {
        file: PathBuf,
        tensor: String,
        dtype: Dtype,
        shape: Vec<u64>,
    },

    #[error("{}: tensor '{tensor}' has {elements} {dtype} elements = {total_bits} bits, not a whole number of bytes", .file.display())]
    PartialByteTensor {
        file: PathBuf,
        tensor: String,
        dtype: Dtype,
        elements: u64,
        total_bits: u64,
    },

    #[error("{}: tensor '{tensor}' has data_offsets [{start}, {end}] with start after end", .file.display())]
    InvertedOffsets {
        file: PathBuf,
        tensor: String,
        start: u64,
        end: u64,
    },

    #[error("{}: tensor '{tensor}' ({dtype}, shape {shape:?}) needs {expected_bytes} bytes but data_offsets [{start}, {end}] span {} bytes", .file.display(), span_len(.start, .end))]
    TensorSizeMismatch {
        file: PathBuf,
        tensor: String,
        dtype: Dtype,
        shape: Vec<u64>,
        expected_bytes: u64,
        start: u64,
        end: u64,
    },

    #[error("{}: tensor '{tensor}' ends at byte {end} but the data section holds {data_len} bytes (truncated file?)", .file.display())]
    TensorOutOfBounds {
        file: PathBuf,
        tensor: String,
        end: u64,
        data_len: u64,
    },

    #[error("{}: tensors '{first}' [{first_start}, {first_end}) and '{second}' [{second_start}, {second_end}) overlap (each tensor must start where the one before it ends)", .file.display())]
    OverlappingTensors {
        file: PathBuf,
        first: String,
        first_start: u64,
        first_end: u64,
        second: String,
        second_start: u64,
        second_end: u64,
    },

    #[error("{}: tensor '{tensor}' starts at byte {start} of the data section, leaving bytes [{expected}, {start}) that belong to no tensor (safetensors forbids gaps)", .file.display())]
    TensorGap {
        file: PathBuf,
        tensor: String,
        start: u64,
        expected: u64,
    },

    #[error("{}: the data section holds {data_len} bytes but its tensors end at byte {covered}: bytes [{covered}, {data_len}) belong to no tensor (safetensors forbids trailing bytes)", .file.display())]
    TrailingBytes {
        file: PathBuf,
        covered: u64,
        data_len: u64,
    },

    // ---- __metadata__ ----
    #[error("{}: '__metadata__' must be null or an object of string values, found {found}", .file.display())]
    MetadataNotObject { file: PathBuf, found: String },

    #[error("{}: '__metadata__' key '{key}' must have a string value, found {found}", .file.display())]
    MetadataValueNotString {
        file: PathBuf,
        key: String,
        found: String,
    },

    // ---- shard index ----
    #[error("{}: key '{key}' appears twice in {location}", .file.display())]
    IndexDuplicateKey {
        file: PathBuf,
        location: String,
        key: String,
    },

    #[error("{}: shard index has no 'weight_map'", .file.display())]
    IndexMissingWeightMap { file: PathBuf },

    #[error("{}: 'weight_map' must be an object of tensor name to shard file, found {found}", .file.display())]
    IndexWeightMapNotObject { file: PathBuf, found: String },

    #[error("{}: 'weight_map' entry for tensor '{tensor}' must be a shard file name string, found {found}", .file.display())]
    IndexShardNotString {
        file: PathBuf,
        tensor: String,
        found: String,
    },

    #[error("{}: shard file name {shard:?} for tensor '{tensor}' {reason}; refusing to open it", .file.display())]
    UnsafeShardName {
        file: PathBuf,
        tensor: String,
        shard: String,
        reason: UnsafeShardReason,
    },

    #[error("{}: index 'metadata' must be an object, found {found}", .file.display())]
    IndexMetadataNotObject { file: PathBuf, found: String },

    // ---- checkpoint consistency ----
    #[error("{}: checkpoint has no shards", .file.display())]
    NoShards { file: PathBuf },

    #[error("{}: shard is listed twice", .file.display())]
    DuplicateShard { file: PathBuf },

    #[error("{}: index names shard '{shard}' but it was not supplied", .file.display())]
    ShardMissing { file: PathBuf, shard: String },

    #[error("{}: shard {} is not named by the index", .file.display(), .shard.display())]
    ShardNotInIndex { file: PathBuf, shard: PathBuf },

    #[error("{}: tensor '{tensor}' is also in {}", .file.display(), .other_file.display())]
    DuplicateTensorAcrossShards {
        file: PathBuf,
        tensor: String,
        other_file: PathBuf,
    },

    #[error("{}: index places tensor '{tensor}' in shard '{shard}' but that shard does not contain it", .file.display())]
    TensorMissingFromShard {
        file: PathBuf,
        tensor: String,
        shard: String,
    },

    #[error("{}: index places tensor '{tensor}' in shard '{expected_shard}' but it is in {}", .file.display(), .actual_shard.display())]
    TensorInWrongShard {
        file: PathBuf,
        tensor: String,
        expected_shard: String,
        actual_shard: PathBuf,
    },

    #[error("{}: tensor '{tensor}' is not listed in the index {}", .file.display(), .index.display())]
    TensorNotInIndex {
        file: PathBuf,
        tensor: String,
        index: PathBuf,
    },
}

/// Length of `[start, end)` for messages; saturates so a hand-built error cannot panic.
fn span_len(start: &u64, end: &u64) -> u64 {
    end.saturating_sub(*start)
}

impl FormatError {
    /// The file the error is about: a shard, or the index for index-level problems.
    pub fn file(&self) -> &Path {
        use FormatError::*;
        match self {
            FileTooShort { file, .. }
            | PrefixTooShort { file, .. }
            | HeaderTooLarge { file, .. }
            | HeaderExceedsFile { file, .. }
            | EmptyHeader { file }
            | NotUtf8 { file, .. }
            | InvalidJson { file, .. }
            | NotAnObject { file, .. }
            | DuplicateMetadataSection { file }
            | InvalidTensorEntry { file, .. }
            | DuplicateTensorField { file, .. }
            | MissingTensorField { file, .. }
            | InvalidTensorField { file, .. }
            | UnknownDtype { file, .. }
            | TensorSizeOverflow { file, .. }
            | ShapeTooLarge { file, .. }
            | PartialByteTensor { file, .. }
            | InvertedOffsets { file, .. }
            | TensorSizeMismatch { file, .. }
            | TensorOutOfBounds { file, .. }
            | OverlappingTensors { file, .. }
            | TensorGap { file, .. }
            | TrailingBytes { file, .. }
            | MetadataNotObject { file, .. }
            | MetadataValueNotString { file, .. }
            | IndexDuplicateKey { file, .. }
            | IndexMissingWeightMap { file }
            | IndexWeightMapNotObject { file, .. }
            | IndexShardNotString { file, .. }
            | UnsafeShardName { file, .. }
            | IndexMetadataNotObject { file, .. }
            | NoShards { file }
            | DuplicateShard { file }
            | ShardMissing { file, .. }
            | ShardNotInIndex { file, .. }
            | DuplicateTensorAcrossShards { file, .. }
            | TensorMissingFromShard { file, .. }
            | TensorInWrongShard { file, .. }
            | TensorNotInIndex { file, .. } => file,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_bounds_message_names_file_tensor_and_sizes() {
        let err = FormatError::TensorOutOfBounds {
            file: PathBuf::from("model-00002.safetensors"),
            tensor: "lm_head.weight".into(),
            end: 1_048_576,
            data_len: 1_048_000,
        };
        assert_eq!(
            err.to_string(),
            "model-00002.safetensors: tensor 'lm_head.weight' ends at byte 1048576 \
             but the data section holds 1048000 bytes (truncated file?)"
        );
        assert_eq!(err.file(), Path::new("model-00002.safetensors"));
    }

    #[test]
    fn size_mismatch_message_reports_span_without_overflow() {
        let err = FormatError::TensorSizeMismatch {
            file: PathBuf::from("a.safetensors"),
            tensor: "w".into(),
            dtype: Dtype::F32,
            shape: vec![2, 3],
            expected_bytes: 24,
            start: 0,
            end: 20,
        };
        assert!(err.to_string().contains("needs 24 bytes"));
        assert!(err.to_string().contains("span 20 bytes"));
    }
}
