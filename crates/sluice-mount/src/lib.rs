//! Sluice mount: a read-only caching mount over an object-store prefix or a directory.
//!
//! - [`Backend`]: where the bytes come from ([`DirBackend`], [`ObjectBackend`]).
//! - [`BlockPool`]: one byte-budgeted cache of blocks shared by every reader, each block
//!   fetched once.
//! - [`DiskCache`]: the optional second tier, sparse local copies with a hash per block;
//!   a copy held whole is handed to the kernel to read directly (passthrough).
//! - [`Streams`]: several sequential streams per file, each with its own prefetch window.
//! - [`MountFs`]: the file system, tested without FUSE; [`mount`] serves it over FUSE.

mod backend;
mod disk_cache;
mod error;
mod fs;
mod fuse;
mod pool;
mod streams;

#[cfg(any(test, feature = "testing"))]
pub use backend::FaultyBackend;
pub use backend::{Backend, DirBackend, Entry, ObjectBackend, Perm};
pub use disk_cache::{DiskCache, DiskCacheOptions, DiskStats};
pub use error::MountError;
pub use fs::{
    Attr, DirEntry, MountFs, MountOptions, MountStats, Opened, ReadData, Released, ROOT_INO,
};
pub use fuse::{check_mount_point, mount, Mounted};
pub use pool::{Block, BlockPool, Claim, PoolStats};
pub use streams::{Prefetch, StreamConfig, Streams};

/// A mutex's guard, poisoned or not: every lock in the mount guards counters and maps a
/// panicking holder leaves consistent.
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
