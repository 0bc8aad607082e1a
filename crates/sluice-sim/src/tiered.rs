//! A KV trace through a stack of cache tiers, as a live `sluice kv` store serves it.
//!
//! Each tier is a `sluice-policy` policy over whole blocks (object-count mode: every
//! block is the same size). Every block of a request goes to the first tier; a block a
//! tier does not hit goes on to the next (write-through: a miss is offered to every
//! tier below). That is what the store does: a get that misses DRAM reads SSD and
//! promotes, a put that is not in DRAM goes to DRAM and SSD. The request's **prefix**
//! is its blocks up to the first one no tier hits: the blocks an engine loads instead of
//! recomputing.
//!
//! `sluice kv bench --compare-sim` runs this on the trace it replays, with the store's
//! policies and capacities, and prints both sides.

use serde::Serialize;
use sluice_policy::{Access, PolicyConfig, Request};

use crate::error::SimError;
use crate::trace::Trace;

/// One tier: its policy and how many blocks it holds.
#[derive(Clone, Debug)]
pub struct TierSpec {
    pub name: String,
    pub policy: PolicyConfig,
    pub capacity_blocks: u64,
}

/// What each tier saw.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TierCounts {
    pub name: String,
    /// Blocks offered to this tier (every block for the first tier).
    pub accesses: u64,
    /// Blocks this tier hit.
    pub hits: u64,
    /// Of those, blocks in their request's prefix (served, not recomputed).
    pub prefix_hits: u64,
}

/// The result of a tiered replay.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TieredStats {
    pub requests: u64,
    pub blocks: u64,
    /// Blocks some tier hit.
    pub hits: u64,
    /// Blocks in their request's prefix.
    pub prefix_hits: u64,
    pub tiers: Vec<TierCounts>,
}

impl TieredStats {
    pub fn hit_ratio(&self) -> f64 {
        ratio(self.hits, self.blocks)
    }

    pub fn prefix_hit_ratio(&self) -> f64 {
        ratio(self.prefix_hits, self.blocks)
    }
}

fn ratio(n: u64, d: u64) -> f64 {
    if d == 0 {
        0.0
    } else {
        n as f64 / d as f64
    }
}

/// Replays `trace` through `tiers`, top first. A trace without request structure is one
/// request per record.
pub fn simulate_tiers(trace: &Trace, tiers: &[TierSpec]) -> Result<TieredStats, SimError> {
    if tiers.is_empty() {
        return Err(SimError::config(
            "tiers",
            "a tiered replay needs at least one",
        ));
    }
    let mut policies = Vec::with_capacity(tiers.len());
    for t in tiers {
        if t.policy.kind().is_oracle() {
            return Err(SimError::config(
                format!("tier {}", t.name),
                format!(
                    "policy {} needs the future; a live store cannot run it",
                    t.policy.kind().name()
                ),
            ));
        }
        policies.push(t.policy.build(t.capacity_blocks)?);
    }
    let mut stats = TieredStats {
        tiers: tiers
            .iter()
            .map(|t| TierCounts {
                name: t.name.clone(),
                ..TierCounts::default()
            })
            .collect(),
        ..TieredStats::default()
    };
    let mut evicted = Vec::new();
    for range in trace.request_ranges() {
        stats.requests += 1;
        let mut in_prefix = true;
        for record in &trace.records[range] {
            stats.blocks += 1;
            let req = Request::new(record.id, 1);
            let mut hit_at = None;
            for (i, p) in policies.iter_mut().enumerate() {
                stats.tiers[i].accesses += 1;
                let access = p.access(&req, &mut evicted);
                evicted.clear();
                if access == Access::Hit {
                    hit_at = Some(i);
                    break;
                }
            }
            in_prefix &= hit_at.is_some();
            if let Some(i) = hit_at {
                stats.hits += 1;
                stats.tiers[i].hits += 1;
                if in_prefix {
                    stats.prefix_hits += 1;
                    stats.tiers[i].prefix_hits += 1;
                }
            }
        }
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulator::{simulate, SimConfig};
    use crate::trace::Record;

    fn trace(requests: &[&[u64]]) -> Trace {
        let mut t = Trace::default();
        for r in requests {
            t.request_starts.push(t.records.len());
            t.records.extend(r.iter().map(|&id| Record {
                time: 0,
                id,
                size: 1,
                next_access: 0,
            }));
        }
        t
    }

    fn tier(name: &str, policy: &str, blocks: u64) -> TierSpec {
        TierSpec {
            name: name.into(),
            policy: PolicyConfig::parse(policy).unwrap(),
            capacity_blocks: blocks,
        }
    }

    #[test]
    fn one_tier_equals_the_plain_simulator_in_count_mode() {
        let reqs: Vec<Vec<u64>> = (0..200u64)
            .map(|i| vec![i % 7, 10 + i % 13, 100 + i % 29, 1000 + i])
            .collect();
        let refs: Vec<&[u64]> = reqs.iter().map(|r| r.as_slice()).collect();
        let t = trace(&refs);
        for p in ["lru", "s3fifo", "arc"] {
            let tiered = simulate_tiers(&t, &[tier("ssd", p, 20)]).unwrap();
            let plain = simulate(
                &t,
                &SimConfig {
                    policy: PolicyConfig::parse(p).unwrap(),
                    capacity: 20,
                    count_mode: true,
                },
            )
            .unwrap();
            assert_eq!(tiered.hits, plain.hits, "{p}");
            assert_eq!(tiered.prefix_hits, plain.prefix_hits, "{p}");
        }
    }

    #[test]
    fn a_block_the_top_tier_misses_is_offered_below_and_ends_the_prefix_when_none_hits() {
        // DRAM holds 1 block, SSD 3 (LRU both).
        let t = trace(&[&[1, 2], &[1, 2], &[3, 1]]);
        let s = simulate_tiers(&t, &[tier("dram", "lru", 1), tier("ssd", "lru", 3)]).unwrap();
        // Request 2: 1 misses DRAM (2 is there), hits SSD; 2 then misses DRAM (1 took
        // the slot), hits SSD. Request 3: 3 misses everywhere, 1 misses DRAM, hits SSD
        // (a hit after the prefix ended).
        assert_eq!(s.tiers[0].hits, 0);
        assert_eq!(s.tiers[1].hits, 3);
        assert_eq!(s.tiers[1].prefix_hits, 2);
        assert_eq!((s.blocks, s.hits, s.prefix_hits), (6, 3, 2));
        assert_eq!(s.tiers[1].accesses, 6);
    }

    #[test]
    fn no_tiers_or_an_oracle_policy_is_refused() {
        let t = trace(&[&[1]]);
        assert!(simulate_tiers(&t, &[]).is_err());
        assert!(simulate_tiers(&t, &[tier("ssd", "belady", 4)]).is_err());
    }
}
