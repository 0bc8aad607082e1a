//! [`DiskCache`]: the mount's optional second tier, files kept in a local directory (an
//! SSD) under a byte budget of their own, so a restarted mount or a pool too small for the
//! model reads from local disk instead of the network.
//!
//! Each cached file is two files, named by the BLAKE3 hash of what identifies it: the
//! mount's source, the file's path, size and version (ETag, or inode and mtime), and the
//! block size. A changed object therefore never hits old bytes.
//! - `<name>.data` is sparse and as long as the file: each cached block sits at its own
//!   offset, and the blocks not cached are holes. A file whose every block is cached is a
//!   byte-exact local copy, which the FUSE adapter can hand to the kernel as the backing
//!   file of an open (passthrough): reads then run at local page-cache speed.
//! - `<name>.sums` holds a header (magic, the key, the file's size and the block size) and
//!   the BLAKE3 hash of every block, all zeros for a block not held.
//!
//! Every read through the cache checks its block against its hash; a block that fails is
//! punched out and reported as a miss, so it is fetched again and never served. A block
//! is written first and its hash after, so a crash leaves the block absent or checkable. A
//! file is handed out for passthrough only once every block has been checked or written by
//! this process, and it is pinned (never evicted) while the kernel holds it. Its data
//! file's change time is noted when it becomes whole ("sealed"); a file changed since (a
//! write by another process) is not handed out but read through the daemon, every block
//! checked again, until it is whole and checked once more.
//!
//! Eviction is least recently used, block by block (a hole is punched), by last read in
//! this process and by the table's time across restarts (a read touches the table, not
//! the data file, whose change time is the seal). The cache fails open: a read error is a
//! miss, and a write error (a full disk) leaves the block uncached with one warning.
//!
//! The directory is marked as a Sluice cache and locked (`flock`) while a mount uses it:
//! a directory holding other files is refused rather than evicted, and two mounts cannot
//! share one budget unknowingly.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use crate::backend::Entry;
use crate::error::MountError;
use crate::lock;

mod table;

use table::{
    block_len, change_time, sums_len, Cached, Held, Index, Name, HEADER, MAGIC, NO_SUM, SUM,
};

const MARKER: &str = "SLUICE-CACHE";
const DATA: &str = "data";
/// How long an open waits for the last blocks of a file being written, to pass it through
/// rather than read it through the daemon.
const COMPLETE_WAIT: Duration = Duration::from_secs(2);
const SUMS: &str = "sums";

/// Where the disk tier lives and how much of it the mount may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskCacheOptions {
    pub dir: PathBuf,
    /// Bytes kept at most: cached blocks plus each file's table of hashes.
    pub budget: u64,
}

/// Counters of the disk tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskStats {
    pub held_bytes: u64,
    /// Blocks held, and files with at least one block.
    pub blocks: u64,
    pub files: u64,
    /// Block fetches served from disk, and those that found no block.
    pub hits: u64,
    pub misses: u64,
    /// Blocks that failed their check (wrong hash, short file, another file's table) and
    /// were dropped.
    pub corrupt: u64,
    pub written_blocks: u64,
    pub written_bytes: u64,
    /// Writes that failed (a full disk), leaving the block uncached.
    pub write_errors: u64,
    pub evicted: u64,
    /// Opens handed a whole local copy to pass through.
    pub passthrough_opens: u64,
}

pub struct DiskCache {
    dir: PathBuf,
    budget: u64,
    /// The mount's block size: the unit of every read, write and hash.
    block: u64,
    /// Hash of the mount's source, part of every key.
    namespace: String,
    index: Mutex<Index>,
    /// Signalled whenever a block write ends.
    written: Condvar,
    /// Held open with an exclusive `flock` while the cache is in use.
    _lock: sluice_engine::FileLock,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_name(stem: &str) -> Option<Name> {
    if stem.len() != 32 || !stem.bytes().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let mut name = [0u8; 16];
    for (i, byte) in name.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&stem[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(name)
}

fn corrupt(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.to_string())
}

/// Frees the bytes of `len` at `offset` (a hole reads as zeros, and fails any hash).
fn punch(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: fallocate on a descriptor `file` owns; no memory is passed.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), mode, offset as i64, len as i64) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The kernel grows its readahead, and the page-cache folios it allocates, only across
/// reads that hit its readahead mark. One 8 MiB `pread` at an offset of a fresh descriptor
/// is, to it, one random read, filled with 4 KiB folios; in steps of this size the folios
/// grow. A restarted mount reading its tier: `folio_mark_accessed` fell from 4.9% to 2.8%
/// of the daemon's samples (docs/benchmarks.md has the A/B).
const RAMP_STEP: usize = 128 << 10;

