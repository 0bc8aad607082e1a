//! Parsing and validating a safetensors header.
//!
//! A safetensors file is `[N: u64 little-endian][N bytes of UTF-8 JSON][data section]`.
//! The JSON is an object mapping tensor names to `{dtype, shape, data_offsets}` entries,
//! plus an optional `"__metadata__"` object of string to string. Offsets are relative to
//! the data section, which starts at file offset `8 + N` and runs to the end of the file.
//!
//! Validation happens in three passes, each with its own errors:
//!
//! 1. the prefix: the file holds the 8 prefix bytes, `N` is non-zero, at most
//!    [`MAX_HEADER_BYTES`], and `8 + N` fits in the file (computed without overflow);
//! 2. the JSON: UTF-8, syntax, an object at the top level, no duplicate tensor names
//!    (detected on a tree that keeps duplicate keys, see `json_tree`), no empty names,
//!    and each entry valid on its own (see `tensor_entry`);
//! 3. the layout: tensors are sorted by `(start, end, name)` and no two non-empty spans
//!    overlap.
//!
//! Gaps between tensors, a data section that does not start at offset 0, and trailing
//! bytes after the last tensor are *allowed*. The safetensors writer never produces them
//! and the reference reader refuses them, but they cannot make us return wrong bytes: every
//! tensor still reads exactly its own span. Being lenient here lets Sluice load files that
//! other tools padded or aligned. Empty tensors (a zero dimension) occupy no bytes, so they
//! never overlap anything, even when their offset lies inside another tensor.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use crate::error::{FormatError, JsonDocument};
use crate::json_tree::{excerpt, JsonTree};
use crate::tensor_entry::TensorEntry;
use crate::tensor_info::TensorInfo;

/// Largest header safetensors accepts. The reference implementation caps it at 100 MB so
/// that a corrupt or hostile length prefix cannot make a reader allocate gigabytes before
/// any validation; real headers are a few MB even for models with 100k tensors. We use the
/// same number so that every file safetensors reads, Sluice reads too.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Size of the little-endian `u64` header-length prefix.
pub const PREFIX_BYTES: u64 = 8;

/// The key under which a header keeps its free-form string metadata.
const METADATA_KEY: &str = "__metadata__";

/// A validated safetensors header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// `N`: the number of JSON bytes after the prefix.
    pub header_len: u64,
    /// File offset of the data section, `8 + N`.
    pub data_start: u64,
    /// Bytes from `data_start` to the end of the file.
    pub data_len: u64,
    /// Every tensor, sorted by `start`, then `end` (then name, for empty tensors that
    /// share an offset).
    pub tensors: Vec<TensorInfo>,
    /// The `__metadata__` object, if the header has one.
    pub metadata: Option<BTreeMap<String, String>>,
}

impl Header {
    /// The tensor called `name`. A linear scan: headers are small and loaders iterate
    /// `tensors` directly; build a map once if you need many lookups.
    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|tensor| tensor.name == name)
    }

    /// Sum of all tensors' byte lengths (saturating, for hand-built headers).
    pub fn total_tensor_bytes(&self) -> u64 {
        self.tensors.iter().fold(0u64, |total, tensor| {
            total.saturating_add(tensor.byte_len())
        })
    }
}

/// Validates the 8-byte prefix against the file size and returns `N`, the header length.
pub fn parse_header_len(file: &Path, prefix: &[u8], file_len: u64) -> Result<u64, FormatError> {
    if file_len < PREFIX_BYTES {
        return Err(FormatError::FileTooShort {
            file: file.to_path_buf(),
            file_len,
        });
    }
    let Some(prefix_bytes) = prefix
        .get(..8)
        .and_then(|bytes| <[u8; 8]>::try_from(bytes).ok())
    else {
        return Err(FormatError::PrefixTooShort {
            file: file.to_path_buf(),
            prefix_len: prefix.len(),
        });
    };
    let header_len = u64::from_le_bytes(prefix_bytes);
    data_len_after(file, header_len, file_len)?;
    Ok(header_len)
}

