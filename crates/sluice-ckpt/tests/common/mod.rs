//! Helpers shared by the checkpoint store's integration tests (each test crate uses some).
#![allow(dead_code)]

use sluice_ckpt::{CkptError, CkptStore, EntryHead, EntryKind, Fetch, ReadPlan, Share, Source};

/// The chunk size of the save tests.
pub const CHUNK: u64 = 4096;

/// Bytes that never repeat within a chunk or across chunks (unlike a short period).
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let mut h = blake3::Hasher::new();
    h.update(&[seed]);
    h.finalize_xof().fill(&mut out);
    out
}

pub fn head(key: &str, nbytes: usize) -> EntryHead {
    EntryHead {
        key: key.into(),
        kind: EntryKind::Tensor,
        dtype: Some("uint8".into()),
        shape: Some(vec![nbytes as u64]),
        nbytes: nbytes as u64,
        meta: serde_json::Value::Null,
    }
}

/// A rank's state: a large entry, a tied copy, and small ones that share a pack.
pub fn state(rank: u8, step: u8) -> Vec<(String, Vec<u8>)> {
    let mut big = pattern(rank, 5 * CHUNK as usize + 100);
    big[0] = step;
    vec![
        (format!("{rank}/big"), big.clone()),
        (format!("{rank}/tied"), big),
        (format!("{rank}/norm"), vec![rank; 40]),
        (format!("{rank}/step"), vec![step; 8]),
    ]
}

pub fn share_of(entries: &[(String, Vec<u8>)]) -> Share {
    let heads = entries.iter().map(|(k, b)| head(k, b.len())).collect();
    let sources = entries
        .iter()
        .map(|(_, b)| Source::Host(b.as_ptr() as usize))
        .collect();
    // SAFETY: every test keeps `entries` alive until its save is finished.
    unsafe { Share::hash(heads, sources, CHUNK, 2) }.unwrap()
}

/// Loads every entry of checkpoint `name` through a fetch.
pub fn load_all(store: &CkptStore, name: &str) -> Result<Vec<(String, Vec<u8>)>, CkptError> {
    let m = store.manifest(name)?;
    let mut out: Vec<(String, Vec<u8>)> = m
        .entries
        .iter()
        .map(|(k, e)| (k.clone(), vec![0u8; e.nbytes as usize]))
        .collect();
    let dests: Vec<(String, usize, u64)> = out
        .iter_mut()
        .map(|(k, b)| (k.clone(), b.as_mut_ptr() as usize, b.len() as u64))
        .collect();
    // SAFETY: the buffers outlive the fetch and are distinct.
    let mut f = unsafe { Fetch::new(&m, &dests, name)? };
    let plan = ReadPlan::new(&[f.needs()]);
    f.read(store, &plan, 0, 2)?;
    f.finish();
    Ok(out)
}

/// Runs a save of `s2` after `s1` with a clean run's every step failed in turn (`run`
/// counts the steps with `None`, fails step k with `Some(k)`, and returns what `check`
/// inspects afterwards): each failure must be reported as I/O, and `check` sees the store
/// it left.
pub fn fail_each_step<T>(
    run: impl Fn(Option<usize>) -> (Vec<sluice_ckpt::Step>, Result<(), CkptError>, T),
    min_steps: usize,
    check: impl Fn(usize, &sluice_ckpt::Step, T),
) {
    let (all, ok, _) = run(None);
    ok.unwrap();
    assert!(all.len() >= min_steps, "{all:?}");
    for (k, step) in all.iter().enumerate() {
        let (_, out, left) = run(Some(k));
        let err = out.expect_err(&format!(
            "a failure at step {k} ({step:?}) was not reported"
        ));
        assert!(matches!(err, CkptError::Io { .. }), "step {k}: {err}");
        check(k, step, left);
    }
}