/// `dst.len()` bytes at `offset`, read in [`RAMP_STEP`] steps (see there).
fn read_ramping(file: &File, dst: &mut [u8], offset: u64) -> io::Result<()> {
    for (i, chunk) in dst.chunks_mut(RAMP_STEP).enumerate() {
        file.read_exact_at(chunk, offset + (i * RAMP_STEP) as u64)?;
    }
    Ok(())
}

fn open_rw(path: &Path, create: bool) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(corrupt("not a regular file"));
    }
    Ok(file)
}

impl DiskCache {
    /// Opens (or creates) the cache directory for the mount of `source`, takes its lock,
    /// indexes the files already there, removes what it cannot use, and evicts down to the
    /// budget.
    pub fn open(
        opts: &DiskCacheOptions,
        source: &str,
        block: u64,
    ) -> Result<DiskCache, MountError> {
        let dir = &opts.dir;
        let bad = |why: String| MountError::config(format!("--cache-dir {}", dir.display()), why);
        if opts.budget == 0 {
            return Err(bad("the cache size must be above 0".into()));
        }
        if std::fs::symlink_metadata(dir).is_ok_and(|m| !m.is_dir())
            && !std::fs::metadata(dir).is_ok_and(|m| m.is_dir())
        {
            return Err(bad("not a directory".into()));
        }
        // Only the mount's user may write a new cache directory: the copies in it are
        // handed to the kernel unhashed (see `pin_complete`).
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(dir)
            .map_err(|e| bad(format!("cannot create it: {e}")))?;
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
        use sluice_engine::{FileLock, LockError, LockMode, LockOpen};
        let mut lock_file = match FileLock::acquire(&marker, LockMode::Exclusive, LockOpen::Create)
        {
            Ok(l) => l,
            Err(LockError::Busy { owner, .. }) => {
                let by = owner.map(|pid| format!(" (pid {pid})")).unwrap_or_default();
                return Err(bad(format!("another mount uses this cache directory{by}")));
            }
            Err(e) => return Err(bad(format!("cannot create its marker: {e}"))),
        };
        let _ = lock_file.write_owner(&std::process::id().to_string());
        let cache = DiskCache {
            dir: dir.clone(),
            budget: opts.budget,
            block,
            namespace: blake3::hash(source.as_bytes()).to_hex().to_string(),
            index: Mutex::new(Index::default()),
            written: Condvar::new(),
            _lock: lock_file,
        };
        cache
            .scan()
            .map_err(|e| bad(format!("cannot index it: {e}")))?;
        {
            let mut ix = lock(&cache.index);
            cache.evict_to(&mut ix, opts.budget);
        }
        let s = cache.stats();
        tracing::info!(dir = %dir.display(), files = s.files, blocks = s.blocks, bytes = s.held_bytes, budget = opts.budget, "disk cache opened");
        Ok(cache)
    }

