//! Faults under the SSD tier: every get returns the exact bytes stored or a miss, and a
//! reopened store finds every block acknowledged durable.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use sluice_kv::{DirectIo, KvError, KvFault, KvStore};

const HEADER: usize = 4096;

#[test]
fn a_failed_write_is_not_acknowledged_and_never_visible() {
    let dir = tempdir();
    // Write 1 is the segment header; write 2 the first record.
    let (store, _f) = open_faulty(
        dir.path(),
        config(0, 64),
        vec![KvFault::FailWrite { nth: 2 }],
    );
    assert_eq!(put(&store, &[1]), vec![false]);
    assert_eq!(lookup(&store, &[1]), 0);
    assert_eq!(get(&store, &[1]), vec![false]);
    assert_eq!(put(&store, &[2]), vec![true]);
    assert_eq!(get(&store, &[2]), vec![true]);
    assert_eq!(store.stats().write_errors, 1);
}

#[test]
fn a_torn_write_is_skipped_at_reopen() {
    let dir = tempdir();
    {
        let faults = vec![KvFault::TornWrite {
            nth: 3,
            keep: 2 * HEADER,
        }];
        let (store, _f) = open_faulty(dir.path(), config(0, 64), faults);
        assert_eq!(put(&store, &[1]), vec![true]);
        assert_eq!(put(&store, &[2]), vec![false]);
        assert_eq!(put(&store, &[3]), vec![true]);
    }
    let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
    assert_eq!(get(&store, &[1]), vec![true]);
    assert_eq!(get(&store, &[2]), vec![false]);
    assert_eq!(get(&store, &[3]), vec![true]);
    assert_eq!(store.stats().torn_slots_skipped, 1);
}

#[test]
fn aligned_blocks_are_written_from_the_callers_memory_and_read_back_exact() {
    let dir = tempdir();
    let mut cfg = config(0, 64);
    cfg.direct = DirectIo::On;
    {
        let store = KvStore::open(dir.path(), cfg.clone()).unwrap();
        assert_eq!(put_aligned(&store, &[1, 2, 3, 4]), vec![true; 4]);
        assert_eq!(
            store.stats().staged_writes,
            0,
            "aligned blocks need no copy"
        );
        assert_eq!(put(&store, &[5, 6]), vec![true; 2]);
        assert_eq!(store.stats().staged_writes, 2, "unaligned ones are staged");
        assert_eq!(get(&store, &[1, 2, 3, 4, 5, 6]), vec![true; 6]);
    }
    let store = KvStore::open(dir.path(), cfg).unwrap();
    assert_eq!(get(&store, &[1, 2, 3, 4, 5, 6]), vec![true; 6]);
    assert_eq!(store.stats().torn_slots_skipped, 0);
}

#[test]
fn a_torn_write_from_the_callers_memory_is_skipped_at_reopen() {
    let dir = tempdir();
    let mut cfg = config(0, 64);
    cfg.direct = DirectIo::On;
    {
        // Write 3 is block 2's record: header and block in one vectored write, torn in
        // the block.
        let faults = vec![KvFault::TornWrite {
            nth: 3,
            keep: HEADER + 4096,
        }];
        let (store, _f) = open_faulty(dir.path(), cfg.clone(), faults);
        assert_eq!(put_aligned(&store, &[1]), vec![true]);
        assert_eq!(put_aligned(&store, &[2]), vec![false]);
        assert_eq!(put_aligned(&store, &[3]), vec![true]);
        assert_eq!(store.stats().staged_writes, 0);
    }
    let store = KvStore::open(dir.path(), cfg).unwrap();
    assert_eq!(get(&store, &[1]), vec![true]);
    assert_eq!(get(&store, &[2]), vec![false]);
    assert_eq!(get(&store, &[3]), vec![true]);
}

