//! Parsing a sharded checkpoint's `model.safetensors.index.json`.
//!
//! The index is `{"metadata": {...}, "weight_map": {"<tensor>": "<shard file>", ...}}`.
//! `weight_map` is required; `metadata` is optional but must be an object when present;
//! other top-level keys are ignored, since writers add their own and they cannot change
//! which bytes a tensor has.
//!
//! The index is untrusted input that names files to open, so each shard name is checked
//! before anyone joins it onto a directory: it must be non-empty, free of NUL bytes, not
//! absolute (`/x`, `\x`, `C:x`), and free of `..` components under either separator.
//! Plain names and relative sub-paths such as `shards/model-00001.safetensors` pass.
//!
//! The index is parsed into a tree that keeps duplicate keys, so a tensor listed twice in
//! `weight_map` (which `serde_json` would silently collapse to its last entry) is reported
//! instead of guessed at: the index decides which file is opened. (A header instead keeps
//! the last of two entries with one name, as safetensors does; see `header`.) Any string
//! is a tensor name, the empty string included, as in a header.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use serde_json::{Map, Number, Value};

use crate::error::{FormatError, JsonDocument, UnsafeShardReason};
use crate::json_tree::{excerpt, JsonTree};

const WEIGHT_MAP_KEY: &str = "weight_map";
const METADATA_KEY: &str = "metadata";

/// A parsed and validated shard index.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardIndex {
    /// The index's `metadata` object (usually `{"total_size": N}`), if present.
    pub metadata: Option<Map<String, Value>>,
    /// Tensor name → shard file name, relative to the index's directory.
    pub weight_map: BTreeMap<String, String>,
}

impl ShardIndex {
    /// The distinct shard file names, in order of first appearance when walking
    /// `weight_map` by tensor name.
    pub fn shard_names(&self) -> Vec<String> {
        let mut seen = HashSet::new();
        self.weight_map
            .values()
            .filter(|shard| seen.insert(shard.as_str()))
            .cloned()
            .collect()
    }
}

/// Parses and validates the bytes of the index file `index_file`.
pub fn parse_index(index_file: &Path, json: &[u8]) -> Result<ShardIndex, FormatError> {
    let entries = match JsonTree::parse(index_file, JsonDocument::Index, json)? {
        JsonTree::Object(entries) => entries,
        other => {
            return Err(FormatError::NotAnObject {
                file: index_file.to_path_buf(),
                document: JsonDocument::Index,
                found: other.describe(),
            })
        }
    };
    let mut top = unique_entries(index_file, "the top level", entries)?;
    let weight_map = match top.remove(WEIGHT_MAP_KEY) {
        Some(tree) => decode_weight_map(index_file, tree)?,
        None => {
            let file = index_file.to_path_buf();
            return Err(FormatError::IndexMissingWeightMap { file });
        }
    };
    let metadata = match top.remove(METADATA_KEY) {
        Some(JsonTree::Object(entries)) => Some(to_json_map(index_file, "'metadata'", entries)?),
        Some(other) => {
            let (file, found) = (index_file.to_path_buf(), other.describe());
            return Err(FormatError::IndexMetadataNotObject { file, found });
        }
        None => None,
    };
    Ok(ShardIndex {
        metadata,
        weight_map,
    })
}

/// Checks that a shard file name from an index is safe to join onto its directory.
pub(crate) fn check_shard_name(name: &str) -> Result<(), UnsafeShardReason> {
    let mut chars = name.chars();
    let has_drive_prefix = matches!(
        (chars.next(), chars.next()),
        (Some(letter), Some(':')) if letter.is_ascii_alphabetic()
    );
    if name.is_empty() {
        Err(UnsafeShardReason::Empty)
    } else if name.contains('\0') {
        Err(UnsafeShardReason::ContainsNul)
    } else if name.starts_with(['/', '\\']) || has_drive_prefix || Path::new(name).is_absolute() {
        Err(UnsafeShardReason::Absolute)
    } else if name.split(['/', '\\']).any(|component| component == "..") {
        Err(UnsafeShardReason::ParentComponent)
    } else {
        Ok(())
    }
}

