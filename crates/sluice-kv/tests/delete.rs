//! `delete` (issue 28): a deleted block leaves every tier and the policies' books, its
//! DRAM slot and SSD segment are given back, leases end, and bad input is refused.

mod common;

use std::path::Path;

use common::*;
use sluice_kv::{BlockStore, KvError, KvStore, WriteMode};

fn delete(store: &dyn BlockStore, ids: &[u64]) -> usize {
    let keys: Vec<Vec<u8>> = ids.iter().map(|i| key(*i)).collect();
    let kr: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
    store.delete(&kr).unwrap()
}

fn segment_files(root: &Path) -> usize {
    std::fs::read_dir(root.join("segments"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "skv")
        })
        .count()
}

#[test]
fn a_deleted_block_is_gone_from_each_tier_layout_and_counted_once() {
    for (dram, ssd) in [(16, 0), (0, 64), (4, 64)] {
        let dir = tempdir();
        let store = KvStore::open(dir.path(), config(dram, ssd)).unwrap();
        put(&store, &[1, 2, 3]);
        // 2 and 3 are there, 9 never was; a key named twice counts once.
        assert_eq!(delete(&store, &[2, 9, 3, 2]), 2, "dram={dram} ssd={ssd}");
        assert_eq!(delete(&store, &[2, 3]), 0);
        assert_eq!(lookup(&store, &[1, 2]), 1);
        assert_eq!(get(&store, &[1]), vec![true]);
        assert_eq!(get(&store, &[2]), vec![false]);
        assert_eq!(get(&store, &[3]), vec![false]);
        assert_eq!(store.stats().deletes, 2);
        // The key can be stored again, and reads its new record.
        assert_eq!(put(&store, &[2]), vec![true]);
        assert_eq!(get(&store, &[2]), vec![true]);
    }
}

/// Fails without the policies' `remove`: the deleted blocks, the newest, stayed in the
/// LRU's books and the next puts evicted the oldest live blocks in their place.
#[test]
fn deleting_gives_the_room_back_to_the_policy() {
    for (dram, ssd) in [(0, 64), (64, 0)] {
        let dir = tempdir();
        let store = KvStore::open(dir.path(), config(dram, ssd)).unwrap();
        let tier = |s: sluice_kv::KvStats| s.ssd.or(s.dram).unwrap();
        let n = tier(store.stats()).capacity_blocks;
        let old: Vec<u64> = (0..n / 2).collect();
        let newest: Vec<u64> = (n / 2..n).collect();
        assert_eq!(put(&store, &old), vec![true; old.len()]);
        assert_eq!(put(&store, &newest), vec![true; newest.len()]);
        let full = tier(store.stats()).used_bytes;
        assert_eq!(delete(&store, &newest), newest.len());
        let t = tier(store.stats());
        assert_eq!((t.blocks, t.used_bytes), (n / 2, full / 2), "dram={dram}");
        let new: Vec<u64> = (n..n + n / 2).collect();
        assert_eq!(put(&store, &new), vec![true; new.len()]);
        assert_eq!(
            lookup(&store, &old),
            old.len(),
            "dram={dram}: a live block was evicted"
        );
    }
}

#[test]
fn segments_left_without_a_live_record_are_removed_at_once() {
    let dir = tempdir();
    let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
    let ids: Vec<u64> = (0..35).collect(); // 7 records a segment: 5 segments
    put(&store, &ids);
    let before = store.stats().ssd.unwrap().allocated_bytes;
    assert_eq!(segment_files(dir.path()), 5);
    // Half of every segment: nothing can go yet.
    let odd: Vec<u64> = ids.iter().copied().filter(|i| i % 2 == 1).collect();
    delete(&store, &odd);
    assert_eq!(segment_files(dir.path()), 5);
    let even: Vec<u64> = ids.iter().copied().filter(|i| i % 2 == 0).collect();
    assert_eq!(delete(&store, &even), even.len());
    // The four sealed segments are gone; the one being appended to stays.
    assert_eq!(segment_files(dir.path()), 1);
    let s = store.stats();
    assert_eq!(s.ssd.as_ref().unwrap().allocated_bytes, before / 5);
    assert_eq!(s.segments_dropped, 4);
    // The store goes on: new puts, reads and a reopen.
    assert_eq!(put(&store, &[100, 101]), vec![true; 2]);
    store.close().unwrap();
    let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
    assert_eq!(get(&store, &[100, 101]), vec![true; 2]);
    assert_eq!(lookup(&store, &[0]), 0);
}

#[test]
fn a_delete_ends_the_lease_taken_before_it() {
    for (dram, ssd) in [(4, 0), (0, 64)] {
        let dir = tempdir();
        let store = KvStore::open(dir.path(), config(dram, ssd)).unwrap();
        put(&store, &[1]);
        let k = key(1);
        assert_eq!(store.lookup(&[&k], true).unwrap(), 1);
        assert_eq!(delete(&store, &[1]), 1);
        assert_eq!(get(&store, &[1]), vec![false], "dram={dram}");
        // Its DRAM slot is free again: the arena takes as many blocks as before.
        if dram > 0 {
            assert_eq!(put(&store, &[2, 3, 4, 5]), vec![true; 4]);
        }
    }
}

/// Deletes are not recorded on disk: a record whose segment still holds live blocks is
/// found again at the next open (docs/design/kv.md, "Deletes"); one whose segment was
/// removed is not.
#[test]
fn a_delete_does_not_survive_a_restart_where_the_segment_stays() {
    let dir = tempdir();
    let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
    put(&store, &(0..21).collect::<Vec<_>>()); // three full segments, 7 records each
    delete(&store, &[3]);
    delete(&store, &(7..14).collect::<Vec<_>>()); // all of the second
    store.close().unwrap();
    let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
    assert_eq!(get(&store, &[3]), vec![true]);
    assert_eq!(lookup(&store, &[7]), 0);
}

#[test]
fn a_write_back_block_deleted_before_its_demotion_is_never_written() {
    let dir = tempdir();
    let mut cfg = config(16, 64);
    cfg.write_mode = WriteMode::WriteBack;
    let store = KvStore::open(dir.path(), cfg.clone()).unwrap();
    put(&store, &[1, 2]);
    assert_eq!(delete(&store, &[1]), 1);
    store.close().unwrap();
    let store = KvStore::open(dir.path(), cfg).unwrap();
    assert_eq!(get(&store, &[1]), vec![false]);
    assert_eq!(get(&store, &[2]), vec![true]);
    assert_eq!(store.stats().ssd.unwrap().blocks, 1);
}

#[test]
fn bad_keys_and_a_closed_store_are_refused() {
    let dir = tempdir();
    let mut cfg = config(4, 64);
    cfg.key_bytes = Some(12);
    let store = KvStore::open(dir.path(), cfg).unwrap();
    let err = store.delete(&[b"twelve-bytes", b"short"]).unwrap_err();
    assert!(
        matches!(err, KvError::InvalidArgument { .. }) && err.to_string().contains("key 1"),
        "{err}"
    );
    assert!(store.delete(&[b""]).is_err());
    assert_eq!(store.delete(&[]).unwrap(), 0);
    store.close().unwrap();
    assert!(matches!(
        store.delete(&[b"twelve-bytes"]),
        Err(KvError::Closed)
    ));
}
