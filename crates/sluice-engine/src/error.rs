//! Errors of the engine layer, one enum per concern.

use std::io;
use std::path::PathBuf;

/// A buffer pool refused or failed a request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    #[error("a {requested_bytes}-byte buffer cannot fit in the pool's {budget_bytes}-byte budget")]
    RequestExceedsBudget {
        requested_bytes: u64,
        budget_bytes: u64,
    },
    #[error("mapping a {bytes}-byte buffer failed: {source}")]
    Map { bytes: u64, source: io::Error },
    #[error("the buffer pool was closed")]
    Closed,
}

/// Opening or probing a file for reading failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    #[error("{}: cannot {op}: {source}", path.display())]
    Io {
        path: PathBuf,
        op: &'static str,
        source: io::Error,
    },
    #[error("{}: direct I/O was required (direct=on) but {reason}", path.display())]
    DirectUnsupported { path: PathBuf, reason: String },
}
