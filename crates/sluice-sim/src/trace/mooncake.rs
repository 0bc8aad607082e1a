//! Mooncake-style KV-cache traces: JSON Lines of inference requests.
//!
//! Each line is one request, as in Mooncake's FAST'25 traces:
//!
//! ```json
//! {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]}
//! ```
//!
//! `timestamp` is in milliseconds, lengths are in tokens, and each hash id
//! names one block of `block_tokens` prompt tokens (512 in Mooncake's
//! traces). Ids are prefix hashes: two requests share a block id only when
//! their prompts agree up to the end of that block.
//!
//! Reading turns every hash id into one [`Record`] in order (time =
//! timestamp, id = hash id) and notes where each request's blocks start in
//! [`Trace::request_starts`], so the simulator can score prefix hits.
//!
//! **Block sizes.** With a model, a block's size is its tokens × the
//! model's KV bytes per token; without one (unit mode) every block has
//! size one. A request's blocks are full (`block_tokens` tokens) except
//! possibly the last: when the list covers the whole prompt
//! (`len(hash_ids) = ceil(input_length / block_tokens)`, as Mooncake writes
//! it), the last block holds the remainder `input_length - (n - 1) ×
//! block_tokens`, which is what a paged KV cache actually stores for it. A
//! shorter list covers a prefix of the prompt, so all its blocks are full.
//!
//! **Validation.** A list *longer* than `ceil(input_length / block_tokens)`
//! is an error, not a warning: it means the trace was hashed with another
//! block size (Qwen-Bailian's traces use 16-token blocks), and every size
//! derived from it would be wrong. Missing `timestamp`, `input_length` or
//! `hash_ids`, values of the wrong type, negative numbers and invalid JSON
//! are errors naming the line and field; `output_length` is optional (the
//! cache never sees it) but checked when present; unknown fields are
//! ignored. Blank lines are skipped; a request with no blocks adds nothing.
//! A decimal timestamp is truncated to whole milliseconds.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::SimError;
use crate::kv_model::KvModel;
use crate::trace::{Record, Trace};

/// Prompt tokens per hash id unless told otherwise: Mooncake's traces hash
/// 512-token blocks. The reader, `sluice sim run --block-tokens`, Python's
/// `block_tokens=` and the generator all default to it.
pub const DEFAULT_BLOCK_TOKENS: u64 = 512;

/// How a KV trace's blocks become sized records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MooncakeConfig {
    /// Prompt tokens per hash id. Default [`DEFAULT_BLOCK_TOKENS`].
    pub block_tokens: u64,
    /// Sizes blocks in KV bytes; `None` gives every block size 1, so cache
    /// capacities count blocks.
    pub model: Option<KvModel>,
}

impl Default for MooncakeConfig {
    fn default() -> MooncakeConfig {
        MooncakeConfig {
            block_tokens: DEFAULT_BLOCK_TOKENS,
            model: None,
        }
    }
}

impl MooncakeConfig {
    /// A config error unless blocks hold at least one token.
    pub fn check(&self) -> Result<(), SimError> {
        if self.block_tokens == 0 {
            return Err(SimError::config("block_tokens", "must be at least 1"));
        }
        Ok(())
    }
}

/// One request line, as written.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct MooncakeLine<'a> {
    /// Milliseconds.
    pub timestamp: u64,
    /// Prompt tokens.
    pub input_length: u64,
    /// Generated tokens.
    pub output_length: u64,
    pub hash_ids: &'a [u64],
}

/// Reads a Mooncake-style JSONL trace.
pub fn read(path: &Path, config: &MooncakeConfig) -> Result<Trace, SimError> {
    let io = |source| SimError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(
        &mut sluice_engine::open_regular(path, 0).map_err(io)?,
        &mut bytes,
    )
    .map_err(io)?;
    parse(&bytes, &path.display().to_string(), config)
}

