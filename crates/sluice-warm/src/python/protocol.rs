//! The JSON side of the protocol (the table is in [`super`]'s header):
//! events encoded for the host, and replies decoded and checked.
//!
//! A reply is untrusted: every prefetch and eviction is checked field by
//! field, an unknown key is a fault rather than ignored (a misspelt
//! `"lenght"` must not pass silently), and a path must be one of the model
//! files the policy was given, so a policy cannot make the runtime touch
//! any other file. Every failure is a [`ReplyError`] saying which item,
//! which field and which value.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use crate::policy::{AccessEvent, AccessKind, FileRange, PolicyContext, Prefetch, Target};

/// The model files a range may name: the path as the policy sees it (lossy
/// UTF-8) → the real path.
pub(super) type ModelFiles = HashMap<PathBuf, PathBuf>;

/// A reply whose `ok` value is not what the call returns.
#[derive(Debug, thiserror::Error)]
pub(super) enum ReplyError {
    /// Not a list (of prefetches or evictions).
    #[error("expected a list of {what} objects, got {got}")]
    NotAList { what: &'static str, got: Value },
    /// Item `index` of the list is not an object.
    #[error("{what} {index}: {got} is not an object")]
    NotAnObject {
        what: &'static str,
        index: usize,
        got: Value,
    },
    /// Item `index` of the list has a bad field.
    #[error("{what} {index}: {fault}")]
    BadItem {
        what: &'static str,
        index: usize,
        fault: FieldError,
    },
    /// A call whose answer is a single value got another one.
    #[error("{call} answered {got}, not {expected}")]
    Unexpected {
        call: &'static str,
        expected: &'static str,
        got: Value,
    },
}

/// What is wrong with one prefetch or eviction.
#[derive(Debug, thiserror::Error)]
pub(super) enum FieldError {
    #[error("unknown field {key:?}")]
    Unknown { key: String },
    #[error("\"path\" must be a string, got {got}")]
    PathNotAString { got: Value },
    #[error("path {path:?} is not absolute")]
    PathNotAbsolute { path: String },
    #[error("path {path:?} is not one of the model files")]
    NotAModelFile { path: String },
    /// Absent, negative, fractional, or too large for the field's type.
    #[error("{key:?} must be a non-negative integer in range, got {got}")]
    NotAnInteger { key: &'static str, got: Value },
    #[error("target {got} is not {{\"accelerator\": n}}, {{\"numa\": n}} or null")]
    BadTarget { got: Value },
}

/// A path as the policy sees it.
fn lossy(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// `ctx.files` keyed by the paths the policy will be told.
pub(super) fn model_files(ctx: &PolicyContext) -> ModelFiles {
    ctx.files
        .iter()
        .map(|(path, _)| (PathBuf::from(lossy(path)), path.clone()))
        .collect()
}

/// The `ctx` of the `init` call.
pub(super) fn ctx_json(ctx: &PolicyContext) -> Value {
    let files: Vec<Value> = ctx
        .files
        .iter()
        .map(|(path, size)| json!([lossy(path), size]))
        .collect();
    json!({
        "model_dir": lossy(&ctx.model_dir),
        "files": files,
        "memory_limited": ctx.memory_limited,
    })
}

/// The `event` of the `on_access` and `evict` calls.
pub(super) fn event_json(event: &AccessEvent) -> Value {
    let kind = match event.kind {
        AccessKind::Open => "open",
        AccessKind::Read => "read",
        AccessKind::Mmap => "mmap",
        AccessKind::Progress => "progress",
        AccessKind::Explicit => "explicit",
    };
    json!({
        "pid": event.pid,
        "worker": event.worker,
        "path": lossy(&event.path),
        "offset": event.offset,
        "len": event.len,
        "kind": kind,
    })
}

/// The answer of `wait_for_init`: a bool.
pub(super) fn parse_wait_for_init(value: Value, _: &ModelFiles) -> Result<bool, ReplyError> {
    match value {
        Value::Bool(b) => Ok(b),
        got => Err(ReplyError::Unexpected {
            call: "wait_for_init",
            expected: "a bool",
            got,
        }),
    }
}

/// The answer of `exit`: `null`.
pub(super) fn parse_exit(value: Value, _: &ModelFiles) -> Result<(), ReplyError> {
    match value {
        Value::Null => Ok(()),
        got => Err(ReplyError::Unexpected {
            call: "exit",
            expected: "null",
            got,
        }),
    }
}

/// The answer of `init` and `on_access`: a list of prefetches.
pub(super) fn parse_prefetches(
    value: Value,
    files: &ModelFiles,
) -> Result<Vec<Prefetch>, ReplyError> {
    parse_list(value, "prefetch", |item| {
        let range = parse_range(item, files, &["stream", "target"])?;
        let stream = match item.get("stream") {
            None | Some(Value::Null) => 0,
            Some(_) => uint(item, "stream")?,
        };
        Ok(Prefetch {
            stream,
            range: range.with_target(parse_target(item.get("target"))?),
        })
    })
}

/// The answer of `evict`: a list of ranges.
pub(super) fn parse_evictions(
    value: Value,
    files: &ModelFiles,
) -> Result<Vec<FileRange>, ReplyError> {
    parse_list(value, "eviction", |item| parse_range(item, files, &[]))
}

fn parse_list<T>(
    value: Value,
    what: &'static str,
    parse: impl Fn(&Map<String, Value>) -> Result<T, FieldError>,
) -> Result<Vec<T>, ReplyError> {
    let Value::Array(items) = value else {
        return Err(ReplyError::NotAList { what, got: value });
    };
    items
        .iter()
        .enumerate()
        .map(|(index, item)| match item {
            Value::Object(map) => {
                parse(map).map_err(|fault| ReplyError::BadItem { what, index, fault })
            }
            other => Err(ReplyError::NotAnObject {
                what,
                index,
                got: other.clone(),
            }),
        })
        .collect()
}

/// `{path, offset, len}` plus the `extra` keys the caller reads; any other
/// key is a fault.
fn parse_range(
    item: &Map<String, Value>,
    files: &ModelFiles,
    extra: &[&str],
) -> Result<FileRange, FieldError> {
    if let Some(key) = item
        .keys()
        .find(|k| !["path", "offset", "len"].contains(&k.as_str()) && !extra.contains(&k.as_str()))
    {
        return Err(FieldError::Unknown { key: key.clone() });
    }
    let Some(Value::String(path)) = item.get("path") else {
        let got = item.get("path").cloned().unwrap_or(Value::Null);
        return Err(FieldError::PathNotAString { got });
    };
    let given = Path::new(path);
    if !given.is_absolute() {
        return Err(FieldError::PathNotAbsolute { path: path.clone() });
    }
    let Some(real) = files.get(given) else {
        return Err(FieldError::NotAModelFile { path: path.clone() });
    };
    Ok(FileRange::new(
        real.clone(),
        uint(item, "offset")?,
        uint(item, "len")?,
    ))
}

/// `{"accelerator": n}`, `{"numa": n}`, or absent or `null` for any.
fn parse_target(target: Option<&Value>) -> Result<Target, FieldError> {
    match target {
        None | Some(Value::Null) => Ok(Target::Any),
        Some(Value::Object(t)) if t.len() == 1 && t.contains_key("accelerator") => {
            Ok(Target::Accelerator(uint(t, "accelerator")?))
        }
        Some(Value::Object(t)) if t.len() == 1 && t.contains_key("numa") => {
            Ok(Target::NumaNode(uint(t, "numa")?))
        }
        Some(other) => Err(FieldError::BadTarget { got: other.clone() }),
    }
}

/// A non-negative integer field that fits `T`.
fn uint<T: TryFrom<u64>>(map: &Map<String, Value>, key: &'static str) -> Result<T, FieldError> {
    let value = map.get(key).unwrap_or(&Value::Null);
    value
        .as_u64()
        .and_then(|n| T::try_from(n).ok())
        .ok_or_else(|| FieldError::NotAnInteger {
            key,
            got: value.clone(),
        })
}