#[test]
fn a_write_the_device_lost_silently_reads_as_a_miss_not_bytes() {
    let dir = tempdir();
    let faults = vec![KvFault::SilentTornWrite {
        nth: 2,
        keep: 2 * HEADER,
    }];
    let (store, _f) = open_faulty(dir.path(), config(0, 64), faults);
    assert_eq!(put(&store, &[1]), vec![true]); // the device said yes
    assert_eq!(get(&store, &[1]), vec![false]);
    assert_eq!(store.stats().corrupt_blocks, 1);
    assert_eq!(lookup(&store, &[1]), 0, "a corrupt block is dropped");
}

#[test]
fn flipped_bits_in_payload_or_header_are_misses_and_the_block_is_dropped() {
    for at in [HEADER + 10, 50, HEADER + BLOCK as usize - 1] {
        let dir = tempdir();
        let (store, faulty) = open_faulty(dir.path(), config(0, 64), vec![]);
        put(&store, &[1]);
        put(&store, &[2]);
        put(&store, &[3]);
        // Reads count from 1 over the double's life; none happened yet.
        faulty.set_faults(vec![KvFault::FlipBit { nth: 2, at }]);
        assert_eq!(get(&store, &[1]), vec![true]);
        assert_eq!(get(&store, &[2]), vec![false], "flip at {at}");
        assert_eq!(get(&store, &[3]), vec![true]);
        assert_eq!(get(&store, &[2]), vec![false]);
        assert_eq!(store.stats().corrupt_blocks, 1);
    }
}

#[test]
fn failed_and_short_reads_are_misses() {
    for fault in [KvFault::FailRead { nth: 1 }, KvFault::ShortRead { nth: 1 }] {
        let dir = tempdir();
        let (store, faulty) = open_faulty(dir.path(), config(0, 64), vec![]);
        put(&store, &[1, 2]);
        faulty.set_faults(vec![fault.clone()]);
        assert_eq!(get(&store, &[1]), vec![false], "{fault:?}");
        assert_eq!(get(&store, &[2]), vec![true], "{fault:?}");
    }
}

#[test]
fn a_failed_sync_acknowledges_nothing_in_the_batch() {
    let dir = tempdir();
    // Sync 1 is the new segment's header; sync 2 the batch.
    let (store, _f) = open_faulty(
        dir.path(),
        config(0, 64),
        vec![KvFault::FailSync { nth: 2 }],
    );
    assert_eq!(put(&store, &[1, 2, 3]), vec![false; 3]);
    assert_eq!(lookup(&store, &[1]), 0);
    assert_eq!(put(&store, &[4]), vec![true]);
}

#[test]
fn a_full_disk_fails_puts_cleanly_and_keeps_what_was_stored() {
    let dir = tempdir();
    let faults = vec![KvFault::NoSpaceAfter { bytes: 200_000 }];
    let (store, _f) = open_faulty(dir.path(), config(0, 64), faults);
    let ids: Vec<u64> = (0..40).collect();
    let ok = put(&store, &ids);
    let stored: Vec<u64> = ids.iter().copied().filter(|i| ok[*i as usize]).collect();
    assert!(!stored.is_empty() && stored.len() < 40, "{ok:?}");
    for id in &stored {
        assert_eq!(
            get(&store, &[*id]),
            vec![true],
            "id {id} of {stored:?}: {:?}",
            store.stats()
        );
    }
    drop(store);
    let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
    for id in &stored {
        assert_eq!(get(&store, &[*id]), vec![true]);
    }
}

/// Issue 27 #4: write-through with a DRAM tier and batch durability. A block whose SSD
/// write failed (ENOSPC) was acknowledged because DRAM held it, and was missing at
/// reopen. An acknowledgement now means the durable record: a failed SSD write is not
/// acknowledged, and is counted as a put failure; a later put of it writes it.
#[test]
fn a_write_through_put_whose_ssd_write_fails_is_not_acknowledged_though_dram_holds_it() {
    let dir = tempdir();
    let faults = vec![KvFault::NoSpaceAfter { bytes: 200_000 }];
    let (store, faulty) = open_faulty(dir.path(), config(16, 64), faults);
    let (mut acked, mut refused) = (Vec::new(), Vec::new());
    for batch in 0..10u64 {
        let ids: Vec<u64> = (batch * 4..batch * 4 + 4).collect();
        for (id, ok) in ids.iter().zip(put(&store, &ids)) {
            match ok {
                true => acked.push(*id),
                false => refused.push(*id),
            }
        }
    }
    let s = store.stats();
    assert!(!acked.is_empty() && !refused.is_empty(), "{acked:?} {s:?}");
    assert_eq!(s.put_failures, refused.len() as u64, "{s:?}");
    assert_eq!(s.put_declined, 0, "{s:?}");
    // Once the disk has room again, a second put of a refused block writes it through.
    faulty.set_faults(vec![]);
    let again = *refused.last().unwrap();
    assert_eq!(put(&store, &[again]), vec![true]);
    acked.push(again);
    drop(store);
    let store = KvStore::open(dir.path(), config(16, 64)).unwrap();
    assert_eq!(get(&store, &acked), vec![true; acked.len()]);
}

