//! Every (trace, policy, cache fraction) of a study, replayed in parallel.
//!
//! Cache fractions are of each trace's working set: its distinct objects'
//! bytes, or their number in object-count mode. Jobs (one replay each, of
//! similar cost) are handed out from a shared counter to `threads` workers;
//! rows come back in (trace, policy, fraction) order whatever finished first.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use serde::Serialize;
use sluice_policy::PolicyConfig;

use crate::error::SimError;
use crate::simulator::{simulate, SimConfig, SimStats};
use crate::trace::{Trace, WorkingSet};

/// What to replay.
#[derive(Clone, Debug)]
pub struct GridConfig {
    /// Policy specs as given (for the report) with their parsed configs.
    pub policies: Vec<(String, PolicyConfig)>,
    /// Fractions of the working set, each in (0, 1].
    pub fractions: Vec<f64>,
    pub count_mode: bool,
    /// Worker threads; 0 means one per available core.
    pub threads: usize,
}

/// One result row.
#[derive(Clone, Debug, Serialize)]
pub struct GridRow {
    pub trace: String,
    pub policy: String,
    /// Whether the policy is an offline oracle (reads the future): a
    /// reference, kept off the Pareto front of the plots.
    pub oracle: bool,
    pub fraction: f64,
    pub capacity: u64,
    pub count_mode: bool,
    pub working_set_objects: u64,
    pub working_set_bytes: u64,
    pub hit_ratio: f64,
    pub byte_hit_ratio: f64,
    pub amplification: f64,
    pub fetch_amplification: f64,
    pub wasted_ratio: f64,
    /// `None` for traces without request structure.
    pub prefix_hit_ratio: Option<f64>,
    pub evictions: u64,
    pub mreq_per_s: f64,
    pub stats: SimStats,
}

/// The capacity a fraction of `ws` stands for (at least 1).
pub fn capacity_for(ws: WorkingSet, fraction: f64, count_mode: bool) -> u64 {
    let total = if count_mode { ws.objects } else { ws.bytes };
    ((total as f64 * fraction).round() as u64).max(1)
}

impl GridConfig {
    /// A config error unless there is a policy and a fraction, and every
    /// fraction is in (0, 1].
    pub fn validate(&self) -> Result<(), SimError> {
        if self.policies.is_empty() {
            return Err(SimError::config("policies", "none given"));
        }
        if self.fractions.is_empty() {
            return Err(SimError::config("cache fractions", "none given"));
        }
        for &f in &self.fractions {
            if !(f > 0.0 && f <= 1.0) {
                return Err(SimError::config(
                    format!("cache fraction {f}"),
                    "is outside (0, 1]",
                ));
            }
        }
        Ok(())
    }
}

/// Replays the whole grid. `progress(done, total)` is called after each job
/// and returns whether to go on: `false` stops every worker after its current
/// replay and the grid returns [`SimError::Cancelled`].
pub fn run_grid(
    traces: &mut [Trace],
    config: &GridConfig,
    progress: &(dyn Fn(usize, usize) -> bool + Sync),
) -> Result<Vec<GridRow>, SimError> {
    config.validate()?;
    let needs_oracle = config.policies.iter().any(|(_, p)| p.kind().is_oracle());
    if needs_oracle {
        traces.iter_mut().for_each(fill_next_access);
    }
    let traces: &[Trace] = traces;
    let working_sets: Vec<WorkingSet> = traces.iter().map(Trace::working_set).collect();
    let mut jobs = Vec::new();
    for t in 0..traces.len() {
        for p in 0..config.policies.len() {
            for &fraction in &config.fractions {
                jobs.push((t, p, fraction));
            }
        }
    }
    let threads = match config.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
    .min(jobs.len().max(1));
    let next = AtomicUsize::new(0);
    // Counted and reported under one lock, so reports never go backwards (two workers
    // finishing together could report 6 of 6, then 5 of 6).
    let done = Mutex::new(0usize);
    let cancelled = AtomicBool::new(false);
    let results: Mutex<Vec<Option<Result<GridRow, SimError>>>> =
        Mutex::new((0..jobs.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                if cancelled.load(Ordering::Relaxed) {
                    break;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(t, p, fraction)) = jobs.get(i) else {
                    break;
                };
                let row = run_job(
                    &traces[t],
                    working_sets[t],
                    &config.policies[p],
                    fraction,
                    config.count_mode,
                );
                results
                    .lock()
                    .expect("no worker panics while holding the lock")[i] = Some(row);
                let mut n = done.lock().unwrap_or_else(|p| p.into_inner());
                *n += 1;
                if !progress(*n, jobs.len()) {
                    cancelled.store(true, Ordering::Relaxed);
                }
            });
        }
    });
    if cancelled.into_inner() {
        return Err(SimError::Cancelled);
    }
    results
        .into_inner()
        .expect("workers have finished")
        .into_iter()
        .map(|r| r.expect("every job ran"))
        .collect()
}

/// Computes `trace`'s next accesses for the oracles, and warns once when the
/// ones its file stored were wrong (see [`crate::trace`]).
fn fill_next_access(trace: &mut Trace) {
    if trace.has_next_access() {
        return;
    }
    let check = trace.fill_next_access();
    if let Some(first) = check.first {
        tracing::warn!(
            "{}: {} of {} records stored a wrong next access (first: {first}); \
             the oracles use next accesses computed from the trace's ids",
            trace.name,
            check.disagreed,
            check.records
        );
    }
}

