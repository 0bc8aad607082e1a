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
    let report = sluice_kv::fsck(dir.path(), true).unwrap();
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

/// Issue 27 #7: a file the store never wrote (`seg-5.skv`: not its naming) is skipped with
/// a warning by open, fsck and the on-disk summary; a damaged file of its own naming is
/// damage: fsck reports it and --repair removes it. The store opens either way.
#[test]
fn stray_files_in_the_segment_directory_do_not_stop_open_fsck_or_stats() {
    let dir = tempdir();
    let ids = filled(dir.path());
    let segs = dir.path().join("segments");
    // `seg-5.skv` once named the real `seg-0000000000000005.skv`; `seg-9.skv` a missing one.
    std::fs::write(segs.join("seg-5.skv"), [7u8; 100]).unwrap();
    std::fs::write(segs.join("seg-9.skv"), [7u8; 100]).unwrap();
    std::fs::write(segs.join("notes.txt"), b"mine").unwrap();
    let summary = sluice_kv::store_summary(dir.path()).expect("stats with a stray file");
    assert_eq!(summary.segments, 5, "{summary:?}");
    let report = sluice_kv::fsck(dir.path(), false).expect("fsck with a stray file");
    assert_eq!(
        (report.bad_blocks, report.bad_segments),
        (0, 0),
        "{report:?}"
    );
    sluice_kv::fsck(dir.path(), true).expect("fsck --repair with a stray file");
    assert!(
        segs.join("seg-9.skv").exists(),
        "a file it never wrote is left alone"
    );
    {
        let store = KvStore::open(dir.path(), config(0, 64)).expect("open with a stray file");
        assert_eq!(get(&store, &ids), vec![true; ids.len()]);
    }
    // A truncated file of the store's own naming: fsck reports it, --repair removes it.
    let own = segs.join(format!("seg-{:016x}.skv", 40));
    std::fs::write(&own, [7u8; 100]).unwrap();
    let report = sluice_kv::fsck(dir.path(), false).unwrap();
    assert_eq!(report.bad_segments, 1, "{report:?}");
    let report = sluice_kv::fsck(dir.path(), true).unwrap();
    assert_eq!(report.bad_segments, 1, "{report:?}");
    assert!(!own.exists());
    assert_eq!(sluice_kv::fsck(dir.path(), false).unwrap().bad_segments, 0);
    let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
    assert_eq!(lookup(&store, &ids), ids.len());
}

/// Issue 27 #8: a sealed segment truncated in the middle of a record. Its summary still
/// lists the records past the cut: fsck reports each as a lost block (it used to report
/// the store clean), and a reopened store no longer counts them in lookups.
#[test]
fn fsck_reports_the_blocks_of_a_truncated_segment_as_lost_and_lookup_drops_them() {
    let dir = tempdir();
    let ids = filled(dir.path());
    // Segment 2 holds ids 7-13 in slots 1-7; cut it 2,000 bytes into slot 3 (id 9).
    let seg = &files_with(dir.path(), "skv")[1];
    let slot = config(0, 64).slot_bytes();
    let f = std::fs::OpenOptions::new().write(true).open(seg).unwrap();
    f.set_len(3 * slot + 2000).unwrap();
    drop(f);
    let report = sluice_kv::fsck(dir.path(), false).unwrap();
    assert_eq!(
        (report.good_blocks, report.bad_blocks),
        (25, 5),
        "{report:?}"
    );
    let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
    assert_eq!(lookup(&store, &ids), 9, "ids 9-13 are gone");
    assert_eq!(lookup(&store, &[13]), 0);
    assert_eq!(get(&store, &ids[14..]), vec![true; 16]);
}

/// Issue 27 #8: a segment file overwritten by a copy of another. Its header names the
/// other segment and its records are copies (same sequence numbers): fsck reports the
/// segment and the blocks its summary listed as lost; a reopened store does not count them.
#[test]
fn fsck_reports_a_segment_overwritten_by_a_copy_of_another_and_lookup_drops_its_blocks() {
    let dir = tempdir();
    let ids = filled(dir.path());
    let segs = files_with(dir.path(), "skv");
    std::fs::copy(&segs[0], &segs[1]).unwrap();
    let report = sluice_kv::fsck(dir.path(), false).unwrap();
    assert_eq!(report.bad_segments, 1, "{report:?}");
    assert_eq!(
        (report.good_blocks, report.bad_blocks),
        (23, 7),
        "{report:?}"
    );
    let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
    assert_eq!(
        lookup(&store, &ids),
        7,
        "ids 7-13 were in the overwritten segment"
    );
    assert_eq!(lookup(&store, &ids[7..14]), 0);
    assert_eq!(get(&store, &ids[..7]), vec![true; 7]);
    assert_eq!(get(&store, &ids[14..]), vec![true; 16]);
    drop(store);
    assert_eq!(sluice_kv::fsck(dir.path(), false).unwrap().bad_blocks, 0);
}
