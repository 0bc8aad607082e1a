//! [`CkptStore`]: a directory of checkpoints sharing one chunk pool.
//!
//! ```text
//! <root>/sluice-ckpt.json      the store's marker (format, version)
//! <root>/lock                  shared by saves and loads, exclusive for gc
//! <root>/chunks/ab/abcd...     content-addressed chunks
//! <root>/<name>/manifest.json  one checkpoint per directory, visible once its manifest is
//! <root>/.pending/...          grouped saves' commit files (crate::commit)
//! ```
//!
//! Saves take the lock shared, garbage collection exclusive: gc must never remove a chunk
//! that a save in flight found already stored and is about to reference. Readers lock a
//! file they can only read, so a store on a read-only mount (or another user's) loads.
//!
//! A store under an object-store prefix (`s3://bucket/run`) has the same layout without
//! the lock and the pending directory; `crate::object` says what replaces them.
//!
//! A store writes only where it owns the directory, and removes only what it wrote: it is
//! created in a new or empty directory (or one that is already a store), a checkpoint is
//! saved where there is none or the store's own, and `gc` removes a checkpoint's manifest
//! and then its directory only if nothing else is in it.

mod maintenance;
mod objects;

pub use maintenance::{diff, CheckpointInfo, DiffReport, GcReport, VerifyReport};
pub use objects::DEFAULT_GRACE;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use sluice_engine::{FileLock, LockError, LockMode, LockOpen};

use crate::chunk_store::ChunkStore;
use crate::chunking::{chunk, parallel_map, ChunkRef, Digest};
use crate::error::CkptError;
use crate::manifest::{Entry, EntryKind, Manifest, MANIFEST_FILE};
use crate::object::ObjectRoot;
use crate::path::{check_name, check_store_path, CHUNKS_DIR, LOCK_FILE, MARKER_FILE, PENDING_DIR};
use crate::steps::{Step, StoreSteps};

/// One item to save: a tensor's bytes with its dtype and shape, or opaque bytes.
pub struct SaveItem<'a> {
    pub key: String,
    pub kind: EntryKind,
    pub dtype: Option<String>,
    pub shape: Option<Vec<u64>>,
    pub bytes: &'a [u8],
    pub meta: serde_json::Value,
}

/// What a save did.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct SaveReport {
    pub entries: usize,
    /// Bytes of every entry, duplicates counted.
    pub logical_bytes: u64,
    /// Bytes of the checkpoint's distinct chunks.
    pub unique_bytes: u64,
    /// Bytes written now: chunks the store did not hold yet.
    pub written_bytes: u64,
    pub written_chunks: usize,
}

/// What a failed save's clean-up did.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Cleanup {
    pub chunks_removed: usize,
    pub bytes_freed: u64,
    /// Chunks left because other saves or loads had the store open (`gc` frees them).
    pub chunks_left: usize,
}

/// An open store of checkpoints.
pub struct CkptStore {
    root: PathBuf,
    chunks: ChunkStore,
    /// `None` where the lock file cannot be opened at all (a read-only store without one).
    lock: Mutex<Option<FileLock>>,
    /// Where the store is an object-store prefix (`root` is then its URL).
    object: Option<ObjectRoot>,
}

/// How a store is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    /// Created if absent; lock shared (saves).
    Create,
    /// Must exist; lock shared, read-only (loads, listings).
    Read,
    /// Must exist; lock exclusive (gc).
    Exclusive,
}

impl CkptStore {
    /// Opens (or creates) the store at `root`, lock shared (saves). A directory that is
    /// neither a store nor empty is refused ([`CkptError::ForeignDirectory`]).
    pub fn open(root: &Path) -> Result<CkptStore, CkptError> {
        CkptStore::open_as(root, Access::Create, crate::steps::real())
    }

    /// [`CkptStore::open`] with its file-system steps going through `steps` (tests).
    pub fn open_with_steps(
        root: &Path,
        steps: Arc<dyn StoreSteps>,
    ) -> Result<CkptStore, CkptError> {
        CkptStore::open_as(root, Access::Create, steps)
    }

