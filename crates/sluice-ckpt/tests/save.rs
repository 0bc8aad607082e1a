//! A save as the fronts run it (share, plan, save job, commit) and a load (fetch), in one
//! process and across ranks simulated by threads: a failure at every file-system step
//! leaves the previous checkpoint loadable and the new one invisible; a rank that dies is
//! noticed at once; a replicated share is written by the successor; grouped reads pair up.

mod common;
use common::{fail_each_step, load_all, share_of, state, CHUNK};

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sluice_ckpt::{
    ChunkRef, CkptError, CkptStore, FailAt, Fetch, ReadPlan, Replica, SaveJob, SaveOptions,
    SavePlan, Saver, Share, ShareTable, Step,
};

fn options(name: &str, rank: usize, world: usize, timeout: Duration) -> SaveOptions {
    SaveOptions {
        name: name.into(),
        rank,
        world,
        chunk_bytes: CHUNK,
        staging_bytes: 8 * CHUNK,
        timeout,
        replicate: false,
        extra: serde_json::Value::Null,
        publish: true,
    }
}

/// Hashes `entries`, plans alone, starts the save.
fn start(
    store: &Arc<CkptStore>,
    saver: &Saver,
    entries: &[(String, Vec<u8>)],
    name: &str,
) -> Result<SaveJob, CkptError> {
    let share = Arc::new(share_of(entries));
    let table = share.table()?.clone();
    let plan = saver.plan(store, std::slice::from_ref(&table), &[1e9])?;
    let opts = options(name, 0, 1, Duration::from_secs(60));
    // SAFETY: `entries` outlives the job in every caller.
    unsafe {
        SaveJob::start(
            Arc::clone(store),
            share,
            vec![table],
            plan,
            opts,
            Box::new(()),
        )
    }
}

fn chunk_names(root: &Path) -> Vec<String> {
    let mut out: Vec<String> = walk(&root.join("chunks"));
    out.sort();
    out
}

fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    out
}

#[test]
fn a_save_round_trips_with_packs_and_a_second_save_writes_only_what_changed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(CkptStore::open(dir.path()).unwrap());
    let saver = Saver::new();
    let s1 = state(0, 1);
    let job = start(&store, &saver, &s1, "s1").unwrap();
    let r = job.finish(&saver, None).unwrap();
    assert_eq!(r.entries, 4);
    assert_eq!(r.written_bytes, Some(r.unique_bytes));
    assert_eq!(load_all(&store, "s1").unwrap(), {
        let mut v = s1.clone();
        v.sort();
        v
    });
    let m = store.manifest("s1").unwrap();
    assert_eq!(m.packs.len(), 1, "the two small entries share one pack");
    assert_eq!(m.version, 2);
    let s2 = state(0, 2); // the first chunk of big and the step change
    let r2 = start(&store, &saver, &s2, "s2")
        .unwrap()
        .finish(&saver, None)
        .unwrap();
    assert_eq!(r2.written_bytes, Some(CHUNK + 48), "one chunk and the pack");
    assert!(saver.bandwidth() > 0.0);
}

#[test]
fn a_failure_at_every_step_leaves_the_last_checkpoint_and_nothing_of_the_new_one() {
    // A clean run counts the steps of the second save.
    let count = |fail: Option<usize>| -> (Vec<Step>, Result<(), CkptError>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let saver = Saver::new();
        let s1 = state(0, 1);
        {
            let store = Arc::new(CkptStore::open(dir.path()).unwrap());
            start(&store, &saver, &s1, "s1")
                .unwrap()
                .finish(&saver, None)
                .unwrap();
        }
        let steps = Arc::new(FailAt::new(fail));
        let store = Arc::new(CkptStore::open_with_steps(dir.path(), steps.clone()).unwrap());
        let s2 = state(0, 2);
        let out = start(&store, &saver, &s2, "s2").and_then(|j| j.finish(&saver, None).map(|_| ()));
        (steps.steps(), out, dir)
    };
    fail_each_step(count, 10, |k, step, dir| {
        let store = CkptStore::open(dir.path()).unwrap();
        let names: Vec<String> = store.list().unwrap().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["s1"], "step {k} ({step:?})");
        let mut s1 = state(0, 1);
        s1.sort();
        assert_eq!(load_all(&store, "s1").unwrap(), s1, "step {k}");
        // What the failed save created is gone again (no gc needed).
        let live: Vec<String> = {
            let m = store.manifest("s1").unwrap();
            let mut v: Vec<String> = m.unique_chunks().keys().map(|d| d.hex()).collect();
            v.sort();
            v
        };
        assert_eq!(chunk_names(dir.path()), live, "step {k} ({step:?})");
    });
}

