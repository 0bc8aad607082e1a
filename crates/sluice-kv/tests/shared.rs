//! The shared-directory tier: stores (nodes) that share a directory read each other's
//! sealed segments, promote what they read into their own tiers, and never get wrong
//! bytes from a segment another store corrupted, dropped or wrote with another block size.

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use sluice_kv::{KvConfig, KvError, KvStore};

/// A store on its own local SSD, with `shared_blocks` of its own in `shared` (0: it only
/// reads other stores' blocks there).
fn node(shared: &Path, shared_blocks: u64) -> KvConfig {
    let mut c = config(0, 64);
    c.shared_dir = Some(shared.to_path_buf());
    c.shared_bytes = shared_blocks * c.slot_bytes();
    c.shared_refresh_ms = 30;
    c
}

/// Waits until `store` sees `n` blocks of the chain `ids` (another store's segment seals
/// after `shared_refresh_ms`, and is found at the next refresh).
fn wait_for(store: &KvStore, ids: &[u64], n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while lookup(store, ids) != n {
        assert!(Instant::now() < deadline, "never saw {n} of {ids:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn segments_of(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "skv"))
        .collect();
    v.sort();
    v
}

/// This store's own directory in the shared directory.
fn own_dir(shared: &Path) -> PathBuf {
    let dirs: Vec<PathBuf> = std::fs::read_dir(shared)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs[0].clone()
}

#[test]
fn a_block_one_node_stored_is_read_by_another_and_then_kept_locally() {
    let (a_dir, b_dir, shared) = (tempdir(), tempdir(), tempdir());
    let a = KvStore::open(a_dir.path(), node(shared.path(), 64)).unwrap();
    let b = KvStore::open(b_dir.path(), node(shared.path(), 0)).unwrap();
    assert_eq!(put(&a, &[1, 2, 3]), vec![true; 3]);
    wait_for(&b, &[1, 2, 3], 3);
    assert_eq!(get(&b, &[1, 2, 3, 4]), vec![true, true, true, false]);
    let s = b.stats();
    assert_eq!(s.hits_shared, 3);
    assert_eq!(s.foreign.as_ref().unwrap().counters.stores, 1);
    // Promoted into B's own SSD tier: the next get is local.
    assert_eq!(s.ssd.unwrap().blocks, 3);
    assert_eq!(get(&b, &[1, 2, 3]), vec![true; 3]);
    assert_eq!(b.stats().hits_ssd, 3);
}

#[test]
fn namespaces_stay_apart_across_nodes() {
    let (a_dir, b_dir, shared) = (tempdir(), tempdir(), tempdir());
    let a = KvStore::open(a_dir.path(), node(shared.path(), 64)).unwrap();
    let mut other = node(shared.path(), 0);
    other.namespace = ns("another-model");
    let b = KvStore::open(b_dir.path(), other).unwrap();
    assert_eq!(put(&a, &[5]), vec![true]);
    // Wait until B has indexed A's segment, then check it is not visible under B's namespace.
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.stats().foreign.unwrap().blocks == 0 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(lookup(&b, &[5]), 0);
    assert_eq!(get(&b, &[5]), vec![false]);
}

#[test]
fn a_corrupted_or_dropped_foreign_segment_is_a_miss_never_bytes() {
    let (a_dir, b_dir, shared) = (tempdir(), tempdir(), tempdir());
    let a = KvStore::open(a_dir.path(), node(shared.path(), 64)).unwrap();
    let b = KvStore::open(b_dir.path(), node(shared.path(), 0)).unwrap();
    assert_eq!(put(&a, &[1, 2]), vec![true; 2]);
    wait_for(&b, &[1, 2], 2);
    // Another node's file gets a flipped byte in block 1's payload (slot 1).
    let seg = &segments_of(&own_dir(shared.path()))[0];
    let slot = node(shared.path(), 64).slot_bytes();
    let f = std::fs::OpenOptions::new().write(true).open(seg).unwrap();
    f.write_all_at(b"X", slot + 4096 + 77).unwrap();
    assert_eq!(get(&b, &[1, 2]), vec![false, false]);
    assert_eq!(b.stats().foreign.unwrap().counters.read_failures, 1);
    assert_eq!(get(&b, &[2]), vec![true], "block 2 was intact");
    // The owner drops the segment: at the next refresh its blocks are gone.
    drop(a);
    std::fs::remove_dir_all(own_dir(shared.path())).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.stats().foreign.unwrap().blocks > 0 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(get(&b, &[2]), vec![true], "promoted to B's SSD before");
    assert_eq!(lookup(&b, &[1]), 0);
}

#[test]
fn a_nodes_own_shared_segments_stay_within_their_disk_limit_and_survive_a_reopen() {
    let (a_dir, b_dir, shared) = (tempdir(), tempdir(), tempdir());
    let cfg = node(shared.path(), 24);
    {
        let a = KvStore::open(a_dir.path(), cfg.clone()).unwrap();
        // The shared budget counts blocks; its on-disk overhead is on top (issue 27 #16).
        let tier = a.stats().shared.unwrap();
        assert_eq!(tier.budget_bytes, cfg.shared_bytes);
        let budget = tier.disk_bytes_limit.unwrap();
        for round in 0..10u64 {
            put(&a, &(round * 8..round * 8 + 8).collect::<Vec<_>>());
            // A segment the reclaim thread removes between the listing and the stat is gone.
            let on_disk: u64 = segments_of(&own_dir(shared.path()))
                .iter()
                .filter_map(|p| std::fs::metadata(p).ok())
                .map(|m| m.len())
                .sum();
            assert!(on_disk <= budget, "round {round}: {on_disk} > {budget}");
        }
        a.close().unwrap();
    }
    let a = KvStore::open(a_dir.path(), cfg).unwrap();
    assert!(a.stats().shared.unwrap().blocks > 0, "recovered at reopen");
    let b = KvStore::open(b_dir.path(), node(shared.path(), 0)).unwrap();
    wait_for(&b, &[79], 1);
    assert_eq!(get(&b, &[79]), vec![true]);
}

#[test]
fn another_block_size_in_the_shared_directory_is_skipped() {
    let (a_dir, b_dir, shared) = (tempdir(), tempdir(), tempdir());
    let mut small = node(shared.path(), 64);
    small.block_bytes = 4096;
    small.ssd_bytes = 64 * small.slot_bytes();
    small.shared_bytes = 64 * small.slot_bytes();
    let a = KvStore::open(a_dir.path(), small).unwrap();
    let key = key(1);
    assert_eq!(a.put_batch(&[&key], &[&[7u8; 4096]]).unwrap(), vec![true]);
    let b = KvStore::open(b_dir.path(), node(shared.path(), 0)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.stats().foreign.unwrap().counters.skipped_summaries == 0 {
        assert!(
            Instant::now() < deadline,
            "never saw the other store's segment"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(lookup(&b, &[1]), 0);
}

#[test]
fn bad_shared_settings_are_refused_naming_them() {
    let dir = tempdir();
    let mut c = config(0, 64);
    c.shared_bytes = 64 * c.slot_bytes();
    let err = KvStore::open(dir.path(), c).err().unwrap();
    assert!(
        matches!(
            err,
            KvError::Config {
                field: "shared_bytes",
                ..
            }
        ),
        "{err}"
    );
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let err = KvStore::open(&dir.path().join("s"), node(&file, 64))
        .err()
        .unwrap();
    assert!(err.to_string().contains("a-file"), "{err}");
    // A reader with no local tiers at all is fine: it serves what others stored.
    let mut reader = config(0, 0);
    reader.shared_dir = Some(dir.path().join("shared"));
    KvStore::open(&dir.path().join("r"), reader).unwrap();
}
