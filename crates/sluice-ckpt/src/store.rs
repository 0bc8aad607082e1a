//! [`CkptStore`]: a directory of checkpoints sharing one chunk pool.
//!
//! ```text
//! <root>/sluice-ckpt.json      the store's marker (format, version)
//! <root>/lock                  shared by saves and loads, exclusive for gc
//! <root>/chunks/ab/abcd...     content-addressed chunks
//! <root>/<name>/manifest.json  one checkpoint per directory, visible once its manifest is
//! ```
//!
//! Saves take the lock shared, garbage collection exclusive: gc must never remove a chunk
//! that a save in flight found already stored and is about to reference.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::chunk_store::ChunkStore;
use crate::chunking::{chunk, parallel_map, ChunkRef, Digest};
use crate::error::CkptError;
use crate::manifest::{Entry, EntryKind, Manifest};

const MARKER: &str = "sluice-ckpt.json";

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

/// A checkpoint in the store, as `ls` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointInfo {
    pub name: String,
    pub created_unix: u64,
    pub entries: usize,
    pub logical_bytes: u64,
    pub unique_bytes: u64,
    /// Of its unique bytes, those another retained checkpoint references too.
    pub shared_bytes: u64,
}

/// What `gc` did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GcReport {
    pub checkpoints_removed: Vec<String>,
    pub chunks_removed: usize,
    pub bytes_freed: u64,
    pub temporaries_removed: usize,
}

/// What `verify` found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifyReport {
    pub chunks: usize,
    pub bytes: u64,
    /// (chunk, entry, why) for each bad chunk.
    pub problems: Vec<(String, String, String)>,
}

/// Changed, added and removed entries between two checkpoints.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DiffReport {
    /// (entry, bytes of its chunks that differ).
    pub changed: Vec<(String, u64)>,
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed_bytes: u64,
}

/// An open store of checkpoints.
pub struct CkptStore {
    root: PathBuf,
    chunks: ChunkStore,
    _lock: std::fs::File,
}

impl CkptStore {
    /// Opens (or creates) the store at `root`, lock shared (saves).
    pub fn open(root: &Path) -> Result<CkptStore, CkptError> {
        CkptStore::open_locked(root, libc::LOCK_SH, true)
    }

    /// Opens the existing store at `root`, lock shared (loads, listings): a path that is
    /// no store is [`CkptError::NoStore`], and nothing is created there.
    pub fn open_existing(root: &Path) -> Result<CkptStore, CkptError> {
        CkptStore::open_locked(root, libc::LOCK_SH, false)
    }

    /// Opens the store with its lock exclusive (garbage collection); a store in use by a
    /// save or load is [`CkptError::Busy`], not waited for.
    pub fn open_exclusive(root: &Path) -> Result<CkptStore, CkptError> {
        CkptStore::open_locked(root, libc::LOCK_EX | libc::LOCK_NB, false)
    }