/// Issue 27: write-back on a full disk. DRAM evicted acknowledged blocks whose SSD write
/// could not happen (no segment could be created), and they were gone without a count or
/// a word: `put_failures` 0, and `sync()` returned as if every acknowledged put were
/// durable (on a 3 MiB tmpfs, 100 of 400 acknowledged blocks were found at reopen).
#[test]
fn write_back_blocks_that_cannot_reach_the_ssd_make_sync_fail_naming_how_many() {
    let dir = tempdir();
    let mut cfg = config(4, 64);
    cfg.write_mode = sluice_kv::WriteMode::WriteBack;
    let faults = vec![KvFault::NoSpaceAfter { bytes: 100_000 }];
    let (store, faulty) = open_faulty(dir.path(), cfg.clone(), faults);
    let ids: Vec<u64> = (0..40).collect();
    for batch in ids.chunks(4) {
        assert_eq!(put(&store, batch), vec![true; 4], "DRAM acknowledges");
    }
    let failed = store.stats().write_back_failures;
    assert!(failed > 0, "{:?}", store.stats());
    let err = store.sync().expect_err("sync cannot claim durability");
    let text = err.to_string();
    assert!(
        matches!(err, KvError::NotDurable { blocks, .. } if blocks >= failed),
        "{text}"
    );
    assert!(text.contains("No space left on device"), "{text}");
    // With room again, sync writes what only DRAM still holds, and says nothing more.
    faulty.set_faults(vec![]);
    store.sync().unwrap();
    let in_dram: Vec<u64> = ids
        .iter()
        .copied()
        .filter(|i| lookup(&store, &[*i]) == 1)
        .collect();
    drop(store);
    let store = KvStore::open(dir.path(), cfg).unwrap();
    assert_eq!(get(&store, &in_dram), vec![true; in_dram.len()]);
}

/// Issue 27: `close()` did not wait for a put running on another thread. The put went on
/// writing after the lock passed to the next owner, whose recovery had sealed that
/// segment without it: the put was acknowledged, and no later open found the block.
#[test]
fn close_waits_for_a_put_running_on_another_thread() {
    let dir = tempdir();
    let (store, faulty) = open_faulty(dir.path(), config(0, 64), vec![]);
    assert_eq!(put(&store, &[1]), vec![true]); // the segment exists
    faulty.set_faults(vec![KvFault::HoldWrites]);
    let writer = {
        let store = store.clone();
        std::thread::spawn(move || put(&store, &[2, 3]))
    };
    wait_until("the put is writing", || faulty.held_writes() > 0);
    let closer = {
        let store = store.clone();
        std::thread::spawn(move || store.close())
    };
    wait_until("close() waits for the put, or returned", || {
        store.close_is_waiting_for_calls() || closer.is_finished()
    });
    assert!(
        !closer.is_finished(),
        "close() returned while a put was writing"
    );
    let k = key(4);
    assert!(matches!(store.lookup(&[&k], false), Err(KvError::Closed)));
    assert!(matches!(
        KvStore::open(dir.path(), config(0, 64)),
        Err(KvError::Locked { .. })
    ));
    faulty.release_writes();
    assert_eq!(writer.join().unwrap(), vec![true, true]);
    closer.join().unwrap().unwrap();
    let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
    assert_eq!(get(&store, &[1, 2, 3]), vec![true; 3]);
}

