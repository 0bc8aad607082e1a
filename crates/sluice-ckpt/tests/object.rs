//! The checkpoint store under an object-store prefix (object_store's in-memory store,
//! which keeps create-only puts as S3, GCS and Azure do): saves and loads round trip; a
//! failure at every step leaves the last checkpoint and nothing of the new one; a name is
//! published once; a manifest naming a missing chunk is never published; gc leaves young
//! chunks; a grouped save commits through marker objects, and a failed rank fails the others.

mod common;
use common::{fail_each_step, load_all, share_of, state, CHUNK};

use std::sync::Arc;
use std::time::Duration;

use object_store::memory::InMemory;
use object_store::ObjectStore;
use sluice_ckpt::{
    CkptError, CkptStore, FailAt, ObjectRoot, SaveJob, SaveOptions, Saver, Share, Step,
};
use sluice_remote::{ObjectUrl, RemoteOptions, RemoteStore};

fn root(mem: &Arc<InMemory>, prefix: &str) -> ObjectRoot {
    let url = ObjectUrl::parse(&format!("s3://bucket/{prefix}")).unwrap();
    let store: Arc<dyn ObjectStore> = mem.clone();
    let remote = RemoteStore::with_store(&url, store, &RemoteOptions::default());
    ObjectRoot::with_remote(url, remote, 8)
}

fn open(mem: &Arc<InMemory>, steps: Option<Arc<FailAt>>) -> Arc<CkptStore> {
    let steps: Arc<dyn sluice_ckpt::StoreSteps> = match steps {
        Some(s) => s,
        None => Arc::new(sluice_ckpt::RealSteps),
    };
    Arc::new(CkptStore::with_object(root(mem, "run"), true, steps).unwrap())
}

fn options(name: &str, rank: usize, world: usize) -> SaveOptions {
    SaveOptions {
        name: name.into(),
        rank,
        world,
        chunk_bytes: CHUNK,
        staging_bytes: 8 * CHUNK,
        timeout: Duration::from_secs(20),
        replicate: false,
        extra: serde_json::Value::Null,
        publish: true,
    }
}

fn save(
    store: &Arc<CkptStore>,
    entries: &[(String, Vec<u8>)],
    name: &str,
) -> Result<(), CkptError> {
    let saver = Saver::new();
    let share = Arc::new(share_of(entries));
    let table = share.table()?.clone();
    let plan = saver.plan(store, std::slice::from_ref(&table), &[1e9])?;
    // SAFETY: `entries` outlives the job.
    let job = unsafe {
        SaveJob::start(
            Arc::clone(store),
            share,
            vec![table],
            plan,
            options(name, 0, 1),
            Box::new(()),
        )?
    };
    job.finish(&saver, None).map(|_| ())
}

fn sorted(mut v: Vec<(String, Vec<u8>)>) -> Vec<(String, Vec<u8>)> {
    v.sort();
    v
}

/// The chunk objects' digests, sorted.
fn chunks(store: &CkptStore) -> Vec<String> {
    let mut v: Vec<String> = store
        .chunks()
        .list()
        .unwrap()
        .into_iter()
        .map(|(d, _)| d.hex())
        .collect();
    v.sort();
    v
}

fn live(store: &CkptStore, name: &str) -> Vec<String> {
    let mut v: Vec<String> = store
        .manifest(name)
        .unwrap()
        .unique_chunks()
        .keys()
        .map(|d| d.hex())
        .collect();
    v.sort();
    v
}

#[test]
fn a_save_round_trips_and_the_next_writes_only_what_changed() {
    let mem = Arc::new(InMemory::new());
    let store = open(&mem, None);
    let s1 = state(0, 1);
    save(&store, &s1, "s1").unwrap();
    assert_eq!(load_all(&store, "s1").unwrap(), sorted(s1.clone()));
    let before = chunks(&store);
    save(&store, &state(0, 2), "s2").unwrap();
    // The first chunk of big (tied: once) and the pack of the small entries.
    assert_eq!(chunks(&store).len(), before.len() + 2);
    assert_eq!(load_all(&store, "s2").unwrap(), sorted(state(0, 2)));
    let names: Vec<String> = store.list().unwrap().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["s1", "s2"]);
    assert!(store.verify("s2", 4).unwrap().problems.is_empty());
    // Another handle on the same prefix finds the store (its marker), not a new one.
    let again = CkptStore::with_object(root(&mem, "run"), false, Arc::new(sluice_ckpt::RealSteps));
    assert_eq!(again.unwrap().list().unwrap().len(), 2);
    let none = CkptStore::with_object(root(&mem, "other"), false, Arc::new(sluice_ckpt::RealSteps));
    assert!(matches!(none, Err(CkptError::NoStore { .. })));
}

