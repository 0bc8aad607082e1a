//! Token-count distributions of the generator, and their spec strings.
//!
//! Message and answer lengths are heavy-tailed (most chat messages are a
//! sentence, a few paste whole documents), so the default is a lognormal
//! given by its median and sigma; uniform and fixed lengths serve tests and
//! controlled studies. Draws use the portable `ln`/`exp` of
//! [`super::math`], so a seed gives the same lengths everywhere.

use sluice_policy::rng::Rng;

use super::math::{exp, standard_normal};
use crate::error::SimError;

/// A distribution of token counts. Samples are whole tokens, at least 1.
#[derive(Clone, Debug, PartialEq)]
pub enum TokenDist {
    /// Always this many.
    Fixed(u64),
    /// Uniform over `min..=max`.
    Uniform { min: u64, max: u64 },
    /// `median × e^(sigma·Z)`, Z standard normal, rounded and clamped to
    /// `min..=max`.
    LogNormal {
        median: f64,
        sigma: f64,
        min: u64,
        max: u64,
    },
}

/// Default clamp of lognormal draws: a whole context window.
const LOGNORMAL_MAX_TOKENS: u64 = 131_072;

impl TokenDist {
    /// Lognormal with the default clamp `1..=131072`.
    pub fn lognormal(median: f64, sigma: f64) -> TokenDist {
        TokenDist::LogNormal {
            median,
            sigma,
            min: 1,
            max: LOGNORMAL_MAX_TOKENS,
        }
    }

    /// Parses `fixed:200` (or just `200`), `uniform:min=10,max=100`, or
    /// `lognormal:median=300,sigma=1.0` with optional `min=` and `max=`.
    pub fn parse(spec: &str) -> Result<TokenDist, SimError> {
        TokenDist::parse_inner(spec)
            .map_err(|m| SimError::config(format!("token distribution {spec:?}"), m))
    }

    fn parse_inner(spec: &str) -> Result<TokenDist, String> {
        let (kind, params) = spec
            .trim()
            .split_once(':')
            .unwrap_or(("fixed", spec.trim()));
        let mut params = DistParams::parse(params);
        let dist = match kind.trim().to_ascii_lowercase().as_str() {
            "fixed" => TokenDist::Fixed(params.bare_or("tokens")?),
            "uniform" => TokenDist::Uniform {
                min: params.u64("min")?,
                max: params.u64("max")?,
            },
            "lognormal" => TokenDist::LogNormal {
                median: params.f64("median")?,
                sigma: params.f64("sigma")?,
                min: params.u64_or("min", 1)?,
                max: params.u64_or("max", LOGNORMAL_MAX_TOKENS)?,
            },
            other => {
                return Err(format!(
                    "unknown kind {other:?}: use fixed:N, uniform:min=A,max=B or \
                     lognormal:median=M,sigma=S"
                ))
            }
        };
        params.reject_leftovers()?;
        dist.check()?;
        Ok(dist)
    }

    fn check(&self) -> Result<(), String> {
        match *self {
            TokenDist::Fixed(0) => Err("fixed tokens must be at least 1".into()),
            TokenDist::Uniform { min, max } | TokenDist::LogNormal { min, max, .. }
                if min == 0 || min > max =>
            {
                Err(format!("need 1 ≤ min ≤ max, got min={min}, max={max}"))
            }
            TokenDist::LogNormal { median, sigma, .. }
                if !(median.is_finite() && median > 0.0 && sigma.is_finite() && sigma >= 0.0) =>
            {
                Err(format!(
                    "need median > 0 and sigma ≥ 0, got {median} and {sigma}"
                ))
            }
            _ => Ok(()),
        }
    }

    /// One draw.
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        match *self {
            TokenDist::Fixed(n) => n.max(1),
            TokenDist::Uniform { min, max } => {
                let span = u128::from(max.saturating_sub(min)) + 1;
                let offset = (u128::from(rng.next_u64()) * span) >> 64;
                (min + offset as u64).max(1)
            }
            TokenDist::LogNormal {
                median,
                sigma,
                min,
                max,
            } => {
                let draw = median * exp(sigma * standard_normal(rng));
                let tokens = if draw.is_finite() {
                    draw.round()
                } else {
                    f64::MAX
                };
                // `as` saturates; the clamp then bounds it.
                (tokens as u64).clamp(min.max(1), max.max(min.max(1)))
            }
        }
    }
}

impl std::str::FromStr for TokenDist {
    type Err = SimError;

    fn from_str(s: &str) -> Result<TokenDist, SimError> {
        TokenDist::parse(s)
    }
}

/// `key=value` parameters of a distribution spec; each is removed as it
/// is read, so what is left over was not understood.
struct DistParams {
    /// Bare values (`fixed:200`) have an empty key.
    pairs: Vec<(String, String)>,
}

