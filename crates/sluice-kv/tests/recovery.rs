//! Reopening a store from segment summaries: one read per sealed segment instead of one
//! per slot, a scan (and a new summary) where a summary is missing, damaged or foreign,
//! and never wrong bytes when a summary lists a record that is no longer there.

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use common::*;
use sluice_kv::KvStore;

fn files_with(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("segments"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    v
}

/// 30 blocks over segments of 7 records: four sealed, one active.
fn filled(dir: &Path) -> Vec<u64> {
    let store = KvStore::open(dir, config(0, 64)).unwrap();
    let ids: Vec<u64> = (0..30).collect();
    for chunk in ids.chunks(5) {
        assert_eq!(put(&store, chunk), vec![true; chunk.len()]);
    }
    store.close().unwrap();
    ids
}

#[test]
fn sealed_segments_are_reopened_from_their_summaries() {
    let dir = tempdir();
    let ids = filled(dir.path());
    let summaries = files_with(dir.path(), "summary");
    assert_eq!(summaries.len(), 4, "one per sealed segment");
    let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
    assert_eq!(store.stats().summaries_read, 4);
    assert_eq!(get(&store, &ids), vec![true; 30]);
    drop(store);
    // The segment left active was scanned once, then sealed with a summary of its own.
    assert_eq!(files_with(dir.path(), "summary").len(), 5);
    let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
    assert_eq!(store.stats().summaries_read, 5);
    assert_eq!(lookup(&store, &ids), 30);
}

#[test]
fn a_damaged_summary_is_ignored_and_the_segment_scanned_and_summarized_again() {
    let dir = tempdir();
    let ids = filled(dir.path());
    let summaries = files_with(dir.path(), "summary");
    let mut bytes = std::fs::read(&summaries[1]).unwrap();
    bytes[70] ^= 0xFF;
    std::fs::write(&summaries[1], &bytes).unwrap();
    // Another segment's (valid) summary in place of the first one's.
    std::fs::copy(&summaries[2], &summaries[0]).unwrap();
    let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
    assert_eq!(store.stats().summaries_read, 2);
    assert_eq!(get(&store, &ids), vec![true; 30]);
    drop(store);
    let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
    assert_eq!(store.stats().summaries_read, 5, "rewritten after the scan");
}

#[test]
fn a_summary_listing_a_record_that_is_gone_costs_a_miss_not_bytes() {
    let dir = tempdir();
    filled(dir.path());
    // Zero the record in slot 2 of the first segment: its summary still lists it.
    let seg = &files_with(dir.path(), "skv")[0];
    let slot = config(0, 64).slot_bytes();
    let f = std::fs::OpenOptions::new().write(true).open(seg).unwrap();
    f.write_all_at(&vec![0u8; 4096], 2 * slot).unwrap();
    let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
    // Slot 2 of segment 1 holds the second block written: id 1.
    assert_eq!(lookup(&store, &[1]), 1, "the summary says it is there");
    assert_eq!(get(&store, &[0, 1, 2]), vec![true, false, false]);
    assert_eq!(store.stats().corrupt_blocks, 1);
    assert_eq!(lookup(&store, &[1]), 0, "dropped once it failed to verify");
    assert_eq!(get(&store, &[2]), vec![true]);
}

#[test]
fn fsck_repair_drops_the_summary_of_a_segment_it_changes() {
    let dir = tempdir();
    filled(dir.path());
    let seg = &files_with(dir.path(), "skv")[0];
    let slot = config(0, 64).slot_bytes();
    let f = std::fs::OpenOptions::new().write(true).open(seg).unwrap();
    f.write_all_at(b"garbage!", 3 * slot + 100).unwrap();
    let report = sluice_kv::fsck::fsck(dir.path(), true).unwrap();
    assert_eq!(report.bad_blocks, 1);
    assert!(!seg.with_extension("summary").exists());
    let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
    assert_eq!(store.stats().summaries_read, 3);
    assert_eq!(
        lookup(&store, &[2]),
        0,
        "the repaired slot is not listed again"
    );
}