/// Every rank's share and table for a world of `world`, and rank 0's plan.
fn plan_world(
    store: &CkptStore,
    states: &[Vec<(String, Vec<u8>)>],
) -> (Vec<Arc<Share>>, Vec<ShareTable>, SavePlan) {
    let shares: Vec<Arc<Share>> = states.iter().map(|s| Arc::new(share_of(s))).collect();
    let tables: Vec<ShareTable> = shares.iter().map(|s| s.table().unwrap().clone()).collect();
    let bw = vec![1e9; states.len()];
    let plan = Saver::new().plan(store, &tables, &bw).unwrap();
    (shares, tables, plan)
}

fn rank_job(
    root: &Path,
    share: &Arc<Share>,
    tables: &[ShareTable],
    plan: &SavePlan,
    opts: SaveOptions,
) -> SaveJob {
    // Each rank has its own handle on the store, as each process has.
    let store = Arc::new(CkptStore::open(root).unwrap());
    // SAFETY: the states outlive the jobs.
    unsafe {
        SaveJob::start(
            store,
            Arc::clone(share),
            tables.to_vec(),
            plan.clone(),
            opts,
            Box::new(()),
        )
    }
    .unwrap()
}

/// Two ranks' jobs for a save of `name` of `states` into `root`.
fn two_ranks(
    root: &Path,
    states: &[Vec<(String, Vec<u8>)>],
    name: &str,
    timeout: Duration,
) -> (SaveJob, SaveJob) {
    let (shares, tables, plan) = plan_world(&CkptStore::open(root).unwrap(), states);
    let job = |r| {
        rank_job(
            root,
            &shares[r],
            &tables,
            &plan,
            options(name, r, 2, timeout),
        )
    };
    (job(0), job(1))
}

/// Runs `f` on a thread; `None` if it did not end within a minute (a hang).
fn within_a_minute<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60)).ok()
}

#[test]
fn a_rank_that_dies_after_staging_fails_the_save_at_once_not_at_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let states = vec![state(0, 1), state(1, 1)];
    let (r0, r1) = two_ranks(&root, &states, "s1", Duration::from_secs(1800));
    r1.wait_staged(None).unwrap().unwrap();
    drop(r1); // its process is gone: its liveness lock with it
    let out = within_a_minute(move || r0.finish(&Saver::new(), None))
        .expect("rank 0 waited for the timeout");
    let err = out.unwrap_err();
    assert!(
        matches!(err, CkptError::RankFailed { rank: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("is gone"), "{err}");
    assert!(CkptStore::open(&root).unwrap().list().unwrap().is_empty());
    drop(states);
}

#[test]
fn a_rank_that_fails_tells_the_others_and_a_stuck_one_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let states = vec![state(0, 1), state(1, 1)];
    let (r0, r1) = two_ranks(&root, &states, "s1", Duration::from_secs(1800));
    r1.cancel("out of memory");
    let e1 = r1.finish(&Saver::new(), None).unwrap_err();
    assert!(e1.to_string().contains("out of memory"), "{e1}");
    let e0 = within_a_minute(move || r0.finish(&Saver::new(), None))
        .expect("rank 0 waited for the timeout")
        .unwrap_err();
    assert!(
        e0.to_string().contains("rank 1 failed") && e0.to_string().contains("out of memory"),
        "{e0}"
    );
    // A rank that is alive but never finishes: the timeout ends the wait.
    let (r0, stuck) = two_ranks(&root, &states, "s2", Duration::from_millis(300));
    let e = r0.finish(&Saver::new(), None).unwrap_err();
    assert!(matches!(e, CkptError::TimedOut { .. }), "{e}");
    assert!(e.to_string().contains("[1]"), "{e}");
    drop(stuck);
    drop(states);
}

/// A replicated save of `states` into `root`: every rank's job (staged), and each rank's
/// share as the replica exchange copies it to the next rank.
fn replicated(root: &Path, states: &[Vec<(String, Vec<u8>)>]) -> (Vec<SaveJob>, Vec<Vec<u8>>) {
    let world = states.len();
    let (shares, tables, plan) = plan_world(&CkptStore::open(root).unwrap(), states);
    let opts = |rank| SaveOptions {
        replicate: true,
        ..options("s1", rank, world, Duration::from_secs(1800))
    };
    let jobs: Vec<SaveJob> = (0..world)
        .map(|r| rank_job(root, &shares[r], &tables, &plan, opts(r)))
        .collect();
    let copies: Vec<Vec<u8>> = jobs
        .iter()
        .map(|j| {
            j.replica_sends()
                .iter()
                // SAFETY: the sources are the states, alive here.
                .flat_map(|&(a, n)| {
                    unsafe { std::slice::from_raw_parts(a as *const u8, n as usize) }.to_vec()
                })
                .collect()
        })
        .collect();
    for j in &jobs {
        j.wait_staged(None).unwrap().unwrap();
    }
    (jobs, copies)
}

fn replica_of(held: &[u8]) -> Replica {
    Replica {
        addr: held.as_ptr() as usize,
        len: held.len() as u64,
    }
}