#[test]
fn a_name_is_published_once() {
    let mem = Arc::new(InMemory::new());
    let store = open(&mem, None);
    save(&store, &state(0, 1), "s1").unwrap();
    let err = save(&store, &state(0, 2), "s1").unwrap_err();
    assert!(err.to_string().contains("exists already"), "{err}");
    assert_eq!(load_all(&store, "s1").unwrap(), sorted(state(0, 1)));
    // The publish itself is create-only (no look first: the put is refused), so a
    // manifest another save put after this one's check is not replaced either.
    let other = {
        save(&store, &state(0, 3), "s3").unwrap();
        store.manifest("s3").unwrap()
    };
    let err = store.publish("s1", &other).unwrap_err();
    assert!(err.to_string().contains("exists already"), "{err}");
    assert_eq!(load_all(&store, "s1").unwrap(), sorted(state(0, 1)));
}

#[test]
fn a_manifest_naming_a_missing_chunk_is_never_published() {
    let mem = Arc::new(InMemory::new());
    let store = open(&mem, None);
    save(&store, &state(0, 1), "s1").unwrap();
    let m = store.manifest("s1").unwrap();
    let gone = *m.unique_chunks().keys().next().unwrap();
    store.chunks().remove(&gone).unwrap();
    let err = store.publish("copy", &m).unwrap_err();
    assert!(
        matches!(err, CkptError::MissingChunk { digest, .. } if digest == gone),
        "{err}"
    );
    // A save's own fresh chunks are not looked at again; the ones it reused still are.
    let fresh: std::collections::BTreeSet<_> = m
        .unique_chunks()
        .into_keys()
        .filter(|d| *d != gone)
        .collect();
    let err = store.publish_after("copy", &m, &fresh).unwrap_err();
    assert!(
        matches!(err, CkptError::MissingChunk { digest, .. } if digest == gone),
        "{err}"
    );
    assert!(matches!(
        store.manifest("copy"),
        Err(CkptError::NoCheckpoint { .. })
    ));
    let err = load_all(&store, "s1").unwrap_err();
    assert!(matches!(err, CkptError::MissingChunk { .. }), "{err}");
    assert!(err.to_string().contains("s3://bucket/run/chunks/"), "{err}");
}

#[test]
fn a_failure_at_every_step_leaves_the_last_checkpoint_and_nothing_of_the_new_one() {
    let run = |fail: Option<usize>| -> (Vec<Step>, Result<(), CkptError>, Arc<InMemory>) {
        let mem = Arc::new(InMemory::new());
        save(&open(&mem, None), &state(0, 1), "s1").unwrap();
        let steps = Arc::new(FailAt::new(fail));
        let store = open(&mem, Some(steps.clone()));
        let out = save(&store, &state(0, 2), "s2");
        (steps.steps(), out, mem)
    };
    fail_each_step(run, 3, |k, step, mem| {
        let store = open(&mem, None);
        let names: Vec<String> = store.list().unwrap().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["s1"], "step {k} ({step:?})");
        let s1 = load_all(&store, "s1").unwrap();
        assert_eq!(s1, sorted(state(0, 1)), "step {k}");
        // What the failed save created is left (no lock: another save may count on it)
        // until gc finds it past its grace.
        assert!(chunks(&store).len() >= live(&store, "s1").len(), "step {k}");
        store.gc_with(10, Duration::ZERO).unwrap();
        assert_eq!(chunks(&store), live(&store, "s1"), "step {k} ({step:?})");
    });
}

#[test]
fn gc_removes_old_checkpoints_and_only_unreferenced_chunks_past_the_grace() {
    let mem = Arc::new(InMemory::new());
    let store = open(&mem, None);
    for step in 1..=3 {
        save(&store, &state(step, step), &format!("s{step}")).unwrap();
    }
    let all = chunks(&store);
    let r = store.gc_with(1, Duration::from_secs(3600)).unwrap();
    assert_eq!(r.checkpoints_removed, ["s1", "s2"]);
    assert_eq!(r.chunks_removed, 0, "young chunks stay for saves in flight");
    assert_eq!(chunks(&store), all);
    let r = store.gc_with(1, Duration::ZERO).unwrap();
    assert_eq!(chunks(&store), live(&store, "s3"));
    assert_eq!(r.chunks_removed, all.len() - live(&store, "s3").len());
    assert_eq!(load_all(&store, "s3").unwrap(), sorted(state(3, 3)));
}

#[test]
fn a_prefix_holding_other_objects_is_not_made_a_store() {
    let mem = Arc::new(InMemory::new());
    let r = root(&mem, "data");
    r.put("train/shard-0.bin", b"x".to_vec().into()).unwrap();
    let err = match CkptStore::with_object(r, true, Arc::new(sluice_ckpt::RealSteps)) {
        Ok(_) => panic!("a prefix holding other objects was made a store"),
        Err(e) => e,
    };
    assert!(matches!(err, CkptError::ForeignDirectory { .. }), "{err}");
    assert!(err.to_string().contains("train/"), "{err}");
}

