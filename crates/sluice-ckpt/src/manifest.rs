//! The manifest of one checkpoint: every entry (tensor or bytes item) with its chunks.
//!
//! A checkpoint is a directory holding `manifest.json`; its bytes are chunks of the store.
//! The manifest is written last, whole or not at all (tmp, fsync, rename, fsync of the
//! directory), after every chunk it names is durable: a checkpoint is visible only once it
//! is complete, and a save that dies leaves the previous checkpoints as they were.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::chunking::{ChunkRef, Digest};
use crate::error::CkptError;

/// What a manifest's `format` field holds.
pub const FORMAT: &str = "sluice-ckpt";
/// The manifest version this build writes, and the newest it reads.
pub const VERSION: u32 = 1;
/// The manifest's file name inside a checkpoint directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// What an entry holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    Tensor,
    Bytes,
}

/// One saved item.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub kind: EntryKind,
    /// The tensor's dtype, as the front end names it (`float32`, `bfloat16`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<u64>>,
    pub nbytes: u64,
    pub chunks: Vec<ChunkRef>,
    /// Front-end data carried along (DCP's sharding metadata, the saving rank).
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub meta: serde_json::Value,
}

/// One checkpoint's manifest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    pub created_unix: u64,
    pub chunk_bytes: u64,
    #[serde(default)]
    pub world_size: u32,
    pub entries: BTreeMap<String, Entry>,
    /// Front-end data for the whole checkpoint.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub extra: serde_json::Value,
}

impl Manifest {
    pub fn new(chunk_bytes: u64, world_size: u32) -> Manifest {
        Manifest {
            format: FORMAT.into(),
            version: VERSION,
            created_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            chunk_bytes,
            world_size,
            entries: BTreeMap::new(),
            extra: serde_json::Value::Null,
        }
    }

    pub fn path_in(dir: &Path) -> PathBuf {
        dir.join(MANIFEST_FILE)
    }

    /// Reads and checks the manifest of the checkpoint at `dir`.
    pub fn read(dir: &Path) -> Result<Manifest, CkptError> {
        let path = Manifest::path_in(dir);
        let file = match sluice_engine::open_regular(&path, 0) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(CkptError::NoCheckpoint {
                    path: dir.to_path_buf(),
                })
            }
            other => other.map_err(CkptError::io(&path))?,
        };
        let bad = |detail: String| CkptError::BadManifest {
            path: path.clone(),
            detail,
        };
        let value: serde_json::Value = serde_json::from_reader(std::io::BufReader::new(file))
            .map_err(|e| bad(e.to_string()))?;
        if value.get("format").and_then(|f| f.as_str()) != Some(FORMAT) {
            return Err(bad(format!("not a {FORMAT} manifest")));
        }
        let version = value.get("version").and_then(|v| v.as_u64()).unwrap_or(0);
        if version > VERSION as u64 {
            return Err(CkptError::NewerFormat {
                path,
                found: version.min(u32::MAX as u64) as u32,
                supported: VERSION,
            });
        }
        let m: Manifest = serde_json::from_value(value).map_err(|e| bad(e.to_string()))?;
        m.check().map_err(bad)?;
        Ok(m)
    }

    /// Entries whose chunks do not add up to their size are refused: a manifest that lies
    /// about sizes would make a load write past its buffers.
    pub fn check(&self) -> Result<(), String> {
        for (key, e) in &self.entries {
            let sum: u64 = e.chunks.iter().map(|c| c.len).sum();
            if sum != e.nbytes {
                return Err(format!(
                    "entry {key:?}: chunks hold {sum} bytes, the entry {}",
                    e.nbytes
                ));
            }
        }
        Ok(())
    }

    /// Publishes the manifest into `dir` (created if absent), whole or not at all.
    pub fn write(&self, dir: &Path) -> Result<(), CkptError> {
        std::fs::create_dir_all(dir).map_err(CkptError::io(dir))?;
        let bytes = serde_json::to_vec_pretty(self).expect("a manifest always serializes");
        let path = Manifest::path_in(dir);
        Ok(sluice_engine::atomic_write(&path, &bytes)?)
    }

    /// Every distinct chunk the checkpoint references, with its length.
    pub fn unique_chunks(&self) -> BTreeMap<Digest, u64> {
        self.entries
            .values()
            .flat_map(|e| e.chunks.iter().map(|c| (c.digest, c.len)))
            .collect()
    }

    /// Bytes of every entry, duplicates counted.
    pub fn logical_bytes(&self) -> u64 {
        self.entries.values().map(|e| e.nbytes).sum()
    }
}
