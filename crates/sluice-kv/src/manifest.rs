//! The store directory: its manifest and its owner lock.
//!
//! ```text
//! <root>/sluice-kv.json   {"format": "sluice-kv", "version": 1, "store_id": ..., "block_bytes": ...}
//! <root>/lock             flock()ed by the process that has the store open; holds its pid
//! <root>/segments/        seg-<id>.skv segment files and their .sealed markers
//! ```
//!
//! One process owns a store at a time (docs/design/kv.md says why): the lock is an
//! exclusive `flock`, which the kernel releases when the owner dies however it dies, so a
//! killed engine never leaves the store locked. A directory that is not empty and has no
//! manifest is refused rather than written into, so a typo in a path cannot mix KV
//! segments into someone's data.

use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sluice_formats::kv::KV_FORMAT_VERSION;

use sluice_engine::{FileLock, LockError, LockMode, LockOpen};

use crate::error::KvError;
use crate::fork_guard::ForkGuard;

pub const MANIFEST_NAME: &str = "sluice-kv.json";
const FORMAT_NAME: &str = "sluice-kv";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    /// 32 hex digits; every segment header repeats it.
    pub store_id: String,
    pub block_bytes: u64,
}

impl Manifest {
    pub fn store_id_bytes(&self) -> Option<[u8; 16]> {
        let s = self.store_id.as_bytes();
        if s.len() != 32 {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, pair) in s.chunks(2).enumerate() {
            let hex = std::str::from_utf8(pair).ok()?;
            out[i] = u8::from_str_radix(hex, 16).ok()?;
        }
        Some(out)
    }
}

