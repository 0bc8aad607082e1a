//! Non-blocking batches (`submit_put`, `submit_get`, `poll`, `wait`) and the lookup that
//! only reports hits that beat recomputing.

mod common;

use std::time::Duration;

use common::*;
use sluice_kv::{JobBuffer, JobKind, KvError, KvStore, RecomputeModel};

fn keys(ids: &[u64]) -> Vec<Vec<u8>> {
    ids.iter().map(|i| key(*i)).collect()
}

fn blocks(ids: &[u64]) -> Vec<Box<dyn JobBuffer>> {
    ids.iter()
        .map(|i| Box::new(block_for(&key(*i))) as Box<dyn JobBuffer>)
        .collect()
}

fn empty(n: usize) -> Vec<Box<dyn JobBuffer>> {
    (0..n)
        .map(|_| Box::new(vec![0u8; BLOCK as usize]) as Box<dyn JobBuffer>)
        .collect()
}

#[test]
fn submitted_puts_and_gets_round_trip_the_exact_bytes() {
    let dir = tempdir();
    let store = KvStore::open(dir.path(), config(4, 64)).unwrap();
    let ids: Vec<u64> = (0..12).collect();
    let put = store.submit_put(keys(&ids), blocks(&ids)).unwrap();
    assert_eq!(put.kind(), JobKind::Put);
    assert_eq!(put.wait(None).unwrap(), vec![true; 12]);
    let get = store.submit_get(keys(&ids), empty(12)).unwrap();
    assert_eq!(
        get.wait(Some(Duration::from_secs(30))).unwrap(),
        vec![true; 12]
    );
    let bufs = get.take_buffers();
    assert_eq!(bufs.len(), 12);
    for (id, b) in ids.iter().zip(&bufs) {
        assert!(b.bytes() == block_for(&key(*id)), "wrong bytes for {id}");
    }
    // A chain with a missing key: prefix semantics, as the blocking call.
    let get = store.submit_get(keys(&[0, 1, 999, 2]), empty(4)).unwrap();
    assert_eq!(get.wait(None).unwrap(), vec![true, true, false, false]);
}

