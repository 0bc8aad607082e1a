//! Whole-object reads, writes, create-only puts, deletes and listings with dates: what a
//! store that keeps its own objects (the checkpoint plane's chunks and manifests) needs.
//!
//! Every call blocks on the shared runtime; it is made from plain threads (a checkpoint's
//! writer threads), never from inside the runtime.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::{PutMode, PutOptions, PutPayload, WriteMultipart};

use super::{request_error, runtime, RemoteStore};
use crate::error::RemoteError;
use crate::url::ObjectUrl;

/// Objects larger than this go up as multipart uploads.
pub const MULTIPART_BYTES: usize = 16 << 20;
/// The part size of a multipart upload (S3 takes 5 MiB at least).
const PART_BYTES: usize = 8 << 20;
/// Parts of one upload in flight at once.
const PARTS_IN_FLIGHT: usize = 4;

/// An object as a listing gives it: its key, size and when it was last written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    pub key: String,
    pub size: u64,
    pub modified: SystemTime,
}

impl Listed {
    fn of(m: object_store::ObjectMeta) -> Listed {
        let ms = m.last_modified.timestamp_millis().max(0) as u64;
        Listed {
            key: m.location.to_string(),
            size: m.size,
            modified: UNIX_EPOCH + Duration::from_millis(ms),
        }
    }
}

impl RemoteStore {
    /// The whole object with its size and date, or `None` where there is none.
    pub fn get(&self, url: &ObjectUrl) -> Result<Option<(Bytes, Listed)>, RemoteError> {
        let path = self.path(url)?;
        let got = runtime()?.block_on(async {
            let r = self.store.get(&path).await?;
            let meta = Listed::of(r.meta.clone());
            Ok::<_, object_store::Error>((r.bytes().await?, meta))
        });
        match got {
            Ok(b) => Ok(Some(b)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(request_error(url, e)),
        }
    }

    /// Size and date of the object, or `None` where there is none (a HEAD).
    pub fn head(&self, url: &ObjectUrl) -> Result<Option<Listed>, RemoteError> {
        let path = self.path(url)?;
        match runtime()?.block_on(self.store.head(&path)) {
            Ok(m) => Ok(Some(Listed::of(m))),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(request_error(url, e)),
        }
    }

    /// Writes the object whole (a reader sees the old object or the new one, never a
    /// part): one PUT, or a multipart upload above [`MULTIPART_BYTES`] that is aborted if
    /// any part fails.
    pub fn put(&self, url: &ObjectUrl, data: Bytes) -> Result<(), RemoteError> {
        let path = self.path(url)?;
        let rt = runtime()?;
        let done = match data.len() > MULTIPART_BYTES {
            false => rt
                .block_on(self.store.put(&path, PutPayload::from_bytes(data)))
                .map(|_| ()),
            true => rt.block_on(async {
                let upload = self.store.put_multipart(&path).await?;
                let mut w = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
                let mut at = 0;
                while at < data.len() {
                    if let Err(e) = w.wait_for_capacity(PARTS_IN_FLIGHT).await {
                        let _ = w.abort().await;
                        return Err(e);
                    }
                    let end = (at + PART_BYTES).min(data.len());
                    w.put(data.slice(at..end));
                    at = end;
                }
                w.finish().await.map(|_| ())
            }),
        };
        done.map_err(|e| request_error(url, e))
    }

    /// Writes the first `len` bytes of the file at `path` as the object, whole or not at
    /// all like [`RemoteStore::put`], reading it a part at a time: at most
    /// `PARTS_IN_FLIGHT` parts of it are in memory at once, however long it is.
    /// `progress` is told the bytes handed on so far each time a part can go (so a caller
    /// can tell a slow upload from a stalled one).
    pub fn put_file(
        &self,
        url: &ObjectUrl,
        path: &std::path::Path,
        len: u64,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<(), RemoteError> {
        use std::os::unix::fs::FileExt;
        let file = std::fs::File::open(path).map_err(|e| RemoteError::Local {
            path: path.to_path_buf(),
            source: e,
        })?;
        let read = |at: u64, n: usize| -> Result<Bytes, RemoteError> {
            let mut buf = vec![0u8; n];
            file.read_exact_at(&mut buf, at)
                .map_err(|e| RemoteError::Local {
                    path: path.to_path_buf(),
                    source: e,
                })?;
            Ok(Bytes::from(buf))
        };
        if len <= MULTIPART_BYTES as u64 {
            return self.put(url, read(0, len as usize)?);
        }
        let obj = self.path(url)?;
        let rt = runtime()?;
        rt.block_on(async {
            let upload = self
                .store
                .put_multipart(&obj)
                .await
                .map_err(|e| request_error(url, e))?;
            let mut w = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
            let mut at = 0u64;
            while at < len {
                let n = (len - at).min(PART_BYTES as u64) as usize;
                let part = match w.wait_for_capacity(PARTS_IN_FLIGHT).await {
                    Ok(()) => {
                        progress(at);
                        read(at, n)
                    }
                    Err(e) => Err(request_error(url, e)),
                };
                match part {
                    Ok(b) => w.put(b),
                    Err(e) => {
                        let _ = w.abort().await;
                        return Err(e);
                    }
                }
                at += n as u64;
            }
            w.finish()
                .await
                .map(|_| ())
                .map_err(|e| request_error(url, e))
        })
    }

    /// Writes the object only if there is none under its name (a conditional,
    /// create-only PUT: S3's `If-None-Match: *`, GCS's `ifGenerationMatch=0`, Azure's
    /// `If-None-Match: *`); `false` if one was there, which is left as it was.
    pub fn put_new(&self, url: &ObjectUrl, data: Bytes) -> Result<bool, RemoteError> {
        let path = self.path(url)?;
        let opts = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        let put = runtime()?.block_on(self.store.put_opts(
            &path,
            PutPayload::from_bytes(data),
            opts,
        ));
        match put {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(request_error(url, e)),
        }
    }

    /// Removes the object; one that is not there is fine.
    pub fn delete(&self, url: &ObjectUrl) -> Result<(), RemoteError> {
        let path = self.path(url)?;
        match runtime()?.block_on(self.store.delete(&path)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(request_error(url, e)),
        }
    }

    /// Every object under `prefix` (at any depth), with its date, in key order.
    pub fn list_dated(&self, prefix: &ObjectUrl) -> Result<Vec<Listed>, RemoteError> {
        let path = self.path(prefix)?;
        let under = (!prefix.key.is_empty()).then_some(&path);
        let listed = runtime()?.block_on(self.store.list(under).try_collect::<Vec<_>>());
        let mut out: Vec<Listed> = match listed {
            Ok(metas) => metas.into_iter().map(Listed::of).collect(),
            Err(e) => return Err(self.list_error(prefix, e)),
        };
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// The objects directly under `prefix` with their dates, and the names of the deeper
    /// prefixes (a directory's files and subdirectories), each in order.
    pub fn list_names(
        &self,
        prefix: &ObjectUrl,
    ) -> Result<(Vec<Listed>, Vec<String>), RemoteError> {
        let path = self.path(prefix)?;
        let under = (!prefix.key.is_empty()).then_some(&path);
        let listed = match runtime()?.block_on(self.store.list_with_delimiter(under)) {
            Ok(listed) => listed,
            Err(e) => return Err(self.list_error(prefix, e)),
        };
        let mut files: Vec<Listed> = listed.objects.into_iter().map(Listed::of).collect();
        files.sort_by(|a, b| a.key.cmp(&b.key));
        let mut dirs: Vec<String> = listed
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_string))
            .collect();
        dirs.sort();
        Ok((files, dirs))
    }
}
