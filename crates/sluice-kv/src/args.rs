//! The checks every batch call makes of its arguments before it runs, shared by the store
//! and its sidecar clients: keys (1 to `MAX_KEY_BYTES` bytes, or exactly `key_bytes`) and
//! buffers (one per key, each a block long). A bad argument is an error naming it.

use sluice_formats::kv::MAX_KEY_BYTES;

use crate::error::KvError;

/// Checks every key of a batch: 1 to `MAX_KEY_BYTES` bytes, and exactly `key_bytes` when
/// the store fixes it. Shared by the store and its sidecar clients.
pub(crate) fn check_keys(keys: &[&[u8]], key_bytes: Option<usize>) -> Result<(), KvError> {
    for (i, key) in keys.iter().enumerate() {
        let what = || format!("key {i}");
        if key.is_empty() || key.len() > MAX_KEY_BYTES {
            return Err(KvError::arg(
                what(),
                format!(
                    "{} bytes, but keys are 1 to {MAX_KEY_BYTES} bytes",
                    key.len()
                ),
            ));
        }
        if let Some(k) = key_bytes.filter(|k| key.len() != *k) {
            return Err(KvError::arg(
                what(),
                format!("{} bytes, but this store's keys are {k} bytes", key.len()),
            ));
        }
    }
    Ok(())
}

/// Checks a batch's buffers: one per key, each exactly a block long.
pub(crate) fn check_buffers(keys: usize, lens: &[usize], block_bytes: u64) -> Result<(), KvError> {
    if keys != lens.len() {
        return Err(KvError::arg(
            "batch",
            format!("{keys} keys but {} buffers", lens.len()),
        ));
    }
    let want = block_bytes as usize;
    if let Some((i, len)) = lens.iter().enumerate().find(|(_, l)| **l != want) {
        return Err(KvError::arg(
            format!("buffer {i}"),
            format!("{len} bytes, but this store's blocks are {want} bytes"),
        ));
    }
    Ok(())
}
