//! [`DiskCache`]: the mount's optional second tier, blocks kept in a local directory
//! (an SSD) under a byte budget of their own, so a restarted mount or a pool too small for
//! the model reads from local disk instead of the network.
//!
//! Each block is one file, named by the BLAKE3 hash of what identifies it: the mount's
//! source, the file's path, size and version (ETag, or inode and mtime), and the block's
//! range. A changed object therefore never hits an old block. The file holds a header
//! (magic, length, that key, and the BLAKE3 hash of the data) and the data. Every read
//! checks all of it; a block that fails the check is deleted and reported as a miss, so it
//! is fetched again and never served.
//!
//! Blocks are written to a temporary name and renamed into place. A crash leaves either
//! no block or a whole one; a block torn by a power cut fails its checksum. Eviction is
//! least recently used, by last read in this process and by file time across restarts.
//! The cache fails open: a read error is a miss, and a write error (a full disk) leaves
//! the block uncached with one warning.
//!
//! The directory is marked as a Sluice cache and locked (`flock`) while a mount uses it:
//! a directory holding other files is refused rather than evicted, and two mounts cannot
//! share one budget unknowingly.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::SystemTime;

use crate::backend::Entry;
use crate::error::MountError;

const MAGIC: &[u8; 8] = b"SLCBLK01";
/// Magic, data length, key hash, data hash.
const HEADER: usize = 8 + 8 + 32 + 32;
const MARKER: &str = "SLUICE-CACHE";
const SUFFIX: &str = ".blk";

/// Where the disk tier lives and how much of it the mount may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskCacheOptions {
    pub dir: PathBuf,
    /// Bytes of block files (headers included) kept at most.
    pub budget: u64,
}

/// Counters of the disk tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskStats {
    pub held_bytes: u64,
    pub blocks: u64,
    /// Block fetches served from disk, and those that found no block.
    pub hits: u64,
    pub misses: u64,
    /// Blocks that failed their check (wrong length, key or checksum) and were deleted.
    pub corrupt: u64,
    pub written_blocks: u64,
    pub written_bytes: u64,
    /// Writes that failed (a full disk), leaving the block uncached.
    pub write_errors: u64,
    pub evicted: u64,
}

type Name = [u8; 16];

#[derive(Default)]
struct Index {
    /// Block files: size on disk and last-use tick.
    files: HashMap<Name, (u64, u64)>,
    /// Last-use tick to block, oldest first.
    lru: BTreeMap<u64, Name>,
    /// Blocks being written: their room is reserved in `held`, but they are not readable.
    writing: HashSet<Name>,
    /// Bytes of block files, including those being written.
    held: u64,
    tick: u64,
    stats: DiskStats,
    warned: bool,
}

impl Index {
    fn touch(&mut self, name: Name) {
        self.tick += 1;
        let tick = self.tick;
        if let Some((_, last)) = self.files.get_mut(&name) {
            self.lru.remove(last);
            *last = tick;
            self.lru.insert(tick, name);
        }
    }

    fn insert(&mut self, name: Name, size: u64) {
        self.tick += 1;
        let tick = self.tick;
        if let Some((old, last)) = self.files.insert(name, (size, tick)) {
            self.lru.remove(&last);
            self.held -= old;
        }
        self.lru.insert(tick, name);
        self.held += size;
    }

    fn remove(&mut self, name: &Name) {
        if let Some((size, last)) = self.files.remove(name) {
            self.lru.remove(&last);
            self.held -= size;
        }
    }
}

