//! Parsing and validating a safetensors header.
//!
//! A safetensors file is `[N: u64 little-endian][N bytes of UTF-8 JSON][data section]`.
//! The JSON is an object mapping tensor names to `{dtype, shape, data_offsets}` entries,
//! plus an optional `"__metadata__"` object of string to string. Offsets are relative to
//! the data section, which starts at file offset `8 + N` and runs to the end of the file.
//!
//! The rules are those of the `safetensors` package (0.8), so that Sluice opens exactly
//! the files it opens; `docs/design/loader.md` tabulates them, and
//! `python/tests/test_header_parity.py` checks them against the package. Validation
//! happens in three passes, each with its own errors:
//!
//! 1. the prefix: the file holds the 8 prefix bytes, `N` is non-zero, at most
//!    [`MAX_HEADER_BYTES`], and `8 + N` fits in the file (computed without overflow);
//! 2. the JSON: UTF-8, syntax (whitespace may pad it, nothing else may), an object at the
//!    top level, `__metadata__` at most once, and each tensor entry typed (see
//!    `tensor_entry`). Like any serde map, a name given twice keeps its last entry; the
//!    earlier ones must still be well-typed, and are then dropped. Any string is a tensor
//!    name, the empty string included;
//! 3. the layout: each kept entry's own arithmetic (see `tensor_entry`), then, with the
//!    tensors sorted by `(start, end, name)`, the spans tile the data section exactly: the
//!    first starts at 0, each starts where the one before it ends, and the last ends at
//!    the end of the file. So there are no overlaps, no gaps and no trailing bytes. An
//!    empty tensor occupies no bytes, and may sit at any boundary between tensors, but
//!    not inside one.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use crate::error::{FormatError, JsonDocument};
use crate::json_tree::{excerpt, JsonTree};
use crate::tensor_entry::{ParsedEntry, TensorEntry};
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
    check_layout(file, &tensors, data_len)?;
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

/// Splits the top-level object into tensors and metadata. Every entry is typed; of
/// entries with the same name only the last is kept and checked, as in safetensors.
fn decode_entries(
    file: &Path,
    entries: Vec<(String, JsonTree)>,
    data_len: u64,
) -> Result<DecodedEntries, FormatError> {
    let mut parsed: Vec<(&str, ParsedEntry)> = Vec::with_capacity(entries.len());
    let mut position: HashMap<&str, usize> = HashMap::with_capacity(entries.len());
    let mut metadata = None;
    let mut metadata_seen = false;
    for (name, value) in &entries {
        if name == METADATA_KEY {
            if metadata_seen {
                let file = file.to_path_buf();
                return Err(FormatError::DuplicateMetadataSection { file });
            }
            metadata_seen = true;
            metadata = decode_metadata(file, value)?;
            continue;
        }
        let entry = TensorEntry::new(file, name).parse(value)?;
        match position.get(name.as_str()) {
            Some(&earlier) => parsed[earlier].1 = entry,
            None => {
                position.insert(name, parsed.len());
                parsed.push((name, entry));
            }
        }
    }
    let tensors = parsed
        .into_iter()
        .map(|(name, entry)| TensorEntry::new(file, name).check(entry, data_len))
        .collect::<Result<_, _>>()?;
    Ok((tensors, metadata))
}

/// `__metadata__` is null (no metadata) or an object whose values are all strings; a key
/// given twice keeps its last value.
fn decode_metadata(
    file: &Path,
    value: &JsonTree,
) -> Result<Option<BTreeMap<String, String>>, FormatError> {
    let entries = match value {
        JsonTree::Null => return Ok(None),
        JsonTree::Object(entries) => entries,
        _ => {
            let found = value.describe();
            return Err(FormatError::MetadataNotObject {
                file: file.to_path_buf(),
                found,
            });
        }
    };
    let mut metadata = BTreeMap::new();
    for (key, value) in entries {
        let JsonTree::String(text) = value else {
            let (file, key, found) = (file.to_path_buf(), excerpt(key), value.describe());
            return Err(FormatError::MetadataValueNotString { file, key, found });
        };
        metadata.insert(key.clone(), text.clone());
    }
    Ok(Some(metadata))
}