    /// Indexes every readable table whose data file matches it; deletes the rest (torn
    /// or foreign files, an older layout's blocks).
    fn scan(&self) -> io::Result<()> {
        let mut found: Vec<(SystemTime, Name, Cached)> = Vec::new();
        let mut stray: Vec<PathBuf> = Vec::new();
        for sub in std::fs::read_dir(&self.dir)? {
            let sub = sub?;
            if !sub.file_type()?.is_dir() {
                continue;
            }
            let mut tables = HashSet::new();
            let mut datas = Vec::new();
            for item in std::fs::read_dir(sub.path())? {
                let item = item?;
                let path = item.path();
                let known = path
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .and_then(parse_name)
                    .zip(path.extension().and_then(|e| e.to_str()));
                match known {
                    Some((name, SUMS)) => match self.load_table(&path) {
                        Ok((when, c)) => {
                            tables.insert(name);
                            found.push((when, name, c));
                        }
                        Err(e) => {
                            tracing::warn!(table = %path.display(), error = %e, "disk cache table unusable; deleting the file's cache");
                            stray.push(path.with_extension(DATA));
                            stray.push(path);
                        }
                    },
                    Some((name, DATA)) => datas.push((name, path)),
                    _ => stray.push(path),
                }
            }
            stray.extend(
                datas
                    .into_iter()
                    .filter(|(name, _)| !tables.contains(name))
                    .map(|(_, p)| p),
            );
        }
        for p in stray {
            let _ = std::fs::remove_file(p);
        }
        // Older files' blocks become the least recently used.
        found.sort_by_key(|(when, name, _)| (*when, *name));
        let mut ix = lock(&self.index);
        for (_, name, mut c) in found {
            for (b, held) in c.blocks.iter_mut().enumerate() {
                if let Some(held) = held {
                    ix.tick += 1;
                    let tick = ix.tick;
                    held.tick = tick;
                    ix.lru.insert(tick, (name, b as u64));
                    ix.held += block_len(c.size, c.block, b as u64);
                }
            }
            ix.held += c.sums_len();
            ix.files.insert(name, c);
        }
        Ok(())
    }