#[test]
fn garbage_and_truncation_in_a_segment_are_skipped_at_reopen() {
    let dir = tempdir();
    {
        let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
        // One put per key, so slot i holds key i (a batch's slots go in any order).
        for id in 1..=5 {
            put(&store, &[id]);
        }
    }
    let seg = dir
        .path()
        .join("segments")
        .join(format!("seg-{:016x}.skv", 1));
    let slot = config(0, 64).slot_bytes();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&seg)
        .unwrap();
    // Garbage where slot 6 would be; then a copy of slot 2's header into slot 7 (a stale
    // header whose payload is not there).
    f.write_all_at(&vec![0x5Au8; 6000], 6 * slot).unwrap();
    let mut head = vec![0u8; HEADER];
    f.read_exact_at(&mut head, 2 * slot).unwrap();
    f.write_all_at(&head, 7 * slot).unwrap();
    // Unsealed segment: the payload check catches the stale copy.
    let _ = std::fs::remove_file(seg.with_extension("sealed"));
    drop(f);
    let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
    assert_eq!(get(&store, &[1, 2, 3, 4, 5]), vec![true; 5]);
    assert_eq!(store.stats().torn_slots_skipped, 2, "{:?}", store.stats());
    drop(store);
    // Truncated in the middle of record 5.
    let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
    f.set_len(5 * slot + 2000).unwrap();
    drop(f);
    let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
    assert_eq!(get(&store, &[1, 2, 3, 4]), vec![true; 4]);
    assert_eq!(get(&store, &[5]), vec![false]);
}

#[test]
fn a_damaged_segment_header_drops_that_segment_only() {
    let dir = tempdir();
    {
        let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
        put(&store, &(0..10).collect::<Vec<_>>()); // 7 per segment: two segments
    }
    let seg1 = dir
        .path()
        .join("segments")
        .join(format!("seg-{:016x}.skv", 1));
    let f = std::fs::OpenOptions::new().write(true).open(&seg1).unwrap();
    f.write_all_at(b"XXXX", 40).unwrap();
    drop(f);
    let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
    let ok: Vec<bool> = (0..10).map(|i| get(&store, &[i])[0]).collect();
    assert_eq!(ok.iter().filter(|o| **o).count(), 3, "{ok:?}");
    assert!(!seg1.exists());
}

#[test]
fn a_dropped_store_releases_its_lock_at_once_even_while_reclaiming() {
    let dir = tempdir();
    let mut cfg = config(0, 64);
    // Reclaim early and deep, so the background thread has dead segments to remove.
    cfg.high_watermark = 0.4;
    cfg.low_watermark = 0.3;
    let (store, faulty) = open_faulty(dir.path(), cfg.clone(), vec![]);
    let limit = cfg.ssd_disk_bytes_limit() as f64;
    // Twice the tier's 96 blocks: the oldest segments die and the files pass the high
    // watermark; the reclaimer takes them back under the low one.
    for round in 0..25u64 {
        put(&store, &(round * 8..round * 8 + 8).collect::<Vec<_>>());
    }
    // A pass ends once the files are under the low watermark, or when the sparsest
    // segment is full of live blocks: either way, under the high one.
    wait_until("a reclaim pass dropped segments", || {
        let s = store.stats();
        s.segments_dropped > 0 && s.ssd.unwrap().allocated_bytes as f64 <= limit * 0.4
    });
    // Past the high watermark again, with slow removals: the reclaimer wakes and is in
    // the middle of removing a segment when the store is dropped.
    faulty.set_faults(vec![KvFault::SlowRemove { millis: 150 }]);
    let mut next = 200u64;
    wait_until("past the high watermark", || {
        put(&store, &(next..next + 8).collect::<Vec<_>>());
        next += 8;
        store.stats().ssd.unwrap().allocated_bytes as f64 > limit * 0.4
    });
    wait_until("a segment removal in progress", || {
        faulty.removes_in_progress() > 0
    });
    drop(store);
    // The next owner gets the store at once: no background thread kept the old one alive.
    let store = KvStore::open(dir.path(), cfg).expect("the dropped store released its lock");
    assert_eq!(get(&store, &[next - 1]), vec![true]);
}

