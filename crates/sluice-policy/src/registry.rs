//! Policies by name, with typed configs.
//!
//! A policy spec is a name, optionally with parameters in parentheses:
//! `lru`, `s3fifo(small_ratio=0.2)`, `tinylfu(cms_width=65536,admit_probability=0.2)`.
//! [`PolicyConfig::parse`] turns a spec into a typed config (unknown names,
//! unknown parameters and out-of-range values are errors naming the value);
//! [`PolicyConfig::build`] makes the policy for a capacity.
//! [`split_specs`] splits a comma-separated list of specs, respecting
//! parentheses, as the CLI's `--policies` takes them.

use crate::arc::Arc;
use crate::belady::{Belady, BeladySize, BeladySizeConfig};
use crate::clock::{Clock, ClockConfig};
use crate::clock_pro::{ClockPro, ClockProConfig};
use crate::error::PolicyError;
use crate::fifo::Fifo;
use crate::lfu::{LfuAging, LfuConfig};
use crate::lru::Lru;
use crate::params::Params;
use crate::policy::Policy;
use crate::s3fifo::{S3Fifo, S3FifoConfig};
use crate::sieve::Sieve;
use crate::slru::{Slru, SlruConfig};
use crate::tinylfu::{tinylfu_slru, WTinyLfu, WTinyLfuConfig};
use crate::tinylfu_door::TinyLfuConfig;
use crate::two_q::{TwoQ, TwoQConfig};

/// Every policy, by the name the CLI and Python use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    Fifo,
    Lru,
    Clock,
    Slru,
    TwoQ,
    Arc,
    ClockPro,
    LfuAging,
    TinyLfu,
    WTinyLfu,
    S3Fifo,
    Sieve,
    Belady,
    BeladySize,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 14] = [
        PolicyKind::Fifo,
        PolicyKind::Lru,
        PolicyKind::Clock,
        PolicyKind::Slru,
        PolicyKind::TwoQ,
        PolicyKind::Arc,
        PolicyKind::ClockPro,
        PolicyKind::LfuAging,
        PolicyKind::TinyLfu,
        PolicyKind::WTinyLfu,
        PolicyKind::S3Fifo,
        PolicyKind::Sieve,
        PolicyKind::Belady,
        PolicyKind::BeladySize,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Fifo => "fifo",
            PolicyKind::Lru => "lru",
            PolicyKind::Clock => "clock",
            PolicyKind::Slru => "slru",
            PolicyKind::TwoQ => "2q",
            PolicyKind::Arc => "arc",
            PolicyKind::ClockPro => "clockpro",
            PolicyKind::LfuAging => "lfu",
            PolicyKind::TinyLfu => "tinylfu",
            PolicyKind::WTinyLfu => "wtinylfu",
            PolicyKind::S3Fifo => "s3fifo",
            PolicyKind::Sieve => "sieve",
            PolicyKind::Belady => "belady",
            PolicyKind::BeladySize => "belady-size",
        }
    }

    /// Accepts the name and a few common spellings (`two_q`, `clock-pro`,
    /// `w-tinylfu`, `lfu-aging`, `s3-fifo`, `beladysize`), case-insensitively.
    pub fn from_name(name: &str) -> Result<PolicyKind, PolicyError> {
        let key: String = name
            .trim()
            .to_ascii_lowercase()
            .chars()
            .filter(|c| !matches!(c, '-' | '_'))
            .collect();
        let kind = match key.as_str() {
            "fifo" => PolicyKind::Fifo,
            "lru" => PolicyKind::Lru,
            "clock" => PolicyKind::Clock,
            "slru" => PolicyKind::Slru,
            "2q" | "twoq" => PolicyKind::TwoQ,
            "arc" => PolicyKind::Arc,
            "clockpro" => PolicyKind::ClockPro,
            "lfu" | "lfuaging" => PolicyKind::LfuAging,
            "tinylfu" | "tinylfuslru" => PolicyKind::TinyLfu,
            "wtinylfu" => PolicyKind::WTinyLfu,
            "s3fifo" => PolicyKind::S3Fifo,
            "sieve" => PolicyKind::Sieve,
            "belady" | "opt" => PolicyKind::Belady,
            "beladysize" => PolicyKind::BeladySize,
            _ => {
                return Err(PolicyError::UnknownPolicy {
                    name: name.to_string(),
                    known: Self::ALL.map(PolicyKind::name).join(", "),
                })
            }
        };
        Ok(kind)
    }

    /// Offline oracles need each request's `next_access`.
    pub fn is_oracle(self) -> bool {
        matches!(self, PolicyKind::Belady | PolicyKind::BeladySize)
    }
}

/// A policy with its typed parameters.
#[derive(Clone, Debug, PartialEq)]
pub enum PolicyConfig {
    Fifo,
    Lru,
    Clock(ClockConfig),
    Slru(SlruConfig),
    TwoQ(TwoQConfig),
    Arc,
    ClockPro(ClockProConfig),
    LfuAging(LfuConfig),
    TinyLfu(TinyLfuConfig),
    WTinyLfu(WTinyLfuConfig),
    S3Fifo(S3FifoConfig),
    Sieve,
    Belady,
    BeladySize(BeladySizeConfig),
}