pub struct DiskCache {
    dir: PathBuf,
    budget: u64,
    /// Hash of the mount's source, part of every key.
    namespace: String,
    index: Mutex<Index>,
    /// Held open with an exclusive `flock` while the cache is in use.
    _lock: File,
    temp_seq: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_name(file_name: &str) -> Option<Name> {
    let stem = file_name.strip_suffix(SUFFIX)?;
    if stem.len() != 32 || !stem.bytes().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let mut name = [0u8; 16];
    for (i, byte) in name.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&stem[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(name)
}

impl DiskCache {
    /// Opens (or creates) the cache directory for the mount of `source`, takes its lock,
    /// indexes the blocks already there, removes torn temporary files, and evicts down to
    /// the budget.
    pub fn open(opts: &DiskCacheOptions, source: &str) -> Result<DiskCache, MountError> {
        let dir = &opts.dir;
        let bad = |why: String| MountError::Config(format!("--cache-dir {}: {why}", dir.display()));
        if opts.budget == 0 {
            return Err(bad("the cache size must be above 0".into()));
        }
        if std::fs::symlink_metadata(dir).is_ok_and(|m| !m.is_dir())
            && !std::fs::metadata(dir).is_ok_and(|m| m.is_dir())
        {
            return Err(bad("not a directory".into()));
        }
        std::fs::create_dir_all(dir).map_err(|e| bad(format!("cannot create it: {e}")))?;
        if !std::fs::metadata(dir)
            .map_err(|e| bad(e.to_string()))?
            .is_dir()
        {
            return Err(bad("not a directory".into()));
        }
        let marker = dir.join(MARKER);
        if !marker.exists() {
            let mut others = std::fs::read_dir(dir).map_err(|e| bad(e.to_string()))?;
            if others.next().is_some() {
                return Err(bad(format!(
                    "it holds other files and no {MARKER} marker; give an empty or new directory (the cache deletes what it evicts)"
                )));
            }
        }
        let lock_file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&marker)
            .map_err(|e| bad(format!("cannot create its marker: {e}")))?;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(lock_file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(bad(format!(
                "another mount uses this cache directory ({})",
                io::Error::last_os_error()
            )));
        }
        let cache = DiskCache {
            dir: dir.clone(),
            budget: opts.budget,
            namespace: blake3::hash(source.as_bytes()).to_hex().to_string(),
            index: Mutex::new(Index::default()),
            _lock: lock_file,
            temp_seq: AtomicU64::new(0),
        };
        cache
            .scan()
            .map_err(|e| bad(format!("cannot index it: {e}")))?;
        {
            let mut ix = lock(&cache.index);
            cache.evict_to(&mut ix, opts.budget);
        }
        let s = cache.stats();
        tracing::info!(dir = %dir.display(), blocks = s.blocks, bytes = s.held_bytes, budget = opts.budget, "disk cache opened");
        Ok(cache)
    }

    fn scan(&self) -> io::Result<()> {
        let mut found: Vec<(SystemTime, Name, u64)> = Vec::new();
        for sub in std::fs::read_dir(&self.dir)? {
            let sub = sub?;
            if !sub.file_type()?.is_dir() {
                continue;
            }
            for item in std::fs::read_dir(sub.path())? {
                let item = item?;
                let file_name = item.file_name();
                let Some(file_name) = file_name.to_str() else {
                    continue;
                };
                if file_name.contains(".tmp.") {
                    let _ = std::fs::remove_file(item.path());
                    continue;
                }
                let Some(name) = parse_name(file_name) else {
                    continue;
                };
                let meta = item.metadata()?;
                if meta.is_file() {
                    let when = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                    found.push((when, name, meta.len()));
                }
            }
        }
        found.sort();
        let mut ix = lock(&self.index);
        for (_, name, size) in found {
            ix.insert(name, size);
        }
        Ok(())
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    pub fn stats(&self) -> DiskStats {
        let ix = lock(&self.index);
        DiskStats {
            held_bytes: ix.held,
            blocks: ix.files.len() as u64,
            ..ix.stats
        }
    }

    fn key(&self, entry: &Entry, offset: u64, len: u64) -> blake3::Hash {
        let mut h = blake3::Hasher::new();
        for part in [
            self.namespace.as_bytes(),
            entry.path.as_bytes(),
            entry.version.as_bytes(),
        ] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part);
        }
        for n in [entry.size, offset, len] {
            h.update(&n.to_le_bytes());
        }
        h.finalize()
    }

    fn path_of(&self, name: &Name) -> PathBuf {
        let hex = hex(name);
        self.dir.join(&hex[..2]).join(format!("{hex}{SUFFIX}"))
    }

    /// Fills `dst` with the block at `offset` of `entry` if the cache holds it whole and
    /// intact; `false` otherwise (a block failing its check is deleted first).
    pub fn read(&self, entry: &Entry, offset: u64, dst: &mut [u8]) -> bool {
        let key = self.key(entry, offset, dst.len() as u64);
        let name: Name = key.as_bytes()[..16].try_into().expect("16 of 32 bytes");
        {
            let mut ix = lock(&self.index);
            if !ix.files.contains_key(&name) {
                ix.stats.misses += 1;
                return false;
            }
            ix.touch(name);
        }
        let path = self.path_of(&name);
        match self.check(&path, key, dst) {
            Ok(file) => {
                lock(&self.index).stats.hits += 1;
                // Keeps the order of use across restarts (the mount owns its blocks, so the
                // read-only descriptor may set the time); a failure only costs that order.
                let _ = file.set_modified(SystemTime::now());
                true
            }
            Err(why) => {
                let mut ix = lock(&self.index);
                ix.stats.misses += 1;
                if why.kind() == io::ErrorKind::InvalidData {
                    ix.stats.corrupt += 1;
                    tracing::warn!(file = %entry.path, offset, block = %path.display(), %why, "disk cache block failed its check; deleted, fetching it again");
                } else {
                    tracing::warn!(file = %entry.path, offset, block = %path.display(), error = %why, "disk cache block unreadable; fetching it again");
                }
                ix.remove(&name);
                drop(ix);
                let _ = std::fs::remove_file(&path);
                false
            }
        }
    }