/// Polls `done` until it holds, for at most 20 s (then fails naming `what`).
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "never got there: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn puts_and_gets_go_on_while_a_segment_is_compacted_in_the_background() {
    let dir = tempdir();
    let mut cfg = config(0, 64);
    cfg.high_watermark = 0.5;
    cfg.low_watermark = 0.3;
    let (store, faulty) = open_faulty(dir.path(), cfg, vec![KvFault::HoldReclaimReads]);
    // Block 0 is read after every put, so the policy keeps it while its segment-mates go:
    // its segment ends up sparse but live, and the background reclaimer compacts it.
    assert_eq!(put(&store, &[0]), vec![true]);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut next = 1u64;
    while faulty.held_reads() == 0 {
        assert!(Instant::now() < deadline, "no compaction started");
        assert_eq!(put(&store, &[next]), vec![true]);
        assert_eq!(get(&store, &[0]), vec![true]);
        next += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    // The reclaim thread is stalled inside a compaction's copy: the tier's lock is free.
    let (tx, rx) = std::sync::mpsc::channel();
    let s = store.clone();
    std::thread::spawn(move || {
        let stored = put(&s, &[10_000, 10_001]);
        let got = get(&s, &[0, next - 1]);
        let _ = tx.send((stored, got));
    });
    let outcome = rx.recv_timeout(Duration::from_secs(10));
    faulty.release_reads();
    let (stored, got) = outcome.expect("a put waited for the compaction's copy");
    assert_eq!((stored, got), (vec![true; 2], vec![true; 2]));
    // Once released, the compaction finishes and every block still reads back exactly.
    let deadline = Instant::now() + Duration::from_secs(20);
    while store.stats().segments_compacted == 0 {
        assert!(Instant::now() < deadline, "the compaction never finished");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(get(&store, &[0, 10_000, 10_001]), vec![true; 3]);
}

/// The child half of the kill -9 tests, run by them (as this test binary, with
/// `--ignored`), never on its own: it puts batches of 4 into the store named by
/// `SLUICE_KV_TEST_CHILD` and prints each acknowledged id; with `SLUICE_KV_TEST_MODE` =
/// `write-back` the store has a DRAM tier in front and writes back, and the child calls
/// `sync()` every 8 batches, printing `synced` once it returned.
#[test]
#[ignore = "the child of the kill -9 tests: they run it"]
fn child_process_kill_9_writer() {
    let root = std::env::var("SLUICE_KV_TEST_CHILD")
        .expect("run by every_block_acknowledged_before_kill_9_is_found_after_reopen");
    let write_back = std::env::var("SLUICE_KV_TEST_MODE").as_deref() == Ok("write-back");
    let store = KvStore::open(std::path::Path::new(&root), child_config(write_back)).unwrap();
    let mut out = std::io::stdout();
    for batch in 0.. {
        let ids: Vec<u64> = (batch * 4..batch * 4 + 4).collect();
        let ok = put(&store, &ids);
        for (id, o) in ids.iter().zip(ok) {
            if o {
                writeln!(out, "acked {id}").unwrap();
            }
        }
        if write_back && batch % 8 == 7 {
            store.sync().unwrap();
            writeln!(out, "synced").unwrap();
        }
        out.flush().unwrap();
    }
}

/// The store the kill -9 child writes: SSD only, or write-back behind a DRAM tier large
/// enough that nothing the test counts is demoted before the kill (only `sync()` writes
/// those blocks to SSD).
fn child_config(write_back: bool) -> sluice_kv::KvConfig {
    let mut c = config(if write_back { 4096 } else { 0 }, 4096);
    if write_back {
        c.write_mode = sluice_kv::WriteMode::WriteBack;
    }
    c
}

/// Runs the child writer until it acknowledged 150 blocks, kills it with SIGKILL mid-put,
/// and returns what it printed: the acknowledged ids, and (write-back) how many of them
/// were acknowledged before its last completed `sync()`.
fn kill_9_a_writer(root: &std::path::Path, mode: &str) -> (Vec<u64>, usize) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process_kill_9_writer",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SLUICE_KV_TEST_CHILD", root)
        .env("SLUICE_KV_TEST_MODE", mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (mut acked, mut synced) = (Vec::new(), 0);
    let lines = BufReader::new(child.stdout.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    for line in lines.lines() {
        let line = line.unwrap();
        if let Some(id) = line.strip_prefix("acked ") {
            acked.push(id.parse::<u64>().unwrap());
        } else if line == "synced" {
            synced = acked.len();
        }
        if acked.len() >= 150 || Instant::now() > deadline {
            break;
        }
    }
    child.kill().unwrap(); // SIGKILL, mid-put
    child.wait().unwrap();
    assert!(
        acked.len() >= 150,
        "child acknowledged only {}",
        acked.len()
    );
    (acked, synced)
}

#[test]
fn every_block_acknowledged_before_kill_9_is_found_after_reopen() {
    let dir = tempdir();
    let (acked, _) = kill_9_a_writer(dir.path(), "write-through");
    let store = KvStore::open(dir.path(), child_config(false)).unwrap();
    assert_eq!(get(&store, &acked), vec![true; acked.len()]);
}

/// Issue 27 #11: write-back with batch durability lost the last batches acknowledged
/// before a kill -9. In write-back a put acknowledges DRAM residency; a block survives a
/// crash once DRAM demoted it to SSD, or once `sync()` wrote it there: every block
/// acknowledged before the last `sync()` is found after the kill.
#[test]
fn write_back_blocks_acknowledged_before_a_sync_survive_kill_9() {
    let dir = tempdir();
    let (acked, synced) = kill_9_a_writer(dir.path(), "write-back");
    assert!(synced >= 100, "the child synced after {synced} blocks");
    let store = KvStore::open(dir.path(), child_config(true)).unwrap();
    let durable = &acked[..synced];
    assert_eq!(get(&store, durable), vec![true; durable.len()]);
}

#[test]
fn racing_puts_gets_lookups_and_evictions_never_return_wrong_bytes() {
    let dir = tempdir();
    let store = KvStore::open(dir.path(), config(6, 48)).unwrap();
    let stop = Instant::now() + Duration::from_millis(1500);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let store = store.clone();
            s.spawn(move || {
                let mut rng = 0x9E3779B97F4A7C15u64.wrapping_mul(t + 1);
                while Instant::now() < stop {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let a = rng % 120;
                    let ids = [a, (a + 1) % 120, (a + 2) % 120];
                    match rng >> 60 {
                        0..=5 => {
                            put(&store, &ids);
                        }
                        6..=11 => {
                            get(&store, &ids); // asserts the bytes of every hit
                        }
                        _ => {
                            let keys: Vec<Vec<u8>> = ids.iter().map(|i| key(*i)).collect();
                            let kr: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
                            let n = store.lookup(&kr, true).unwrap();
                            get(&store, &ids[..n]);
                        }
                    }
                }
            });
        }
    });
    let s = store.stats();
    assert!(s.dram.unwrap().blocks <= 6);
    let ssd = s.ssd.unwrap();
    assert!(ssd.allocated_bytes <= ssd.disk_bytes_limit.unwrap());
}

