//! A shard's bytes, wherever they live: the local descriptor its header was
//! validated from, or an object in a remote store pinned to the version (ETag)
//! its header was read from.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use sluice_engine::{DirectMode, RangeRead, SourceFile};

use crate::error::LoadError;
use crate::remote_reader::RemoteObject;

#[derive(Debug)]
pub enum ShardFile {
    Local(File),
    Remote(Arc<RemoteObject>),
}

impl ShardFile {
    /// The shard as the engines read it.
    pub(crate) fn source(&self, path: &Path, direct: DirectMode) -> Result<SourceFile, LoadError> {
        match self {
            ShardFile::Local(file) => {
                let dup = file
                    .try_clone()
                    .map_err(|e| LoadError::io(path, "dup", e))?;
                Ok(SourceFile::from_file(path, dup, direct)?)
            }
            ShardFile::Remote(obj) => {
                if direct == DirectMode::On {
                    return Err(LoadError::Open(
                        sluice_engine::OpenError::DirectUnsupported {
                            path: path.to_path_buf(),
                            reason: "an object in a remote store has no O_DIRECT".into(),
                        },
                    ));
                }
                let reader: Arc<dyn RangeRead> = obj.clone();
                Ok(SourceFile::remote(path, obj.size(), reader))
            }
        }
    }

    /// Reads into `dest` from `offset`; fewer bytes only where the shard ends.
    pub(crate) fn read_at(&self, dest: &mut [u8], offset: u64) -> std::io::Result<usize> {
        match self {
            ShardFile::Local(file) => file.read_at(dest, offset),
            ShardFile::Remote(obj) => obj.read_at(offset, dest),
        }
    }

    /// The local descriptor, for vectored reads; `None` for a remote object.
    pub(crate) fn local(&self) -> Option<&File> {
        match self {
            ShardFile::Local(file) => Some(file),
            ShardFile::Remote(_) => None,
        }
    }
}