/// Parses and validates the header JSON (exactly the `N` bytes after the prefix) of a file
/// that is `file_len` bytes long.
pub fn parse_header(file: &Path, header_json: &[u8], file_len: u64) -> Result<Header, FormatError> {
    // usize is at most 64 bits on every supported target; saturate to stay panic-free.
    let header_len = u64::try_from(header_json.len()).unwrap_or(u64::MAX);
    let data_len = data_len_after(file, header_len, file_len)?;
    let entries = match JsonTree::parse(file, JsonDocument::Header, header_json)? {
        JsonTree::Object(entries) => entries,
        other => {
            let (file, document) = (file.to_path_buf(), JsonDocument::Header);
            let found = other.describe();
            return Err(FormatError::NotAnObject {
                file,
                document,
                found,
            });
        }
    };
    let (mut tensors, metadata) = decode_entries(file, entries, data_len)?;
    tensors.sort_by(|a, b| (a.start, a.end, &a.name).cmp(&(b.start, b.end, &b.name)));
    check_no_overlap(file, &tensors)?;
    Ok(Header {
        header_len,
        data_start: PREFIX_BYTES + header_len,
        data_len,
        tensors,
        metadata,
    })
}

/// Parses the header of a whole file held in memory (tests and fuzzing).
pub fn parse_file_bytes(file: &Path, bytes: &[u8]) -> Result<Header, FormatError> {
    let file_len = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    let header_len = parse_header_len(file, bytes, file_len)?;
    // parse_header_len proved 8 + N <= bytes.len(), so these conversions cannot fail;
    // fall back to the same error anyway rather than trusting that proof with a panic.
    let header_json = usize::try_from(header_len)
        .ok()
        .and_then(|len| bytes.get(8..8usize.checked_add(len)?))
        .ok_or_else(|| FormatError::HeaderExceedsFile {
            file: file.to_path_buf(),
            header_len,
            file_len,
        })?;
    parse_header(file, header_json, file_len)
}

/// Checks `N` against the limits and the file size; returns the data section length.
fn data_len_after(file: &Path, header_len: u64, file_len: u64) -> Result<u64, FormatError> {
    if header_len == 0 {
        return Err(FormatError::EmptyHeader {
            file: file.to_path_buf(),
        });
    }
    if header_len > MAX_HEADER_BYTES {
        return Err(FormatError::HeaderTooLarge {
            file: file.to_path_buf(),
            header_len,
            max_header_bytes: MAX_HEADER_BYTES,
        });
    }
    PREFIX_BYTES
        .checked_add(header_len)
        .and_then(|data_start| file_len.checked_sub(data_start))
        .ok_or_else(|| FormatError::HeaderExceedsFile {
            file: file.to_path_buf(),
            header_len,
            file_len,
        })
}

type DecodedEntries = (Vec<TensorInfo>, Option<BTreeMap<String, String>>);

/// Splits the top-level object into tensors and metadata, refusing duplicates.
fn decode_entries(
    file: &Path,
    entries: Vec<(String, JsonTree)>,
    data_len: u64,
) -> Result<DecodedEntries, FormatError> {
    let mut tensors = Vec::with_capacity(entries.len());
    let mut seen = HashSet::with_capacity(entries.len());
    let mut metadata = None;
    for (name, value) in &entries {
        if name == METADATA_KEY {
            if metadata.is_some() {
                let file = file.to_path_buf();
                return Err(FormatError::DuplicateMetadataSection { file });
            }
            metadata = Some(decode_metadata(file, value)?);
            continue;
        }
        if name.is_empty() {
            let file = file.to_path_buf();
            return Err(FormatError::EmptyTensorName { file });
        }
        if !seen.insert(name.as_str()) {
            let (file, tensor) = (file.to_path_buf(), name.clone());
            return Err(FormatError::DuplicateTensor { file, tensor });
        }
        tensors.push(TensorEntry::new(file, name).decode(value, data_len)?);
    }
    Ok((tensors, metadata))
}