/// A 1 MiB-block store: four 256 KiB pieces per record, so reads into aligned buffers are
/// streamed (io_uring where it works) and hashed piece by piece.
fn big_block_store(dir: &std::path::Path, engine: sluice_engine::EngineChoice) -> KvStore {
    let mut c = sluice_kv::KvConfig::new(1 << 20, ns("m"));
    c.ssd_bytes = 16 * c.slot_bytes();
    c.segment_bytes = 8 * c.slot_bytes();
    c.direct = DirectIo::On;
    c.engine = engine;
    KvStore::open(dir, c).unwrap()
}

fn big_block(i: u64) -> sluice_engine::AlignedBuf {
    let mut b = sluice_engine::AlignedBuf::new(1 << 20).unwrap();
    for (j, x) in b.as_mut_slice().iter_mut().enumerate() {
        *x = (j as u64 * 31 + i * 7) as u8;
    }
    b
}

/// Gets `ids` into page-aligned buffers; every block returned must hold its bytes.
fn get_big(store: &KvStore, ids: &[u64]) -> Vec<bool> {
    let keys: Vec<Vec<u8>> = ids.iter().map(|i| key(*i)).collect();
    let kr: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
    let mut bufs: Vec<sluice_engine::AlignedBuf> = ids
        .iter()
        .map(|_| sluice_engine::AlignedBuf::new(1 << 20).unwrap())
        .collect();
    let mut br: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
    let ok = store.get_batch_into(&kr, &mut br).unwrap();
    for (i, o) in ok.iter().enumerate() {
        if *o {
            assert!(
                bufs[i].as_slice() == big_block(ids[i]).as_slice(),
                "wrong bytes for {}",
                ids[i]
            );
        }
    }
    ok
}