/// With `tensors` sorted by `(start, end)`, the spans must tile `[0, data_len)`. Overlaps
/// are looked for first, as the more specific complaint: a tensor that starts before the
/// one before it ends. Then gaps, and bytes after the last tensor.
fn check_layout(file: &Path, tensors: &[TensorInfo], data_len: u64) -> Result<(), FormatError> {
    // Without overlaps, ends never decrease, so the tensor before reaches furthest.
    for pair in tensors.windows(2) {
        let (previous, tensor) = (&pair[0], &pair[1]);
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
    let mut covered = 0;
    for tensor in tensors {
        if tensor.start != covered {
            return Err(FormatError::TensorGap {
                file: file.to_path_buf(),
                tensor: tensor.name.clone(),
                start: tensor.start,
                expected: covered,
            });
        }
        covered = tensor.end;
    }
    if covered != data_len {
        return Err(FormatError::TrailingBytes {
            file: file.to_path_buf(),
            covered,
            data_len,
        });
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
    fn a_repeated_tensor_name_keeps_the_last_entry_as_safetensors_does() {
        let json = format!(
            r#"{{"w":{},"w":{}}}"#,
            entry("F32", "[1]", 0, 4),
            entry("U8", "[4]", 0, 4)
        );
        let header = parse(&json, 4).unwrap();
        assert_eq!(header.tensors.len(), 1);
        assert_eq!(header.get("w").map(|t| t.dtype), Some(Dtype::U8));
        // The dropped entry's arithmetic is never checked...
        let json = format!(
            r#"{{"w":{},"w":{}}}"#,
            entry("U8", "[9]", 99, 1),
            entry("U8", "[4]", 0, 4)
        );
        assert_eq!(parse(&json, 4).unwrap().tensors.len(), 1);
        // ...but its types are, and its bytes count for nothing: here they are a gap.
        let json = format!(
            r#"{{"w":{},"w":{}}}"#,
            entry("F12", "[4]", 0, 4),
            entry("U8", "[4]", 0, 4)
        );
        let err = parse(&json, 4).unwrap_err();
        assert!(matches!(err, FormatError::UnknownDtype { .. }), "{err}");
        let json = format!(
            r#"{{"w":{},"w":{}}}"#,
            entry("U8", "[4]", 0, 4),
            entry("U8", "[4]", 4, 8)
        );
        let err = parse(&json, 8).unwrap_err();
        assert!(
            matches!(&err, FormatError::TensorGap { tensor, start: 4, expected: 0, .. } if tensor == "w"),
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
    fn accepts_empty_tensor_name_as_safetensors_does() {
        let header = parse(&format!(r#"{{"":{}}}"#, entry("U8", "[1]", 0, 1)), 1).unwrap();
        assert_eq!(header.tensors[0].name, "");
    }

    #[test]
    fn rejects_metadata_that_is_neither_null_nor_an_object() {
        for json in [r#"{"__metadata__":["a"]}"#, r#"{"__metadata__":"pt"}"#] {
            let err = parse(json, 0).unwrap_err();
            assert!(
                matches!(err, FormatError::MetadataNotObject { .. }),
                "{json}: {err}"
            );
        }
    }

    #[test]
    fn null_metadata_is_no_metadata_as_in_safetensors() {
        assert_eq!(parse(r#"{"__metadata__":null}"#, 0).unwrap().metadata, None);
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
    fn a_repeated_metadata_key_keeps_the_last_value_as_safetensors_does() {
        let metadata = parse(r#"{"__metadata__":{"k":"a","k":"b"}}"#, 0)
            .unwrap()
            .metadata
            .unwrap();
        assert_eq!(metadata.get("k").map(String::as_str), Some("b"));
        let err = parse(r#"{"__metadata__":{"k":1,"k":"b"}}"#, 0).unwrap_err();
        assert!(
            matches!(err, FormatError::MetadataValueNotString { .. }),
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
    fn rejects_data_that_does_not_start_at_offset_zero() {
        let json = format!(r#"{{"a":{}}}"#, entry("U8", "[4]", 4, 8));
        let err = parse(&json, 8).unwrap_err();
        assert!(
            matches!(&err, FormatError::TensorGap { tensor, start: 4, expected: 0, .. } if tensor == "a"),
            "{err}"
        );
        assert!(err.to_string().contains("bytes [0, 4)"), "{err}");
    }

    #[test]
    fn rejects_a_gap_between_tensors_and_names_the_tensor_after_it() {
        let json = format!(
            r#"{{"a":{},"b":{}}}"#,
            entry("U8", "[4]", 0, 4),
            entry("U8", "[4]", 16, 20)
        );
        let err = parse(&json, 20).unwrap_err();
        assert!(
            matches!(&err, FormatError::TensorGap { tensor, start: 16, expected: 4, .. } if tensor == "b"),
            "{err}"
        );
    }

    #[test]
    fn rejects_trailing_bytes_after_the_last_tensor() {
        let json = format!(r#"{{"a":{}}}"#, entry("U8", "[4]", 0, 4));
        let err = parse(&json, 5).unwrap_err();
        assert!(
            matches!(
                err,
                FormatError::TrailingBytes {
                    covered: 4,
                    data_len: 5,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().starts_with("model.safetensors: "), "{err}");
        let err = parse("{}", 1).unwrap_err();
        assert!(
            matches!(err, FormatError::TrailingBytes { covered: 0, .. }),
            "{err}"
        );
    }

    #[test]
    fn an_overlap_is_reported_before_the_gap_it_leaves() {
        // b moved into a leaves [8, 12) uncovered; the overlap is the one to report.
        let json = format!(
            r#"{{"a":{},"b":{},"c":{}}}"#,
            entry("U8", "[8]", 0, 8),
            entry("U8", "[4]", 2, 6),
            entry("U8", "[4]", 12, 16)
        );
        let err = parse(&json, 16).unwrap_err();
        assert!(
            matches!(err, FormatError::OverlappingTensors { .. }),
            "{err}"
        );
    }

    #[test]
    fn empty_tensors_may_sit_at_any_boundary() {
        let json = format!(
            r#"{{"a":{},"e1":{},"e2":{},"e3":{},"b":{}}}"#,
            entry("U8", "[4]", 0, 4),
            entry("F32", "[0]", 8, 8),
            entry("F32", "[0, 3]", 8, 8),
            entry("F32", "[0]", 0, 0),
            entry("U8", "[4]", 4, 8)
        );
        let header = parse(&json, 8).unwrap();
        let names: Vec<&str> = header.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["e3", "a", "b", "e1", "e2"]);
        let only_empty = format!(r#"{{"e":{}}}"#, entry("U8", "[0]", 0, 0));
        assert_eq!(parse(&only_empty, 0).unwrap().tensors.len(), 1);
    }

    #[test]
    fn rejects_an_empty_tensor_inside_another_or_past_the_end() {
        let json = format!(
            r#"{{"a":{},"e":{}}}"#,
            entry("U8", "[8]", 0, 8),
            entry("F32", "[0]", 4, 4)
        );
        let err = parse(&json, 8).unwrap_err();
        assert!(
            matches!(&err, FormatError::OverlappingTensors { first, second, .. } if first == "a" && second == "e"),
            "{err}"
        );
        let json = format!(r#"{{"e":{}}}"#, entry("F32", "[0]", 3, 3));
        let err = parse(&json, 3).unwrap_err();
        assert!(
            matches!(
                err,
                FormatError::TensorGap {
                    start: 3,
                    expected: 0,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn accepts_header_padded_with_json_whitespace_but_not_nul() {
        assert!(parse("{} \t\r\n ", 0).is_ok());
        assert!(parse(" \n{}", 0).is_ok());
        let err = parse("{}\0\0", 0).unwrap_err();
        assert!(matches!(err, FormatError::InvalidJson { .. }), "{err}");
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