#[test]
fn a_grouped_save_commits_through_marker_objects_and_a_failed_rank_fails_the_others() {
    let mem = Arc::new(InMemory::new());
    let states: Vec<Vec<(String, Vec<u8>)>> = (0..2).map(|r| state(r, 1)).collect();
    let shares: Vec<Arc<Share>> = states.iter().map(|s| Arc::new(share_of(s))).collect();
    let tables: Vec<_> = shares.iter().map(|s| s.table().unwrap().clone()).collect();
    let plan = Saver::new()
        .plan(&open(&mem, None), &tables, &[1e9, 1e9])
        .unwrap();
    let run = |name: &str, fail_rank: Option<usize>| -> Vec<Result<(), CkptError>> {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|rank| {
                    let (mem, shares, tables, plan) = (&mem, &shares, &tables, &plan);
                    let name = name.to_string();
                    s.spawn(move || {
                        let store = open(mem, None); // each rank its own handle
                        let saver = Saver::new();
                        // SAFETY: the states outlive the jobs.
                        let job = unsafe {
                            SaveJob::start(
                                store,
                                Arc::clone(&shares[rank]),
                                tables.clone(),
                                plan.clone(),
                                options(&name, rank, 2),
                                Box::new(()),
                            )?
                        };
                        if fail_rank == Some(rank) {
                            job.cancel("injected");
                        }
                        job.finish(&saver, None).map(|_| ())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    let ok = run("g1", None);
    assert!(ok.iter().all(|r| r.is_ok()), "{ok:?}");
    let store = open(&mem, None);
    let mut want: Vec<_> = states.concat();
    want.sort();
    assert_eq!(load_all(&store, "g1").unwrap(), want);
    assert!(store.object().unwrap().list(".pending").unwrap().is_empty());
    let started = std::time::Instant::now();
    let failed = run("g2", Some(1));
    assert!(failed.iter().all(|r| r.is_err()), "{failed:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the other rank waited out its timeout"
    );
    assert!(matches!(
        store.manifest("g2"),
        Err(CkptError::NoCheckpoint { .. })
    ));
}

#[test]
fn a_rank_whose_heartbeat_stops_fails_the_commit_long_before_the_timeout() {
    let mem = Arc::new(InMemory::new());
    let store = open(&mem, None);
    let timeout = Duration::from_secs(120);
    let root = store.object().unwrap();
    let c0 = sluice_ckpt::Commit::join_object(root, "k", "tok1", 0, 2, timeout).unwrap();
    let mut c1 = sluice_ckpt::Commit::join_object(root, "k", "tok1", 1, 2, timeout).unwrap();
    let started = std::time::Instant::now(); // rank 1's heartbeat is as new as it gets
    c0.mark_durable(0, &serde_json::json!({})).unwrap();
    c1.kill_heartbeat(); // rank 1's process is gone, its share never marked
    let err = c0.wait_marks().unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(err, CkptError::RankFailed { rank: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("is gone"), "{err}");
    assert!(
        took >= sluice_ckpt::HEARTBEAT_STALE - Duration::from_millis(100),
        "{took:?}"
    );
    assert!(took < sluice_ckpt::HEARTBEAT_STALE * 3, "{took:?}");
    // A rank that is alive but slow is not taken for dead.
    let d0 = sluice_ckpt::Commit::join_object(root, "k", "tok2", 0, 2, timeout).unwrap();
    let d1 = sluice_ckpt::Commit::join_object(root, "k", "tok2", 1, 2, timeout).unwrap();
    d0.mark_durable(0, &serde_json::json!({})).unwrap();
    let marker = std::thread::spawn(move || {
        std::thread::sleep(sluice_ckpt::HEARTBEAT_STALE + Duration::from_secs(2));
        d1.mark_durable(1, &serde_json::json!({})).unwrap();
        d1
    });
    assert_eq!(d0.wait_marks().unwrap().len(), 2);
    drop(marker.join().unwrap());
    drop(d0);
    drop((c0, c1));
}

#[test]
fn ranks_that_create_one_store_at_once_all_open_it() {
    for _ in 0..20 {
        let mem = Arc::new(InMemory::new());
        let opened: Vec<bool> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    let mem = &mem;
                    s.spawn(move || {
                        CkptStore::with_object(
                            root(mem, "run"),
                            true,
                            Arc::new(sluice_ckpt::RealSteps),
                        )
                        .is_ok()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(opened.iter().all(|&o| o), "{opened:?}");
    }
}
