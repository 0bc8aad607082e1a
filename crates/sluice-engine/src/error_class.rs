//! [`ErrorClass`]: what kind of failure an error is, the one classification both fronts use.
//!
//! Every plane's error type implements [`Classify`]. The CLI turns the class into its exit
//! status ([`ErrorClass::exit_code`]) and the Python layer into the `sluice.errors`
//! exception ([`ErrorClass::python_name`]), from this one table: a failure means the same
//! from the shell and from Python, and a new error variant is classified once, where it is
//! defined. [`ConfigError`] is the structured "a value Sluice cannot take" that the planes
//! share.

use std::io;

/// What kind of failure an error is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// A bad option, flag, argument or path given by the caller.
    Config,
    /// A memory limit below what the request needs, known before any read.
    MemoryLimit,
    /// A memory limit used up at run time by what the caller still holds.
    MemoryExhausted,
    /// A safetensors header or index that is malformed.
    BadHeader,
    /// A tensor the checkpoint does not have.
    TensorNotFound,
    /// A cache trace that is malformed.
    BadTrace,
    /// A store (KV store, checkpoint store, template) of another format, version or block
    /// size, or whose manifest does not decode.
    BadStore,
    /// A path that is not what it must be: not a regular file where one belongs (a FIFO, a
    /// socket, a directory), a mount point that is stale or not empty.
    BadPath,
    /// A file, object, store, checkpoint or chunk that does not exist.
    NotFound,
    /// Access refused (file permissions, an object store's credentials).
    PermissionDenied,
    /// Stored bytes that no longer match their checksum.
    Corrupt,
    /// A store in use by another process, or another save or load.
    Locked,
    /// No `sluice warm` runtime, or several and none chosen.
    NoRuntime,
    /// A `sluice warm` runtime that went away.
    RuntimeGone,
    /// An I/O operation failed.
    Io,
    /// Anything else that failed: a cancelled operation, a rank that failed, wrong bytes.
    Failed,
}

/// Exit status: the command failed (I/O, damage, a peer, wrong bytes).
pub const EXIT_FAILED: i32 = 1;
/// Exit status: a bad flag, option or argument.
pub const EXIT_USAGE: i32 = 2;
/// Exit status: input that is not what it should be (a malformed file, trace or store).
pub const EXIT_INVALID: i32 = 3;
/// Exit status: a missing (or forbidden) file, object, store or checkpoint.
pub const EXIT_NOT_FOUND: i32 = 4;

impl ErrorClass {
    /// Every class, for tables that must cover them all.
    pub const ALL: [ErrorClass; 16] = [
        ErrorClass::Config,
        ErrorClass::MemoryLimit,
        ErrorClass::MemoryExhausted,
        ErrorClass::BadHeader,
        ErrorClass::TensorNotFound,
        ErrorClass::BadTrace,
        ErrorClass::BadStore,
        ErrorClass::BadPath,
        ErrorClass::NotFound,
        ErrorClass::PermissionDenied,
        ErrorClass::Corrupt,
        ErrorClass::Locked,
        ErrorClass::NoRuntime,
        ErrorClass::RuntimeGone,
        ErrorClass::Io,
        ErrorClass::Failed,
    ];

    /// The CLI's exit status for this class.
    pub fn exit_code(self) -> i32 {
        use ErrorClass::*;
        match self {
            Config | MemoryLimit | NoRuntime => EXIT_USAGE,
            BadHeader | TensorNotFound | BadTrace | BadStore | BadPath => EXIT_INVALID,
            NotFound | PermissionDenied | RuntimeGone => EXIT_NOT_FOUND,
            MemoryExhausted | Corrupt | Locked | Io | Failed => EXIT_FAILED,
        }
    }

    /// The `sluice.errors` exception class for this class.
    pub fn python_name(self) -> &'static str {
        use ErrorClass::*;
        match self {
            Config => "ConfigError",
            MemoryLimit | MemoryExhausted => "MemoryLimitError",
            BadHeader => "HeaderError",
            TensorNotFound => "TensorNotFoundError",
            BadTrace => "TraceError",
            BadStore => "StoreFormatError",
            BadPath | Io => "SluiceIOError",
            NotFound => "SluiceFileNotFoundError",
            PermissionDenied => "SluicePermissionError",
            Corrupt => "ChunkCorruptError",
            Locked => "StoreLockedError",
            NoRuntime | RuntimeGone => "NoRuntimeError",
            Failed => "SluiceError",
        }
    }

    /// The class of a failed file operation: a path that is not a regular file, a missing
    /// or forbidden one, or another I/O failure.
    pub fn of_io(err: &io::Error) -> ErrorClass {
        if crate::is_not_regular(err) {
            return ErrorClass::BadPath;
        }
        match err.kind() {
            io::ErrorKind::NotFound => ErrorClass::NotFound,
            io::ErrorKind::PermissionDenied => ErrorClass::PermissionDenied,
            _ => ErrorClass::Io,
        }
    }
}

