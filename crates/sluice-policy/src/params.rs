//! Setting a policy's parameters by name, with range checks.
//!
//! A spec such as `s3fifo(small_ratio=0.2)` reaches each policy's config as
//! `key`, `value` text. Every config implements [`Params`]; [`parse_value`]
//! and [`check`] turn a bad value into a [`PolicyError::BadParameter`] that
//! names the policy, the field, the value and the accepted range.
//!
//! This module is a leaf: it imports only the error type, so the policies
//! (which use it) and the registry (which uses them) never import each other
//! back.

use crate::error::PolicyError;

/// Parameters settable by name from a spec.
pub trait Params {
    /// `name=value` pairs this config takes, for error messages.
    const KNOWN: &'static str;
    /// Sets one parameter, checking its range.
    fn set(&mut self, key: &str, value: &str) -> Result<(), PolicyError>;
}

/// Parses `value` as `T` for `policy.field`, or a `BadParameter` error.
pub fn parse_value<T: std::str::FromStr>(
    policy: &'static str,
    field: &'static str,
    value: &str,
    expected: &'static str,
) -> Result<T, PolicyError> {
    value.trim().parse().map_err(|_| PolicyError::BadParameter {
        policy,
        field,
        value: value.to_string(),
        expected,
    })
}

/// A `BadParameter` error unless `ok`.
pub fn check(
    ok: bool,
    policy: &'static str,
    field: &'static str,
    value: impl ToString,
    expected: &'static str,
) -> Result<(), PolicyError> {
    if ok {
        Ok(())
    } else {
        Err(PolicyError::BadParameter {
            policy,
            field,
            value: value.to_string(),
            expected,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_name_policy_field_value_and_range() {
        let err = parse_value::<f64>("s3fifo", "small_ratio", "abc", "0 to 1").unwrap_err();
        assert_eq!(
            err.to_string(),
            "policy s3fifo: small_ratio = abc is out of range (0 to 1)"
        );
        let err = check(false, "clock", "bits", 9, "1 to 8").unwrap_err();
        assert!(err.to_string().contains("bits = 9"), "{err}");
        assert_eq!(parse_value::<u64>("clock", "bits", " 3 ", "1 to 8"), Ok(3));
        assert_eq!(check(true, "clock", "bits", 3, "1 to 8"), Ok(()));
    }
}