/// Parses JSONL bytes; `name` is the trace's name and the path in errors.
pub fn parse(bytes: &[u8], name: &str, config: &MooncakeConfig) -> Result<Trace, SimError> {
    let sizer = BlockSizer::new(config)?;
    let mut trace = empty_trace(name);
    for (index, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        if raw.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let line = LineContext {
            name,
            line: index as u64 + 1,
        };
        let request = line.parse(raw)?;
        sizer
            .append(
                &mut trace,
                request.timestamp,
                request.input_length,
                &request.hash_ids,
            )
            .map_err(|(field, message)| line.error(field, message))?;
    }
    Ok(trace)
}

/// Builds a trace from requests in memory (the generator's output), sized
/// and checked as [`parse`] does; errors name the 1-based request.
pub fn trace_from_lines<'a>(
    name: &str,
    lines: impl IntoIterator<Item = MooncakeLine<'a>>,
    config: &MooncakeConfig,
) -> Result<Trace, SimError> {
    let sizer = BlockSizer::new(config)?;
    let mut trace = empty_trace(name);
    for (index, l) in lines.into_iter().enumerate() {
        let line = LineContext {
            name,
            line: index as u64 + 1,
        };
        sizer
            .append(&mut trace, l.timestamp, l.input_length, l.hash_ids)
            .map_err(|(field, message)| line.error(field, message))?;
    }
    Ok(trace)
}

/// Writes requests as JSONL, one object per line.
pub fn write_jsonl<'a>(
    lines: impl IntoIterator<Item = MooncakeLine<'a>>,
    path: &Path,
) -> Result<(), SimError> {
    crate::atomic::write_file(path, |out| write_jsonl_to(lines, out))
}

