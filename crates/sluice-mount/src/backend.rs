//! Where a mount's bytes come from: a local directory or an object-store prefix. A
//! [`Backend`] lists its files once and reads ranges of them; every read of a remote file
//! is pinned to the version (ETag) it was listed with.

#[cfg(any(test, feature = "testing"))]
mod faulty;
#[cfg(any(test, feature = "testing"))]
pub use faulty::FaultyBackend;

use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sluice_remote::{ObjectInfo, ObjectUrl, RemoteError, RemoteStore};

/// One file or directory of a backend: its path relative to the root (`/`-separated, no
/// leading `/`; the root itself is `""`), size and version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub path: String,
    pub size: u64,
    /// ETag for objects; inode and mtime for local files.
    pub version: String,
    /// A directory (a local one, or an object store's folder marker): never read.
    pub is_dir: bool,
    /// The source's own permissions, where it has them (a local directory); `None` serves
    /// the mount's defaults (world-readable, owned by the daemon's user).
    pub perm: Option<Perm>,
}

impl Entry {
    /// A file with no permissions of its own.
    pub fn file(path: &str, size: u64, version: &str) -> Entry {
        Entry {
            path: path.to_string(),
            size,
            version: version.to_string(),
            is_dir: false,
            perm: None,
        }
    }

    /// A directory with no permissions of its own.
    pub fn dir(path: &str) -> Entry {
        Entry {
            path: path.to_string(),
            size: 0,
            version: String::new(),
            is_dir: true,
            perm: None,
        }
    }
}

/// A source file's or directory's owner and permission bits, served as they are (less the
/// write bits: the mount is read-only), so the kernel grants through the mount what the
/// source grants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Perm {
    /// Read and execute bits only (`mode & 0o555`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

impl Perm {
    fn of(meta: &std::fs::Metadata) -> Perm {
        Perm {
            mode: meta.mode() & 0o555,
            uid: meta.uid(),
            gid: meta.gid(),
        }
    }
}

/// A source of files for a mount.
pub trait Backend: Send + Sync {
    /// Every file under the root, in path order, and directories where the source has
    /// them (a directory is also implied by the files under it).
    fn list(&self) -> io::Result<Vec<Entry>>;
    /// Fills `dst` from `offset` of `entry`; fewer bytes only where the file ends. A file
    /// changed since it was listed is an error, never other bytes.
    fn read(&self, entry: &Entry, offset: u64, dst: &mut [u8]) -> io::Result<usize>;
    /// The root, for logs and errors.
    fn describe(&self) -> String;
}

/// At most this many files and directories in a directory source: links to directories
/// can repeat a tree many times over without a loop.
const MAX_LOCAL_ENTRIES: usize = 1 << 22;

/// A local directory (tests, and a mount over a network file system). Symbolic links are
/// followed: a link to a file serves the file (pinned to the target's inode, mtime and ctime), a
/// link to a directory its tree, except a link back to a directory above it (a loop).
/// Dangling links, loops, FIFOs, sockets and devices are skipped, each logged with its
/// path. Permissions and owners are served as the source has them.
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

    /// Lists `dir`, whose own (device, inode) and those of the directories above it are
    /// `above`.
    fn walk(
        &self,
        dir: &Path,
        above: &mut Vec<(u64, u64)>,
        out: &mut Vec<Entry>,
    ) -> io::Result<()> {
        let context = |e: io::Error, path: &Path| {
            io::Error::new(e.kind(), format!("{}: {e}", path.display()))
        };
        for item in std::fs::read_dir(dir).map_err(|e| context(e, dir))? {
            let item = item.map_err(|e| context(e, dir))?;
            let path = item.path();
            let Some(rel) = path.strip_prefix(&self.root).ok().and_then(|p| p.to_str()) else {
                tracing::warn!(path = %path.display(), "skipping a name that is not UTF-8");
                continue;
            };
            // Follows a symbolic link (and only then can this fail for an entry just listed).
            let meta = match std::fs::metadata(&path) {
                Ok(meta) => meta,
                Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                    tracing::info!(path = %path.display(), "skipping a symbolic link that loops");
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    tracing::info!(path = %path.display(), "skipping a dangling symbolic link (or a file removed while listed)");
                    continue;
                }
                Err(e) => return Err(context(e, &path)),
            };
            if out.len() >= MAX_LOCAL_ENTRIES {
                return Err(io::Error::other(format!(
                    "{}: more than {MAX_LOCAL_ENTRIES} files and directories (symbolic links repeating a tree?)",
                    self.root.display()
                )));
            }
            if meta.is_dir() {
                let id = (meta.dev(), meta.ino());
                if above.contains(&id) {
                    tracing::info!(path = %path.display(), "skipping a symbolic link to a directory above it (a loop)");
                    continue;
                }
                out.push(Entry {
                    perm: Some(Perm::of(&meta)),
                    ..Entry::dir(rel)
                });
                above.push(id);
                let walked = self.walk(&path, above, out);
                above.pop();
                walked?;
            } else if meta.is_file() {
                out.push(Entry {
                    path: rel.to_string(),
                    size: meta.len(),
                    version: local_version(&meta),
                    is_dir: false,
                    perm: Some(Perm::of(&meta)),
                });
            } else {
                let kind = sluice_engine::kind_name(meta.file_type());
                tracing::info!(path = %path.display(), "skipping {kind}");
            }
        }
        Ok(())
    }
}