    /// A table and its data file, checked for shape; the table's time.
    fn load_table(&self, path: &Path) -> io::Result<(SystemTime, Cached)> {
        let table = std::fs::read(path)?;
        if table.len() < HEADER as usize || &table[..8] != MAGIC {
            return Err(corrupt("bad header"));
        }
        let word = |at: usize| u64::from_le_bytes(table[at..at + 8].try_into().expect("8 bytes"));
        let (size, block) = (word(40), word(48));
        if block == 0 || size == 0 {
            return Err(corrupt("bad sizes"));
        }
        if table.len() as u64 != sums_len(size, block) {
            return Err(corrupt("wrong length"));
        }
        let data = std::fs::symlink_metadata(path.with_extension(DATA))?;
        if !data.is_file() || data.len() != size {
            return Err(corrupt("data file missing or of the wrong size"));
        }
        let mut c = Cached::new(table[8..40].try_into().expect("32 bytes"), size, block);
        for (held, sum) in c
            .blocks
            .iter_mut()
            .zip(table[HEADER as usize..].chunks_exact(32))
        {
            let sum: [u8; 32] = sum.try_into().expect("32 bytes");
            *held = (sum != NO_SUM).then_some(Held {
                sum,
                tick: 0,
                checked: false,
            });
        }
        // Reads touch the table's time (and writes change it): the file's last use.
        let when = std::fs::metadata(path)
            .and_then(|m| m.modified())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        Ok((when, c))
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    pub fn stats(&self) -> DiskStats {
        let ix = lock(&self.index);
        DiskStats {
            held_bytes: ix.held,
            blocks: ix.lru.len() as u64,
            files: ix.files.len() as u64,
            ..ix.stats
        }
    }

    fn key(&self, entry: &Entry) -> [u8; 32] {
        let mut h = blake3::Hasher::new();
        for part in [
            self.namespace.as_bytes(),
            entry.path.as_bytes(),
            entry.version.as_bytes(),
        ] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part);
        }
        for n in [entry.size, self.block] {
            h.update(&n.to_le_bytes());
        }
        *h.finalize().as_bytes()
    }

    fn path_of(&self, name: &Name, ext: &str) -> PathBuf {
        let hex = hex(name);
        self.dir.join(&hex[..2]).join(format!("{hex}.{ext}"))
    }

    /// The cached file of `entry`, if the index has it under this key; one under the same
    /// name but another key is dropped.
    fn find<'a>(&self, ix: &'a mut Index, entry: &Entry) -> Option<(Name, &'a mut Cached)> {
        let key = self.key(entry);
        let name: Name = key[..16].try_into().expect("16 of 32 bytes");
        let matches = ix.files.get(&name).map(|c| c.key == key);
        if matches == Some(false) {
            tracing::warn!(file = %entry.path, "disk cache table belongs to another file; dropping it");
            ix.stats.corrupt += 1;
            self.drop_file(ix, name);
        }
        ix.files.get_mut(&name).map(|c| (name, c))
    }

    /// The data file, opened for this one use: a mount over many files must not hold two
    /// descriptors for each file it ever cached.
    fn data_of(&self, name: &Name, c: &Cached, create: bool) -> io::Result<File> {
        let path = self.path_of(name, DATA);
        if create {
            std::fs::create_dir_all(path.parent().expect("cache paths have a parent"))?;
        }
        let f = open_rw(&path, create)?;
        let len = f.metadata()?.len();
        if len != c.size {
            if !create || len != 0 {
                return Err(corrupt("data file of the wrong size"));
            }
            f.set_len(c.size)?;
        }
        Ok(f)
    }

    /// The table, opened for this one use (and written whole when new).
    fn sums_of(&self, name: &Name, c: &Cached, create: bool) -> io::Result<File> {
        let f = open_rw(&self.path_of(name, SUMS), create)?;
        if f.metadata()?.len() != c.sums_len() {
            if !create {
                return Err(corrupt("table of the wrong size"));
            }
            let mut table = vec![0u8; c.sums_len() as usize];
            table[..8].copy_from_slice(MAGIC);
            table[8..40].copy_from_slice(&c.key);
            table[40..48].copy_from_slice(&c.size.to_le_bytes());
            table[48..56].copy_from_slice(&c.block.to_le_bytes());
            f.write_all_at(&table, 0)?;
        }
        Ok(f)
    }

    /// Fills `dst` with the block at `offset` of `entry` if the cache holds it and it
    /// passes its check; `false` otherwise (a block failing its check is dropped first).
    pub fn read(&self, entry: &Entry, offset: u64, dst: &mut [u8]) -> bool {
        let block = self.block;
        let b = offset / block;
        let (name, want, data) = {
            let mut ix = lock(&self.index);
            let found = self.find(&mut ix, entry).and_then(|(name, c)| {
                let ok = offset % block == 0 && c.block_len(b) == dst.len() as u64;
                let want = c
                    .blocks
                    .get(b as usize)
                    .copied()
                    .flatten()
                    .filter(|_| ok)?
                    .sum;
                let data = self.data_of(&name, c, false);
                c.pins += 1;
                Some((name, want, data))
            });
            let Some((name, want, data)) = found else {
                ix.stats.misses += 1;
                return false;
            };
            ix.touch(name, b);
            (name, want, data)
        };
        let result = data.and_then(|f| {
            read_ramping(&f, dst, offset).map_err(|e| {
                if e.kind() == io::ErrorKind::UnexpectedEof {
                    corrupt("data file cut short")
                } else {
                    e
                }
            })?;
            if *blake3::hash(dst).as_bytes() != want {
                return Err(corrupt("checksum mismatch"));
            }
            Ok(f)
        });
        let mut ix = lock(&self.index);
        if let Some(c) = ix.files.get_mut(&name) {
            c.pins -= 1;
            if let Ok(f) = &result {
                if let Some(held) = c.blocks[b as usize].as_mut() {
                    held.checked = true;
                }
                c.seal_if_whole(f);
            }
        }
        match result {
            Ok(_) => {
                ix.stats.hits += 1;
                drop(ix);
                // Keeps the order of use across restarts; a failure only costs that order.
                if let Ok(table) = open_rw(&self.path_of(&name, SUMS), false) {
                    let _ = table.set_modified(SystemTime::now());
                }
                true
            }
            Err(why) => {
                ix.stats.misses += 1;
                let path = self.path_of(&name, DATA);
                if why.kind() == io::ErrorKind::InvalidData {
                    ix.stats.corrupt += 1;
                    tracing::warn!(file = %entry.path, offset, cache = %path.display(), %why, "disk cache block failed its check; dropped, fetching it again");
                } else {
                    tracing::warn!(file = %entry.path, offset, cache = %path.display(), error = %why, "disk cache block unreadable; fetching it again");
                }
                self.drop_block(&mut ix, name, b);
                false
            }
        }
    }

    /// Keeps `data`, the block at `offset` of `entry`, evicting the least recently used
    /// blocks to stay in budget. Failures are counted and logged, never returned: the
    /// block simply stays uncached.
    pub fn write(&self, entry: &Entry, offset: u64, data: &[u8]) {
        let block = self.block;
        if offset % block != 0 || entry.size == 0 {
            return;
        }
        let b = offset / block;
        let len = data.len() as u64;
        let key = self.key(entry);
        let name: Name = key[..16].try_into().expect("16 of 32 bytes");
        let (name, files) = {
            let mut ix = lock(&self.index);
            let new = match self.find(&mut ix, entry) {
                Some((_, c)) => {
                    if c.blocks[b as usize].is_some() || c.writing.contains(&b) {
                        return;
                    }
                    false
                }
                None => true,
            };
            if block_len(entry.size, block, b) != len {
                return;
            }
            let need = len + if new { sums_len(entry.size, block) } else { 0 };
            if need > self.budget {
                return;
            }
            if !new {
                // Its own blocks are not evicted to make room for it.
                ix.files.get_mut(&name).expect("found above").pins += 1;
            }
            self.evict_to(&mut ix, self.budget - need);
            if !new {
                ix.files.get_mut(&name).expect("pinned").pins -= 1;
            }
            if ix.held + need > self.budget {
                return; // the rest is pinned or being written by others
            }
            // Reserve the room now so concurrent writers cannot overshoot the budget.
            ix.held += need;
            let c = ix
                .files
                .entry(name)
                .or_insert_with(|| Cached::new(key, entry.size, block));
            c.writing.insert(b);
            c.pins += 1;
            // Created (directory, sparse data file, table) with the file's first block.
            let files = self
                .data_of(&name, c, new)
                .and_then(|d| Ok((d, self.sums_of(&name, c, new)?)));
            (name, files)
        };
        let sum = blake3::hash(data);
        let written = files.and_then(|(d, s)| {
            d.write_all_at(data, offset)?;
            s.write_all_at(sum.as_bytes(), HEADER + SUM * b)?;
            Ok(d)
        });
        let mut ix = lock(&self.index);
        self.written.notify_all();
        let Some(c) = ix.files.get_mut(&name) else {
            // Dropped meanwhile (its data file unusable): only the reservation is left.
            ix.held -= len;
            return;
        };
        c.writing.remove(&b);
        c.pins -= 1;
        match written {
            Ok(d) => {
                ix.tick += 1;
                let tick = ix.tick;
                if let Some(c) = ix.files.get_mut(&name) {
                    c.blocks[b as usize] = Some(Held {
                        sum: *sum.as_bytes(),
                        tick,
                        checked: true,
                    });
                    c.seal_if_whole(&d);
                }
                ix.lru.insert(tick, (name, b));
                ix.stats.written_blocks += 1;
                ix.stats.written_bytes += len;
            }
            Err(e) => {
                if let Ok(d) = open_rw(&self.path_of(&name, DATA), false) {
                    let _ = punch(&d, offset, len);
                }
                ix.held -= len;
                ix.stats.write_errors += 1;
                if !std::mem::replace(&mut ix.warned, true) {
                    tracing::warn!(dir = %self.dir.display(), error = %e, "cannot write to the disk cache; blocks stay uncached (warned once)");
                }
                self.drop_if_empty(&mut ix, name);
            }
        }
    }

    /// A read-only descriptor of `entry`'s whole local copy, if every block is held and
    /// has been checked by this process; the file is pinned until [`DiskCache::unpin`].
    /// A file whose last blocks are being written (a reader just read them through the
    /// pool) is waited for, up to [`COMPLETE_WAIT`].
    pub fn pin_complete(&self, entry: &Entry) -> Option<File> {
        let mut ix = self.wait_written(entry);
        let (name, c) = self.find(&mut ix, entry)?;
        if !c.complete_and_checked() {
            return None;
        }
        let path = self.path_of(&name, DATA);
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .ok()
            .filter(|f| f.metadata().is_ok_and(|m| m.is_file() && m.len() == c.size))?;
        if c.sealed.is_none() || change_time(&file) != c.sealed {
            // Written by someone else since this process checked it: every block is
            // checked again on its next read through the daemon, and sealed anew.
            for held in c.blocks.iter_mut().flatten() {
                held.checked = false;
            }
            c.sealed = None;
            if !std::mem::replace(&mut c.warned_changed, true) {
                tracing::warn!(file = %entry.path, cache = %path.display(), "disk cache copy changed since it was checked; reading it through the daemon to check every block again");
            }
            return None;
        }
        c.pins += 1;
        ix.stats.passthrough_opens += 1;
        Some(file)
    }

    /// Whether [`DiskCache::pin_complete`] would hand out `entry` now (after the same
    /// wait for its last blocks).
    pub fn is_complete(&self, entry: &Entry) -> bool {
        let mut ix = self.wait_written(entry);
        self.find(&mut ix, entry)
            .is_some_and(|(_, c)| c.complete_and_checked())
    }

    /// The index, once no write of `entry`'s last missing blocks is in flight (or after
    /// [`COMPLETE_WAIT`]).
    fn wait_written(&self, entry: &Entry) -> MutexGuard<'_, Index> {
        let deadline = std::time::Instant::now() + COMPLETE_WAIT;
        let mut ix = lock(&self.index);
        while let Some((_, c)) = self.find(&mut ix, entry) {
            let finishing = !c.writing.is_empty()
                && c.held_blocks() + c.writing.len() as u64 == c.blocks.len() as u64;
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if !finishing || left.is_zero() {
                break;
            }
            ix = self
                .written
                .wait_timeout(ix, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        ix
    }

    /// Ends a pin taken by [`DiskCache::pin_complete`].
    pub fn unpin(&self, entry: &Entry) {
        let mut ix = lock(&self.index);
        if let Some((_, c)) = self.find(&mut ix, entry) {
            c.pins = c.pins.saturating_sub(1);
        }
    }

    /// Drops block `b` of a file: a hole in its data, zeros for its hash. A file with no
    /// block left is deleted; one whose hole cannot be punched is deleted whole.
    fn drop_block(&self, ix: &mut Index, name: Name, b: u64) {
        let Some(c) = ix.files.get_mut(&name) else {
            return;
        };
        let Some(Held { tick, .. }) = c.blocks[b as usize].take() else {
            return;
        };
        c.sealed = None;
        let (offset, len) = (b * c.block, c.block_len(b));
        let cleared = self
            .sums_of(&name, c, false)
            .and_then(|s| s.write_all_at(&NO_SUM, HEADER + SUM * b))
            .and_then(|()| punch(&self.data_of(&name, c, false)?, offset, len));
        ix.lru.remove(&tick);
        ix.held -= len;
        if let Err(e) = cleared {
            tracing::debug!(error = %e, "cannot punch out a disk cache block; dropping its file");
            self.drop_file(ix, name);
            return;
        }
        self.drop_if_empty(ix, name);
    }

    fn drop_if_empty(&self, ix: &mut Index, name: Name) {
        if ix
            .files
            .get(&name)
            .is_some_and(|c| c.held_blocks() == 0 && c.pins == 0 && c.writing.is_empty())
        {
            self.drop_file(ix, name);
        }
    }

    /// Forgets a file and deletes both of its files.
    fn drop_file(&self, ix: &mut Index, name: Name) {
        let Some(c) = ix.files.remove(&name) else {
            return;
        };
        for (b, held) in c.blocks.iter().enumerate() {
            if let Some(held) = held {
                ix.lru.remove(&held.tick);
                ix.held -= c.block_len(b as u64);
            }
        }
        ix.held -= c.sums_len();
        for ext in [SUMS, DATA] {
            if let Err(e) = std::fs::remove_file(self.path_of(&name, ext)) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!(error = %e, "cannot delete a disk cache file");
                }
            }
        }
    }

    /// Evicts least recently used blocks of files not pinned until at most `limit` bytes
    /// are held (or only pinned files are left).
    fn evict_to(&self, ix: &mut Index, limit: u64) {
        while ix.held > limit {
            let victim = ix
                .lru
                .values()
                .find(|(name, _)| ix.files.get(name).is_some_and(|c| c.pins == 0))
                .copied();
            let Some((name, b)) = victim else {
                break;
            };
            ix.stats.evicted += 1;
            self.drop_block(ix, name, b);
        }
    }
}
