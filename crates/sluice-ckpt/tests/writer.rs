//! [`WriteJob`]: a share staged within its budget then written and synced, failures that
//! reach both waits, cancellation, and a job dropped while it runs.

mod common;
use common::pattern;

use std::time::Duration;

use sluice_ckpt::{chunk, CkptError, CkptStore, StagingPool, WriteJob, WriteTask};

const CHUNK: u64 = 4096;

fn tasks(bytes: &[u8]) -> Vec<WriteTask> {
    let mut at = bytes.as_ptr() as usize;
    chunk(bytes, CHUNK as usize, 2)
        .into_iter()
        .map(|c| {
            let t = WriteTask { chunk: c, src: at };
            at += c.len as usize;
            t
        })
        .collect()
}

#[test]
fn a_share_streams_through_a_small_pool_and_lands_whole() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let store = CkptStore::open(dir.path()).unwrap();
    let bytes = pattern(1, 64 * CHUNK as usize + 100);
    let t = tasks(&bytes);
    let pool = StagingPool::new(2 * CHUNK, CHUNK).unwrap();
    // SAFETY: `bytes` outlives the job (the job is waited for and dropped below).
    let job = unsafe { WriteJob::start(store.chunks().clone(), t.clone(), pool, 2, Box::new(())) }
        .unwrap();
    job.wait_staged(None).unwrap().unwrap();
    let r = job.wait_durable(None).unwrap().unwrap();
    assert_eq!(r.chunks_written, 65);
    assert_eq!(r.bytes_written, bytes.len() as u64);
    assert!(
        store.chunks().direct_writes(),
        "ext4 takes O_DIRECT chunk writes"
    );
    assert!(
        r.staging_peak_bytes <= 2 * CHUNK,
        "{}",
        r.staging_peak_bytes
    );
    for task in &t {
        let mut out = vec![0u8; task.chunk.len as usize];
        store
            .chunks()
            .read_into(&task.chunk, "x", &mut out)
            .unwrap();
    }
    drop(job);
    // A second job over the same bytes writes nothing: every chunk is there.
    let pool = StagingPool::new(2 * CHUNK, CHUNK).unwrap();
    // SAFETY: as above.
    let job = unsafe { WriteJob::start(store.chunks().clone(), t, pool, 2, Box::new(())) }.unwrap();
    let r = job.wait_durable(None).unwrap().unwrap();
    assert_eq!((r.chunks_written, r.chunks_present), (0, 65));
}

#[test]
fn a_failed_write_fails_both_waits_with_the_file_named() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let store = CkptStore::open(dir.path()).unwrap();
    let bytes = pattern(2, 8 * CHUNK as usize);
    let t = tasks(&bytes);
    // Every chunk's fan-out directory is taken by a file: creating it fails (even as root).
    for task in &t {
        let fan = store.chunks().path_of(&task.chunk.digest);
        let fan = fan.parent().unwrap();
        std::fs::create_dir_all(fan.parent().unwrap()).unwrap();
        std::fs::write(fan, b"not a directory").unwrap();
    }
    let pool = StagingPool::new(CHUNK, CHUNK).unwrap();
    // SAFETY: `bytes` outlives the job.
    let job = unsafe { WriteJob::start(store.chunks().clone(), t, pool, 2, Box::new(())) }.unwrap();
    let err = job
        .wait_durable(Some(Duration::from_secs(30)))
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, CkptError::Io { .. }), "{err}");
    assert!(
        err.to_string().contains(&dir.path().display().to_string()),
        "{err}"
    );
    // Staged resolves too (here with the error: the save is over either way).
    assert!(job.wait_staged(Some(Duration::from_secs(30))).is_some());
}

