//! A shard's bytes, wherever they live: the local descriptor its header was
//! validated from, or an object in a remote store pinned to the version (ETag)
//! its header was read from.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use sluice_engine::{DirectMode, RangeRead, SourceFile};
use sluice_remote::{ObjectInfo, RemoteError, RemoteStore};

use crate::error::LoadError;

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

/// One object's bytes for the engines and `safe_open`, every read pinned to the ETag its
/// header was read with.
pub struct RemoteObject {
    store: Arc<RemoteStore>,
    info: ObjectInfo,
}

impl std::fmt::Debug for RemoteObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteObject")
            .field("url", &self.info.url.to_string())
            .field("size", &self.info.size)
            .field("etag", &self.info.etag)
            .finish()
    }
}

impl RemoteObject {
    pub(crate) fn new(store: Arc<RemoteStore>, info: ObjectInfo) -> RemoteObject {
        RemoteObject { store, info }
    }

    pub fn size(&self) -> u64 {
        self.info.size
    }

    /// Fills `dst` from `offset` (clipped at the object's end) on the shared runtime;
    /// returns the bytes read.
    pub(crate) async fn read_into(&self, offset: u64, dst: &mut [u8]) -> std::io::Result<usize> {
        let n = self.info.size.saturating_sub(offset).min(dst.len() as u64) as usize;
        if n == 0 {
            return Ok(0);
        }
        self.store
            .read_into(&self.info, offset, &mut dst[..n])
            .await
            .map_err(RemoteError::into_io)?;
        Ok(n)
    }
}

impl RangeRead for RemoteObject {
    fn read_at(&self, offset: u64, dst: &mut [u8]) -> std::io::Result<usize> {
        let n = self.info.size.saturating_sub(offset).min(dst.len() as u64) as usize;
        if n == 0 {
            return Ok(0);
        }
        self.store
            .read_ranges(&self.info, vec![(offset, &mut dst[..n])])
            .map_err(RemoteError::into_io)?;
        Ok(n)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
