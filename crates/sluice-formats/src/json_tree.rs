//! A JSON tree that keeps duplicate object keys, so validation can see them.
//!
//! `serde_json::Value` (and every derived struct) silently keeps the last of two equal
//! keys. We parse into [`JsonTree`], whose objects are ordered `(key, value)` lists with
//! every occurrence kept, so that each validator decides: the shard index refuses a
//! repeated key (it names the files to open), and the header applies safetensors' own
//! rules exactly, which keep the last of two tensor entries but refuse a repeated field
//! inside one entry, and type the entries they drop (serde decodes a value before it
//! replaces the earlier one).
//!
//! Parsing is two steps, each with its own error: UTF-8 validation (which reports the
//! byte offset of the first bad byte) and JSON syntax (which reports line and column).
//! Nesting depth is bounded by serde_json's recursion limit (128), so hostile input cannot
//! overflow the stack either while parsing or while dropping the tree.
//!
//! Memory: a node is 32 bytes, and every JSON value takes at least two bytes of text
//! (value plus separator), so the tree costs at most ~16x the header size (plus string
//! contents). Real headers are a few MB; a hostile header at the 100 MB cap could cost
//! ~1.6 GB, the same order as the typed `serde_json` decoding the reference reader does.

use std::fmt;
use std::path::Path;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::error::{FormatError, JsonDocument};

/// Longest excerpt of an offending value quoted in an error message. 48 characters is
/// enough to recognise a dtype or file name, short enough to keep messages on one line.
const MAX_EXCERPT_CHARS: usize = 48;

/// One JSON value, with objects kept as ordered key/value lists (duplicates included).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum JsonTree {
    Null,
    Bool(bool),
    /// A non-negative integer that fits in `u64`.
    Unsigned(u64),
    /// A negative integer that fits in `i64`.
    Signed(i64),
    /// Any other number (fractional, exponent, or out of the integer ranges).
    Float(f64),
    String(String),
    Array(Vec<JsonTree>),
    Object(Vec<(String, JsonTree)>),
}

impl JsonTree {
    /// Parses `bytes` as one JSON document, reporting errors against `file`.
    pub(crate) fn parse(
        file: &Path,
        document: JsonDocument,
        bytes: &[u8],
    ) -> Result<JsonTree, FormatError> {
        let text = std::str::from_utf8(bytes).map_err(|err| FormatError::NotUtf8 {
            file: file.to_path_buf(),
            document,
            byte_offset: err.valid_up_to(),
        })?;
        serde_json::from_str(text).map_err(|err| FormatError::InvalidJson {
            file: file.to_path_buf(),
            document,
            line: err.line(),
            column: err.column(),
            message: strip_position(&err),
        })
    }

    /// The value as a non-negative integer, if it is one. A negative zero parses as
    /// `Signed(0)` in some serde_json paths, so non-negative signed values count too.
    pub(crate) fn as_u64(&self) -> Option<u64> {
        match *self {
            JsonTree::Unsigned(value) => Some(value),
            JsonTree::Signed(value) => u64::try_from(value).ok(),
            _ => None,
        }
    }

    /// A short human description for error messages: the value itself for scalars
    /// (truncated), and the kind for containers.
    pub(crate) fn describe(&self) -> String {
        match self {
            JsonTree::Null => "null".to_string(),
            JsonTree::Bool(value) => value.to_string(),
            JsonTree::Unsigned(value) => value.to_string(),
            JsonTree::Signed(value) => value.to_string(),
            JsonTree::Float(value) => value.to_string(),
            JsonTree::String(value) => format!("{:?}", excerpt(value)),
            JsonTree::Array(items) => format!("an array of {} items", items.len()),
            JsonTree::Object(entries) => format!("an object with {} keys", entries.len()),
        }
    }
}

/// At most [`MAX_EXCERPT_CHARS`] characters of `text`, with an ellipsis when cut.
pub(crate) fn excerpt(text: &str) -> String {
    match text.char_indices().nth(MAX_EXCERPT_CHARS) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_string(),
    }
}