fn run_job(
    trace: &Trace,
    ws: WorkingSet,
    (spec, policy): &(String, PolicyConfig),
    fraction: f64,
    count_mode: bool,
) -> Result<GridRow, SimError> {
    let capacity = capacity_for(ws, fraction, count_mode);
    let config = SimConfig {
        policy: policy.clone(),
        capacity,
        count_mode,
    };
    let stats = simulate(trace, &config)?;
    Ok(GridRow {
        trace: trace.name.clone(),
        policy: spec.clone(),
        oracle: policy.kind().is_oracle(),
        fraction,
        capacity,
        count_mode,
        working_set_objects: ws.objects,
        working_set_bytes: ws.bytes,
        hit_ratio: stats.hit_ratio(),
        byte_hit_ratio: stats.byte_hit_ratio(),
        amplification: stats.amplification(),
        fetch_amplification: stats.fetch_amplification(),
        wasted_ratio: stats.wasted_ratio(),
        prefix_hit_ratio: (!trace.request_starts.is_empty()).then(|| stats.prefix_hit_ratio()),
        evictions: stats.evictions,
        mreq_per_s: stats.mreq_per_s(),
        stats,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Record;

    fn zipfish_trace() -> Trace {
        let mut rng = sluice_policy::rng::Rng::new(42);
        let records = (0..20_000)
            .map(|i| {
                // Squaring a uniform draw skews popularity towards small ids.
                let u = rng.next_f64();
                let id = (u * u * 2_000.0) as u64;
                Record {
                    time: i,
                    id,
                    size: 100 + id % 900,
                    next_access: 0,
                }
            })
            .collect();
        Trace {
            name: "zipfish".into(),
            records,
            ..Trace::default()
        }
    }

    fn config(threads: usize) -> GridConfig {
        let policies = ["lru", "arc", "s3fifo", "belady"]
            .iter()
            .map(|s| (s.to_string(), PolicyConfig::parse(s).unwrap()))
            .collect();
        GridConfig {
            policies,
            fractions: vec![0.01, 0.1, 0.5],
            count_mode: false,
            threads,
        }
    }

    fn summary(rows: &[GridRow]) -> Vec<(String, f64, u64, u64)> {
        rows.iter()
            .map(|r| (r.policy.clone(), r.fraction, r.stats.hits, r.evictions))
            .collect()
    }

    #[test]
    fn rows_are_in_grid_order_and_independent_of_threads() {
        let one = run_grid(&mut [zipfish_trace()], &config(1), &|_, _| true).unwrap();
        let four = run_grid(&mut [zipfish_trace()], &config(4), &|_, _| true).unwrap();
        assert_eq!(summary(&one), summary(&four));
        let order: Vec<(&str, f64)> = one
            .iter()
            .map(|r| (r.policy.as_str(), r.fraction))
            .collect();
        assert_eq!(order[0], ("lru", 0.01));
        assert_eq!(order[2], ("lru", 0.5));
        assert_eq!(order[11], ("belady", 0.5));
        let oracles: Vec<bool> = one.iter().step_by(3).map(|r| r.oracle).collect();
        assert_eq!(oracles, [false, false, false, true]);
        for r in &one {
            assert!(r.capacity <= r.working_set_bytes);
            assert_eq!(
                r.capacity,
                capacity_for(
                    WorkingSet {
                        objects: r.working_set_objects,
                        bytes: r.working_set_bytes
                    },
                    r.fraction,
                    false,
                )
            );
        }
    }

    #[test]
    fn a_false_from_progress_cancels_the_grid() {
        let calls = AtomicUsize::new(0);
        let err = run_grid(&mut [zipfish_trace()], &config(1), &|_, _| {
            calls.fetch_add(1, Ordering::Relaxed);
            false
        })
        .unwrap_err();
        assert!(matches!(err, SimError::Cancelled));
        assert_eq!(calls.into_inner(), 1, "one worker stops after one replay");
    }

    #[test]
    fn progress_never_goes_backwards_with_many_workers() {
        let mut c = config(4);
        c.fractions = (1..=12).map(|i| i as f64 / 20.0).collect();
        let seen = Mutex::new(Vec::new());
        run_grid(&mut [zipfish_trace()], &c, &|done, total| {
            if done == 1 {
                // A slow first report (Python's callback takes the GIL): another worker
                // that finishes meanwhile must not report 2 before this reports 1.
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            seen.lock().unwrap().push((done, total));
            true
        })
        .unwrap();
        let seen = seen.into_inner().unwrap();
        let total = seen[0].1;
        assert_eq!(seen, (1..=total).map(|d| (d, total)).collect::<Vec<_>>());
    }

    #[test]
    fn bad_grids_are_config_errors() {
        let mut c = config(1);
        c.fractions = vec![0.1, 1.5];
        let err = run_grid(&mut [zipfish_trace()], &c, &|_, _| true).unwrap_err();
        assert!(err.to_string().contains("1.5"), "{err}");
        c.fractions.clear();
        assert!(run_grid(&mut [zipfish_trace()], &c, &|_, _| true).is_err());
        let mut c = config(1);
        c.policies.clear();
        assert!(run_grid(&mut [zipfish_trace()], &c, &|_, _| true).is_err());
    }
}
