//! The TinyLFU admission door, and the parameters of the TinyLFU policies.
//!
//! TinyLFU (Einziger, Friedman, Manes, ACM TOS 2017) admits a new object only
//! when it has been requested more often, recently, than the object it would
//! displace. [`TinyLfuDoor`] asks a [`CountMinSketch`] for both counts; every
//! request is recorded, and a loser may still be let in with probability
//! `admit_probability`. [`TinyLfuConfig`] holds the door's parameters (the
//! sketch's shape, reset period and seed, the admission draw) and the SLRU
//! share of the "tinylfu" policy built on it ([`crate::tinylfu`]); W-TinyLFU
//! takes the same sketch parameters (`set_door_param`).

use crate::admission::Admission;
use crate::error::PolicyError;
use crate::params::{check, parse_value, Params};
use crate::policy::Request;
use crate::rng::Rng;
use crate::sketch::CountMinSketch;

/// The parameters of "tinylfu": its door's sketch and admission draw, and
/// the SLRU cache behind the door.
#[derive(Clone, Debug, PartialEq)]
pub struct TinyLfuConfig {
    /// Counters per row of the count-min sketch. 16,384 as seed 003's
    /// baseline (8 KiB a row); 65,536 gained 0.8 points there, for caches of
    /// many more objects than counters.
    pub cms_width: usize,
    /// Rows (hash functions) of the sketch. 4, the usual count-min choice:
    /// an estimate is off by more than e/width x requests with probability
    /// at most e^-4.
    pub cms_depth: usize,
    /// Probability of admitting a candidate the sketch would reject. 0: the
    /// plain TinyLFU door (seed 003 found 0.1 to 0.8 within 1.5 points).
    pub admit_probability: f64,
    /// The sketch halves every reset_factor x capacity-in-objects recorded
    /// requests: 10 as TinyLFU's sample size W = 10 C, long enough to see
    /// an object of the cache's working set several times.
    pub reset_factor: u64,
    /// Protected share of the SLRU main cache. 0.8 as in the TinyLFU paper,
    /// whose traces favour keeping proven objects over new ones.
    pub protected_ratio: f64,
    /// Seed of the sketch hashes and the admission draw, so that runs
    /// repeat exactly.
    pub seed: u64,
}

impl Default for TinyLfuConfig {
    fn default() -> TinyLfuConfig {
        TinyLfuConfig {
            cms_width: 16_384,
            cms_depth: 4,
            admit_probability: 0.0,
            reset_factor: 10,
            protected_ratio: 0.8,
            seed: 0,
        }
    }
}

impl Params for TinyLfuConfig {
    const KNOWN: &'static str =
        "cms_width, cms_depth, admit_probability, reset_factor, protected_ratio, seed";

    fn set(&mut self, key: &str, value: &str) -> Result<(), PolicyError> {
        if key == "admit_probability" {
            let range = "0 to 1";
            let v: f64 = parse_value("tinylfu", "admit_probability", value, range)?;
            check(
                (0.0..=1.0).contains(&v),
                "tinylfu",
                "admit_probability",
                v,
                range,
            )?;
            self.admit_probability = v;
            return Ok(());
        }
        set_door_param(self, "tinylfu", Self::KNOWN, key, value)
    }
}

