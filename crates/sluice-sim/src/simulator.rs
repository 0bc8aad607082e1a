//! One replay: a trace through one policy at one capacity, and its metrics.
//!
//! Each record becomes a [`Request`] for the policy (the `sluice-policy`
//! code the KV store, coming, will run too), whose [`Access`] answer and
//! eviction reports are counted. Definitions (also in docs/sim.md):
//!
//! - **hit ratio**: hits ÷ requests. **byte hit ratio**: bytes of hit
//!   requests ÷ bytes requested.
//! - **amplification**: bytes fetched from the backend *into the cache*
//!   (the sizes of admitted misses) ÷ bytes served from hits. It is the cost
//!   a cache adds in backend traffic per byte it saves; a door that refuses
//!   one-hit wonders lowers it. This is seed 003's `pop_bytes / hit_bytes`.
//! - **fetch amplification**: all miss bytes ÷ hit bytes, for a cache whose
//!   every miss reads through it (equals `bmr / (1 - bmr)`).
//! - **wasted ratio**: admitted objects that left the cache, or were still
//!   in it at the end, without a single hit ÷ admitted objects.
//! - **prefix hit ratio** (KV traces): blocks hit before the first miss of
//!   their request ÷ blocks; a block after a miss is useless to attention.
//!
//! In object-count mode every object has size 1 for the policy (capacity is
//! in objects); byte metrics still use the real sizes.

use std::time::Instant;

use serde::Serialize;
use sluice_policy::{Access, Evicted, PolicyConfig, Request};

use crate::error::SimError;
use crate::trace::Trace;

/// One replay's parameters.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub policy: PolicyConfig,
    /// Bytes, or objects in object-count mode.
    pub capacity: u64,
    /// Size every object 1 for the policy (libCacheSim's `ignore_obj_size`).
    pub count_mode: bool,
}

/// Counters of one replay; the ratios are methods.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SimStats {
    pub requests: u64,
    pub hits: u64,
    pub bytes_requested: u64,
    pub hit_bytes: u64,
    pub miss_bytes: u64,
    pub admitted: u64,
    pub admitted_bytes: u64,
    pub evictions: u64,
    /// Admitted objects with no hit before eviction or the end of the trace.
    pub wasted: u64,
    /// Blocks hit before their request's first miss (KV traces), else 0.
    pub prefix_hits: u64,
    /// Wall-clock seconds of the replay loop alone.
    pub seconds: f64,
}

fn ratio(num: u64, den: u64) -> f64 {
    if den == 0 {
        0.0
    } else {
        num as f64 / den as f64
    }
}

impl SimStats {
    pub fn hit_ratio(&self) -> f64 {
        ratio(self.hits, self.requests)
    }

    pub fn byte_hit_ratio(&self) -> f64 {
        ratio(self.hit_bytes, self.bytes_requested)
    }

    /// Admitted (cache-fill) bytes per hit byte; infinite when nothing hit
    /// but something was fetched.
    pub fn amplification(&self) -> f64 {
        if self.hit_bytes == 0 && self.admitted_bytes > 0 {
            return f64::INFINITY;
        }
        ratio(self.admitted_bytes, self.hit_bytes)
    }

    /// All miss bytes per hit byte.
    pub fn fetch_amplification(&self) -> f64 {
        if self.hit_bytes == 0 && self.miss_bytes > 0 {
            return f64::INFINITY;
        }
        ratio(self.miss_bytes, self.hit_bytes)
    }

    pub fn wasted_ratio(&self) -> f64 {
        ratio(self.wasted, self.admitted)
    }

    pub fn prefix_hit_ratio(&self) -> f64 {
        ratio(self.prefix_hits, self.requests)
    }

    /// Millions of requests replayed per second.
    pub fn mreq_per_s(&self) -> f64 {
        if self.seconds <= 0.0 {
            return 0.0;
        }
        self.requests as f64 / self.seconds / 1e6
    }
}