impl PolicyConfig {
    /// The default config of `kind`.
    pub fn default_for(kind: PolicyKind) -> PolicyConfig {
        match kind {
            PolicyKind::Fifo => PolicyConfig::Fifo,
            PolicyKind::Lru => PolicyConfig::Lru,
            PolicyKind::Clock => PolicyConfig::Clock(ClockConfig::default()),
            PolicyKind::Slru => PolicyConfig::Slru(SlruConfig::default()),
            PolicyKind::TwoQ => PolicyConfig::TwoQ(TwoQConfig::default()),
            PolicyKind::Arc => PolicyConfig::Arc,
            PolicyKind::ClockPro => PolicyConfig::ClockPro(ClockProConfig::default()),
            PolicyKind::LfuAging => PolicyConfig::LfuAging(LfuConfig::default()),
            PolicyKind::TinyLfu => PolicyConfig::TinyLfu(TinyLfuConfig::default()),
            PolicyKind::WTinyLfu => PolicyConfig::WTinyLfu(WTinyLfuConfig::default()),
            PolicyKind::S3Fifo => PolicyConfig::S3Fifo(S3FifoConfig::default()),
            PolicyKind::Sieve => PolicyConfig::Sieve,
            PolicyKind::Belady => PolicyConfig::Belady,
            PolicyKind::BeladySize => PolicyConfig::BeladySize(BeladySizeConfig::default()),
        }
    }

    pub fn kind(&self) -> PolicyKind {
        match self {
            PolicyConfig::Fifo => PolicyKind::Fifo,
            PolicyConfig::Lru => PolicyKind::Lru,
            PolicyConfig::Clock(_) => PolicyKind::Clock,
            PolicyConfig::Slru(_) => PolicyKind::Slru,
            PolicyConfig::TwoQ(_) => PolicyKind::TwoQ,
            PolicyConfig::Arc => PolicyKind::Arc,
            PolicyConfig::ClockPro(_) => PolicyKind::ClockPro,
            PolicyConfig::LfuAging(_) => PolicyKind::LfuAging,
            PolicyConfig::TinyLfu(_) => PolicyKind::TinyLfu,
            PolicyConfig::WTinyLfu(_) => PolicyKind::WTinyLfu,
            PolicyConfig::S3Fifo(_) => PolicyKind::S3Fifo,
            PolicyConfig::Sieve => PolicyKind::Sieve,
            PolicyConfig::Belady => PolicyKind::Belady,
            PolicyConfig::BeladySize(_) => PolicyKind::BeladySize,
        }
    }

    /// Parses a spec such as `lru` or `s3fifo(small_ratio=0.2,ghost_ratio=1.0)`.
    pub fn parse(spec: &str) -> Result<PolicyConfig, PolicyError> {
        let spec = spec.trim();
        let (name, params) = match spec.find('(') {
            Some(open) => {
                let Some(inner) = spec[open + 1..].strip_suffix(')') else {
                    return Err(PolicyError::UnknownPolicy {
                        name: spec.to_string(),
                        known: "a name, or name(key=value,...) with a closing parenthesis"
                            .to_string(),
                    });
                };
                (&spec[..open], inner)
            }
            None => (spec, ""),
        };
        let mut config = PolicyConfig::default_for(PolicyKind::from_name(name)?);
        for pair in params.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            config.set(key.trim(), value.trim())?;
        }
        Ok(config)
    }

    fn set(&mut self, key: &str, value: &str) -> Result<(), PolicyError> {
        let none = |policy: &'static str| PolicyError::UnknownParameter {
            policy,
            field: key.to_string(),
            known: "no parameters",
        };
        match self {
            PolicyConfig::Clock(c) => c.set(key, value),
            PolicyConfig::Slru(c) => c.set(key, value),
            PolicyConfig::TwoQ(c) => c.set(key, value),
            PolicyConfig::ClockPro(c) => c.set(key, value),
            PolicyConfig::LfuAging(c) => c.set(key, value),
            PolicyConfig::TinyLfu(c) => c.set(key, value),
            PolicyConfig::WTinyLfu(c) => c.set(key, value),
            PolicyConfig::S3Fifo(c) => c.set(key, value),
            PolicyConfig::BeladySize(c) => c.set(key, value),
            other => Err(none(other.kind().name())),
        }
    }

    /// The policy for `capacity` bytes (objects in object-count mode).
    pub fn build(&self, capacity: u64) -> Result<Box<dyn Policy + Send>, PolicyError> {
        if capacity == 0 {
            return Err(PolicyError::ZeroCapacity);
        }
        Ok(match self {
            PolicyConfig::Fifo => Box::new(Fifo::new(capacity)),
            PolicyConfig::Lru => Box::new(Lru::new(capacity)),
            PolicyConfig::Clock(c) => Box::new(Clock::new(capacity, c.clone())),
            PolicyConfig::Slru(c) => Box::new(Slru::new(capacity, c.clone())),
            PolicyConfig::TwoQ(c) => Box::new(TwoQ::new(capacity, c.clone())),
            PolicyConfig::Arc => Box::new(Arc::new(capacity)),
            PolicyConfig::ClockPro(c) => Box::new(ClockPro::new(capacity, c.clone())),
            PolicyConfig::LfuAging(c) => Box::new(LfuAging::new(capacity, c.clone())),
            PolicyConfig::TinyLfu(c) => Box::new(tinylfu_slru(capacity, c.clone())),
            PolicyConfig::WTinyLfu(c) => Box::new(WTinyLfu::new(capacity, c.clone())),
            PolicyConfig::S3Fifo(c) => Box::new(S3Fifo::new(capacity, c.clone())),
            PolicyConfig::Sieve => Box::new(Sieve::new(capacity)),
            PolicyConfig::Belady => Box::new(Belady::new(capacity)),
            PolicyConfig::BeladySize(c) => Box::new(BeladySize::new(capacity, c.clone())),
        })
    }
}

