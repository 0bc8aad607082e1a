//! Errors of the OS-facing primitives (page cache, cgroups, NUMA, atomic
//! writes). Each names the file, process or value at fault, and says
//! whether the kernel lacks a feature, so callers can fall back and log.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum OsError {
    /// A system call on a file (or a /proc or /sys entry) failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The kernel, file system or privileges lack a feature; callers fall
    /// back and log.
    #[error("{feature} unavailable: {reason}")]
    Unsupported {
        feature: &'static str,
        reason: String,
    },
    /// An argument the call cannot take: `what` names the call and the
    /// argument, `value` is what was given, `expected` what it must be.
    #[error("{what} {value}: {expected}")]
    InvalidArgument {
        what: String,
        value: String,
        expected: &'static str,
    },
}

impl OsError {
    /// Wraps an I/O error with the path it concerns, as `map_err` takes it.
    pub fn io(path: impl AsRef<Path>) -> impl FnOnce(std::io::Error) -> OsError {
        let path = path.as_ref().to_path_buf();
        move |source| OsError::Io { path, source }
    }

    /// The last OS error (errno) with the path it concerns.
    pub fn last(path: impl AsRef<Path>) -> OsError {
        OsError::io(path)(std::io::Error::last_os_error())
    }
}

/// Runs a system call that returns a count or -1 with `errno`, again while it is
/// interrupted by a signal (EINTR); the count, or the error.
pub fn retry_eintr(mut call: impl FnMut() -> isize) -> std::io::Result<usize> {
    loop {
        let n = call();
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}