impl DistParams {
    fn parse(text: &str) -> DistParams {
        let pairs = text
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|item| {
                let (key, value) = item.split_once('=').unwrap_or(("", item));
                (key.trim().to_ascii_lowercase(), value.trim().to_string())
            })
            .collect();
        DistParams { pairs }
    }

    fn take(&mut self, key: &str) -> Option<String> {
        let i = self.pairs.iter().position(|(k, _)| k == key)?;
        Some(self.pairs.remove(i).1)
    }

    fn u64_or(&mut self, key: &str, default: u64) -> Result<u64, String> {
        match self.take(key) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| format!("{key}={v:?} is not an unsigned integer")),
        }
    }

    fn u64(&mut self, key: &str) -> Result<u64, String> {
        let v = self.take(key).ok_or_else(|| format!("{key}= is missing"))?;
        v.parse()
            .map_err(|_| format!("{key}={v:?} is not an unsigned integer"))
    }

    fn f64(&mut self, key: &str) -> Result<f64, String> {
        let v = self.take(key).ok_or_else(|| format!("{key}= is missing"))?;
        v.parse()
            .map_err(|_| format!("{key}={v:?} is not a number"))
    }

    /// `fixed:200` or `fixed:tokens=200`.
    fn bare_or(&mut self, key: &str) -> Result<u64, String> {
        match self.take("") {
            Some(v) => v
                .parse()
                .map_err(|_| format!("{v:?} is not an unsigned integer")),
            None => self.u64(key),
        }
    }

    fn reject_leftovers(&self) -> Result<(), String> {
        match self.pairs.first() {
            Some((k, v)) if k.is_empty() => Err(format!("unexpected {v:?}")),
            Some((k, _)) => Err(format!("unknown parameter {k:?}")),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_dists_parse_from_strings() {
        assert_eq!(
            TokenDist::parse("fixed:200").unwrap(),
            TokenDist::Fixed(200)
        );
        assert_eq!(TokenDist::parse("64").unwrap(), TokenDist::Fixed(64));
        assert_eq!(
            TokenDist::parse("fixed:tokens=8").unwrap(),
            TokenDist::Fixed(8)
        );
        assert_eq!(
            TokenDist::parse("uniform:min=10,max=100").unwrap(),
            TokenDist::Uniform { min: 10, max: 100 }
        );
        assert_eq!(
            TokenDist::parse("lognormal:median=300,sigma=1.0").unwrap(),
            TokenDist::lognormal(300.0, 1.0)
        );
        assert_eq!(
            TokenDist::parse("LogNormal: median=300, sigma=0.5, max=1000").unwrap(),
            TokenDist::LogNormal {
                median: 300.0,
                sigma: 0.5,
                min: 1,
                max: 1000
            }
        );
    }

    #[test]
    fn token_dist_errors_name_the_problem() {
        let cases = [
            ("gamma:k=2", "unknown kind \"gamma\""),
            ("uniform:min=10", "max= is missing"),
            ("uniform:min=10,max=5", "need 1 ≤ min ≤ max"),
            ("lognormal:median=x,sigma=1", "median=\"x\" is not a number"),
            ("lognormal:median=-3,sigma=1", "need median > 0"),
            (
                "lognormal:median=3,sigma=1,mean=2",
                "unknown parameter \"mean\"",
            ),
            ("fixed:0", "at least 1"),
            ("fixed:ten", "is not an unsigned integer"),
        ];
        for (spec, want) in cases {
            let e = TokenDist::parse(spec).unwrap_err().to_string();
            assert!(e.contains(want), "{spec}: {e}");
        }
    }

    #[test]
    fn lognormal_samples_center_on_the_median() {
        let dist = TokenDist::lognormal(300.0, 1.0);
        let mut rng = Rng::new(1);
        let mut draws: Vec<u64> = (0..20_001).map(|_| dist.sample(&mut rng)).collect();
        draws.sort_unstable();
        let median = draws[10_000];
        assert!((270..=330).contains(&median), "{median}");
        assert!(draws
            .iter()
            .all(|&d| (1..=LOGNORMAL_MAX_TOKENS).contains(&d)));
    }

    #[test]
    fn uniform_samples_cover_the_range_inclusively() {
        let dist = TokenDist::Uniform { min: 3, max: 5 };
        let mut rng = Rng::new(2);
        let mut seen = [false; 3];
        for _ in 0..1000 {
            let d = dist.sample(&mut rng);
            assert!((3..=5).contains(&d));
            seen[(d - 3) as usize] = true;
        }
        assert_eq!(seen, [true; 3]);
    }
}
