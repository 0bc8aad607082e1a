//! Small synchronisation helpers every module of the store uses; this module imports
//! nothing of the crate, so anything may import it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking the data of a poisoned lock as it is: a panic in one batch (caught,
/// and reported as a failed batch) must not make the store unusable, and every
/// structure behind these locks is valid between its own statements.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Adds `n` to a counter (statistics only: no ordering with other memory).
pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}
