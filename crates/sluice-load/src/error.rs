//! Errors of the load plane. Each names the file, tensor or value at fault.

use std::io;
use std::path::PathBuf;

use sluice_engine::{Classify, ConfigError, EngineError, ErrorClass, OpenError, PoolError};
use sluice_formats::FormatError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    #[error(transparent)]
    Format(#[from] FormatError),
    /// An object store refused, failed or changed under a read (issue 15).
    #[error(transparent)]
    Remote(#[from] sluice_remote::RemoteError),
    #[error("{}: cannot {op}: {source}", path.display())]
    Io {
        path: PathBuf,
        op: &'static str,
        source: io::Error,
    },
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("{}: no *.safetensors files in this directory", dir.display())]
    NoShards { dir: PathBuf },
    #[error("{}: the index names shard {shard:?}, but {} does not exist", index.display(), path.display())]
    ShardFileMissing {
        index: PathBuf,
        shard: String,
        path: PathBuf,
    },
    #[error(
        "{}: {} missing: the shard names promise a complete -NNNNN-of-MMMMM series; pass allow_partial=True (--allow-partial) to load the rest",
        dir.display(),
        shard_list(missing)
    )]
    ShardsMissing { dir: PathBuf, missing: Vec<PathBuf> },
    #[error("tensor {name:?} was requested but {} has no such tensor", checkpoint.display())]
    UnknownTensor { name: String, checkpoint: PathBuf },
    #[error("{}: reading {len} bytes at offset {offset} failed: {source}", path.display())]
    Read {
        path: PathBuf,
        offset: u64,
        len: usize,
        source: io::Error,
    },
    #[error(
        "{}: file ended early: expected {expected} bytes at offset {offset}, read {got} (was it truncated while loading?)",
        path.display()
    )]
    Truncated {
        path: PathBuf,
        offset: u64,
        expected: u64,
        got: u64,
    },
    #[error(
        "tensor {tensor:?} takes a {bytes}-byte buffer; with the buffer read next to it (one you hold while the other is read) \
         and the staging buffer, a stream needs {needed} bytes, but memory_limit is {limit} bytes; raise memory_limit"
    )]
    TensorExceedsMemoryLimit {
        tensor: String,
        bytes: u64,
        needed: u64,
        limit: u64,
    },
    #[error(
        "the stream's memory_limit of {limit} bytes is exhausted by {held} bytes of yielded tensors that are still referenced; \
         copy tensors out and drop them, or raise memory_limit"
    )]
    MemoryLimitExhausted { limit: u64, held: u64 },
    #[error("the {engine} engine failed: {source}")]
    EngineFailed {
        engine: &'static str,
        source: io::Error,
    },
    #[error("buffer pool: {0}")]
    Pool(#[from] PoolError),
    #[error("invalid load configuration: {0}")]
    Config(#[from] ConfigError),
    /// A thread the load needs could not be started.
    #[error("cannot start the load thread: {0}")]
    Thread(io::Error),
    #[error("the load was cancelled")]
    Cancelled,
}

impl LoadError {
    pub(crate) fn io(path: impl Into<PathBuf>, op: &'static str, source: io::Error) -> Self {
        LoadError::Io {
            path: path.into(),
            op,
            source,
        }
    }

    /// A failed read of `len` bytes at `offset` of `path`. A remote store's
    /// error, carried through the engines as an `io::Error`, comes back out
    /// as [`LoadError::Remote`], which names the URL and the range.
    pub fn read(path: &std::path::Path, offset: u64, len: usize, source: io::Error) -> LoadError {
        if source
            .get_ref()
            .is_some_and(|e| e.is::<sluice_remote::RemoteError>())
        {
            if let Some(inner) = source.into_inner() {
                if let Ok(remote) = inner.downcast::<sluice_remote::RemoteError>() {
                    return LoadError::Remote(*remote);
                }
            }
            unreachable!("checked above that the error is a RemoteError");
        }
        LoadError::Read {
            path: path.to_path_buf(),
            offset,
            len,
            source,
        }
    }

    /// True when the error is a missing file, directory, shard or object.
    pub fn is_not_found(&self) -> bool {
        self.class() == ErrorClass::NotFound
    }
}

impl LoadError {
    /// A config error: `what` is the option or value, `problem` what is wrong with it.
    pub fn config(what: impl Into<String>, problem: impl Into<String>) -> LoadError {
        LoadError::Config(ConfigError::new(what, problem))
    }
}

impl Classify for LoadError {
    fn class(&self) -> ErrorClass {
        match self {
            LoadError::Format(_) | LoadError::NoShards { .. } => ErrorClass::BadHeader,
            LoadError::Remote(e) => e.class(),
            LoadError::Io { source, .. } | LoadError::Read { source, .. } => {
                ErrorClass::of_io(source)
            }
            LoadError::Open(e) => e.class(),
            LoadError::Engine(e) => e.class(),
            LoadError::Pool(e) => e.class(),
            LoadError::ShardFileMissing { .. } | LoadError::ShardsMissing { .. } => {
                ErrorClass::NotFound
            }
            LoadError::UnknownTensor { .. } => ErrorClass::TensorNotFound,
            LoadError::TensorExceedsMemoryLimit { .. } => ErrorClass::MemoryLimit,
            LoadError::MemoryLimitExhausted { .. } => ErrorClass::MemoryExhausted,
            LoadError::Config(_) => ErrorClass::Config,
            LoadError::Truncated { .. } | LoadError::EngineFailed { .. } | LoadError::Thread(_) => {
                ErrorClass::Io
            }
            LoadError::Cancelled => ErrorClass::Failed,
        }
    }

    fn errno(&self) -> Option<i32> {
        match self {
            LoadError::Io { source, .. }
            | LoadError::Read { source, .. }
            | LoadError::EngineFailed { source, .. }
            | LoadError::Thread(source) => source.raw_os_error(),
            LoadError::Open(e) => e.errno(),
            _ => None,
        }
    }
}

/// The file names of `shards` for a one-line message: the first few, then how many more
/// (a name promising 99,999 shards must not make a megabyte-long error line).
fn shard_list(shards: &[PathBuf]) -> String {
    const SHOWN: usize = 8;
    let names: Vec<_> = shards
        .iter()
        .take(SHOWN)
        .map(|p| p.file_name().unwrap_or_default().to_string_lossy())
        .collect();
    match shards.len().saturating_sub(SHOWN) {
        0 => names.join(", "),
        more => format!("{} and {more} more", names.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_list_of_missing_shards_is_cut_short_in_the_message() {
        let missing: Vec<PathBuf> = (2..=99_999)
            .map(|n| PathBuf::from(format!("/m/model-{n:05}-of-99999.safetensors")))
            .collect();
        let err = LoadError::ShardsMissing {
            dir: PathBuf::from("/m"),
            missing,
        };
        let text = err.to_string();
        assert!(text.len() < 1000, "{} bytes", text.len());
        assert!(text.contains("model-00002-of-99999.safetensors"), "{text}");
        assert!(text.contains("and 99990 more"), "{text}");
    }
}