/// An error that knows its [`ErrorClass`].
pub trait Classify: std::error::Error {
    /// What kind of failure this is.
    fn class(&self) -> ErrorClass;

    /// The OS error number behind it, if one is (`ENOSPC` for a full disk): the Python
    /// exception's `errno`.
    fn errno(&self) -> Option<i32> {
        None
    }

    /// An exit status the failure carries itself, where its class's would be wrong: a
    /// command a signal stopped (128 + the signal, as shells report it), a daemon whose
    /// status is passed on.
    fn exit_status(&self) -> Option<i32> {
        None
    }
}

/// A value Sluice cannot take: `what` names the option, argument or setting (and the value
/// where it helps), `problem` says what is wrong or what it must be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {problem}")]
pub struct ConfigError {
    pub what: String,
    pub problem: String,
}

impl ConfigError {
    pub fn new(what: impl Into<String>, problem: impl Into<String>) -> ConfigError {
        ConfigError {
            what: what.into(),
            problem: problem.into(),
        }
    }
}

impl Classify for ConfigError {
    fn class(&self) -> ErrorClass {
        ErrorClass::Config
    }
}

impl Classify for crate::OsError {
    fn class(&self) -> ErrorClass {
        match self {
            crate::OsError::Io { source, .. } => ErrorClass::of_io(source),
            crate::OsError::Unsupported { .. } => ErrorClass::Failed,
            crate::OsError::InvalidArgument { .. } => ErrorClass::Config,
        }
    }

    fn errno(&self) -> Option<i32> {
        match self {
            crate::OsError::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

impl Classify for crate::OpenError {
    fn class(&self) -> ErrorClass {
        match self {
            crate::OpenError::Io { source, .. } => ErrorClass::of_io(source),
            crate::OpenError::DirectUnsupported { .. } => ErrorClass::Io,
        }
    }

    fn errno(&self) -> Option<i32> {
        match self {
            crate::OpenError::Io { source, .. } => source.raw_os_error(),
            crate::OpenError::DirectUnsupported { .. } => None,
        }
    }
}

impl Classify for crate::EngineError {
    fn class(&self) -> ErrorClass {
        ErrorClass::Io
    }
}

impl Classify for crate::PoolError {
    fn class(&self) -> ErrorClass {
        match self {
            crate::PoolError::RequestExceedsBudget { .. } => ErrorClass::MemoryLimit,
            crate::PoolError::Map { .. } => ErrorClass::Io,
            crate::PoolError::Closed => ErrorClass::Failed,
        }
    }
}

impl Classify for crate::gpu::GpuError {
    fn class(&self) -> ErrorClass {
        match self {
            crate::gpu::GpuError::NoRuntime { .. } => ErrorClass::NoRuntime,
            crate::gpu::GpuError::Invalid { .. } => ErrorClass::Config,
            crate::gpu::GpuError::Alloc { .. } => ErrorClass::MemoryLimit,
            _ => ErrorClass::Failed,
        }
    }

    fn errno(&self) -> Option<i32> {
        match self {
            crate::gpu::GpuError::Alloc { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_has_an_exit_status_and_an_exception() {
        for c in ErrorClass::ALL {
            assert!((1..=4).contains(&c.exit_code()), "{c:?}");
            assert!(c.python_name().ends_with("Error"), "{c:?}");
        }
    }

    #[test]
    fn io_errors_are_classified_by_kind() {
        let e = |k| io::Error::from(k);
        assert_eq!(
            ErrorClass::of_io(&e(io::ErrorKind::NotFound)),
            ErrorClass::NotFound
        );
        assert_eq!(
            ErrorClass::of_io(&e(io::ErrorKind::PermissionDenied)),
            ErrorClass::PermissionDenied
        );
        assert_eq!(
            ErrorClass::of_io(&io::Error::from_raw_os_error(libc::ENOSPC)),
            ErrorClass::Io
        );
    }
}
