//! The KV plane's error type.
//!
//! Only failures the caller must act on are errors: bad configuration, bad arguments, a
//! store directory that is not ours or is held by another process, and I/O on the store's
//! own metadata. A block that cannot be read, or reads back corrupt, is not an error: it is
//! a miss, counted in the stats (an engine recomputes a missing prefix; it must never get
//! wrong bytes, and never a failure it has to special-case).

use std::path::PathBuf;

use sluice_formats::kv::KvFormatError;

#[derive(Debug, thiserror::Error)]
pub enum KvError {
    /// A configuration value out of range: `field` names it, `value` is what was given.
    #[error("kv config: {field} = {value}: {expected}")]
    Config {
        field: &'static str,
        value: String,
        expected: String,
    },
    /// An argument of a call: a key or buffer of the wrong size, mismatched batch lengths.
    #[error("{what}: {detail}")]
    InvalidArgument { what: String, detail: String },
    /// The directory holds something that is not a sluice kv store of this version, or one
    /// created with other settings that cannot change (`block_bytes`).
    #[error("{path}: {detail}")]
    Incompatible { path: PathBuf, detail: String },
    /// The store is open elsewhere (one owner per store directory): `holder` is the pid
    /// its lock file names, when it names one.
    #[error("{path}: {}", locked_message(*holder))]
    Locked { path: PathBuf, holder: Option<u32> },
    /// I/O on the store's directory, manifest or lock file failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Write-back blocks, acknowledged in DRAM, that could not be written to the SSD tier
    /// since the last `sync()`: `source` is the last failure.
    #[error(
        "{path}: {blocks} block(s) acknowledged in write-back mode could not be written to the \
         SSD tier since the last sync ({source}); those DRAM had evicted are lost, the rest \
         are still only in DRAM"
    )]
    NotDurable {
        path: PathBuf,
        blocks: u64,
        #[source]
        source: std::io::Error,
    },
    /// The object store of the shared tier (`remote`) could not be reached, listed or
    /// configured when the store opened: `source` names the URL and says why.
    #[error("kv remote tier: {source}")]
    Remote {
        #[source]
        source: sluice_remote::RemoteError,
    },
    /// A segment file that cannot be decoded at all (its header is damaged).
    #[error("{path}: {source}")]
    Format {
        path: PathBuf,
        #[source]
        source: KvFormatError,
    },
    /// A handle used in a child `fork`ed from the process that opened it: the child's copy
    /// shares its parent's files, lock and sockets (see `fork_guard`).
    #[error(
        "{path}: opened by process {opened_by}, of which this process ({this}) is a fork; a \
         forked child cannot use the store or sidecar connection it inherited: open it (or \
         connect) again in this process"
    )]
    Forked {
        path: PathBuf,
        opened_by: u32,
        this: u32,
    },
    /// The store was closed.
    #[error("the kv store is closed")]
    Closed,
    /// A job id this store never issued, or one already collected.
    #[error("unknown job {0}")]
    UnknownJob(u64),
}

/// Who holds a store's lock, in words: this process (a second open of a store it already
/// has open), or another one.
fn locked_message(holder: Option<u32>) -> String {
    match holder {
        Some(pid) if pid == std::process::id() => {
            format!("the store is open already: this process already has it open (pid {pid})")
        }
        Some(pid) => format!("the store is open in another process (pid {pid})"),
        None => "the store is open in another process".into(),
    }
}

impl KvError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> KvError {
        let path = path.into();
        move |source| KvError::Io { path, source }
    }

    pub(crate) fn arg(what: impl Into<String>, detail: impl Into<String>) -> KvError {
        KvError::InvalidArgument {
            what: what.into(),
            detail: detail.into(),
        }
    }

    pub(crate) fn config(
        field: &'static str,
        value: impl ToString,
        expected: impl Into<String>,
    ) -> KvError {
        KvError::Config {
            field,
            value: value.to_string(),
            expected: expected.into(),
        }
    }
}

impl sluice_engine::Classify for KvError {
    fn class(&self) -> sluice_engine::ErrorClass {
        use sluice_engine::ErrorClass;
        match self {
            KvError::Config { .. } | KvError::InvalidArgument { .. } => ErrorClass::Config,
            KvError::Incompatible { .. } | KvError::Format { .. } => ErrorClass::BadStore,
            KvError::Locked { .. } | KvError::Forked { .. } => ErrorClass::Locked,
            KvError::Io { source, .. } | KvError::NotDurable { source, .. } => {
                ErrorClass::of_io(source)
            }
            KvError::Closed | KvError::UnknownJob(_) => ErrorClass::Failed,
            KvError::Remote { source } => source.class(),
        }
    }

    fn errno(&self) -> Option<i32> {
        match self {
            KvError::Io { source, .. } | KvError::NotDurable { source, .. } => {
                source.raw_os_error()
            }
            _ => None,
        }
    }
}