#[test]
fn a_replica_damaged_in_transit_is_refused_not_written_as_the_share() {
    // Issue 27: the successor wrote the copy it received under the chunks' names without
    // checking them, so a byte changed on the way became a durable, "verified" checkpoint.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let states = vec![state(0, 1), state(1, 1)];
    let (jobs, mut copies) = replicated(&root, &states);
    let mut jobs = jobs.into_iter();
    let (r0, r1) = (jobs.next().unwrap(), jobs.next().unwrap());
    drop(r1); // dies once staged: rank 0 holds its share, damaged
    let at = copies[1].len() / 2;
    copies[1][at] ^= 0x40;
    let err = r0
        .finish(&Saver::new(), Some(replica_of(&copies[1])))
        .unwrap_err();
    assert!(matches!(err, CkptError::CorruptChunk { .. }), "{err}");
    assert!(err.to_string().contains("replicated share"), "{err}");
    assert!(CkptStore::open(&root).unwrap().list().unwrap().is_empty());
}

#[test]
fn a_replicated_share_of_a_rank_that_died_is_written_by_its_successor() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let states = vec![state(0, 1), state(1, 1), state(2, 1)];
    let (jobs, copies) = replicated(&root, &states);
    let mut jobs = jobs.into_iter();
    let (r0, r1, r2) = (
        jobs.next().unwrap(),
        jobs.next().unwrap(),
        jobs.next().unwrap(),
    );
    drop(r1); // dies once staged: rank 2 holds its share
    let held = copies[1].clone();
    let t2 = std::thread::spawn(move || {
        let out = r2.finish(&Saver::new(), Some(replica_of(&held)));
        drop(held);
        out
    });
    let s0 = r0
        .finish(&Saver::new(), Some(replica_of(&copies[2])))
        .unwrap();
    let s2 = t2.join().unwrap().unwrap();
    assert_eq!(s2.stood_in_for, Some(1));
    // Rank 1 may have written some of its chunks before it died: the stand-in skips them.
    assert!(s0.written_bytes.unwrap() <= s0.unique_bytes);
    let store = CkptStore::open(&root).unwrap();
    let mut all: Vec<(String, Vec<u8>)> = states.concat();
    all.sort();
    assert_eq!(load_all(&store, "s1").unwrap(), all);
}

#[test]
fn grouped_reads_pair_every_send_with_a_receive() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(CkptStore::open(dir.path()).unwrap());
    let saver = Saver::new();
    let s = state(0, 1);
    start(&store, &saver, &s, "s1")
        .unwrap()
        .finish(&saver, None)
        .unwrap();
    let m = store.manifest("s1").unwrap();
    // Both ranks load everything: each chunk is read by one and sent to the other.
    let mut bufs: Vec<Vec<(String, Vec<u8>)>> = (0..2)
        .map(|_| {
            m.entries
                .iter()
                .map(|(k, e)| (k.clone(), vec![0u8; e.nbytes as usize]))
                .collect()
        })
        .collect();
    let mut fetches: Vec<Fetch> = bufs
        .iter_mut()
        .map(|b| {
            let d: Vec<(String, usize, u64)> = b
                .iter_mut()
                .map(|(k, v)| (k.clone(), v.as_mut_ptr() as usize, v.len() as u64))
                .collect();
            // SAFETY: the buffers outlive the fetches.
            unsafe { Fetch::new(&m, &d, "s1") }.unwrap()
        })
        .collect();
    let needs: Vec<Vec<ChunkRef>> = fetches.iter().map(Fetch::needs).collect();
    let plan = ReadPlan::new(&needs);
    for (r, f) in fetches.iter_mut().enumerate() {
        f.read(&store, &plan, r, 2).unwrap();
    }
    let t: Vec<_> = (0..2)
        .map(|r| fetches[r].transfers(&plan, &needs, r))
        .collect();
    let sends: Vec<_> = t[0].iter().filter(|x| x.send).map(|x| x.len).collect();
    let recvs: Vec<_> = t[1].iter().filter(|x| !x.send).map(|x| x.len).collect();
    assert_eq!(
        sends, recvs,
        "rank 0's sends and rank 1's receives pair up in order"
    );
    for r in 0..2 {
        let (other, mine) = (&t[1 - r], &t[r]);
        for (s, d) in other
            .iter()
            .filter(|x| x.send)
            .zip(mine.iter().filter(|x| !x.send))
        {
            // SAFETY: both are landing places of the same chunk, of `len` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    s.addr as *const u8,
                    d.addr as *mut u8,
                    s.len as usize,
                )
            };
        }
    }
    let reads: Vec<u64> = fetches.iter_mut().map(|f| f.finish().read_bytes).collect();
    assert!(reads.iter().all(|r| *r > 0), "both ranks read: {reads:?}");
    let mut want = s.clone();
    want.sort();
    for b in &bufs {
        assert_eq!(b, &want);
    }
}
