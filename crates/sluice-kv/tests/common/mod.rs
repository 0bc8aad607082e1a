//! Helpers shared by the KV store's integration tests.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use sluice_kv::{
    BlockStore, FaultyDir, FsSegmentDir, KvConfig, KvFault, KvStore, Namespace, SegmentDir,
};

pub const BLOCK: u64 = 8192;

pub fn ns(model: &str) -> Namespace {
    Namespace {
        model: model.into(),
        dtype: "bfloat16".into(),
        tp_size: 1,
        kv_format: "test".into(),
        ..Namespace::default()
    }
}

/// A config of `dram_blocks` DRAM slots and `ssd_blocks` worth of SSD budget.
pub fn config(dram_blocks: u64, ssd_blocks: u64) -> KvConfig {
    let mut c = KvConfig::new(BLOCK, ns("m"));
    c.dram_bytes = dram_blocks * BLOCK;
    c.ssd_bytes = ssd_blocks * c.slot_bytes();
    c.segment_bytes = 8 * c.slot_bytes();
    c.io_threads = 4;
    c
}

/// The bytes stored under a key in these tests: a function of the key, so any get can be
/// checked without remembering what was put.
pub fn block_for(key: &[u8]) -> Vec<u8> {
    let seed = blake3::hash(key);
    let mut out = Vec::with_capacity(BLOCK as usize);
    let mut h = blake3::Hasher::new_keyed(seed.as_bytes());
    h.update(b"block");
    let mut reader = h.finalize_xof();
    out.resize(BLOCK as usize, 0);
    reader.fill(&mut out);
    out
}

pub fn key(i: u64) -> Vec<u8> {
    format!("block-{i:08}").into_bytes()
}

/// Puts `ids` into a store or a sidecar client.
pub fn put(store: &dyn BlockStore, ids: &[u64]) -> Vec<bool> {
    let keys: Vec<Vec<u8>> = ids.iter().map(|i| key(*i)).collect();
    let blocks: Vec<Vec<u8>> = keys.iter().map(|k| block_for(k)).collect();
    let kr: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
    let br: Vec<&[u8]> = blocks.iter().map(|b| b.as_slice()).collect();
    store.put_batch(&kr, &br).unwrap()
}

/// Gets `ids`; asserts every block returned holds exactly its bytes; returns the flags.
pub fn get(store: &dyn BlockStore, ids: &[u64]) -> Vec<bool> {
    let keys: Vec<Vec<u8>> = ids.iter().map(|i| key(*i)).collect();
    let kr: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
    let mut bufs: Vec<Vec<u8>> = ids.iter().map(|_| vec![0u8; BLOCK as usize]).collect();
    let mut br: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
    let ok = store.get_batch_into(&kr, &mut br).unwrap();
    for (i, o) in ok.iter().enumerate() {
        if *o {
            assert!(
                bufs[i] == block_for(&keys[i]),
                "wrong bytes for key {}",
                ids[i]
            );
        }
    }
    ok
}

pub fn lookup(store: &dyn BlockStore, ids: &[u64]) -> usize {
    let keys: Vec<Vec<u8>> = ids.iter().map(|i| key(*i)).collect();
    let kr: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
    store.lookup(&kr, false).unwrap()
}

/// Opens a store over a fault-injecting segment directory.
pub fn open_faulty(root: &Path, cfg: KvConfig, faults: Vec<KvFault>) -> (KvStore, Arc<FaultyDir>) {
    let real: Arc<dyn SegmentDir> = Arc::new(FsSegmentDir::new(&root.join("segments"), cfg.direct));
    let faulty = Arc::new(FaultyDir::new(real, faults));
    let dir: Arc<dyn SegmentDir> = faulty.clone();
    (KvStore::open_with_dir(root, cfg, dir).unwrap(), faulty)
}

pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in("/var/tmp").unwrap()
}

/// Like [`put`], but from page-aligned buffers, the way an engine's KV pages arrive: O_DIRECT
/// can then write them without a staging copy.
pub fn put_aligned(store: &KvStore, ids: &[u64]) -> Vec<bool> {
    let keys: Vec<Vec<u8>> = ids.iter().map(|i| key(*i)).collect();
    let blocks: Vec<sluice_engine::AlignedBuf> = keys
        .iter()
        .map(|k| {
            let mut b = sluice_engine::AlignedBuf::new(BLOCK as usize).unwrap();
            b.as_mut_slice().copy_from_slice(&block_for(k));
            b
        })
        .collect();
    let kr: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
    let br: Vec<&[u8]> = blocks.iter().map(|b| b.as_slice()).collect();
    store.put_batch(&kr, &br).unwrap()
}