/// Turns an object's entries into a map, refusing repeated keys.
fn unique_entries(
    file: &Path,
    location: &str,
    entries: Vec<(String, JsonTree)>,
) -> Result<BTreeMap<String, JsonTree>, FormatError> {
    let mut map = BTreeMap::new();
    for (key, value) in entries {
        if map.contains_key(&key) {
            return Err(FormatError::IndexDuplicateKey {
                file: file.to_path_buf(),
                location: location.to_string(),
                key: excerpt(&key),
            });
        }
        map.insert(key, value);
    }
    Ok(map)
}

fn decode_weight_map(file: &Path, tree: JsonTree) -> Result<BTreeMap<String, String>, FormatError> {
    let JsonTree::Object(entries) = tree else {
        let (file, found) = (file.to_path_buf(), tree.describe());
        return Err(FormatError::IndexWeightMapNotObject { file, found });
    };
    let mut weight_map = BTreeMap::new();
    for (tensor, shard) in unique_entries(file, "'weight_map'", entries)? {
        let JsonTree::String(shard) = shard else {
            let (file, found) = (file.to_path_buf(), shard.describe());
            return Err(FormatError::IndexShardNotString {
                file,
                tensor,
                found,
            });
        };
        if let Err(reason) = check_shard_name(&shard) {
            let (file, shard) = (file.to_path_buf(), excerpt(&shard));
            return Err(FormatError::UnsafeShardName {
                file,
                tensor,
                shard,
                reason,
            });
        }
        weight_map.insert(tensor, shard);
    }
    Ok(weight_map)
}

/// Converts an object to `serde_json` form, refusing repeated keys at any depth.
fn to_json_map(
    file: &Path,
    location: &str,
    entries: Vec<(String, JsonTree)>,
) -> Result<Map<String, Value>, FormatError> {
    let mut map = Map::new();
    for (key, value) in unique_entries(file, location, entries)? {
        let value = to_json_value(file, &format!("{location}.'{key}'"), value)?;
        map.insert(key, value);
    }
    Ok(map)
}

