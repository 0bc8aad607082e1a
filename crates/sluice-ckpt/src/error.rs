//! The checkpoint plane's error type.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum CkptError {
    /// I/O on a store file failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A chunk's bytes do not hash to its name: it was damaged after it was written.
    #[error("chunk {digest} of {entry:?} in {path} is corrupt (its bytes hash to {actual})")]
    CorruptChunk {
        digest: String,
        actual: String,
        entry: String,
        path: PathBuf,
    },
    /// A manifest names a chunk the store does not hold.
    #[error("chunk {digest} of {entry:?} is missing from {path}")]
    MissingChunk {
        digest: String,
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
    /// A path that holds no checkpoint store (no `sluice-ckpt.json`).
    #[error("{path}: not a checkpoint store (no sluice-ckpt.json)")]
    NoStore { path: PathBuf },
    /// The store is in use (a save or load holds its lock) and the operation needs it alone.
    #[error("{path}: the checkpoint store is in use by a save or load; try again when it ends")]
    Busy { path: PathBuf },
    /// A save stopped before it finished (cancelled, or another part of it failed first).
    #[error("save cancelled: {0}")]
    Cancelled(String),
    /// A write plan that cannot exist: a chunk no rank with bandwidth holds.
    #[error("write plan: {0}")]
    Unplannable(String),
}

impl CkptError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> CkptError {
        let path = path.into();
        move |source| CkptError::Io { path, source }
    }

    /// A lossless-enough copy for handing one failure to several waiters: the kind, errno
    /// and message of an I/O error survive, its source chain does not.
    pub fn duplicate(&self) -> CkptError {
        let io = |e: &std::io::Error| match e.raw_os_error() {
            Some(code) => std::io::Error::from_raw_os_error(code),
            None => std::io::Error::new(e.kind(), e.to_string()),
        };
        match self {
            CkptError::Io { path, source } => CkptError::Io {
                path: path.clone(),
                source: io(source),
            },
            CkptError::CorruptChunk {
                digest,
                actual,
                entry,
                path,
            } => CkptError::CorruptChunk {
                digest: digest.clone(),
                actual: actual.clone(),
                entry: entry.clone(),
                path: path.clone(),
            },
            CkptError::MissingChunk {
                digest,
                entry,
                path,
            } => CkptError::MissingChunk {
                digest: digest.clone(),
                entry: entry.clone(),
                path: path.clone(),
            },
            CkptError::BadManifest { path, detail } => CkptError::BadManifest {
                path: path.clone(),
                detail: detail.clone(),
            },
            CkptError::NewerFormat {
                path,
                found,
                supported,
            } => CkptError::NewerFormat {
                path: path.clone(),
                found: *found,
                supported: *supported,
            },
            CkptError::NoCheckpoint { path } => CkptError::NoCheckpoint { path: path.clone() },
            CkptError::InvalidArgument { what, detail } => CkptError::InvalidArgument {
                what: what.clone(),
                detail: detail.clone(),
            },
            CkptError::Unplannable(s) => CkptError::Unplannable(s.clone()),
            CkptError::Cancelled(s) => CkptError::Cancelled(s.clone()),
            CkptError::Busy { path } => CkptError::Busy { path: path.clone() },
            CkptError::NoStore { path } => CkptError::NoStore { path: path.clone() },
        }
    }

    pub(crate) fn arg(what: impl Into<String>, detail: impl Into<String>) -> CkptError {
        CkptError::InvalidArgument {
            what: what.into(),
            detail: detail.into(),
        }
    }
}

impl From<sluice_engine::OsError> for CkptError {
    fn from(e: sluice_engine::OsError) -> CkptError {
        match e {
            sluice_engine::OsError::Io { path, source } => CkptError::Io { path, source },
            other => CkptError::Io {
                path: PathBuf::new(),
                source: std::io::Error::other(other.to_string()),
            },
        }
    }
}