/// Splits `lru,s3fifo(small_ratio=0.2,ghost_ratio=1),arc` at the commas that
/// are outside parentheses.
pub fn split_specs(list: &str) -> Vec<String> {
    let (mut out, mut current, mut depth) = (Vec::new(), String::new(), 0i32);
    for c in list.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut current).trim().to_string());
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    out.push(current.trim().to_string());
    out.retain(|s| !s.is_empty());
    out
}

/// Parses a comma-separated list of specs, keeping each spec's text (for
/// reports) next to its config.
pub fn parse_specs(list: &str) -> Result<Vec<(String, PolicyConfig)>, PolicyError> {
    split_specs(list)
        .into_iter()
        .map(|spec| Ok((spec.clone(), PolicyConfig::parse(&spec)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_through_its_name_and_builds() {
        for kind in PolicyKind::ALL {
            assert_eq!(PolicyKind::from_name(kind.name()), Ok(kind));
            let policy = PolicyConfig::default_for(kind).build(100).unwrap();
            assert_eq!(policy.name(), kind.name());
            assert_eq!((policy.capacity(), policy.used()), (100, 0));
        }
    }

    #[test]
    fn specs_split_outside_parentheses() {
        assert_eq!(
            split_specs("lru, s3fifo(small_ratio=0.2,ghost_ratio=1),arc,"),
            ["lru", "s3fifo(small_ratio=0.2,ghost_ratio=1)", "arc"]
        );
    }

    #[test]
    fn bad_specs_name_the_offending_value() {
        let err = PolicyConfig::parse("lru2").unwrap_err();
        assert!(err.to_string().contains("\"lru2\""), "{err}");
        let err = PolicyConfig::parse("lru(x=1)").unwrap_err();
        assert!(matches!(err, PolicyError::UnknownParameter { .. }), "{err}");
        let err = PolicyConfig::parse("s3fifo(small_ratio=2)").unwrap_err();
        assert!(err.to_string().contains("small_ratio = 2"), "{err}");
        let err = PolicyConfig::parse("s3fifo(small_ratio=abc").unwrap_err();
        assert!(matches!(err, PolicyError::UnknownPolicy { .. }), "{err}");
        assert_eq!(
            PolicyConfig::Lru.build(0).err(),
            Some(PolicyError::ZeroCapacity)
        );
    }

    #[test]
    fn tinylfu_specs_reach_their_configs_and_bad_ones_name_the_field() {
        let spec = "cms_width=64,cms_depth=2,reset_factor=3,protected_ratio=0.5,seed=9";
        let Ok(PolicyConfig::TinyLfu(t)) = PolicyConfig::parse(&format!("tinylfu({spec})")) else {
            panic!("tinylfu parses");
        };
        let Ok(PolicyConfig::WTinyLfu(w)) =
            PolicyConfig::parse(&format!("wtinylfu({spec},window_ratio=0.2)"))
        else {
            panic!("wtinylfu parses");
        };
        assert_eq!((t.cms_width, w.cms_width, w.window_ratio), (64, 64, 0.2));
        for (spec, needle) in [
            ("wtinylfu(cms_depth=9)", "wtinylfu"),
            ("tinylfu(cms_width=8)", "cms_width"),
            ("wtinylfu(admit_probability=0.5)", "window_ratio"),
            ("tinylfu(admit_probability=1.5)", "admit_probability"),
            ("wtinylfu(protected_ratio=1)", "protected_ratio"),
        ] {
            let err = PolicyConfig::parse(spec).unwrap_err().to_string();
            assert!(err.contains(needle), "{spec}: {err}");
        }
    }

    #[test]
    fn parameters_reach_the_config() {
        let config = PolicyConfig::parse("S3-FIFO(small_ratio=0.2)").unwrap();
        let PolicyConfig::S3Fifo(c) = config else {
            panic!("{config:?}")
        };
        assert_eq!(c.small_ratio, 0.2);
    }
}
