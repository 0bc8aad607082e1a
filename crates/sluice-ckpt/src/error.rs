//! The checkpoint plane's error type.
//!
//! Every variant names what the user can act on: the store, checkpoint, entry, chunk or
//! rank, and the value that was wrong. Errors are `Clone` (I/O errors are shared), so one
//! failure can be handed to every waiter of a save.

use std::path::PathBuf;
use std::sync::Arc;

use crate::chunking::Digest;

#[derive(Debug, Clone, thiserror::Error)]
pub enum CkptError {
    /// I/O on a store file failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: Arc<std::io::Error>,
    },
    /// A chunk's bytes do not hash to its name: it was damaged after it was written.
    #[error("chunk {digest} of {entry:?} in {path} is corrupt ({found})")]
    CorruptChunk {
        digest: Digest,
        found: ChunkDamage,
        entry: String,
        path: PathBuf,
    },
    /// A manifest names a chunk the store does not hold.
    #[error("chunk {digest} of {entry:?} is missing from {path}")]
    MissingChunk {
        digest: Digest,
        entry: String,
        path: PathBuf,
    },
    /// A manifest or store file that does not decode, or describes something impossible.
    #[error("{path}: {detail}")]
    BadManifest { path: PathBuf, detail: String },
    /// A manifest written by a newer Sluice.
    #[error("{path}: checkpoint format version {found}; this build reads up to {supported}")]
    NewerFormat {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    /// No checkpoint at a path (no manifest: never written, or a save that did not finish).
    #[error(
        "{path}: no checkpoint here (no manifest.json: never saved, or the save did not finish)"
    )]
    NoCheckpoint { path: PathBuf },
    /// An argument out of range: `what` names it.
    #[error("{what}: {detail}")]
    InvalidArgument { what: String, detail: String },
    /// A request to an object store failed (it names the object's URL).
    #[error("{0}")]
    Remote(Arc<sluice_remote::RemoteError>),
    /// A directory the store did not write, where it would write: a store is created only
    /// in a new or empty directory, and a checkpoint only where none or its own was.
    #[error(
        "{path}: {role} holds files Sluice did not write ({}); choose a new or empty \
         directory",
        list_names(.found)
    )]
    ForeignDirectory {
        path: PathBuf,
        /// "is not a checkpoint store and" / "is no checkpoint of this store and".
        role: &'static str,
        found: Vec<String>,
    },
    /// A path that holds no checkpoint store (no `sluice-ckpt.json`).
    #[error("{path}: not a checkpoint store (no sluice-ckpt.json)")]
    NoStore { path: PathBuf },
    /// The store is in use (a save or load holds its lock) and the operation needs it alone.
    #[error("{path}: the checkpoint store is in use by a save or load; try again when it ends")]
    Busy { path: PathBuf },
    /// A save stopped before it finished (cancelled, or another part of it failed first).
    #[error("save cancelled: {0}")]
    Cancelled(String),
    /// A grouped save or load that another rank failed or left.
    #[error("{path}: rank {rank} {why}")]
    RankFailed {
        path: PathBuf,
        rank: u32,
        why: String,
    },
    /// A grouped save whose ranks did not all finish in time.
    #[error("{path}: {what} within {timeout_s:.0} s; not published")]
    TimedOut {
        path: PathBuf,
        what: String,
        timeout_s: f64,
    },
    /// A write plan that cannot exist: a chunk no rank with bandwidth holds.
    #[error("write plan: {0}")]
    Unplannable(String),
}

/// What a damaged chunk file holds instead of its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkDamage {
    /// Bytes of the right length that hash to another digest.
    Hashes(Digest),
    /// Fewer bytes than the chunk has.
    Short { len: u64 },
    /// More bytes than the chunk has.
    Long,
}

impl std::fmt::Display for ChunkDamage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChunkDamage::Hashes(d) => write!(f, "its bytes hash to {d}"),
            ChunkDamage::Short { len } => write!(f, "it is only {len} bytes long"),
            ChunkDamage::Long => write!(f, "it holds more bytes than the chunk's length"),
        }
    }
}

/// Up to eight names, then how many more.
fn list_names(names: &[String]) -> String {
    let mut out: Vec<String> = names.iter().take(8).map(|n| format!("{n:?}")).collect();
    if names.len() > 8 {
        out.push(format!("{} more", names.len() - 8));
    }
    out.join(", ")
}

impl CkptError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> CkptError {
        let path = path.into();
        move |source| CkptError::Io {
            path,
            source: Arc::new(source),
        }
    }

    pub(crate) fn arg(what: impl Into<String>, detail: impl Into<String>) -> CkptError {
        CkptError::InvalidArgument {
            what: what.into(),
            detail: detail.into(),
        }
    }

    /// The OS error number of an I/O failure (ENOSPC for a full disk).
    pub fn errno(&self) -> Option<i32> {
        match self {
            CkptError::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

impl sluice_engine::Classify for CkptError {
    fn class(&self) -> sluice_engine::ErrorClass {
        use sluice_engine::ErrorClass;
        match self {
            CkptError::Io { source, .. } => ErrorClass::of_io(source),
            CkptError::CorruptChunk { .. } => ErrorClass::Corrupt,
            CkptError::MissingChunk { .. }
            | CkptError::NoCheckpoint { .. }
            | CkptError::NoStore { .. } => ErrorClass::NotFound,
            CkptError::BadManifest { .. } | CkptError::NewerFormat { .. } => ErrorClass::BadStore,
            CkptError::InvalidArgument { .. }
            | CkptError::ForeignDirectory { .. }
            | CkptError::Unplannable(_) => ErrorClass::Config,
            CkptError::Busy { .. } => ErrorClass::Locked,
            CkptError::Remote(e) => e.class(),
            CkptError::Cancelled(_) | CkptError::RankFailed { .. } | CkptError::TimedOut { .. } => {
                ErrorClass::Failed
            }
        }
    }

    fn errno(&self) -> Option<i32> {
        CkptError::errno(self)
    }
}

impl From<sluice_engine::OsError> for CkptError {
    fn from(e: sluice_engine::OsError) -> CkptError {
        match e {
            sluice_engine::OsError::Io { path, source } => CkptError::Io {
                path,
                source: Arc::new(source),
            },
            other => CkptError::Io {
                path: PathBuf::new(),
                source: Arc::new(std::io::Error::other(other.to_string())),
            },
        }
    }
}