#[test]
fn poll_reports_each_finished_job_once_and_wait_collects_it() {
    let dir = tempdir();
    let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
    let a = store.submit_put(keys(&[1, 2]), blocks(&[1, 2])).unwrap();
    let b = store.submit_put(keys(&[3]), blocks(&[3])).unwrap();
    let c = store.submit_get(keys(&[1]), empty(1)).unwrap();
    assert_ne!(a.id(), b.id());
    // `c` is collected by its wait; `a` and `b` only by poll.
    c.wait(None).unwrap();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        for job in store.poll() {
            assert!(job.is_done());
            assert!(job.id() != c.id(), "a waited job is not polled again");
            seen.push((job.id(), job.result().unwrap()));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    seen.sort();
    assert_eq!(seen, vec![(a.id(), vec![true, true]), (b.id(), vec![true])]);
    assert!(store.poll().is_empty(), "each job is reported once");
}

#[test]
fn a_waited_job_is_never_polled_even_when_the_wait_beats_the_worker() {
    // The worker sets a job's outcome, then lists it for `poll`; a waiter can wake and
    // return in between. That job must stay off the list (this raced once in `make test`).
    let dir = tempdir();
    let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
    store
        .submit_put(keys(&[1]), blocks(&[1]))
        .unwrap()
        .wait(None)
        .unwrap();
    for _ in 0..2000 {
        let job = store.submit_get(keys(&[1]), empty(1)).unwrap();
        assert_eq!(job.wait(None).unwrap(), vec![true]);
    }
    // Closing waits until every worker has finished with its job, listing included.
    store.close().unwrap();
    let polled: Vec<u64> = store.poll().iter().map(|j| j.id()).collect();
    assert!(polled.is_empty(), "waited jobs polled again: {polled:?}");
}

#[test]
fn bad_arguments_fail_the_submit_not_the_job() {
    let dir = tempdir();
    let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
    let short: Vec<Box<dyn JobBuffer>> = vec![Box::new(vec![0u8; 10])];
    match store.submit_get(keys(&[1]), short) {
        Err(KvError::InvalidArgument { what, detail }) => {
            assert_eq!(what, "buffer 0");
            assert!(detail.contains("10 bytes"), "{detail}");
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    match store.submit_put(vec![Vec::new()], blocks(&[1])) {
        Err(KvError::InvalidArgument { what, .. }) => assert_eq!(what, "key 0"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    match store.submit_put(keys(&[1, 2]), blocks(&[1])) {
        Err(KvError::InvalidArgument { what, .. }) => assert_eq!(what, "batch"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    assert!(store.poll().is_empty());
}

#[test]
fn close_finishes_queued_jobs_and_refuses_new_ones() {
    let dir = tempdir();
    let store = KvStore::open(dir.path(), config(0, 256)).unwrap();
    let jobs: Vec<_> = (0..40u64)
        .map(|i| store.submit_put(keys(&[i]), blocks(&[i])).unwrap())
        .collect();
    store.close().unwrap();
    for j in &jobs {
        assert!(j.is_done(), "close returned before job {} finished", j.id());
        assert_eq!(j.result().unwrap(), vec![true]);
    }
    assert!(matches!(
        store.submit_put(keys(&[99]), blocks(&[99])),
        Err(KvError::Closed)
    ));
    // Every job's blocks are durable: a new owner finds them.
    drop(store);
    let store = KvStore::open(dir.path(), config(0, 256)).unwrap();
    let ids: Vec<u64> = (0..40).collect();
    assert_eq!(lookup(&store, &ids), 40);
}

#[test]
fn a_wait_with_a_timeout_returns_none_while_the_job_runs() {
    let dir = tempdir();
    // A slow disk: every write sleeps, so the job is still running when we look.
    let (store, _f) = open_faulty(
        dir.path(),
        config(0, 64),
        vec![sluice_kv::KvFault::SlowWrite { millis: 300 }],
    );
    let job = store.submit_put(keys(&[1]), blocks(&[1])).unwrap();
    assert_eq!(job.wait(Some(Duration::from_millis(20))), None);
    assert!(!job.is_done());
    assert_eq!(job.result(), None);
    assert_eq!(job.wait(None).unwrap(), vec![true]);
}

#[test]
fn a_wait_longer_than_the_clock_can_count_waits_for_the_job() {
    // Issue 27: a deadline past what `Instant` can hold panicked ("overflow when adding
    // duration to instant"); from Python, `job.wait(1e300)` raised a PanicException.
    let dir = tempdir();
    let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
    let job = store.submit_put(keys(&[1]), blocks(&[1])).unwrap();
    assert_eq!(job.wait(Some(Duration::MAX)).unwrap(), vec![true]);
}

#[test]
fn dropping_a_store_with_jobs_in_flight_neither_hangs_nor_loses_acknowledged_blocks() {
    let dir = tempdir();
    {
        let store = KvStore::open(dir.path(), config(0, 256)).unwrap();
        let jobs: Vec<_> = (0..20u64)
            .map(|i| store.submit_put(keys(&[i]), blocks(&[i])).unwrap())
            .collect();
        drop(store);
        for j in jobs {
            assert_eq!(j.wait(Some(Duration::from_secs(60))).unwrap(), vec![true]);
        }
    }
    let store = KvStore::open(dir.path(), config(0, 256)).unwrap();
    let ids: Vec<u64> = (0..20).collect();
    assert_eq!(lookup(&store, &ids), 20);
}

fn recompute(tokens_per_s: f64) -> sluice_kv::KvConfig {
    let mut cfg = config(4, 64);
    cfg.recompute = Some(RecomputeModel {
        tokens_per_s,
        block_tokens: 16,
    });
    cfg
}

#[test]
fn lookup_worth_loading_reports_only_hits_that_beat_recomputing() {
    let ids: Vec<u64> = (0..8).collect();
    let ks = keys(&ids);
    let kr: Vec<&[u8]> = ks.iter().map(|k| k.as_slice()).collect();
    // A prefill of 16 tokens per picosecond: nothing loads faster than that.
    let dir = tempdir();
    let store = KvStore::open(dir.path(), recompute(16e12)).unwrap();
    put(&store, &ids);
    assert_eq!(store.lookup(&kr, false).unwrap(), 8);
    assert_eq!(store.lookup_worth_loading(&kr, true).unwrap(), 0);
    drop(store);
    // One token per second: every resident block is worth loading.
    let dir = tempdir();
    let store = KvStore::open(dir.path(), recompute(1.0)).unwrap();
    put(&store, &ids);
    assert_eq!(store.lookup_worth_loading(&kr, true).unwrap(), 8);
    assert_eq!(get(&store, &ids), vec![true; 8]);
    let ks9 = keys(&[0, 1, 1000, 2]);
    let kr9: Vec<&[u8]> = ks9.iter().map(|k| k.as_slice()).collect();
    assert_eq!(store.lookup_worth_loading(&kr9, false).unwrap(), 2);
    // The load model learned from the gets above.
    let model = store.stats().load_model;
    assert!(model.dram_block_s > 0.0 && model.ssd_block_s > 0.0);
}

#[test]
fn lookup_worth_loading_without_a_recompute_model_or_with_a_bad_one_is_refused() {
    let dir = tempdir();
    let store = KvStore::open(dir.path(), config(4, 64)).unwrap();
    let k = key(1);
    match store.lookup_worth_loading(&[&k], false) {
        Err(KvError::InvalidArgument { detail, .. }) => {
            assert!(detail.contains("recompute"), "{detail}")
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let dir = tempdir();
        match KvStore::open(dir.path(), recompute(bad)) {
            Err(KvError::Config { field, .. }) => assert_eq!(field, "recompute_tokens_per_s"),
            other => panic!("{bad}: expected Config, got {:?}", other.err()),
        }
    }
}