/// serde_json appends " at line L column C" to its messages; we report those as fields.
fn strip_position(err: &serde_json::Error) -> String {
    let full = err.to_string();
    let suffix = format!(" at line {} column {}", err.line(), err.column());
    full.strip_suffix(&suffix).unwrap_or(&full).to_string()
}

impl<'de> Deserialize<'de> for JsonTree {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(JsonTreeVisitor)
    }
}

struct JsonTreeVisitor;

impl<'de> Visitor<'de> for JsonTreeVisitor {
    type Value = JsonTree;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<JsonTree, E> {
        Ok(JsonTree::Null)
    }

    fn visit_bool<E>(self, value: bool) -> Result<JsonTree, E> {
        Ok(JsonTree::Bool(value))
    }

    fn visit_u64<E>(self, value: u64) -> Result<JsonTree, E> {
        Ok(JsonTree::Unsigned(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<JsonTree, E> {
        Ok(match u64::try_from(value) {
            Ok(unsigned) => JsonTree::Unsigned(unsigned),
            Err(_) => JsonTree::Signed(value),
        })
    }

    fn visit_f64<E>(self, value: f64) -> Result<JsonTree, E> {
        Ok(JsonTree::Float(value))
    }

    fn visit_str<E>(self, value: &str) -> Result<JsonTree, E> {
        Ok(JsonTree::String(value.to_string()))
    }

    fn visit_string<E>(self, value: String) -> Result<JsonTree, E> {
        Ok(JsonTree::String(value))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<JsonTree, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(JsonTree::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<JsonTree, A::Error> {
        let mut entries = Vec::new();
        while let Some((key, value)) = map.next_entry::<String, JsonTree>()? {
            entries.push((key, value));
        }
        Ok(JsonTree::Object(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<JsonTree, FormatError> {
        JsonTree::parse(Path::new("x.json"), JsonDocument::Header, text.as_bytes())
    }

    #[test]
    fn keeps_duplicate_keys_in_order() {
        let tree = parse(r#"{"a": 1, "a": 2}"#).unwrap();
        assert_eq!(
            tree,
            JsonTree::Object(vec![
                ("a".into(), JsonTree::Unsigned(1)),
                ("a".into(), JsonTree::Unsigned(2)),
            ])
        );
    }

    #[test]
    fn classifies_numbers_by_integer_range() {
        let tree = parse("[0, -3, 1.5, 18446744073709551615, 18446744073709551616]").unwrap();
        let JsonTree::Array(items) = tree else {
            panic!("expected array");
        };
        assert_eq!(items[0], JsonTree::Unsigned(0));
        assert_eq!(items[1], JsonTree::Signed(-3));
        assert_eq!(items[2], JsonTree::Float(1.5));
        assert_eq!(items[3], JsonTree::Unsigned(u64::MAX));
        assert!(matches!(items[4], JsonTree::Float(_)));
    }

    #[test]
    fn reports_invalid_utf8_offset() {
        let err =
            JsonTree::parse(Path::new("x"), JsonDocument::Header, b"{\"a\xff\": 1}").unwrap_err();
        assert!(matches!(err, FormatError::NotUtf8 { byte_offset: 3, .. }));
    }

    #[test]
    fn reports_invalid_json_line_and_column() {
        let err = parse("{\n  \"a\": ,\n}").unwrap_err();
        let FormatError::InvalidJson {
            line,
            column,
            message,
            ..
        } = err
        else {
            panic!("expected InvalidJson, got {err:?}");
        };
        assert_eq!((line, column), (2, 8));
        assert!(!message.contains("at line"), "{message}");
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let text = "[".repeat(100_000);
        assert!(matches!(parse(&text), Err(FormatError::InvalidJson { .. })));
    }

    #[test]
    fn nodes_stay_within_the_documented_32_bytes() {
        assert!(std::mem::size_of::<JsonTree>() <= 32);
    }

    #[test]
    fn describe_truncates_long_strings() {
        let long = "x".repeat(500);
        let described = JsonTree::String(long).describe();
        assert!(described.len() < 60, "{described}");
        assert!(described.ends_with("...\""));
    }
}