    /// Opens the existing store at `root` for reading (loads, listings), lock shared: a
    /// path that is no store is [`CkptError::NoStore`], nothing is created, and no write
    /// access is needed.
    pub fn open_existing(root: &Path) -> Result<CkptStore, CkptError> {
        CkptStore::open_as(root, Access::Read, crate::steps::real())
    }

    /// Opens the store with its lock exclusive (garbage collection); a store in use by a
    /// save or load is [`CkptError::Busy`], not waited for.
    pub fn open_exclusive(root: &Path) -> Result<CkptStore, CkptError> {
        CkptStore::open_as(root, Access::Exclusive, crate::steps::real())
    }

    fn open_as(
        root: &Path,
        access: Access,
        steps: Arc<dyn StoreSteps>,
    ) -> Result<CkptStore, CkptError> {
        check_store_path(root)?;
        if crate::path::is_url(root) {
            let url = root.to_str().expect("a checked URL is UTF-8");
            return CkptStore::open_object(url, access, steps);
        }
        if root.exists() && !root.is_dir() {
            return Err(CkptError::arg(
                root.display().to_string(),
                "is not a directory",
            ));
        }
        let marker = root.join(MARKER_FILE);
        // A FIFO or a device in place of the marker would block the open: it is opened
        // non-blocking and refused unless it is a regular file.
        let read = sluice_engine::open_regular(&marker, 0).and_then(|mut f| {
            let mut b = Vec::new();
            std::io::Read::read_to_end(&mut f, &mut b).map(|_| b)
        });
        match read {
            Ok(b) => check_marker(&marker, &b)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && access == Access::Create => {
                create(root, &*steps)?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(CkptError::NoStore {
                    path: root.to_path_buf(),
                })
            }
            Err(e) => return Err(CkptError::io(&marker)(e)),
        }
        if access == Access::Create {
            let chunks = root.join(CHUNKS_DIR);
            std::fs::create_dir_all(&chunks).map_err(CkptError::io(&chunks))?;
        }
        let lock = take_lock(root, access)?;
        Ok(CkptStore {
            root: root.to_path_buf(),
            chunks: ChunkStore::with_steps(&root.join(CHUNKS_DIR), steps),
            lock: Mutex::new(lock),
            object: None,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn chunks(&self) -> &ChunkStore {
        &self.chunks
    }

    /// The object store, where the store is under an object-store prefix.
    pub fn object(&self) -> Option<&ObjectRoot> {
        self.object.as_ref()
    }

    /// The manifest of checkpoint `name`.
    pub fn manifest(&self, name: &str) -> Result<Manifest, CkptError> {
        check_name(name)?;
        match &self.object {
            Some(o) => self.manifest_object(o, name),
            None => Manifest::read(&self.root.join(name)),
        }
    }

    fn steps(&self) -> &dyn StoreSteps {
        &**self.chunks.steps()
    }

    /// The directory of checkpoint `name` (a plain name: see [`crate::path::check_name`]).
    pub fn checkpoint_dir(&self, name: &str) -> Result<PathBuf, CkptError> {
        check_name(name)?;
        Ok(self.root.join(name))
    }

    /// Checks that checkpoint `name` can be saved: its directory is absent, empty, or holds
    /// only this store's manifest (a checkpoint saved again). Anything else (a torch DCP
    /// directory, another store) is [`CkptError::ForeignDirectory`], before any chunk is
    /// written.
    pub fn prepare(&self, name: &str) -> Result<PathBuf, CkptError> {
        let dir = self.checkpoint_dir(name)?;
        if let Some(o) = &self.object {
            return self.prepare_object(o, name);
        }
        match std::fs::symlink_metadata(&dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(dir),
            Err(e) => return Err(CkptError::io(&dir)(e)),
            Ok(m) if !m.is_dir() => {
                return Err(CkptError::ForeignDirectory {
                    path: dir,
                    role: "is no checkpoint directory of this store: it",
                    found: vec![kind_of(&m).into()],
                })
            }
            Ok(_) => {}
        }
        let found: Vec<String> = names_in(&dir)?
            .into_iter()
            .filter(|n| n != MANIFEST_FILE)
            .collect();
        if !found.is_empty() {
            return Err(CkptError::ForeignDirectory {
                path: dir,
                role: "is no checkpoint of this store and",
                found,
            });
        }
        Ok(dir)
    }

    /// Saves `items` as checkpoint `name` in one process: chunks and hashes them on
    /// `threads` threads, writes the chunks the store lacks, makes them durable, then
    /// publishes the manifest. Until then the checkpoint does not exist.
    pub fn save(
        &self,
        name: &str,
        items: &[SaveItem<'_>],
        chunk_bytes: u64,
        threads: usize,
    ) -> Result<SaveReport, CkptError> {
        self.prepare(name)?;
        if chunk_bytes == 0 {
            return Err(CkptError::arg("chunk_bytes", "must be at least 1"));
        }
        let mut keys = BTreeSet::new();
        for it in items {
            if !keys.insert(it.key.as_str()) {
                return Err(CkptError::arg(format!("entry {:?}", it.key), "saved twice"));
            }
        }
        let mut manifest = Manifest::new(chunk_bytes, 1);
        let mut report = SaveReport::default();
        let mut pending: Vec<(ChunkRef, &[u8])> = Vec::new();
        let mut seen = BTreeSet::new();
        for it in items {
            let chunks = chunk(it.bytes, chunk_bytes as usize, threads);
            let mut at = 0usize;
            for c in &chunks {
                let bytes = &it.bytes[at..at + c.len as usize];
                at += c.len as usize;
                if seen.insert(c.digest) {
                    report.unique_bytes += c.len;
                    pending.push((*c, bytes));
                }
            }
            report.logical_bytes += it.bytes.len() as u64;
            manifest
                .entries
                .insert(it.key.clone(), entry_of(it, chunks));
        }
        report.entries = items.len();
        let written = self.write_chunks(&pending, threads)?;
        report.written_chunks = written.len();
        report.written_bytes = written.iter().map(|(_, n)| n).sum();
        let digests: Vec<Digest> = written.iter().map(|(d, _)| *d).collect();
        let published = self
            .chunks
            .sync(&digests)
            .and_then(|()| self.publish(name, &manifest));
        if let Err(e) = published {
            self.remove_created(&digests);
            return Err(e);
        }
        Ok(report)
    }

    /// Publishes `manifest` as checkpoint `name`, after checking that the store holds every
    /// chunk it references (a manifest naming a chunk nobody wrote is refused, never
    /// published). The caller has made those chunks durable. A publish that fails after
    /// the manifest was renamed into place (its directory did not sync) takes it back: a
    /// failed save is never visible.
    pub fn publish(&self, name: &str, manifest: &Manifest) -> Result<(), CkptError> {
        self.publish_after(name, manifest, &BTreeSet::new())
    }

    /// [`CkptStore::publish`] by the save that put the chunks in `fresh` and saw them
    /// durable: an object store checks only the others (a file system checks all, by a
    /// `stat` each).
    pub fn publish_after(
        &self,
        name: &str,
        manifest: &Manifest,
        fresh: &BTreeSet<Digest>,
    ) -> Result<(), CkptError> {
        if let Some(o) = &self.object {
            check_name(name)?;
            return self.publish_object(o, name, manifest, fresh);
        }
        let dir = self.prepare(name)?;
        let path = Manifest::path_in(&dir);
        manifest.check().map_err(|detail| CkptError::BadManifest {
            path: path.clone(),
            detail,
        })?;
        for (d, (len, entry)) in manifest.chunk_owners() {
            if !self.chunks.contains(&ChunkRef { digest: d, len }) {
                return Err(CkptError::MissingChunk {
                    digest: d,
                    entry: entry.to_string(),
                    path: self.chunks.path_of(&d),
                });
            }
        }
        std::fs::create_dir_all(&dir).map_err(CkptError::io(&dir))?;
        let bytes = manifest.to_bytes();
        if let Err(e) = crate::steps::atomic_write(self.steps(), &path, &bytes) {
            if std::fs::read(&path).is_ok_and(|on_disk| on_disk == bytes) {
                let _ = std::fs::remove_file(&path);
            }
            let _ = std::fs::remove_dir(&dir); // the directory it made, if nothing is in it
            return Err(e.into());
        }
        Ok(())
    }

    /// Writes every chunk the store lacks, on `threads` threads; returns those written.
    pub fn write_chunks(
        &self,
        chunks: &[(ChunkRef, &[u8])],
        threads: usize,
    ) -> Result<Vec<(Digest, u64)>, CkptError> {
        let threads = self.chunks.io_threads(threads);
        let results = parallel_map(chunks, threads, |(c, b)| self.chunks.write(c, b));
        let mut written = Vec::new();
        let mut first_err = None;
        for ((c, _), r) in chunks.iter().zip(results) {
            match r {
                Ok(true) => written.push((c.digest, c.len)),
                Ok(false) => {}
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_err {
            let created: Vec<Digest> = written.iter().map(|(d, _)| *d).collect();
            self.remove_created(&created);
            return Err(e);
        }
        Ok(written)
    }

    /// A failed save's clean-up: removes the chunks it created that no published
    /// checkpoint references, so a full disk is not kept full until `gc`. Only while no
    /// other save or load has the store open (the lock is taken exclusive for it, without
    /// waiting): another save may have found one of these chunks stored and count on it.
    /// Otherwise the chunks stay for `gc`, and the log says so.
    pub fn remove_created(&self, created: &[Digest]) -> Cleanup {
        let mut report = Cleanup::default();
        if created.is_empty() {
            return report;
        }
        if self.object.is_some() {
            return self.remove_created_objects(created);
        }
        let mut guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let alone = match guard.as_mut() {
            Some(l) => l.try_change(LockMode::Exclusive).unwrap_or(false),
            None => false,
        };
        let live = match alone {
            true => self.live_chunks(),
            false => Err(CkptError::Busy {
                path: self.root.clone(),
            }),
        };
        if let Ok(live) = live {
            for d in created {
                if live.contains(d) {
                    continue;
                }
                let len = std::fs::metadata(self.chunks.path_of(d)).map_or(0, |m| m.len());
                if self.chunks.remove(d).is_ok() {
                    report.chunks_removed += 1;
                    report.bytes_freed += len;
                }
            }
        }
        report.chunks_left = created.len() - report.chunks_removed;
        if let Some(l) = guard.as_mut() {
            // Back to shared: after the upgrade, and after one that failed too (flock(2)
            // may drop the shared lock before it refuses the exclusive one).
            if !l.try_change(LockMode::Shared).unwrap_or(false) {
                tracing::debug!(
                    "{}: could not take the lock back shared",
                    self.root.display()
                );
            }
        }
        if report.chunks_left > 0 && !alone {
            tracing::warn!(
                "{}: a failed save left {} chunks (other saves or loads have the store open); \
                 `sluice ckpt gc` frees them",
                self.root.display(),
                report.chunks_left
            );
        }
        report
    }

    /// Every chunk some published checkpoint references.
    pub(crate) fn live_chunks(&self) -> Result<BTreeSet<Digest>, CkptError> {
        Ok(self
            .list()?
            .iter()
            .flat_map(|(_, m)| m.unique_chunks().into_keys())
            .collect())
    }

    /// Reads entry `key` of `manifest` into `out` (exactly its size), chunk by chunk on
    /// `threads` threads, every chunk verified.
    pub fn read_entry(
        &self,
        manifest: &Manifest,
        key: &str,
        out: &mut [u8],
        threads: usize,
    ) -> Result<(), CkptError> {
        let e = manifest
            .entries
            .get(key)
            .ok_or_else(|| CkptError::arg(format!("entry {key:?}"), "is not in the checkpoint"))?;
        if out.len() as u64 != e.nbytes {
            return Err(CkptError::arg(
                format!("entry {key:?}"),
                format!(
                    "the checkpoint holds {} bytes, the destination {}",
                    e.nbytes,
                    out.len()
                ),
            ));
        }
        if let Some(p) = e.pack {
            let len = manifest.packs.get(&p.digest).copied().unwrap_or(0);
            let mut pack = vec![0u8; len as usize];
            let c = ChunkRef {
                digest: p.digest,
                len,
            };
            self.chunks.read_into(&c, key, &mut pack)?;
            let at = p.offset as usize;
            out.copy_from_slice(&pack[at..at + out.len()]);
            return Ok(());
        }
        let mut pieces: Vec<(ChunkRef, &str, &mut [u8])> = Vec::with_capacity(e.chunks.len());
        let mut rest = out;
        for c in &e.chunks {
            let (head, tail) = rest.split_at_mut(c.len as usize);
            pieces.push((*c, key, head));
            rest = tail;
        }
        self.read_chunks(pieces, threads)
    }

    /// Reads chunks into their buffers on up to `threads` threads, each verified against
    /// its digest; the `&str` names the entry in errors. The first failure is returned.
    pub fn read_chunks(
        &self,
        pieces: Vec<(ChunkRef, &str, &mut [u8])>,
        threads: usize,
    ) -> Result<(), CkptError> {
        let cells: Vec<Mutex<(ChunkRef, &str, &mut [u8])>> =
            pieces.into_iter().map(Mutex::new).collect();
        let threads = self.chunks.io_threads(threads);
        let results = parallel_map(&cells, threads, |cell| {
            let mut g = cell.lock().unwrap_or_else(|p| p.into_inner());
            let (c, key, buf) = &mut *g;
            self.chunks.read_into(c, key, buf)
        });
        results.into_iter().collect()
    }

    /// The checkpoints in the store, oldest first (by when each was published).
    pub fn list(&self) -> Result<Vec<(String, Manifest)>, CkptError> {
        if let Some(o) = &self.object {
            return self.list_object(o);
        }
        let mut out = Vec::new();
        for name in names_in(&self.root)? {
            let path = self.root.join(&name);
            if check_name(&name).is_err() || !path.is_dir() {
                continue;
            }
            match Manifest::read(&path) {
                Ok(m) => {
                    // Ordered by when the manifest was published (nanoseconds), not by the
                    // whole seconds it records: two saves in one second still sort right.
                    let published = std::fs::metadata(Manifest::path_in(&path))
                        .and_then(|m| m.modified())
                        .unwrap_or(std::time::UNIX_EPOCH);
                    out.push((published, name, m));
                }
                Err(CkptError::NoCheckpoint { .. }) => {} // a save that never finished
                // Which chunks a damaged checkpoint uses is unknown: rather than guess (and
                // let `gc` remove them), the listing stops and says what to do.
                Err(CkptError::BadManifest { path: file, detail }) => {
                    return Err(CkptError::BadManifest {
                        path: file,
                        detail: format!(
                            "{detail}; checkpoint {name:?} is damaged: restore its \
                             manifest.json, or remove {} to go on without it",
                            path.display()
                        ),
                    })
                }
                Err(err) => return Err(err),
            }
        }
        out.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        Ok(out.into_iter().map(|(_, n, m)| (n, m)).collect())
    }

    /// The most recently published checkpoint, if any (its manifest alone is read).
    pub fn newest(&self) -> Result<Option<(String, Manifest)>, CkptError> {
        if self.object.is_some() {
            return Ok(self.list()?.pop());
        }
        let mut best: Option<(std::time::SystemTime, String)> = None;
        for name in names_in(&self.root)? {
            if check_name(&name).is_err() {
                continue;
            }
            let Ok(meta) = std::fs::metadata(Manifest::path_in(&self.root.join(&name))) else {
                continue;
            };
            let at = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
            if best.as_ref().is_none_or(|(t, n)| (at, &name) > (*t, n)) {
                best = Some((at, name));
            }
        }
        match best {
            None => Ok(None),
            Some((_, name)) => {
                let m = Manifest::read(&self.root.join(&name))?;
                Ok(Some((name, m)))
            }
        }
    }

    /// Removes checkpoint `name`'s manifest, then its directory if nothing else is in it;
    /// `false` if files Sluice did not write were left there.
    fn remove_checkpoint(&self, name: &str) -> Result<bool, CkptError> {
        if let Some(o) = &self.object {
            return self.remove_object_checkpoint(o, name);
        }
        let dir = self.root.join(name);
        // The manifest goes first: a checkpoint half removed is no checkpoint at all.
        let m = Manifest::path_in(&dir);
        self.steps()
            .before(Step::Remove, &m)
            .and_then(|()| std::fs::remove_file(&m))
            .map_err(CkptError::io(&m))?;
        match std::fs::remove_dir(&dir) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => Ok(false),
            Err(e) => Err(CkptError::io(&dir)(e)),
        }
    }
}

/// Makes `root` a store: it must be new, empty, or hold only what a store being created
/// by another rank at the same moment writes (its lock, chunks, marker temporaries).
fn create(root: &Path, steps: &dyn StoreSteps) -> Result<(), CkptError> {
    let ours = |n: &str| {
        [LOCK_FILE, CHUNKS_DIR, PENDING_DIR].contains(&n)
            || n.starts_with(&format!(".{MARKER_FILE}.tmp"))
    };
    match names_in(root) {
        Ok(found) => {
            let foreign: Vec<String> = found.into_iter().filter(|n| !ours(n)).collect();
            // Another rank or process made the store since this one looked (a group's
            // ranks all open a new store at once): it is a store now.
            let marker = root.join(MARKER_FILE);
            if foreign.iter().any(|n| n == MARKER_FILE) {
                if let Ok(b) = std::fs::read(&marker) {
                    if check_marker(&marker, &b).is_ok() {
                        return Ok(());
                    }
                }
            }
            if !foreign.is_empty() {
                return Err(CkptError::ForeignDirectory {
                    path: root.to_path_buf(),
                    role: "is not a checkpoint store and",
                    found: foreign,
                });
            }
        }
        Err(CkptError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(root).map_err(CkptError::io(root))?
        }
        Err(e) => return Err(e),
    }
    let body = serde_json::json!({"format": "sluice-ckpt-store", "version": 1});
    let marker = root.join(MARKER_FILE);
    Ok(crate::steps::atomic_write(
        steps,
        &marker,
        body.to_string().as_bytes(),
    )?)
}

/// The store's lock, as `access` needs it. A reader that cannot open the lock file at all
/// (a read-only store created without one, no read permission) reads without it.
fn take_lock(root: &Path, access: Access) -> Result<Option<FileLock>, CkptError> {
    let path = root.join(LOCK_FILE);
    let (mode, open) = match access {
        Access::Create => (LockMode::Shared, LockOpen::Create),
        Access::Read => (LockMode::Shared, LockOpen::ReadOnly),
        Access::Exclusive => (LockMode::Exclusive, LockOpen::Create),
    };
    match FileLock::acquire(&path, mode, open) {
        Ok(l) => Ok(Some(l)),
        Err(LockError::Busy { .. }) => Err(CkptError::Busy {
            path: root.to_path_buf(),
        }),
        Err(LockError::Io { source, .. })
            if access == Access::Read
                && matches!(
                    source.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
                ) =>
        {
            tracing::debug!(
                "{}: reading without the store's lock: {source}",
                path.display()
            );
            Ok(None)
        }
        Err(LockError::Io { path, source }) => Err(CkptError::io(path)(source)),
    }
}

/// The names in a directory, sorted.
fn names_in(dir: &Path) -> Result<Vec<String>, CkptError> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(CkptError::io(dir))? {
        let e = e.map_err(CkptError::io(dir))?;
        out.push(e.file_name().to_string_lossy().into_owned());
    }
    out.sort();
    Ok(out)
}

fn kind_of(m: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = m.file_type();
    match () {
        _ if t.is_file() => "a file",
        _ if t.is_symlink() => "a symbolic link",
        _ if t.is_fifo() => "a FIFO",
        _ if t.is_socket() => "a socket",
        _ => "a device",
    }
}

fn check_marker(path: &Path, bytes: &[u8]) -> Result<(), CkptError> {
    let v: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| CkptError::BadManifest {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
    if v.get("format").and_then(|f| f.as_str()) != Some("sluice-ckpt-store") {
        return Err(CkptError::BadManifest {
            path: path.to_path_buf(),
            detail: "not a sluice checkpoint store".into(),
        });
    }
    let version = v.get("version").and_then(|v| v.as_u64()).unwrap_or(0);
    if version > 1 {
        return Err(CkptError::NewerFormat {
            path: path.to_path_buf(),
            found: version.min(u32::MAX as u64) as u32,
            supported: 1,
        });
    }
    Ok(())
}

fn entry_of(it: &SaveItem<'_>, chunks: Vec<ChunkRef>) -> Entry {
    Entry {
        kind: it.kind,
        dtype: it.dtype.clone(),
        shape: it.shape.clone(),
        nbytes: it.bytes.len() as u64,
        chunks,
        pack: None,
        meta: it.meta.clone(),
    }
}
