//! `sluice inspect`: validate a checkpoint and list what it holds.

use std::path::PathBuf;

use sluice_formats::Checkpoint;
use sluice_load::{open_shard_files, LoadError, ReadOptions};

use crate::InspectArgs;

pub fn run(args: &InspectArgs) -> Result<(), LoadError> {
    let options = ReadOptions {
        allow_partial: args.allow_partial,
    };
    // Local, or an object URL (`s3://bucket/prefix`) whose headers come by ranged GETs.
    let found = open_shard_files(&args.path, options)?;
    let (checkpoint, missing) = (found.checkpoint, found.missing);
    if args.json {
        outln!("{}", to_json(&checkpoint, &missing, !args.summary));
    } else {
        print_text(&checkpoint, &missing, !args.summary);
    }
    Ok(())
}

fn to_json(ckpt: &Checkpoint, missing: &[PathBuf], with_tensors: bool) -> serde_json::Value {
    let shards: Vec<_> = ckpt
        .shards
        .iter()
        .map(|s| {
            let mut shard = serde_json::json!({
                "path": s.path,
                "file_bytes": s.file_len,
                "tensor_bytes": s.header.total_tensor_bytes(),
                "tensor_count": s.header.tensors.len(),
                "metadata": s.header.metadata,
            });
            if with_tensors {
                shard["tensors"] = s
                    .header
                    .tensors
                    .iter()
                    .map(|t| serde_json::json!({"name": t.name, "dtype": t.dtype.as_str(), "shape": t.shape, "bytes": t.byte_len()}))
                    .collect();
            }
            shard
        })
        .collect();
    serde_json::json!({
        "path": ckpt.source.path(),
        "valid": true,
        "complete": missing.is_empty(),
        "missing_shards": missing,
        "tensor_count": ckpt.tensor_count(),
        "tensor_bytes": ckpt.total_bytes(),
        "shards": shards,
    })
}

fn print_text(ckpt: &Checkpoint, missing: &[PathBuf], with_tensors: bool) {
    for shard in &ckpt.shards {
        outln!(
            "{}  {} tensors, {} bytes",
            shard.path.display(),
            shard.header.tensors.len(),
            shard.header.total_tensor_bytes()
        );
        if !with_tensors {
            continue;
        }
        for t in &shard.header.tensors {
            let shape: Vec<String> = t.shape.iter().map(u64::to_string).collect();
            outln!(
                "  {:<60} {:<8} [{}] {}",
                printable(&t.name),
                t.dtype.as_str(),
                shape.join(", "),
                t.byte_len()
            );
        }
    }
    for path in missing.iter().take(MISSING_SHOWN) {
        outln!("{}  MISSING", path.display());
    }
    if missing.len() > MISSING_SHOWN {
        outln!(
            "... and {} more MISSING (--json lists them all)",
            missing.len() - MISSING_SHOWN
        );
    }
    let verdict = if missing.is_empty() {
        "valid"
    } else {
        "partial"
    };
    outln!(
        "{verdict}: {} tensors in {} shard(s), {} bytes{}",
        ckpt.tensor_count(),
        ckpt.shards.len(),
        ckpt.total_bytes(),
        if missing.is_empty() {
            String::new()
        } else {
            format!("; {} shard(s) missing", missing.len())
        }
    );
}

/// A tensor name for a terminal: as it is, or quoted with escapes when it holds control
/// characters (a newline or a NUL in a hostile header must not forge output lines).
fn printable(name: &str) -> std::borrow::Cow<'_, str> {
    match name.chars().any(char::is_control) {
        true => format!("{name:?}").into(),
        false => name.into(),
    }
}

/// Missing shards listed one per line in text output; the rest are counted (`--json` lists
/// every one).
pub(crate) const MISSING_SHOWN: usize = 8;