/// Reads the manifest of `root`, or creates the store there when the directory is absent
/// or empty. A manifest with another block size is [`KvError::Incompatible`].
pub fn open_or_create(root: &Path, block_bytes: u64) -> Result<Manifest, KvError> {
    let path = root.join(MANIFEST_NAME);
    if root.exists() && !root.is_dir() {
        return Err(KvError::Incompatible {
            path: root.to_path_buf(),
            detail: "is not a directory".into(),
        });
    }
    // A manifest that cannot even be looked at (a link that loops) is named, not taken
    // for a missing one.
    if path.try_exists().map_err(KvError::io(&path))? {
        let m = read_manifest(root)?;
        if m.block_bytes != block_bytes {
            return Err(KvError::Incompatible {
                path,
                detail: format!(
                    "the store holds {}-byte blocks; opened with block_bytes={block_bytes}",
                    m.block_bytes
                ),
            });
        }
        return Ok(m);
    }
    create_dir(root)?;
    let mut entries = std::fs::read_dir(root).map_err(KvError::io(root))?;
    if entries.next().is_some() {
        return Err(KvError::Incompatible {
            path: root.to_path_buf(),
            detail: format!("not empty and has no {MANIFEST_NAME}: not a sluice kv store"),
        });
    }
    let m = Manifest {
        format: FORMAT_NAME.into(),
        version: KV_FORMAT_VERSION,
        store_id: sluice_engine::unique_hex(32),
        block_bytes,
    };
    let json = serde_json::to_vec_pretty(&m).expect("a manifest always serialises");
    sluice_engine::atomic_write(&path, &json).map_err(|e| KvError::Io {
        path: path.clone(),
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(m)
}

/// Creates the directory `dir` (and its parents). A path there that is not a directory
/// is named for what it is (`create_dir_all` says only "File exists"), as bad input.
pub(crate) fn create_dir(dir: &Path) -> Result<(), KvError> {
    std::fs::create_dir_all(dir).map_err(|e| {
        let named = match std::fs::metadata(dir) {
            Ok(meta) if !meta.is_dir() => {
                Some(sluice_engine::wrong_kind("a directory", meta.file_type()))
            }
            Ok(_) => None,
            Err(m) => sluice_engine::wrong_kind_of_error("a directory", &m),
        };
        KvError::io(dir)(named.unwrap_or(e))
    })
}

/// Reads and checks the manifest of an existing store.
pub fn read_manifest(root: &Path) -> Result<Manifest, KvError> {
    let path = root.join(MANIFEST_NAME);
    // Opened as a regular file only: a FIFO in its place must not hang the open.
    let mut bytes = Vec::new();
    sluice_engine::open_regular(&path, 0)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(KvError::io(&path))?;
    let m: Manifest = serde_json::from_slice(&bytes).map_err(|e| KvError::Incompatible {
        path: path.clone(),
        detail: format!("manifest is not valid: {e}"),
    })?;
    if m.format != FORMAT_NAME {
        return Err(KvError::Incompatible {
            path,
            detail: format!("format is {:?}, not {FORMAT_NAME:?}", m.format),
        });
    }
    if m.version != KV_FORMAT_VERSION {
        return Err(KvError::Incompatible {
            path,
            detail: format!(
                "format version {}, this build reads version {KV_FORMAT_VERSION}",
                m.version
            ),
        });
    }
    if m.store_id_bytes().is_none() || m.block_bytes == 0 {
        return Err(KvError::Incompatible {
            path,
            detail: "store_id must be 32 hex digits and block_bytes positive".into(),
        });
    }
    Ok(m)
}

/// The owner lock, held while the store is open.
pub struct StoreLock {
    lock: Option<FileLock>,
    fork: ForkGuard,
}

/// The owner releases the lock outright, so that a child forked while the store was open
/// (it holds a copy of the lock's descriptor) does not keep the store locked after the
/// owner let go of it. Such a child's copy only closes its descriptor: releasing would
/// unlock its parent's store.
impl Drop for StoreLock {
    fn drop(&mut self) {
        let Some(lock) = self.lock.take() else { return };
        if self.fork.is_forked() {
            return;
        }
        let path = lock.path().to_path_buf();
        if let Err(e) = lock.release() {
            tracing::warn!("{}: releasing the store's lock: {e}", path.display());
        }
    }
}

/// Takes the store's exclusive lock without waiting; [`KvError::Locked`] names the holder.
pub fn lock(root: &Path) -> Result<StoreLock, KvError> {
    let path = root.join(LOCK_NAME);
    let mut lock = FileLock::acquire(&path, LockMode::Exclusive, LockOpen::Create)
        .map_err(|e| locked_or_io(root, e))?;
    let _ = lock.write_owner(&std::process::id().to_string());
    Ok(StoreLock {
        lock: Some(lock),
        fork: ForkGuard::this_process(),
    })
}

/// A busy lock as [`KvError::Locked`] naming the holder's pid, else an I/O error.
fn locked_or_io(root: &Path, e: LockError) -> KvError {
    match e {
        LockError::Busy { owner, .. } => KvError::Locked {
            path: root.to_path_buf(),
            holder: owner.and_then(|o| o.parse().ok()),
        },
        LockError::Io { path, source } => KvError::Io { path, source },
    }
}

/// `Ok` when no process has the store at `root` open: its lock is taken and released at
/// once ([`KvError::Locked`] names the holder otherwise).
pub fn check_store_closed(root: &Path) -> Result<(), KvError> {
    lock(root).map(drop)
}

/// How a read-only command (`kv stats`, `kv fsck` without `--repair`) holds the store.
pub enum ReadLock {
    /// A shared lock on the lock file, opened read-only: no writer can open the store
    /// meanwhile, and none had it open.
    Shared { _lock: FileLock },
    /// No lock, and why: the lock file is missing or cannot be read (a user with read
    /// permission only on the store's files). A writer could then run beside the read.
    Unlocked(String),
}

impl ReadLock {
    /// In words, for reports and logs.
    pub fn describe(&self) -> String {
        match self {
            ReadLock::Shared { .. } => "shared (read-only)".into(),
            ReadLock::Unlocked(why) => format!("none: {why}"),
        }
    }
}

/// Takes a shared lock on the store without writing anything: the lock file is opened
/// read-only and never created, so this works on a read-only file system and for a user
/// who may only read the store. [`KvError::Locked`] when a process has it open.
pub fn lock_shared(root: &Path) -> Result<ReadLock, KvError> {
    let path = root.join(LOCK_NAME);
    match FileLock::acquire(&path, LockMode::Shared, LockOpen::ReadOnly) {
        Ok(lock) => Ok(ReadLock::Shared { _lock: lock }),
        Err(e @ LockError::Busy { .. }) => Err(locked_or_io(root, e)),
        Err(LockError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Ok(unlocked(&path, "there is no lock file".into()))
        }
        Err(LockError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::PermissionDenied =>
        {
            Ok(unlocked(
                &path,
                format!("the lock file cannot be read ({source})"),
            ))
        }
        Err(e) if e.is_unsupported() => Ok(unlocked(&path, format!("flock failed ({e})"))),
        Err(LockError::Io { path, source }) => Err(KvError::Io { path, source }),
    }
}

fn unlocked(path: &Path, why: String) -> ReadLock {
    tracing::warn!(
        "{}: {why}; reading the store without its lock (a process writing it meanwhile would make this read inconsistent)",
        path.display()
    );
    ReadLock::Unlocked(why)
}

const LOCK_NAME: &str = "lock";