    /// Fills `dst` from the block file at `path` if it passes every check; the open file.
    fn check(&self, path: &Path, key: blake3::Hash, dst: &mut [u8]) -> io::Result<File> {
        let corrupt = |why: &str| io::Error::new(io::ErrorKind::InvalidData, why.to_string());
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(corrupt("not a regular file"));
        }
        if meta.len() != (HEADER + dst.len()) as u64 {
            return Err(corrupt("wrong size"));
        }
        let mut header = [0u8; HEADER];
        file.read_exact_at(&mut header, 0)?;
        if &header[..8] != MAGIC {
            return Err(corrupt("bad magic"));
        }
        if header[8..16] != (dst.len() as u64).to_le_bytes() {
            return Err(corrupt("wrong length"));
        }
        if header[16..48] != *key.as_bytes() {
            return Err(corrupt("another block's key"));
        }
        file.read_exact_at(dst, HEADER as u64).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                corrupt("truncated")
            } else {
                e
            }
        })?;
        if header[48..80] != *blake3::hash(dst).as_bytes() {
            return Err(corrupt("checksum mismatch"));
        }
        Ok(file)
    }

    /// Keeps `data`, the block at `offset` of `entry`, evicting the least recently used
    /// blocks to stay in budget. Failures are counted and logged, never returned: the
    /// block simply stays uncached.
    pub fn write(&self, entry: &Entry, offset: u64, data: &[u8]) {
        let key = self.key(entry, offset, data.len() as u64);
        let name: Name = key.as_bytes()[..16].try_into().expect("16 of 32 bytes");
        let size = (HEADER + data.len()) as u64;
        if size > self.budget {
            return;
        }
        {
            let mut ix = lock(&self.index);
            if ix.files.contains_key(&name) || ix.writing.contains(&name) {
                return;
            }
            self.evict_to(&mut ix, self.budget - size);
            if ix.held + size > self.budget {
                return; // the rest is being written by others
            }
            // Reserve the room now so concurrent writers cannot overshoot the budget.
            ix.held += size;
            ix.writing.insert(name);
        }
        let path = self.path_of(&name);
        let written = self.write_file(&path, key, data);
        let mut ix = lock(&self.index);
        ix.held -= size;
        ix.writing.remove(&name);
        match written {
            Ok(()) => {
                ix.insert(name, size);
                ix.stats.written_blocks += 1;
                ix.stats.written_bytes += data.len() as u64;
            }
            Err(e) => {
                ix.stats.write_errors += 1;
                if !std::mem::replace(&mut ix.warned, true) {
                    tracing::warn!(dir = %self.dir.display(), error = %e, "cannot write to the disk cache; blocks stay uncached (warned once)");
                }
            }
        }
    }

    fn write_file(&self, path: &Path, key: blake3::Hash, data: &[u8]) -> io::Result<()> {
        let parent = path.parent().expect("block paths have a parent");
        std::fs::create_dir_all(parent)?;
        let temp = path.with_extension(format!(
            "tmp.{}.{}",
            std::process::id(),
            self.temp_seq.fetch_add(1, Ordering::Relaxed)
        ));
        let result = (|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&temp)?;
            let mut header = [0u8; HEADER];
            header[..8].copy_from_slice(MAGIC);
            header[8..16].copy_from_slice(&(data.len() as u64).to_le_bytes());
            header[16..48].copy_from_slice(key.as_bytes());
            header[48..80].copy_from_slice(blake3::hash(data).as_bytes());
            f.write_all(&header)?;
            f.write_all(data)?;
            std::fs::rename(&temp, path)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        result
    }

    fn evict_to(&self, ix: &mut Index, limit: u64) {
        while ix.held > limit {
            let Some((_, name)) = ix.lru.pop_first() else {
                break;
            };
            if let Some((size, _)) = ix.files.remove(&name) {
                ix.held -= size;
            }
            ix.stats.evicted += 1;
            if let Err(e) = std::fs::remove_file(self.path_of(&name)) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!(error = %e, "cannot delete an evicted disk cache block");
                }
            }
        }
    }
}