/// A local file's version: its inode, mtime and ctime. The ctime catches a rewrite in
/// place whose mtime was put back (`touch -r`, `cp -p` of the same size), which no one can
/// set back.
fn local_version(meta: &std::fs::Metadata) -> String {
    format!(
        "{}:{}:{}:{}:{}",
        meta.ino(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ctime(),
        meta.ctime_nsec()
    )
}

impl Backend for DirBackend {
    fn list(&self) -> io::Result<Vec<Entry>> {
        let meta = std::fs::metadata(&self.root)?;
        let mut out = vec![Entry {
            perm: Some(Perm::of(&meta)),
            ..Entry::dir("")
        }];
        self.walk(&self.root, &mut vec![(meta.dev(), meta.ino())], &mut out)?;
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    fn read(&self, entry: &Entry, offset: u64, dst: &mut [u8]) -> io::Result<usize> {
        let path = self.root.join(&entry.path);
        // A FIFO put in the file's place must not block the read (and the daemon's thread).
        let file = sluice_engine::open_regular(&path, 0)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
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

    /// The error for a prefix with nothing under it: an object URL (a key, not a prefix)
    /// says so.
    fn nothing_listed(&self) -> io::Error {
        let key = &self.prefix.key;
        if !key.is_empty() && !key.ends_with('/') {
            if let Ok(obj) = self.store.info(&self.prefix) {
                return io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "{} is an object ({} bytes), not a prefix: mount the prefix that holds it",
                        self.prefix, obj.size
                    ),
                );
            }
        }
        let shown = match key.is_empty() || key.ends_with('/') {
            true => self.prefix.to_string(),
            false => format!("{}/", self.prefix),
        };
        io::Error::new(io::ErrorKind::NotFound, format!("no objects under {shown}"))
    }
}

impl Backend for ObjectBackend {
    /// The objects under the prefix; a key ending in `/` (a folder marker, as the AWS
    /// console, s3fs and rclone make) is a directory. Nothing under the prefix is a
    /// missing source (`NotFound`), named as an object where the URL is one.
    fn list(&self) -> io::Result<Vec<Entry>> {
        let listed = self
            .store
            .list(&self.prefix)
            .map_err(RemoteError::into_io)?;
        let prefix = self.prefix_key();
        let out: Vec<Entry> = listed
            .into_iter()
            .filter_map(|o| {
                // (The prefix's own folder marker is not under it, and skipped.)
                let rel = o.url.key.strip_prefix(&prefix)?;
                Some(match rel.strip_suffix('/') {
                    Some(dir) => Entry::dir(dir),
                    None => Entry::file(rel, o.size, &o.etag.unwrap_or_default()),
                })
            })
            .filter(|e| !e.path.is_empty())
            .collect();
        if out.is_empty() {
            return Err(self.nothing_listed());
        }
        Ok(out)
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