fn to_json_value(file: &Path, location: &str, tree: JsonTree) -> Result<Value, FormatError> {
    Ok(match tree {
        JsonTree::Null => Value::Null,
        JsonTree::Bool(value) => Value::Bool(value),
        JsonTree::Unsigned(value) => Value::Number(value.into()),
        JsonTree::Signed(value) => Value::Number(value.into()),
        // JSON text cannot spell NaN or infinity, so from_f64 always succeeds here.
        JsonTree::Float(value) => Number::from_f64(value).map_or(Value::Null, Value::Number),
        JsonTree::String(value) => Value::String(value),
        JsonTree::Array(items) => Value::Array(
            items
                .into_iter()
                .enumerate()
                .map(|(i, item)| to_json_value(file, &format!("{location}[{i}]"), item))
                .collect::<Result<_, _>>()?,
        ),
        JsonTree::Object(entries) => Value::Object(to_json_map(file, location, entries)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const INDEX: &str = "model.safetensors.index.json";

    fn parse(json: &str) -> Result<ShardIndex, FormatError> {
        parse_index(Path::new(INDEX), json.as_bytes())
    }

    #[test]
    fn parses_a_typical_index() {
        let index = parse(
            r#"{"metadata":{"total_size":1024},"weight_map":{
                "b":"model-00002-of-00002.safetensors",
                "a":"model-00001-of-00002.safetensors",
                "c":"model-00001-of-00002.safetensors"}}"#,
        )
        .unwrap();
        assert_eq!(index.weight_map.len(), 3);
        assert_eq!(
            index.shard_names(),
            [
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors"
            ]
        );
        let metadata = index.metadata.unwrap();
        assert_eq!(metadata.get("total_size"), Some(&Value::from(1024u64)));
    }

    #[test]
    fn metadata_and_extra_keys_are_optional() {
        let index = parse(r#"{"weight_map":{"a":"x.safetensors"},"format":"pt"}"#).unwrap();
        assert_eq!(index.metadata, None);
    }

    #[test]
    fn rejects_invalid_json() {
        let err = parse(r#"{"weight_map": {"#).unwrap_err();
        assert!(
            matches!(
                err,
                FormatError::InvalidJson {
                    document: JsonDocument::Index,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn rejects_index_that_is_not_utf8() {
        let err = parse_index(Path::new(INDEX), b"{\"weight_map\": {\"\xfe\": 1}}").unwrap_err();
        assert!(
            matches!(
                err,
                FormatError::NotUtf8 {
                    byte_offset: 17,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn rejects_index_that_is_not_an_object() {
        let err = parse(r#"["weight_map"]"#).unwrap_err();
        assert!(matches!(err, FormatError::NotAnObject { .. }), "{err}");
    }

    #[test]
    fn rejects_index_without_weight_map() {
        let err = parse(r#"{"metadata":{}}"#).unwrap_err();
        assert!(
            matches!(err, FormatError::IndexMissingWeightMap { .. }),
            "{err}"
        );
    }

    #[test]
    fn rejects_weight_map_that_is_not_an_object() {
        let err = parse(r#"{"weight_map":["a.safetensors"]}"#).unwrap_err();
        assert!(
            matches!(err, FormatError::IndexWeightMapNotObject { .. }),
            "{err}"
        );
    }

    #[test]
    fn rejects_shard_name_that_is_not_a_string() {
        let err = parse(r#"{"weight_map":{"w":1}}"#).unwrap_err();
        assert!(
            matches!(&err, FormatError::IndexShardNotString { tensor, .. } if tensor == "w"),
            "{err}"
        );
    }

    #[test]
    fn rejects_tensor_listed_twice_in_weight_map() {
        let err = parse(r#"{"weight_map":{"w":"a.safetensors","w":"b.safetensors"}}"#).unwrap_err();
        assert!(
            matches!(&err, FormatError::IndexDuplicateKey { key, .. } if key == "w"),
            "{err}"
        );
    }

    #[test]
    fn rejects_duplicate_top_level_and_nested_metadata_keys() {
        let err = parse(r#"{"weight_map":{},"weight_map":{}}"#).unwrap_err();
        assert!(
            matches!(err, FormatError::IndexDuplicateKey { .. }),
            "{err}"
        );
        let err = parse(r#"{"weight_map":{},"metadata":{"a":{"b":1,"b":2}}}"#).unwrap_err();
        assert!(
            matches!(&err, FormatError::IndexDuplicateKey { location, .. } if location == "'metadata'.'a'"),
            "{err}"
        );
    }

    #[test]
    fn accepts_empty_tensor_name_in_weight_map_as_shards_may_hold_one() {
        let index = parse(r#"{"weight_map":{"":"a.safetensors"}}"#).unwrap();
        assert_eq!(
            index.weight_map.get("").map(String::as_str),
            Some("a.safetensors")
        );
    }

    #[test]
    fn rejects_metadata_that_is_not_an_object() {
        let err = parse(r#"{"weight_map":{},"metadata":"big"}"#).unwrap_err();
        assert!(
            matches!(err, FormatError::IndexMetadataNotObject { .. }),
            "{err}"
        );
    }

    #[test]
    fn rejects_path_traversal_in_shard_names() {
        let cases = [
            ("", UnsafeShardReason::Empty),
            ("/etc/passwd", UnsafeShardReason::Absolute),
            ("\\\\server\\share", UnsafeShardReason::Absolute),
            ("C:\\x.safetensors", UnsafeShardReason::Absolute),
            ("c:x.safetensors", UnsafeShardReason::Absolute),
            ("../x.safetensors", UnsafeShardReason::ParentComponent),
            ("a/../../x.safetensors", UnsafeShardReason::ParentComponent),
            ("a\\..\\x.safetensors", UnsafeShardReason::ParentComponent),
            ("..", UnsafeShardReason::ParentComponent),
            ("x\0.safetensors", UnsafeShardReason::ContainsNul),
        ];
        for (name, reason) in cases {
            let json = serde_json::json!({"weight_map": {"w": name}}).to_string();
            let err = parse(&json).unwrap_err();
            assert!(
                matches!(&err, FormatError::UnsafeShardName { reason: r, tensor, .. } if *r == reason && tensor == "w"),
                "{name:?}: {err}"
            );
        }
    }

    #[test]
    fn accepts_plain_names_and_relative_sub_paths() {
        for name in [
            "model.safetensors",
            "shards/model-1.safetensors",
            "..x",
            "a..b/c",
            "./m",
        ] {
            assert_eq!(check_shard_name(name), Ok(()), "{name}");
        }
    }
}