/// `__metadata__` must be an object whose values are all strings.
fn decode_metadata(file: &Path, value: &JsonTree) -> Result<BTreeMap<String, String>, FormatError> {
    let JsonTree::Object(entries) = value else {
        let found = value.describe();
        return Err(FormatError::MetadataNotObject {
            file: file.to_path_buf(),
            found,
        });
    };
    let mut metadata = BTreeMap::new();
    for (key, value) in entries {
        let JsonTree::String(text) = value else {
            let (file, key, found) = (file.to_path_buf(), excerpt(key), value.describe());
            return Err(FormatError::MetadataValueNotString { file, key, found });
        };
        if metadata.contains_key(key) {
            let file = file.to_path_buf();
            return Err(FormatError::DuplicateMetadataKey {
                file,
                key: excerpt(key),
            });
        }
        metadata.insert(key.clone(), text.clone());
    }
    Ok(metadata)
}

/// With `tensors` sorted by start, a non-empty tensor overlaps an earlier one exactly when
/// it starts before the furthest end reached so far; that furthest tensor is named.
fn check_no_overlap(file: &Path, tensors: &[TensorInfo]) -> Result<(), FormatError> {
    let mut furthest: Option<&TensorInfo> = None;
    for tensor in tensors.iter().filter(|tensor| tensor.start < tensor.end) {
        if let Some(previous) = furthest {
            if tensor.start < previous.end {
                return Err(FormatError::OverlappingTensors {
                    file: file.to_path_buf(),
                    first: previous.name.clone(),
                    first_start: previous.start,
                    first_end: previous.end,
                    second: tensor.name.clone(),
                    second_start: tensor.start,
                    second_end: tensor.end,
                });
            }
        }
        // No overlap means `tensor.start >= previous.end`, so it now reaches furthest.
        furthest = Some(tensor);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::Dtype;

    const FILE: &str = "model.safetensors";

    /// A file made of the prefix, `json` as the header, and `data_len` zero bytes.
    fn file_bytes(json: &str, data_len: usize) -> Vec<u8> {
        let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(json.as_bytes());
        bytes.resize(bytes.len() + data_len, 0);
        bytes
    }

    fn parse(json: &str, data_len: usize) -> Result<Header, FormatError> {
        parse_file_bytes(Path::new(FILE), &file_bytes(json, data_len))
    }

    fn entry(dtype: &str, shape: &str, start: u64, end: u64) -> String {
        format!(r#"{{"dtype":"{dtype}","shape":{shape},"data_offsets":[{start},{end}]}}"#)
    }

    #[test]
    fn parses_valid_file_sorted_by_offset() {
        let json = format!(
            r#"{{"b":{},"a":{},"__metadata__":{{"format":"pt"}}}}"#,
            entry("F32", "[2]", 8, 16),
            entry("BF16", "[2,2]", 0, 8)
        );
        let header = parse(&json, 16).unwrap();
        assert_eq!(header.header_len, json.len() as u64);
        assert_eq!(header.data_start, 8 + json.len() as u64);
        assert_eq!(header.data_len, 16);
        let names: Vec<&str> = header.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(header.get("b").map(|t| t.dtype), Some(Dtype::F32));
        assert_eq!(header.get("missing"), None);
        assert_eq!(header.total_tensor_bytes(), 16);
        let metadata = header.metadata.unwrap();
        assert_eq!(metadata.get("format").map(String::as_str), Some("pt"));
    }

    #[test]
    fn accepts_empty_object_and_space_padding() {
        let header = parse("{}      ", 0).unwrap();
        assert!(header.tensors.is_empty());
        assert_eq!(header.metadata, None);
    }

    #[test]
    fn rejects_file_shorter_than_prefix() {
        let err = parse_file_bytes(Path::new(FILE), &[1, 0, 0]).unwrap_err();
        assert!(
            matches!(err, FormatError::FileTooShort { file_len: 3, .. }),
            "{err}"
        );
    }

    #[test]
    fn rejects_prefix_slice_shorter_than_eight_bytes() {
        let err = parse_header_len(Path::new(FILE), &[2, 0], 100).unwrap_err();
        assert!(
            matches!(err, FormatError::PrefixTooShort { prefix_len: 2, .. }),
            "{err}"
        );
    }

    #[test]
    fn rejects_header_larger_than_the_safetensors_limit() {
        let prefix = (MAX_HEADER_BYTES + 1).to_le_bytes();
        let err = parse_header_len(Path::new(FILE), &prefix, u64::MAX).unwrap_err();
        assert!(matches!(err, FormatError::HeaderTooLarge { .. }), "{err}");
        let err = parse_header_len(Path::new(FILE), &u64::MAX.to_le_bytes(), 16).unwrap_err();
        assert!(matches!(err, FormatError::HeaderTooLarge { .. }), "{err}");
    }

    #[test]
    fn rejects_header_longer_than_file() {
        let prefix = 100u64.to_le_bytes();
        let err = parse_header_len(Path::new(FILE), &prefix, 107).unwrap_err();
        assert!(
            matches!(
                err,
                FormatError::HeaderExceedsFile {
                    header_len: 100,
                    file_len: 107,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(parse_header_len(Path::new(FILE), &prefix, 108), Ok(100));
    }

    #[test]
    fn rejects_header_json_longer_than_file() {
        let err = parse_header(Path::new(FILE), b"{}", 9).unwrap_err();
        assert!(
            matches!(err, FormatError::HeaderExceedsFile { .. }),
            "{err}"
        );
    }

    #[test]
    fn rejects_zero_length_header() {
        let err = parse_file_bytes(Path::new(FILE), &[0; 8]).unwrap_err();
        assert!(matches!(err, FormatError::EmptyHeader { .. }), "{err}");
    }

    #[test]
    fn rejects_header_that_is_not_utf8_and_gives_the_offset() {
        let mut bytes = file_bytes(r#"{"ab": 1}"#, 0);
        bytes[8 + 3] = 0xC3; // a lone UTF-8 lead byte inside the key
        let err = parse_file_bytes(Path::new(FILE), &bytes).unwrap_err();
        assert!(
            matches!(
                err,
                FormatError::NotUtf8 {
                    byte_offset: 3,
                    document: JsonDocument::Header,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn rejects_invalid_json_with_line_and_column() {
        let err = parse("{\"a\": {\"dtype\": }", 0).unwrap_err();
        assert!(
            matches!(err, FormatError::InvalidJson { line: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn rejects_top_level_value_that_is_not_an_object() {
        for json in ["[]", "\"x\"", "3", "null"] {
            let err = parse(json, 0).unwrap_err();
            assert!(
                matches!(err, FormatError::NotAnObject { .. }),
                "{json}: {err}"
            );
        }
    }

    #[test]
    fn rejects_duplicate_tensor_names() {
        let e = entry("U8", "[1]", 0, 1);
        let err = parse(&format!(r#"{{"w":{e},"w":{e}}}"#), 1).unwrap_err();
        assert!(
            matches!(&err, FormatError::DuplicateTensor { tensor, .. } if tensor == "w"),
            "{err}"
        );
    }

    #[test]
    fn rejects_two_metadata_sections() {
        let err = parse(r#"{"__metadata__":{},"__metadata__":{}}"#, 0).unwrap_err();
        assert!(
            matches!(err, FormatError::DuplicateMetadataSection { .. }),
            "{err}"
        );
    }

    #[test]
    fn rejects_empty_tensor_name() {
        let err = parse(&format!(r#"{{"":{}}}"#, entry("U8", "[1]", 0, 1)), 1).unwrap_err();
        assert!(matches!(err, FormatError::EmptyTensorName { .. }), "{err}");
    }

    #[test]
    fn rejects_metadata_that_is_not_an_object() {
        let err = parse(r#"{"__metadata__":["a"]}"#, 0).unwrap_err();
        assert!(
            matches!(err, FormatError::MetadataNotObject { .. }),
            "{err}"
        );
        let err = parse(r#"{"__metadata__":null}"#, 0).unwrap_err();
        assert!(
            matches!(err, FormatError::MetadataNotObject { .. }),
            "{err}"
        );
    }

    #[test]
    fn rejects_metadata_value_that_is_not_a_string_and_names_the_key() {
        let err = parse(r#"{"__metadata__":{"ok":"x","step":5}}"#, 0).unwrap_err();
        assert!(
            matches!(&err, FormatError::MetadataValueNotString { key, found, .. } if key == "step" && found == "5"),
            "{err}"
        );
    }

    #[test]
    fn rejects_duplicate_metadata_key() {
        let err = parse(r#"{"__metadata__":{"k":"a","k":"b"}}"#, 0).unwrap_err();
        assert!(
            matches!(&err, FormatError::DuplicateMetadataKey { key, .. } if key == "k"),
            "{err}"
        );
    }

    #[test]
    fn rejects_overlapping_tensors_and_names_both() {
        let json = format!(
            r#"{{"a":{},"b":{},"c":{}}}"#,
            entry("U8", "[8]", 0, 8),
            entry("U8", "[4]", 8, 12),
            entry("U8", "[4]", 6, 10)
        );
        let err = parse(&json, 12).unwrap_err();
        let FormatError::OverlappingTensors { first, second, .. } = &err else {
            panic!("expected overlap, got {err}");
        };
        assert_eq!((first.as_str(), second.as_str()), ("a", "c"));
    }

    #[test]
    fn rejects_tensor_nested_inside_a_longer_one() {
        let json = format!(
            r#"{{"outer":{},"inner":{}}}"#,
            entry("U8", "[10]", 0, 10),
            entry("U8", "[2]", 4, 6)
        );
        assert!(matches!(
            parse(&json, 10),
            Err(FormatError::OverlappingTensors { .. })
        ));
    }

    #[test]
    fn rejects_identical_spans() {
        let e = entry("U16", "[2]", 0, 4);
        let err = parse(&format!(r#"{{"a":{e},"b":{e}}}"#), 4).unwrap_err();
        assert!(
            matches!(err, FormatError::OverlappingTensors { .. }),
            "{err}"
        );
    }

    #[test]
    fn allows_gaps_and_trailing_bytes() {
        let json = format!(
            r#"{{"a":{},"b":{}}}"#,
            entry("U8", "[4]", 4, 8),
            entry("U8", "[4]", 16, 20)
        );
        let header = parse(&json, 64).unwrap();
        assert_eq!(header.data_len, 64);
        assert_eq!(header.total_tensor_bytes(), 8);
    }

    #[test]
    fn empty_tensors_never_overlap() {
        let json = format!(
            r#"{{"a":{},"e1":{},"e2":{},"e3":{}}}"#,
            entry("U8", "[8]", 0, 8),
            entry("F32", "[0]", 8, 8),
            entry("F32", "[0, 3]", 8, 8),
            entry("F32", "[0]", 4, 4)
        );
        let header = parse(&json, 8).unwrap();
        let names: Vec<&str> = header.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a", "e3", "e1", "e2"]);
    }

    #[test]
    fn tensor_errors_name_the_file() {
        let json = format!(r#"{{"w":{}}}"#, entry("U8", "[9]", 0, 9));
        let err = parse(&json, 8).unwrap_err();
        assert_eq!(err.file(), Path::new(FILE));
        assert!(err
            .to_string()
            .starts_with("model.safetensors: tensor 'w' ends at byte 9"));
    }
}