/// Replays `trace` through the policy of `config`.
///
/// Oracle policies need `trace.has_next_access()` (see
/// [`Trace::fill_next_access`]); without it this is an error rather than
/// silently wrong numbers.
pub fn simulate(trace: &Trace, config: &SimConfig) -> Result<SimStats, SimError> {
    let kind = config.policy.kind();
    if kind.is_oracle() && !trace.has_next_access() {
        return Err(SimError::config(
            format!("policy {}", kind.name()),
            format!(
                "needs next-access times; trace {} has none (fill them first)",
                trace.name
            ),
        ));
    }
    let mut policy = config.policy.build(config.capacity)?;
    let mut stats = SimStats::default();
    let mut evicted: Vec<Evicted> = Vec::with_capacity(64);
    let mut starts = trace.request_starts.iter().copied().peekable();
    let mut in_prefix = false;
    let started = Instant::now();
    for (i, record) in trace.records.iter().enumerate() {
        let request = Request {
            id: record.id,
            size: if config.count_mode { 1 } else { record.size },
            next_access: record.next_access,
        };
        let access = policy.access(&request, &mut evicted);
        stats.bytes_requested = stats.bytes_requested.saturating_add(record.size);
        if starts.peek() == Some(&i) {
            starts.next();
            in_prefix = true;
        }
        match access {
            Access::Hit => {
                stats.hits += 1;
                stats.hit_bytes = stats.hit_bytes.saturating_add(record.size);
                stats.prefix_hits += u64::from(in_prefix);
            }
            Access::Miss { admitted } => {
                in_prefix = false;
                stats.miss_bytes = stats.miss_bytes.saturating_add(record.size);
                if admitted {
                    stats.admitted += 1;
                    stats.admitted_bytes = stats.admitted_bytes.saturating_add(record.size);
                }
            }
        }
        if !evicted.is_empty() {
            stats.evictions += evicted.len() as u64;
            stats.wasted += evicted.iter().filter(|e| e.hits == 0).count() as u64;
            evicted.clear();
        }
    }
    stats.seconds = started.elapsed().as_secs_f64();
    stats.requests = trace.records.len() as u64;
    policy.for_each_resident(&mut |e| stats.wasted += u64::from(e.hits == 0));
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Record;

    fn trace(ids: &[u64], size: u64) -> Trace {
        let mut t = Trace {
            name: "test".into(),
            records: ids
                .iter()
                .map(|&id| Record {
                    time: 0,
                    id,
                    size,
                    next_access: 0,
                })
                .collect(),
            ..Trace::default()
        };
        t.fill_next_access();
        t
    }

    fn lru(capacity: u64, count_mode: bool) -> SimConfig {
        SimConfig {
            policy: PolicyConfig::Lru,
            capacity,
            count_mode,
        }
    }

    #[test]
    fn counts_add_up_on_a_small_lru_replay() {
        // Capacity 2: 1 2 1 3 1 2 → miss miss hit miss(evicts 2) hit miss(evicts 3).
        let s = simulate(&trace(&[1, 2, 1, 3, 1, 2], 10), &lru(2, true)).unwrap();
        assert_eq!((s.requests, s.hits, s.evictions), (6, 2, 2));
        assert_eq!((s.hit_bytes, s.miss_bytes, s.bytes_requested), (20, 40, 60));
        assert_eq!((s.admitted, s.admitted_bytes), (4, 40));
        // 2 and 3 were evicted unhit; 2 (again) is resident unhit at the end.
        assert_eq!(s.wasted, 3);
        assert_eq!(s.amplification(), 2.0);
        assert!((s.hit_ratio() - 2.0 / 6.0).abs() < 1e-12);
    }

    #[test]
    fn count_mode_sizes_objects_one_for_the_policy_only() {
        let t = trace(&[1, 2, 1], 1000);
        let counted = simulate(&t, &lru(2, true)).unwrap();
        assert_eq!(counted.hits, 1);
        assert_eq!(counted.hit_bytes, 1000);
        let bytes = simulate(&t, &lru(2, false)).unwrap();
        assert_eq!(bytes.hits, 0, "a 1000-byte object never fits in 2 bytes");
        assert_eq!(bytes.admitted, 0);
    }

    #[test]
    fn prefix_hits_stop_at_the_first_miss_of_a_request() {
        let mut t = trace(&[1, 2, 3, 1, 9, 3], 1);
        t.request_starts = vec![0, 3];
        let s = simulate(&t, &lru(10, true)).unwrap();
        // Second request: 1 hit, 9 miss, 3 hit but after the miss.
        assert_eq!((s.hits, s.prefix_hits), (2, 1));
    }

    #[test]
    fn oracles_refuse_a_trace_without_next_access() {
        let mut t = trace(&[1, 2], 1);
        t.next_access = crate::trace::NextAccess::Stored;
        let config = SimConfig {
            policy: PolicyConfig::Belady,
            capacity: 1,
            count_mode: true,
        };
        let err = simulate(&t, &config).unwrap_err();
        assert!(err.to_string().contains("next-access"), "{err}");
    }
}