/// Sets one of the sketch and SLRU parameters both TinyLFU variants take;
/// `policy` and `known` name the variant in errors.
pub(crate) fn set_door_param(
    config: &mut TinyLfuConfig,
    policy: &'static str,
    known: &'static str,
    key: &str,
    value: &str,
) -> Result<(), PolicyError> {
    const RATIO: &str = "between 0 and 1, exclusive";
    match key {
        "cms_width" => {
            let v: usize = parse_value(policy, "cms_width", value, "at least 16")?;
            check(v >= 16, policy, "cms_width", v, "at least 16")?;
            config.cms_width = v;
        }
        "cms_depth" => {
            let v: usize = parse_value(policy, "cms_depth", value, "1 to 8")?;
            check((1..=8).contains(&v), policy, "cms_depth", v, "1 to 8")?;
            config.cms_depth = v;
        }
        "reset_factor" => {
            let v: u64 = parse_value(policy, "reset_factor", value, "at least 1")?;
            check(v >= 1, policy, "reset_factor", v, "at least 1")?;
            config.reset_factor = v;
        }
        "protected_ratio" => {
            let v: f64 = parse_value(policy, "protected_ratio", value, RATIO)?;
            check(v > 0.0 && v < 1.0, policy, "protected_ratio", v, RATIO)?;
            config.protected_ratio = v;
        }
        "seed" => config.seed = parse_value(policy, "seed", value, "an unsigned integer")?,
        _ => {
            return Err(PolicyError::UnknownParameter {
                policy,
                field: key.to_string(),
                known,
            })
        }
    }
    Ok(())
}

/// The TinyLFU admission door: admit a candidate only if the sketch says it
/// is more popular than the victim it would displace (or, with probability
/// `admit_probability`, anyway).
pub struct TinyLfuDoor {
    sketch: CountMinSketch,
    rng: Rng,
    admit_probability: f64,
}

impl TinyLfuDoor {
    /// A door for a cache of `capacity` bytes (objects in object-count mode).
    pub fn new(capacity: u64, config: &TinyLfuConfig) -> TinyLfuDoor {
        let sketch = CountMinSketch::new(config.cms_width, config.cms_depth, config.seed)
            .with_reset(capacity, config.reset_factor);
        TinyLfuDoor {
            sketch,
            // A different stream from the sketch's row seeds.
            rng: Rng::new(config.seed ^ 0xD00E_D00E_D00E_D00E),
            admit_probability: config.admit_probability,
        }
    }

    /// The frequency sketch, for inspection.
    pub fn sketch(&self) -> &CountMinSketch {
        &self.sketch
    }
}

impl Admission for TinyLfuDoor {
    fn record(&mut self, id: u64) {
        self.sketch.increment(id);
    }

    fn admit(&mut self, candidate: &Request, victim: Option<u64>) -> bool {
        self.sketch.observe_size(candidate.size);
        let Some(victim) = victim else {
            return true;
        };
        if self.sketch.estimate(candidate.id) > self.sketch.estimate(victim) {
            return true;
        }
        self.admit_probability > 0.0 && self.rng.next_f64() < self.admit_probability
    }

    fn name(&self) -> &'static str {
        "tinylfu"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn door(admit_probability: f64) -> TinyLfuDoor {
        let config = TinyLfuConfig {
            admit_probability,
            ..TinyLfuConfig::default()
        };
        TinyLfuDoor::new(100, &config)
    }

    #[test]
    fn door_rejects_a_one_hit_wonder_against_a_frequent_victim() {
        let mut door = door(0.0);
        for _ in 0..5 {
            door.record(7);
        }
        door.record(8);
        assert!(!door.admit(&Request::new(8, 1), Some(7)));
        assert!(door.admit(&Request::new(7, 1), Some(8)));
    }

    #[test]
    fn door_admits_when_nothing_would_be_evicted() {
        let mut door = door(0.0);
        door.record(1);
        assert!(door.admit(&Request::new(1, 1), None));
    }

    #[test]
    fn door_admits_losers_with_the_configured_probability() {
        let (mut sometimes, mut always) = (door(0.25), door(1.0));
        for _ in 0..5 {
            sometimes.record(7);
            always.record(7);
        }
        let loser = Request::new(8, 1);
        let admitted = (0..10_000)
            .filter(|_| sometimes.admit(&loser, Some(7)))
            .count();
        assert!((2_200..2_800).contains(&admitted), "{admitted}");
        assert!((0..100).all(|_| always.admit(&loser, Some(7))));
    }
}
