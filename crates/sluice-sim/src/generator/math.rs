//! Portable random draws: the floating-point functions the generator needs,
//! built from IEEE-exact operations only.
//!
//! `f64::ln` and `f64::exp` call the platform's libm, whose last-bit
//! rounding differs between C libraries; one differing bit can change a
//! rounded token count and with it every later draw. `+ - × ÷` and `√` are
//! correctly rounded on every IEEE platform, so `ln` and `exp` here are
//! range reduction plus a fixed polynomial in those, evaluated in a fixed
//! order: the same bits on every machine.

use sluice_policy::rng::Rng;

/// SplitMix64's finalizer: a bijective 64-bit mixer.
pub(super) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Exponential draw with the given mean (0 for a mean of 0).
pub(super) fn exponential(rng: &mut Rng, mean: f64) -> f64 {
    // 1 - U lies in (0, 1], so the logarithm is finite.
    -mean * ln(1.0 - rng.next_f64())
}

/// Standard normal draw by Marsaglia's polar method (only `ln` and `√`).
pub(super) fn standard_normal(rng: &mut Rng) -> f64 {
    loop {
        let u = 2.0 * rng.next_f64() - 1.0;
        let v = 2.0 * rng.next_f64() - 1.0;
        let s = u * u + v * v;
        if s > 0.0 && s < 1.0 {
            return u * (-2.0 * ln(s) / s).sqrt();
        }
    }
}

// ln 2 split so that k × LN2_HI is exact for |k| < 2^20 (fdlibm's split).
const LN2_HI: f64 = 0.693_147_180_369_123_8;
const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;

/// Natural logarithm from IEEE-exact arithmetic: `x = m · 2^e` with `m` in
/// `[√½, √2)`, then `ln m = 2·atanh((m − 1)/(m + 1))` by its series.
pub(super) fn ln(x: f64) -> f64 {
    if x.is_nan() || x < 0.0 {
        return f64::NAN;
    }
    if x == 0.0 {
        return f64::NEG_INFINITY;
    }
    if x.is_infinite() {
        return x;
    }
    if x < f64::MIN_POSITIVE {
        // Subnormal: scale into the normal range by 2^54 first.
        return ln(x * 18_014_398_509_481_984.0) - 54.0 * (LN2_HI + LN2_LO);
    }
    let bits = x.to_bits();
    let mut e = ((bits >> 52) & 0x7FF) as i64 - 1023;
    let mut m = f64::from_bits((bits & ((1 << 52) - 1)) | (1023 << 52));
    if m > std::f64::consts::SQRT_2 {
        m /= 2.0;
        e += 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    // |s| < 0.172: eleven terms leave an error below 1e-18.
    let mut sum = 0.0;
    for k in (0..11).rev() {
        sum = sum * s2 + 1.0 / f64::from(2 * k + 1);
    }
    let e = e as f64;
    (2.0 * s * sum + e * LN2_LO) + e * LN2_HI
}

/// `e^x` from IEEE-exact arithmetic: `x = k·ln 2 + r`, `|r| ≤ ½ ln 2`, a
/// Taylor series for `e^r`, then an exact scaling by `2^k`.
pub(super) fn exp(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    if x > 709.7 {
        return f64::INFINITY;
    }
    if x < -745.2 {
        return 0.0;
    }
    let k = (x / (LN2_HI + LN2_LO)).round();
    let r = (x - k * LN2_HI) - k * LN2_LO;
    // |r| ≤ 0.347: terms past r^18/18! are below 1e-25.
    let mut sum = 1.0;
    for n in (1..=18).rev() {
        sum = 1.0 + sum * r / f64::from(n);
    }
    let k = k as i64;
    if k >= -1021 {
        sum * f64::from_bits(((k + 1023) as u64) << 52)
    } else {
        // Two steps keep the intermediate power of two normal.
        sum * f64::from_bits(((k + 1023 + 54) as u64) << 52) / 18_014_398_509_481_984.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn portable_ln_and_exp_match_the_platform_closely() {
        let mut rng = Rng::new(9);
        for _ in 0..10_000 {
            let x = exp(40.0 * rng.next_f64() - 20.0);
            let rel = |a: f64, b: f64| ((a - b) / b).abs();
            assert!(
                rel(ln(x), x.ln()) < 1e-14 || (ln(x) - x.ln()).abs() < 1e-15,
                "{x}"
            );
            let y = 1400.0 * rng.next_f64() - 700.0;
            assert!(rel(exp(y), y.exp()) < 1e-14, "{y}");
        }
        assert_eq!(ln(1.0), 0.0);
        assert_eq!(exp(0.0), 1.0);
        assert!((ln(5e-324) - 5e-324f64.ln()).abs() < 1e-12);
        assert!(exp(-745.0) > 0.0 && exp(-746.0) == 0.0);
    }
}
