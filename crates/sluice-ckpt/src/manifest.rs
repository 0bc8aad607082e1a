//! The manifest of one checkpoint: every entry (tensor or bytes item) with its chunks.
//!
//! An entry's bytes are either whole chunks, in order, or a range of a *pack*: a chunk
//! that holds many small entries back to back (see `share.rs`). The manifest lists
//! the packs it uses with their lengths; a manifest with packs is version 2, so a build
//! that predates packs refuses it instead of misreading it.
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
/// The newest manifest version this build reads: 2 added packs of small entries.
pub const VERSION: u32 = 2;
/// The version of a manifest without packs (what every earlier build reads).
const VERSION_NO_PACKS: u32 = 1;
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
    /// The entry's whole chunks, in order (none when it is packed, or empty).
    pub chunks: Vec<ChunkRef>,
    /// Where a packed entry's `nbytes` bytes are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pack: Option<PackRef>,
    /// Front-end data carried along (DCP's sharding metadata, the saving rank).
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub meta: serde_json::Value,
}

/// A packed entry's place: `nbytes` bytes at `offset` of pack `digest`, and the digest of
/// those bytes alone (what `diff` compares: a pack changes when any of its entries does).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackRef {
    #[serde(rename = "d")]
    pub digest: Digest,
    #[serde(rename = "o")]
    pub offset: u64,
    #[serde(rename = "h")]
    pub bytes_digest: Digest,
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
    /// The packs small entries live in, with their lengths.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub packs: BTreeMap<Digest, u64>,
    /// Front-end data for the whole checkpoint.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub extra: serde_json::Value,
}

/// The manifest file's `checksum`: BLAKE3 (hex) of the manifest's JSON value with
/// `checksum` removed, written compact with keys sorted (serde_json's map), so any reader
/// of the same value computes the same bytes. Written with every manifest; checked when
/// read where present (manifests written before it have none).
const CHECKSUM: &str = "checksum";

/// The digest a manifest's `checksum` holds: of its JSON value, `checksum` removed,
/// written compact with keys sorted (serde_json's map), so any reader of the same value
/// computes the same bytes.
fn canonical_digest(value: &serde_json::Value) -> String {
    let mut v = value.clone();
    if let Some(map) = v.as_object_mut() {
        map.remove(CHECKSUM);
    }
    let bytes = serde_json::to_vec(&v).expect("a JSON value always serializes");
    Digest::of(&bytes).to_string()
}

impl Manifest {
    pub fn new(chunk_bytes: u64, world_size: u32) -> Manifest {
        Manifest {
            format: FORMAT.into(),
            version: VERSION_NO_PACKS,
            created_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            chunk_bytes,
            world_size,
            entries: BTreeMap::new(),
            packs: BTreeMap::new(),
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
        let value: serde_json::Value = serde_json::from_reader(std::io::BufReader::new(file))
            .map_err(|e| CkptError::BadManifest {
                path: path.clone(),
                detail: e.to_string(),
            })?;
        Manifest::from_value(value, path)
    }

    /// Checks and decodes a manifest's bytes, read from `path` (a file or an object URL,
    /// named in errors).
    pub fn from_bytes(bytes: &[u8], path: PathBuf) -> Result<Manifest, CkptError> {
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| CkptError::BadManifest {
                path: path.clone(),
                detail: e.to_string(),
            })?;
        Manifest::from_value(value, path)
    }

    fn from_value(value: serde_json::Value, path: PathBuf) -> Result<Manifest, CkptError> {
        let bad = |detail: String| CkptError::BadManifest {
            path: path.clone(),
            detail,
        };
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
        if let Some(stored) = value.get(CHECKSUM) {
            let computed = canonical_digest(&value);
            if stored.as_str() != Some(computed.as_str()) {
                return Err(bad(format!(
                    "checksum mismatch: the manifest was changed or damaged after it was \
                     written (it records {stored}, its bytes hash to {computed:?})"
                )));
            }
        }
        let m: Manifest = serde_json::from_value(value).map_err(|e| bad(e.to_string()))?;
        m.check().map_err(bad)?;
        Ok(m)
    }

    /// Entries whose chunks do not add up to their size are refused: a manifest that lies
    /// about sizes would make a load write past its buffers.
    pub fn check(&self) -> Result<(), String> {
        for (key, e) in &self.entries {
            if let Some(p) = e.pack {
                let Some(len) = self.packs.get(&p.digest) else {
                    return Err(format!("entry {key:?}: pack {} is not listed", p.digest));
                };
                let fits = p
                    .offset
                    .checked_add(e.nbytes)
                    .is_some_and(|end| end <= *len);
                if !fits || !e.chunks.is_empty() {
                    return Err(format!(
                        "entry {key:?}: {} bytes at {} do not fit its {len}-byte pack",
                        e.nbytes, p.offset
                    ));
                }
                continue;
            }
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
        let path = Manifest::path_in(dir);
        Ok(sluice_engine::atomic_write(&path, &self.to_bytes())?)
    }

    /// The manifest file's bytes: pretty JSON with its `checksum`.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut value = serde_json::to_value(self).expect("a manifest always serializes");
        let sum = canonical_digest(&value);
        if let Some(map) = value.as_object_mut() {
            map.insert(CHECKSUM.into(), sum.into());
        }
        serde_json::to_vec_pretty(&value).expect("a JSON value always serializes")
    }

    /// Every distinct chunk the checkpoint references (packs included), with its length.
    pub fn unique_chunks(&self) -> BTreeMap<Digest, u64> {
        self.entries
            .values()
            .flat_map(|e| e.chunks.iter().map(|c| (c.digest, c.len)))
            .chain(self.packs.iter().map(|(d, n)| (*d, *n)))
            .collect()
    }

    /// Each distinct chunk with its length and the first entry that uses it (for messages).
    pub fn chunk_owners(&self) -> BTreeMap<Digest, (u64, &str)> {
        let mut out = BTreeMap::new();
        for (key, e) in &self.entries {
            for c in &e.chunks {
                out.entry(c.digest).or_insert((c.len, key.as_str()));
            }
            if let Some(p) = e.pack {
                let len = self.packs.get(&p.digest).copied().unwrap_or(0);
                out.entry(p.digest).or_insert((len, key.as_str()));
            }
        }
        out
    }

    /// Bytes of every entry, duplicates counted.
    pub fn logical_bytes(&self) -> u64 {
        self.entries.values().map(|e| e.nbytes).sum()
    }
}
