//! [`BlockStore`]: the engine-facing calls, served either by a store this process owns
//! ([`KvStore`]) or by a `sluice kv serve` sidecar that several processes share
//! ([`crate::KvClient`]). Adapters, the Python module and the CLI's bench take either.

use crate::error::KvError;
use crate::jobs::{JobBuffer, KvJob};
use crate::store::KvStore;

/// The calls an engine makes on a KV block store. Every method has the semantics of the
/// [`KvStore`] method of the same name.
pub trait BlockStore: Send + Sync {
    /// Every block of the store is this long.
    fn block_bytes(&self) -> u64;
    fn lookup(&self, keys: &[&[u8]], lease: bool) -> Result<usize, KvError>;
    fn lookup_worth_loading(&self, keys: &[&[u8]], lease: bool) -> Result<usize, KvError>;
    fn put_batch(&self, keys: &[&[u8]], blocks: &[&[u8]]) -> Result<Vec<bool>, KvError>;
    fn get_batch_into(&self, keys: &[&[u8]], bufs: &mut [&mut [u8]]) -> Result<Vec<bool>, KvError>;
    /// Deletes blocks; returns how many the store held.
    fn delete(&self, keys: &[&[u8]]) -> Result<usize, KvError>;
    fn submit_put(
        &self,
        keys: Vec<Vec<u8>>,
        blocks: Vec<Box<dyn JobBuffer>>,
    ) -> Result<KvJob, KvError>;
    fn submit_get(
        &self,
        keys: Vec<Vec<u8>>,
        bufs: Vec<Box<dyn JobBuffer>>,
    ) -> Result<KvJob, KvError>;
    /// Finished jobs not reported yet, each once.
    fn poll(&self) -> Vec<KvJob>;
    fn sync(&self) -> Result<(), KvError>;
    /// The counters, as `KvStats` serializes them (a client adds its own under "client").
    fn stats_json(&self) -> Result<serde_json::Value, KvError>;
    fn close(&self) -> Result<(), KvError>;
}

impl BlockStore for KvStore {
    fn block_bytes(&self) -> u64 {
        self.config().block_bytes
    }
    fn lookup(&self, keys: &[&[u8]], lease: bool) -> Result<usize, KvError> {
        KvStore::lookup(self, keys, lease)
    }
    fn lookup_worth_loading(&self, keys: &[&[u8]], lease: bool) -> Result<usize, KvError> {
        KvStore::lookup_worth_loading(self, keys, lease)
    }
    fn put_batch(&self, keys: &[&[u8]], blocks: &[&[u8]]) -> Result<Vec<bool>, KvError> {
        KvStore::put_batch(self, keys, blocks)
    }
    fn get_batch_into(&self, keys: &[&[u8]], bufs: &mut [&mut [u8]]) -> Result<Vec<bool>, KvError> {
        KvStore::get_batch_into(self, keys, bufs)
    }
    fn delete(&self, keys: &[&[u8]]) -> Result<usize, KvError> {
        KvStore::delete(self, keys)
    }
    fn submit_put(
        &self,
        keys: Vec<Vec<u8>>,
        blocks: Vec<Box<dyn JobBuffer>>,
    ) -> Result<KvJob, KvError> {
        KvStore::submit_put(self, keys, blocks)
    }
    fn submit_get(
        &self,
        keys: Vec<Vec<u8>>,
        bufs: Vec<Box<dyn JobBuffer>>,
    ) -> Result<KvJob, KvError> {
        KvStore::submit_get(self, keys, bufs)
    }
    fn poll(&self) -> Vec<KvJob> {
        KvStore::poll(self)
    }
    fn sync(&self) -> Result<(), KvError> {
        KvStore::sync(self)
    }
    fn stats_json(&self) -> Result<serde_json::Value, KvError> {
        Ok(serde_json::to_value(self.stats()).unwrap_or_default())
    }
    fn close(&self) -> Result<(), KvError> {
        KvStore::close(self)
    }
}
