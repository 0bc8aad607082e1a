//! The oracles replay a trace's own future, whatever an oracleGeneral file
//! stores in its `next_access_vtime` fields (issue 12, item 15): a file whose
//! fields were wrong made Belady report 0.297 where the optimum was 0.44.

use std::path::Path;

use sluice_policy::PolicyConfig;
use sluice_sim::trace::oracle_general::{self, RECORD_BYTES};
use sluice_sim::{run_grid, GridConfig, Record, Trace};

/// A skewed trace: small ids are requested far more often.
fn skewed_trace() -> Trace {
    let mut rng = sluice_policy::rng::Rng::new(7);
    let records = (0..5_000)
        .map(|i| {
            let u = rng.next_f64();
            let id = (u * u * 500.0) as u64;
            Record {
                time: i,
                id,
                size: 1,
                next_access: 0,
            }
        })
        .collect();
    Trace {
        name: "skewed".into(),
        records,
        ..Trace::default()
    }
}

/// `bytes` with every record's `next_access_vtime` replaced by
/// `wrong(index, stored)`.
fn with_next(bytes: &[u8], wrong: impl Fn(usize, i64) -> i64) -> Vec<u8> {
    let mut out = bytes.to_vec();
    for (i, rec) in out.chunks_exact_mut(RECORD_BYTES).enumerate() {
        let stored = i64::from_le_bytes(rec[16..24].try_into().unwrap());
        rec[16..24].copy_from_slice(&wrong(i, stored).to_le_bytes());
    }
    out
}

fn belady_hit_ratios(bytes: &[u8]) -> Vec<f64> {
    let mut trace = oracle_general::parse(bytes, "t.oracleGeneral").unwrap();
    let config = GridConfig {
        policies: vec![("belady".into(), PolicyConfig::parse("belady").unwrap())],
        fractions: vec![0.05, 0.2],
        count_mode: true,
        threads: 1,
    };
    run_grid(std::slice::from_mut(&mut trace), &config, &|_, _| true)
        .unwrap()
        .iter()
        .map(|r| r.hit_ratio)
        .collect()
}

#[test]
fn belady_ignores_wrong_stored_next_access_and_replays_the_true_future() {
    let correct = oracle_general::encode(&skewed_trace(), Path::new("o")).unwrap();
    let truth = belady_hit_ratios(&correct);
    assert!(truth.iter().all(|&h| h > 0.3), "{truth:?}");
    let never = with_next(&correct, |_, _| -1);
    // Each record points one request too far: at the object's second next
    // request, or at the end of the trace (a forward position, in range).
    let n = correct.len() / RECORD_BYTES;
    let one_too_far = with_next(&correct, |i, stored| {
        if stored == -1 {
            -1
        } else {
            (stored + 1).min(n as i64).max(i as i64 + 2)
        }
    });
    // A trace cut from a longer one: its last records point past its end.
    let cut = with_next(
        &correct,
        |_, stored| if stored == -1 { n as i64 + 5 } else { stored },
    );
    for (what, bytes) in [("never", never), ("one too far", one_too_far), ("cut", cut)] {
        assert_eq!(belady_hit_ratios(&bytes), truth, "{what}");
    }
}