#[test]
fn cancel_stops_a_job_blocked_on_its_budget_and_drop_waits_for_it() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let store = CkptStore::open(dir.path()).unwrap();
    let bytes = pattern(3, 4096 * CHUNK as usize); // 16 MiB through one 4 KiB buffer
    let t = tasks(&bytes);
    let pool = StagingPool::new(CHUNK, CHUNK).unwrap();
    // SAFETY: `bytes` outlives the job (dropped below, before `bytes`).
    let job = unsafe { WriteJob::start(store.chunks().clone(), t, pool, 1, Box::new(())) }.unwrap();
    job.cancel("test");
    let err = job
        .wait_durable(Some(Duration::from_secs(30)))
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, CkptError::Cancelled(_)), "{err}");
    drop(job);

    // A job dropped unfinished is cancelled, and the drop returns once its thread ended.
    let pool = StagingPool::new(CHUNK, CHUNK).unwrap();
    let t = tasks(&bytes);
    // SAFETY: as above.
    let job = unsafe { WriteJob::start(store.chunks().clone(), t, pool, 1, Box::new(())) }.unwrap();
    drop(job);
}

#[test]
fn a_budget_that_cannot_hold_a_chunk_is_refused() {
    assert!(matches!(
        StagingPool::new(CHUNK - 1, CHUNK),
        Err(CkptError::InvalidArgument { .. })
    ));
    assert!(StagingPool::new(CHUNK, 0).is_err());
}

#[test]
fn a_file_system_without_o_direct_gets_the_same_chunks_through_the_page_cache() {
    // ramfs refuses O_DIRECT with EINVAL (tmpfs takes it since Linux 6.6): the job falls
    // back to buffered writes, once.
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "ramfs", "ramfs"])
        .arg(dir.path())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("cannot mount ramfs here (not root?): the O_DIRECT fallback is not exercised");
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(dir.path().to_path_buf());
    let store = CkptStore::open(dir.path()).unwrap();
    let bytes = pattern(7, 5 * CHUNK as usize + 333);
    let t = tasks(&bytes);
    let pool = StagingPool::new(2 * CHUNK, CHUNK).unwrap();
    // SAFETY: `bytes` outlives the job (waited for and dropped below).
    let job = unsafe { WriteJob::start(store.chunks().clone(), t.clone(), pool, 2, Box::new(())) }
        .unwrap();
    let r = job.wait_durable(None).unwrap().unwrap();
    assert_eq!((r.chunks_written, r.bytes_written), (6, bytes.len() as u64));
    assert!(!store.chunks().direct_writes());
    for task in &t {
        let path = store.chunks().path_of(&task.chunk.digest);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), task.chunk.len);
        let mut out = vec![0u8; task.chunk.len as usize];
        store
            .chunks()
            .read_into(&task.chunk, "x", &mut out)
            .unwrap();
    }
}

#[test]
fn a_push_the_moment_the_job_starts_is_taken() {
    // The job's channel used to be made by its thread: a push that beat the thread's start
    // failed with "the job takes no more chunks" (a streamed save under load).
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let store = CkptStore::open(dir.path()).unwrap();
    for round in 0..100u8 {
        let bytes = pattern(round, 2 * CHUNK as usize);
        let chunks = chunk(&bytes, CHUNK as usize, 1);
        let pool = StagingPool::new(4 * CHUNK, CHUNK).unwrap();
        // SAFETY: no tasks; the pushed bytes outlive the push (it returns once staged).
        let job = unsafe {
            WriteJob::start_with_pushes(store.chunks().clone(), vec![], pool, 1, Box::new(()), true)
        }
        .unwrap();
        let pushed: Vec<_> = chunks
            .iter()
            .scan(bytes.as_ptr() as usize, |at, c| {
                let p = (*c, *at);
                *at += c.len as usize;
                Some(p)
            })
            .collect();
        // SAFETY: each address points at its chunk's bytes in `bytes`.
        unsafe { job.push(&pushed) }.unwrap_or_else(|e| panic!("round {round}: {e}"));
        job.end_pushes();
        let r = job.wait_durable(None).unwrap().unwrap();
        assert_eq!(
            r.bytes_written + r.chunks_present as u64 * CHUNK,
            bytes.len() as u64
        );
    }
}