/// [`write_jsonl`] into any writer.
pub fn write_jsonl_to<'a, W: Write + ?Sized>(
    lines: impl IntoIterator<Item = MooncakeLine<'a>>,
    out: &mut W,
) -> std::io::Result<()> {
    for line in lines {
        serde_json::to_writer(&mut *out, &line)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

fn empty_trace(name: &str) -> Trace {
    Trace {
        name: name.to_string(),
        ..Trace::default()
    }
}

/// Turns a request's hash ids into records of the right sizes.
struct BlockSizer {
    block_tokens: u64,
    /// `None` in unit mode.
    bytes_per_token: Option<u64>,
}

/// A field name and what is wrong with it.
type FieldProblem = (&'static str, String);

impl BlockSizer {
    fn new(config: &MooncakeConfig) -> Result<BlockSizer, SimError> {
        config.check()?;
        Ok(BlockSizer {
            block_tokens: config.block_tokens,
            bytes_per_token: config.model.as_ref().map(KvModel::bytes_per_token),
        })
    }

    fn append(
        &self,
        trace: &mut Trace,
        timestamp: u64,
        input_length: u64,
        hash_ids: &[u64],
    ) -> Result<(), FieldProblem> {
        let max_blocks = input_length.div_ceil(self.block_tokens);
        let n = hash_ids.len() as u64;
        if n > max_blocks {
            let message = format!(
                "{n} block ids, but input_length {input_length} fills at most {max_blocks} \
                 blocks of {} tokens: is the block size (--block-tokens) right?",
                self.block_tokens
            );
            return Err(("hash_ids", message));
        }
        if hash_ids.is_empty() {
            return Ok(());
        }
        trace.request_starts.push(trace.records.len());
        let last_tokens = if n == max_blocks {
            input_length - (n - 1) * self.block_tokens
        } else {
            self.block_tokens
        };
        for (i, &id) in hash_ids.iter().enumerate() {
            let tokens = if i as u64 == n - 1 {
                last_tokens
            } else {
                self.block_tokens
            };
            let size = self.size(tokens)?;
            trace.records.push(Record {
                time: timestamp,
                id,
                size,
                next_access: 0,
            });
        }
        Ok(())
    }

    fn size(&self, tokens: u64) -> Result<u64, FieldProblem> {
        match self.bytes_per_token {
            None => Ok(1),
            Some(bpt) => tokens.checked_mul(bpt).ok_or_else(|| {
                (
                    "input_length",
                    format!("{tokens} tokens × {bpt} B overflow 64 bits"),
                )
            }),
        }
    }
}

/// A request as read, before sizing.
struct ParsedRequest {
    timestamp: u64,
    input_length: u64,
    hash_ids: Vec<u64>,
}

/// The shape a well-formed line deserializes into directly.
#[derive(Deserialize)]
struct TypedLine {
    timestamp: serde_json::Number,
    input_length: u64,
    #[serde(default)]
    #[allow(dead_code)] // Checked for type, not used.
    output_length: Option<u64>,
    hash_ids: Vec<u64>,
}

/// Where a line sits, for its errors.
struct LineContext<'a> {
    name: &'a str,
    line: u64,
}

impl LineContext<'_> {
    fn error(&self, field: &str, message: String) -> SimError {
        SimError::BadField {
            path: PathBuf::from(self.name),
            line: self.line,
            field: field.to_string(),
            message,
        }
    }

    /// The typed fast path; a line it rejects is parsed again as a generic
    /// JSON value to say exactly which field is wrong.
    fn parse(&self, raw: &[u8]) -> Result<ParsedRequest, SimError> {
        let typed_error = match serde_json::from_slice::<TypedLine>(raw) {
            Ok(typed) => match timestamp_ms(&typed.timestamp) {
                Some(timestamp) => {
                    return Ok(ParsedRequest {
                        timestamp,
                        input_length: typed.input_length,
                        hash_ids: typed.hash_ids,
                    })
                }
                None => {
                    let message = format!("{} is not a non-negative number", typed.timestamp);
                    return Err(self.error("timestamp", message));
                }
            },
            Err(e) => e,
        };
        Err(self
            .diagnose(raw)
            .unwrap_or_else(|| self.error("json", typed_error.to_string())))
    }

    /// The first thing wrong with a line the typed parse rejected.
    fn diagnose(&self, raw: &[u8]) -> Option<SimError> {
        if let Err(e) = std::str::from_utf8(raw) {
            let at = e.valid_up_to();
            return Some(self.error("json", format!("invalid UTF-8 at byte {at}")));
        }
        let value: Value = match serde_json::from_slice(raw) {
            Ok(v) => v,
            Err(e) => return Some(self.error("json", format!("invalid JSON: {e}"))),
        };
        let Some(object) = value.as_object() else {
            let found = describe(&value);
            return Some(self.error("json", format!("expected a JSON object, found {found}")));
        };
        let required = ["timestamp", "input_length", "hash_ids"];
        if let Some(missing) = required.iter().find(|k| !object.contains_key(**k)) {
            return Some(self.error(missing, "missing".into()));
        }
        if !object["timestamp"].is_number() {
            let found = describe(&object["timestamp"]);
            let message = format!("expected a number of milliseconds, found {found}");
            return Some(self.error("timestamp", message));
        }
        for field in ["input_length", "output_length"] {
            if let Some(problem) = object.get(field).and_then(not_unsigned) {
                return Some(self.error(field, problem));
            }
        }
        self.diagnose_hash_ids(&object["hash_ids"])
    }

    fn diagnose_hash_ids(&self, value: &Value) -> Option<SimError> {
        let Some(ids) = value.as_array() else {
            let found = describe(value);
            return Some(self.error(
                "hash_ids",
                format!("expected a list of integers, found {found}"),
            ));
        };
        ids.iter().enumerate().find_map(|(i, id)| {
            not_unsigned(id).map(|problem| self.error(&format!("hash_ids[{i}]"), problem))
        })
    }
}

/// A JSON number as whole milliseconds: unsigned integers as they are,
/// non-negative decimals truncated.
fn timestamp_ms(number: &serde_json::Number) -> Option<u64> {
    if let Some(v) = number.as_u64() {
        return Some(v);
    }
    let v = number.as_f64()?;
    (v.is_finite() && v >= 0.0 && v < u64::MAX as f64).then_some(v as u64)
}

/// Why `value` is not an unsigned integer, or `None` if it is one.
fn not_unsigned(value: &Value) -> Option<String> {
    if value.as_u64().is_some() {
        return None;
    }
    let found = describe(value);
    Some(match value.as_f64() {
        Some(v) if v < 0.0 => format!("{found} is negative"),
        _ => format!("expected a non-negative integer, found {found}"),
    })
}

/// A short description of a JSON value for messages.
fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => n.to_string(),
        Value::String(s) if s.len() > 40 => format!("a string of {} bytes", s.len()),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(a) => format!("a list of {} items", a.len()),
        Value::Object(_) => "an object".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(block_tokens: u64) -> MooncakeConfig {
        MooncakeConfig {
            block_tokens,
            model: None,
        }
    }

    fn err(text: &str) -> String {
        parse(text.as_bytes(), "kv.jsonl", &unit(512))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn each_hash_id_becomes_one_record_at_the_request_time() {
        let text = "{\"timestamp\": 5, \"input_length\": 1000, \"output_length\": 3, \"hash_ids\": [1, 2]}\n\
                    {\"timestamp\": 9, \"input_length\": 600, \"output_length\": 3, \"hash_ids\": [1, 3]}\n";
        let t = parse(text.as_bytes(), "kv", &unit(512)).unwrap();
        let got: Vec<(u64, u64, u64)> = t.records.iter().map(|r| (r.time, r.id, r.size)).collect();
        assert_eq!(got, [(5, 1, 1), (5, 2, 1), (9, 1, 1), (9, 3, 1)]);
        assert_eq!(t.request_starts, [0, 2]);
    }

    #[test]
    fn model_sizes_full_blocks_and_a_partial_last_block() {
        let model = KvModel::parse("layers=1,kv_heads=1,head_dim=1,dtype_bytes=1").unwrap();
        let config = MooncakeConfig {
            block_tokens: 512,
            model: Some(model),
        };
        let full_list = r#"{"timestamp": 0, "input_length": 1100, "hash_ids": [1, 2, 3]}"#;
        let t = parse(full_list.as_bytes(), "kv", &config).unwrap();
        let sizes: Vec<u64> = t.records.iter().map(|r| r.size).collect();
        // 2 bytes per token: 512, 512 and the 76-token remainder.
        assert_eq!(sizes, [1024, 1024, 152]);
        let prefix_list = r#"{"timestamp": 0, "input_length": 1100, "hash_ids": [1, 2]}"#;
        let t = parse(prefix_list.as_bytes(), "kv", &config).unwrap();
        assert!(t.records.iter().all(|r| r.size == 1024));
    }

    #[test]
    fn too_many_hash_ids_for_the_block_size_is_an_error() {
        let e = err("{\"timestamp\": 0, \"input_length\": 600, \"hash_ids\": [1, 2, 3]}");
        assert!(
            e.starts_with("kv.jsonl:1: field hash_ids: 3 block ids"),
            "{e}"
        );
        assert!(e.contains("--block-tokens"), "{e}");
    }

    #[test]
    fn blank_lines_crlf_and_empty_requests_are_tolerated() {
        let text = "\r\n{\"timestamp\": 1, \"input_length\": 0, \"hash_ids\": []}\r\n  \n\
                    {\"timestamp\": 2, \"input_length\": 10, \"hash_ids\": [4]}\r\n";
        let t = parse(text.as_bytes(), "kv", &unit(512)).unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t.request_starts, [0]);
    }

    #[test]
    fn empty_file_is_an_empty_trace() {
        assert!(parse(b"", "kv", &unit(512)).unwrap().is_empty());
    }

    #[test]
    fn decimal_timestamps_are_truncated_and_unknown_fields_ignored() {
        let text = r#"{"timestamp": 7.9, "input_length": 1, "hash_ids": [0], "chat_id": "x"}"#;
        let t = parse(text.as_bytes(), "kv", &unit(512)).unwrap();
        assert_eq!(t.records[0].time, 7);
    }

    #[test]
    fn malformed_lines_name_line_and_field() {
        let ok = r#"{"timestamp": 1, "input_length": 10, "hash_ids": [1]}"#;
        let cases = [
            (
                r#"{"input_length": 10, "hash_ids": [1]}"#,
                "kv.jsonl:2: field timestamp: missing",
            ),
            (
                r#"{"timestamp": 1, "hash_ids": [1]}"#,
                "kv.jsonl:2: field input_length: missing",
            ),
            (
                r#"{"timestamp": 1, "input_length": 10}"#,
                "kv.jsonl:2: field hash_ids: missing",
            ),
            (
                r#"{"timestamp": "soon", "input_length": 10, "hash_ids": [1]}"#,
                "field timestamp: expected a number of milliseconds, found string \"soon\"",
            ),
            (
                r#"{"timestamp": -4, "input_length": 10, "hash_ids": [1]}"#,
                "field timestamp: -4 is not a non-negative number",
            ),
            (
                r#"{"timestamp": 1, "input_length": -10, "hash_ids": [1]}"#,
                "field input_length: -10 is negative",
            ),
            (
                r#"{"timestamp": 1, "input_length": "10", "hash_ids": [1]}"#,
                "field input_length: expected a non-negative integer, found string \"10\"",
            ),
            (
                r#"{"timestamp": 1, "input_length": 10, "output_length": 1.5, "hash_ids": [1]}"#,
                "field output_length: expected a non-negative integer, found 1.5",
            ),
            (
                r#"{"timestamp": 1, "input_length": 10, "hash_ids": 5}"#,
                "field hash_ids: expected a list of integers, found 5",
            ),
            (
                r#"{"timestamp": 1, "input_length": 2000, "hash_ids": [1, -2]}"#,
                "kv.jsonl:2: field hash_ids[1]: -2 is negative",
            ),
            (
                r#"{"timestamp": 1, "input_length": 10, "hash_ids": [1]"#,
                "kv.jsonl:2: field json: invalid JSON",
            ),
            (
                "[1, 2]",
                "field json: expected a JSON object, found a list of 2 items",
            ),
        ];
        for (bad, want) in cases {
            let e = err(&format!("{ok}\n{bad}\n"));
            assert!(e.contains(want), "{bad}: {e}");
        }
    }

    #[test]
    fn invalid_utf8_is_a_line_error() {
        let e = parse(b"{\"timestamp\": \"\xff\"}\n", "kv.jsonl", &unit(512))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "kv.jsonl:1: field json: invalid UTF-8 at byte 15");
    }

    #[test]
    fn zero_block_tokens_is_a_config_error() {
        assert!(matches!(
            parse(b"", "kv", &unit(0)),
            Err(SimError::Config(_))
        ));
    }

    #[test]
    fn write_then_read_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kv.jsonl");
        let a = [10, 11, 12];
        let b = [10, 13];
        let lines = [
            MooncakeLine {
                timestamp: 0,
                input_length: 1500,
                output_length: 20,
                hash_ids: &a,
            },
            MooncakeLine {
                timestamp: 250,
                input_length: 1024,
                output_length: 5,
                hash_ids: &b,
            },
        ];
        write_jsonl(lines, &path).unwrap();
        let back = read(&path, &unit(512)).unwrap();
        let direct = trace_from_lines("mem", lines, &unit(512)).unwrap();
        assert_eq!(back.records, direct.records);
        assert_eq!(back.request_starts, [0, 3]);
        let ids: Vec<u64> = back.records.iter().map(|r| r.id).collect();
        assert_eq!(ids, [10, 11, 12, 10, 13]);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with(
            "{\"timestamp\":0,\"input_length\":1500,\"output_length\":20,\"hash_ids\":[10,11,12]}\n"
        ));
    }
}
