//! Where a mount's bytes come from: a local directory or an object-store prefix. A
//! [`Backend`] lists its files once and reads ranges of them; every read of a remote file
//! is pinned to the version (ETag) it was listed with.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sluice_remote::{ObjectInfo, ObjectUrl, RemoteError, RemoteStore};

/// One file of a backend: its path relative to the root (`/`-separated, no leading `/`),
/// size and version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub path: String,
    pub size: u64,
    /// ETag for objects; inode and mtime for local files.
    pub version: String,
}

/// A source of files for a mount.
pub trait Backend: Send + Sync {
    /// Every file under the root, in path order.
    fn list(&self) -> io::Result<Vec<Entry>>;
    /// Fills `dst` from `offset` of `entry`; fewer bytes only where the file ends. A file
    /// changed since it was listed is an error, never other bytes.
    fn read(&self, entry: &Entry, offset: u64, dst: &mut [u8]) -> io::Result<usize>;
    /// The root, for logs and errors.
    fn describe(&self) -> String;
}

/// A local directory (tests, and a mount over a network file system).
pub struct DirBackend {
    root: PathBuf,
}

impl DirBackend {
    pub fn new(root: &Path) -> io::Result<DirBackend> {
        if !std::fs::metadata(root)?.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{}: not a directory", root.display()),
            ));
        }
        Ok(DirBackend {
            root: root.to_path_buf(),
        })
    }

    fn walk(&self, dir: &Path, out: &mut Vec<Entry>) -> io::Result<()> {
        for item in std::fs::read_dir(dir)? {
            let item = item?;
            let meta = item.metadata()?;
            let path = item.path();
            if meta.is_dir() {
                self.walk(&path, out)?;
            } else if meta.is_file() {
                let Some(rel) = path.strip_prefix(&self.root).ok().and_then(|p| p.to_str()) else {
                    tracing::warn!(path = %path.display(), "skipping a name that is not UTF-8");
                    continue;
                };
                out.push(Entry {
                    path: rel.to_string(),
                    size: meta.len(),
                    version: local_version(&meta),
                });
            }
        }
        Ok(())
    }
}

fn local_version(meta: &std::fs::Metadata) -> String {
    format!("{}:{}:{}", meta.ino(), meta.mtime(), meta.mtime_nsec())
}

impl Backend for DirBackend {
    fn list(&self) -> io::Result<Vec<Entry>> {
        let mut out = Vec::new();
        self.walk(&self.root, &mut out)?;
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    fn read(&self, entry: &Entry, offset: u64, dst: &mut [u8]) -> io::Result<usize> {
        let path = self.root.join(&entry.path);
        let file = File::open(&path)?;
        let meta = file.metadata()?;
        if local_version(&meta) != entry.version || meta.len() != entry.size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: changed since it was listed", path.display()),
            ));
        }
        let want = entry.size.saturating_sub(offset).min(dst.len() as u64) as usize;
        let mut done = 0;
        while done < want {
            match file.read_at(&mut dst[done..want], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    fn describe(&self) -> String {
        self.root.display().to_string()
    }
}

/// Every object under a prefix of a store.
pub struct ObjectBackend {
    store: Arc<RemoteStore>,
    prefix: ObjectUrl,
}

impl ObjectBackend {
    pub fn new(store: Arc<RemoteStore>, prefix: ObjectUrl) -> ObjectBackend {
        ObjectBackend { store, prefix }
    }

    fn prefix_key(&self) -> String {
        let key = self.prefix.key.trim_end_matches('/');
        if key.is_empty() {
            String::new()
        } else {
            format!("{key}/")
        }
    }
}

impl Backend for ObjectBackend {
    fn list(&self) -> io::Result<Vec<Entry>> {
        let listed = self
            .store
            .list(&self.prefix)
            .map_err(RemoteError::into_io)?;
        let prefix = self.prefix_key();
        Ok(listed
            .into_iter()
            .filter_map(|o| {
                let rel = o.url.key.strip_prefix(&prefix)?.to_string();
                (!rel.is_empty()).then(|| Entry {
                    path: rel,
                    size: o.size,
                    version: o.etag.unwrap_or_default(),
                })
            })
            .collect())
    }

    fn read(&self, entry: &Entry, offset: u64, dst: &mut [u8]) -> io::Result<usize> {
        let n = entry.size.saturating_sub(offset).min(dst.len() as u64) as usize;
        if n == 0 {
            return Ok(0);
        }
        let info = ObjectInfo {
            url: ObjectUrl {
                key: format!("{}{}", self.prefix_key(), entry.path),
                ..self.prefix.clone()
            },
            size: entry.size,
            etag: (!entry.version.is_empty()).then(|| entry.version.clone()),
        };
        self.store
            .read_ranges(&info, vec![(offset, &mut dst[..n])])
            .map_err(RemoteError::into_io)?;
        Ok(n)
    }

    fn describe(&self) -> String {
        self.prefix.to_string()
    }
}

/// A [`Backend`] test double: passes to another, counts reads per (file, offset), and
/// fails the next reads it is told to, or delays every read.
pub struct FaultyBackend {
    inner: Arc<dyn Backend>,
    fail_next: std::sync::atomic::AtomicUsize,
    delay: std::time::Duration,
    reads: std::sync::Mutex<std::collections::HashMap<(String, u64), usize>>,
}

impl FaultyBackend {
    pub fn new(inner: Arc<dyn Backend>, delay: std::time::Duration) -> FaultyBackend {
        FaultyBackend {
            inner,
            fail_next: std::sync::atomic::AtomicUsize::new(0),
            delay,
            reads: Default::default(),
        }
    }

    /// Fails the next `n` reads with EIO-like errors.
    pub fn fail_next(&self, n: usize) {
        self.fail_next.store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Reads so far, per (path, offset).
    pub fn reads(&self) -> std::collections::HashMap<(String, u64), usize> {
        self.reads.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Backend for FaultyBackend {
    fn list(&self) -> io::Result<Vec<Entry>> {
        self.inner.list()
    }

    fn read(&self, entry: &Entry, offset: u64, dst: &mut [u8]) -> io::Result<usize> {
        use std::sync::atomic::Ordering;
        *self
            .reads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((entry.path.clone(), offset))
            .or_default() += 1;
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        let failing = self
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Err(io::Error::other(format!(
                "{}: injected failure at {offset}",
                entry.path
            )));
        }
        self.inner.read(entry, offset, dst)
    }

    fn describe(&self) -> String {
        format!("faulty({})", self.inner.describe())
    }
}