    fn open_locked(root: &Path, how: libc::c_int, create: bool) -> Result<CkptStore, CkptError> {
        if root.exists() && !root.is_dir() {
            return Err(CkptError::arg(
                root.display().to_string(),
                "is not a directory",
            ));
        }
        if !create && !root.join(MARKER).is_file() {
            return Err(CkptError::NoStore {
                path: root.to_path_buf(),
            });
        }
        std::fs::create_dir_all(root.join("chunks")).map_err(CkptError::io(root))?;
        let marker = root.join(MARKER);
        // A FIFO or a device in place of the marker or the lock would block the open:
        // both are opened non-blocking and refused unless they are regular files.
        let read = sluice_engine::open_regular(&marker, 0).and_then(|mut f| {
            let mut b = Vec::new();
            std::io::Read::read_to_end(&mut f, &mut b).map(|_| b)
        });
        match read {
            Ok(b) => check_marker(&marker, &b)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let body = serde_json::json!({"format": "sluice-ckpt-store", "version": 1});
                sluice_engine::atomic_write(&marker, body.to_string().as_bytes())?;
            }
            Err(e) => return Err(CkptError::io(&marker)(e)),
        }
        let lock_path = root.join("lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&lock_path)
            .and_then(|f| {
                if f.metadata()?.is_file() {
                    Ok(f)
                } else {
                    Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        "not a regular file",
                    ))
                }
            })
            .map_err(CkptError::io(&lock_path))?;
        // SAFETY: flock on a descriptor we own; it is released when the file closes.
        if unsafe { libc::flock(lock.as_raw_fd(), how) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::WouldBlock {
                return Err(CkptError::Busy {
                    path: root.to_path_buf(),
                });
            }
            return Err(CkptError::io(&lock_path)(e));
        }
        Ok(CkptStore {
            root: root.to_path_buf(),
            chunks: ChunkStore::new(&root.join("chunks")),
            _lock: lock,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn chunks(&self) -> &ChunkStore {
        &self.chunks
    }

    /// The directory of checkpoint `name` (a plain name: no separators, not `chunks`).
    pub fn checkpoint_dir(&self, name: &str) -> Result<PathBuf, CkptError> {
        let bad = name.is_empty()
            || name.contains('/')
            || name.starts_with('.')
            || name == "chunks"
            || name == "lock"
            || name == MARKER;
        if bad {
            return Err(CkptError::arg(
                format!("checkpoint name {name:?}"),
                "must be a plain name (no '/', not starting with '.', not chunks or lock)",
            ));
        }
        Ok(self.root.join(name))
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
        let dir = self.checkpoint_dir(name)?;
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
        self.chunks.sync(&digests)?;
        manifest.write(&dir)?;
        Ok(report)
    }

    /// Publishes `manifest` as checkpoint `name`, after checking that the store holds every
    /// chunk it references (a manifest naming a chunk nobody wrote is refused, never
    /// published). The caller has made those chunks durable.
    pub fn publish(&self, name: &str, manifest: &Manifest) -> Result<(), CkptError> {
        let dir = self.checkpoint_dir(name)?;
        manifest.check().map_err(|detail| CkptError::BadManifest {
            path: Manifest::path_in(&dir),
            detail,
        })?;
        for (key, e) in &manifest.entries {
            for c in &e.chunks {
                if !self.chunks.contains(c) {
                    return Err(CkptError::MissingChunk {
                        digest: c.digest.hex(),
                        entry: key.clone(),
                        path: self.chunks.path_of(&c.digest),
                    });
                }
            }
        }
        manifest.write(&dir)
    }

    /// Writes every chunk the store lacks, on `threads` threads; returns those written.
    pub fn write_chunks(
        &self,
        chunks: &[(ChunkRef, &[u8])],
        threads: usize,
    ) -> Result<Vec<(Digest, u64)>, CkptError> {
        let results = parallel_map(chunks, threads, |(c, b)| self.chunks.write(c, b));
        let mut written = Vec::new();
        for ((c, _), r) in chunks.iter().zip(results) {
            if r? {
                written.push((c.digest, c.len));
            }
        }
        Ok(written)
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
        let cells: Vec<std::sync::Mutex<(ChunkRef, &str, &mut [u8])>> =
            pieces.into_iter().map(std::sync::Mutex::new).collect();
        let results = parallel_map(&cells, threads, |cell| {
            let mut g = cell.lock().unwrap_or_else(|p| p.into_inner());
            let (c, key, buf) = &mut *g;
            self.chunks.read_into(c, key, buf)
        });
        results.into_iter().collect()
    }

    /// The checkpoints in the store, oldest first (by when each was published).
    pub fn list(&self) -> Result<Vec<(String, Manifest)>, CkptError> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(&self.root).map_err(CkptError::io(&self.root))? {
            let e = e.map_err(CkptError::io(&self.root))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if name == "chunks" || !e.path().is_dir() {
                continue;
            }
            match Manifest::read(&e.path()) {
                Ok(m) => {
                    // Ordered by when the manifest was published (nanoseconds), not by the
                    // whole seconds it records: two saves in one second still sort right.
                    let published = std::fs::metadata(Manifest::path_in(&e.path()))
                        .and_then(|m| m.modified())
                        .unwrap_or(std::time::UNIX_EPOCH);
                    out.push((published, name, m));
                }
                Err(CkptError::NoCheckpoint { .. }) => {} // a save that never finished
                Err(err) => return Err(err),
            }
        }
        out.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        Ok(out.into_iter().map(|(_, n, m)| (n, m)).collect())
    }

    /// The most recently published checkpoint, if any (its manifest alone is read).
    pub fn newest(&self) -> Result<Option<(String, Manifest)>, CkptError> {
        let mut best: Option<(std::time::SystemTime, String)> = None;
        for e in std::fs::read_dir(&self.root).map_err(CkptError::io(&self.root))? {
            let e = e.map_err(CkptError::io(&self.root))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if name == "chunks" || name.starts_with('.') {
                continue;
            }
            let Ok(meta) = std::fs::metadata(Manifest::path_in(&e.path())) else {
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

    /// `ls`: each checkpoint with its sizes.
    pub fn infos(&self) -> Result<Vec<CheckpointInfo>, CkptError> {
        let all = self.list()?;
        let mut refs: BTreeMap<Digest, usize> = BTreeMap::new();
        for (_, m) in &all {
            for d in m.unique_chunks().keys() {
                *refs.entry(*d).or_default() += 1;
            }
        }
        Ok(all
            .into_iter()
            .map(|(name, m)| {
                let unique = m.unique_chunks();
                CheckpointInfo {
                    created_unix: m.created_unix,
                    entries: m.entries.len(),
                    logical_bytes: m.logical_bytes(),
                    unique_bytes: unique.values().sum(),
                    shared_bytes: unique
                        .iter()
                        .filter(|(d, _)| refs[*d] > 1)
                        .map(|(_, n)| n)
                        .sum(),
                    name,
                }
            })
            .collect())
    }

    /// Keeps the `keep` newest checkpoints, removes the others and every chunk no kept
    /// checkpoint references (and temporaries a crashed save left). Needs the lock
    /// exclusive ([`CkptStore::open_exclusive`]).
    pub fn gc(&self, keep: usize) -> Result<GcReport, CkptError> {
        let all = self.list()?;
        let cut = all.len().saturating_sub(keep);
        let mut report = GcReport::default();
        for (name, _) in &all[..cut] {
            let dir = self.root.join(name);
            // The manifest goes first: a checkpoint half removed is no checkpoint at all.
            let m = Manifest::path_in(&dir);
            std::fs::remove_file(&m).map_err(CkptError::io(&m))?;
            std::fs::remove_dir_all(&dir).map_err(CkptError::io(&dir))?;
            report.checkpoints_removed.push(name.clone());
        }
        let live: BTreeSet<Digest> = all[cut..]
            .iter()
            .flat_map(|(_, m)| m.unique_chunks().into_keys())
            .collect();
        for (d, len) in self.chunks.list()? {
            if !live.contains(&d) {
                self.chunks.remove(&d)?;
                report.chunks_removed += 1;
                report.bytes_freed += len;
            }
        }
        report.temporaries_removed = self.chunks.remove_temporaries();
        // Markers of grouped saves that never published (the lock is exclusive: none runs).
        let pending = self.root.join(".pending");
        if pending.exists() {
            std::fs::remove_dir_all(&pending).map_err(CkptError::io(&pending))?;
        }
        Ok(report)
    }

    /// Re-hashes every chunk of checkpoint `name`.
    pub fn verify(&self, name: &str, threads: usize) -> Result<VerifyReport, CkptError> {
        self.verify_with(name, threads, &|_, _| {})
    }

    /// [`CkptStore::verify`], calling `progress(bytes done, bytes in all)` as chunks finish.
    pub fn verify_with(
        &self,
        name: &str,
        threads: usize,
        progress: &(dyn Fn(u64, u64) + Sync),
    ) -> Result<VerifyReport, CkptError> {
        let m = Manifest::read(&self.checkpoint_dir(name)?)?;
        let mut owner: BTreeMap<Digest, (u64, String)> = BTreeMap::new();
        for (key, e) in &m.entries {
            for c in &e.chunks {
                owner.entry(c.digest).or_insert((c.len, key.clone()));
            }
        }
        let chunks: Vec<(Digest, u64, String)> =
            owner.into_iter().map(|(d, (n, k))| (d, n, k)).collect();
        let total: u64 = chunks.iter().map(|c| c.1).sum();
        let done = AtomicU64::new(0);
        let results = parallel_map(&chunks, threads, |(d, n, key)| {
            let mut buf = vec![0u8; *n as usize];
            let c = ChunkRef {
                digest: *d,
                len: *n,
            };
            let r = self.chunks.read_into(&c, key, &mut buf);
            progress(done.fetch_add(*n, Ordering::Relaxed) + n, total);
            r
        });
        let mut report = VerifyReport::default();
        for ((d, n, key), r) in chunks.into_iter().zip(results) {
            report.chunks += 1;
            report.bytes += n;
            if let Err(e) = r {
                report.problems.push((d.hex(), key, e.to_string()));
            }
        }
        Ok(report)
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
        meta: it.meta.clone(),
    }
}

/// What changed from checkpoint `a` to `b`: entries whose chunks differ, with the bytes of
/// the chunks that are new in `b`, and entries added or removed.
pub fn diff(a: &Manifest, b: &Manifest) -> DiffReport {
    let mut out = DiffReport::default();
    for (key, eb) in &b.entries {
        match a.entries.get(key) {
            None => out.added.push(key.clone()),
            Some(ea) if ea.chunks != eb.chunks => {
                let old: BTreeSet<Digest> = ea.chunks.iter().map(|c| c.digest).collect();
                let bytes: u64 = eb
                    .chunks
                    .iter()
                    .filter(|c| !old.contains(&c.digest))
                    .map(|c| c.len)
                    .sum();
                out.changed_bytes += bytes;
                out.changed.push((key.clone(), bytes));
            }
            Some(_) => {}
        }
    }
    out.removed = a
        .entries
        .keys()
        .filter(|k| !b.entries.contains_key(*k))
        .cloned()
        .collect();
    out
}