#[test]
fn streamed_reads_of_large_blocks_verify_every_piece() {
    for engine in [
        sluice_engine::EngineChoice::Auto,
        sluice_engine::EngineChoice::Threads,
    ] {
        let dir = tempdir();
        let store = big_block_store(dir.path(), engine);
        let keys: Vec<Vec<u8>> = (0..3).map(key).collect();
        let blocks: Vec<sluice_engine::AlignedBuf> = (0..3).map(big_block).collect();
        let kr: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
        let br: Vec<&[u8]> = blocks.iter().map(|b| b.as_slice()).collect();
        assert_eq!(store.put_batch(&kr, &br).unwrap(), vec![true; 3]);
        assert_eq!(get_big(&store, &[0, 1, 2]), vec![true; 3], "{engine:?}");
        // A flipped byte in the third piece of block 1's payload (segment 1, slot 2), and
        // block 2's record (segment 2, slot 1) cut short by a truncated file: misses,
        // never bytes.
        let seg = |id: u64| {
            dir.path()
                .join("segments")
                .join(format!("seg-{id:016x}.skv"))
        };
        let slot = (1u64 << 20) + 4096;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(seg(1))
            .unwrap();
        f.write_all_at(b"!", 2 * slot + 4096 + 600_000).unwrap();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(seg(2))
            .unwrap();
        f.set_len(slot + 4096 + 900_000).unwrap();
        assert_eq!(get_big(&store, &[0]), vec![true]);
        assert_eq!(get_big(&store, &[1]), vec![false], "{engine:?}");
        assert_eq!(get_big(&store, &[2]), vec![false], "{engine:?}");
        assert_eq!(store.stats().corrupt_blocks, 2, "{engine:?}");
    }
}

#[test]
fn records_split_into_many_pieces_are_written_and_read_whole() {
    // Past 63 pieces of 256 KiB the pieces grow; they must stay 4 KiB multiples for
    // O_DIRECT (at 32 MiB they were not, and every put failed with EINVAL).
    let dir = tempdir();
    let block = (16 << 20) + (64 << 10);
    let mut c = sluice_kv::KvConfig::new(block as u64, ns("m"));
    c.ssd_bytes = 8 * c.slot_bytes();
    c.direct = DirectIo::On;
    let store = KvStore::open(dir.path(), c).unwrap();
    let mut bytes = sluice_engine::AlignedBuf::new(block).unwrap();
    for (j, x) in bytes.as_mut_slice().iter_mut().enumerate() {
        *x = (j % 253) as u8;
    }
    let k = key(1);
    assert_eq!(
        store.put_batch(&[&k], &[bytes.as_slice()]).unwrap(),
        vec![true]
    );
    let mut out = sluice_engine::AlignedBuf::new(block).unwrap();
    let ok = store
        .get_batch_into(&[&k], &mut [out.as_mut_slice()])
        .unwrap();
    assert_eq!(ok, vec![true]);
    assert!(out.as_slice() == bytes.as_slice());
    assert_eq!(store.stats().staged_writes, 0, "the aligned path was taken");
}
