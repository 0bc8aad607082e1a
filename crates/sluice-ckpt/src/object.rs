//! [`ObjectRoot`]: a checkpoint store under an object-store prefix (`s3://`, `gs://`,
//! `az://`), laid out as a directory store is:
//!
//! ```text
//! <prefix>/sluice-ckpt.json       the store's marker
//! <prefix>/chunks/ab/abcd...      content-addressed chunks
//! <prefix>/<name>/manifest.json   one checkpoint, visible once its manifest is
//! ```
//!
//! An object store has no rename and no lock, so what a directory store gets from them is
//! had another way:
//! - a chunk is one PUT (a multipart upload when large), which a reader sees whole or not
//!   at all; a put that returned is durable;
//! - the manifest is published last with a create-only PUT: two saves of one name cannot
//!   both publish, and a save killed at any point leaves no manifest, so nothing visible;
//! - `gc` takes no lock: it removes only unreferenced chunks older than a grace period (a
//!   save in flight writes young ones), and a publish checks that every chunk it names is
//!   stored just before it puts the manifest.
//!
//! Requests go through `sluice-remote` (credentials, endpoints, retries and typed errors
//! as the loaders have them).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use sluice_remote::{Listed, ObjectUrl, RemoteError, RemoteOptions, RemoteStore};

use crate::error::CkptError;

/// A store's prefix in an object store.
#[derive(Clone)]
pub struct ObjectRoot {
    /// The prefix, with no trailing `/` (the bucket's root when empty).
    url: ObjectUrl,
    remote: Arc<RemoteStore>,
    /// Requests in flight at once for a store's bulk work (chunk reads and writes).
    concurrency: usize,
}

impl std::fmt::Debug for ObjectRoot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ObjectRoot({})", self.url)
    }
}

impl ObjectRoot {
    /// The store at `url` (a bucket and an optional prefix), configured from the
    /// environment as the loaders are (`AWS_*`, `GOOGLE_*`, `AZURE_*`, `SLUICE_REMOTE_*`).
    pub fn open(url: &str) -> Result<ObjectRoot, CkptError> {
        let parsed = ObjectUrl::parse(url).map_err(CkptError::remote)?;
        // Every chunk is verified against its BLAKE3 name on every read, so a SHA-256 of
        // each upload's body for its signature buys nothing but CPU (about 15% of a save's
        // time on two cores); AWS_UNSIGNED_PAYLOAD=false asks for it anyway.
        let opts = RemoteOptions::from_env_self_verified().map_err(CkptError::remote)?;
        let remote = RemoteStore::open(&parsed, &opts).map_err(CkptError::remote)?;
        Ok(ObjectRoot::with_remote(parsed, remote, opts.concurrency))
    }

    /// A store over an opened bucket (tests give an in-memory or a fault-injecting one).
    pub fn with_remote(url: ObjectUrl, remote: RemoteStore, concurrency: usize) -> ObjectRoot {
        let key = url.key.trim_end_matches('/').to_string();
        ObjectRoot {
            url: ObjectUrl { key, ..url },
            remote: Arc::new(remote),
            concurrency: concurrency.max(1),
        }
    }

    /// The store's URL, as a path for messages (`s3://bucket/prefix`).
    pub fn display(&self) -> PathBuf {
        PathBuf::from(self.url.to_string().trim_end_matches('/'))
    }

    pub fn concurrency(&self) -> usize {
        self.concurrency
    }

    /// The URL of `rel` (a `/`-separated key under the store's prefix).
    pub fn url(&self, rel: &str) -> ObjectUrl {
        match rel.is_empty() {
            true => self.url.clone(),
            false => self.url.join(rel),
        }
    }

    /// `rel`'s URL as a path, for messages and error types that name a path.
    pub fn path(&self, rel: &str) -> PathBuf {
        PathBuf::from(self.url(rel).to_string())
    }

    pub fn get(&self, rel: &str) -> Result<Option<(Bytes, Listed)>, CkptError> {
        self.remote.get(&self.url(rel)).map_err(CkptError::remote)
    }

    pub fn head(&self, rel: &str) -> Result<Option<Listed>, CkptError> {
        self.remote.head(&self.url(rel)).map_err(CkptError::remote)
    }

    pub fn put(&self, rel: &str, data: Bytes) -> Result<(), CkptError> {
        self.remote
            .put(&self.url(rel), data)
            .map_err(CkptError::remote)
    }

    /// A create-only put: `false` if an object was there already.
    pub fn put_new(&self, rel: &str, data: Bytes) -> Result<bool, CkptError> {
        self.remote
            .put_new(&self.url(rel), data)
            .map_err(CkptError::remote)
    }

    pub fn delete(&self, rel: &str) -> Result<(), CkptError> {
        self.remote
            .delete(&self.url(rel))
            .map_err(CkptError::remote)
    }

    /// Every object under `rel` at any depth, keys relative to the store's prefix.
    pub fn list(&self, rel: &str) -> Result<Vec<Listed>, CkptError> {
        let mut out = self
            .remote
            .list_dated(&self.url(rel))
            .map_err(CkptError::remote)?;
        for l in &mut out {
            l.key = self.relative(&l.key);
        }
        Ok(out)
    }

    /// The objects directly under `rel` (keys relative to the store's prefix) and the
    /// names of the prefixes below it.
    pub fn list_dir(&self, rel: &str) -> Result<(Vec<Listed>, Vec<String>), CkptError> {
        let (mut files, dirs) = self
            .remote
            .list_names(&self.url(rel))
            .map_err(CkptError::remote)?;
        for l in &mut files {
            l.key = self.relative(&l.key);
        }
        Ok((files, dirs))
    }

    fn relative(&self, key: &str) -> String {
        match self.url.key.is_empty() {
            true => key.to_string(),
            false => key
                .strip_prefix(&self.url.key)
                .map(|k| k.trim_start_matches('/'))
                .unwrap_or(key)
                .to_string(),
        }
    }
}

/// How long ago `t` was (zero for a date in the future: clocks differ).
pub fn age(t: SystemTime) -> std::time::Duration {
    SystemTime::now().duration_since(t).unwrap_or_default()
}

impl CkptError {
    pub(crate) fn remote(e: RemoteError) -> CkptError {
        CkptError::Remote(Arc::new(e))
    }
}
