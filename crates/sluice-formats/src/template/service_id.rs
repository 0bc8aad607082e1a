//! The name of a template: the blake3 hash of the service's spec string.
//!
//! Operators describe a service by a spec (model path, tensor and pipeline parallel sizes,
//! prefill/decode split, anything that changes what workers read). Hashing it gives a
//! fixed-size id that a template file stores and a template directory uses as the file
//! name, in 64 lowercase hex digits.

use std::fmt;

/// Identifies an inference service: the blake3 hash of its spec string.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceId(pub [u8; 32]);

/// Why a string is not a service id in hex.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServiceIdError {
    #[error("service id {text:?}: {len} bytes, expected 64 hex digits")]
    Length { text: String, len: usize },
    #[error("service id {text:?}: not a hex digit at position {position}")]
    NotHex { text: String, position: usize },
}

impl ServiceId {
    /// The id of a service described by `spec` (model path, parallel configuration, ...):
    /// blake3 of its UTF-8 bytes. Equal specs give equal ids; callers build the spec in one
    /// canonical form.
    pub fn from_spec(spec: &str) -> ServiceId {
        ServiceId(*blake3::hash(spec.as_bytes()).as_bytes())
    }

    /// 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// Parses 64 hex digits (either case), as [`ServiceId::to_hex`] writes.
    pub fn parse_hex(text: &str) -> Result<ServiceId, ServiceIdError> {
        if text.len() != 64 {
            return Err(ServiceIdError::Length {
                text: text.to_string(),
                len: text.len(),
            });
        }
        let mut id = [0u8; 32];
        for (i, pair) in text.as_bytes().chunks_exact(2).enumerate() {
            match (hex_value(pair[0]), hex_value(pair[1])) {
                (Some(high), Some(low)) => id[i] = high << 4 | low,
                _ => {
                    return Err(ServiceIdError::NotHex {
                        text: text.to_string(),
                        position: 2 * i,
                    })
                }
            }
        }
        Ok(ServiceId(id))
    }
}

/// Lowercase hex of `bytes`.
pub(super) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 * bytes.len());
    for &byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
    out
}

fn hex_value(digit: u8) -> Option<u8> {
    // A non-ASCII byte becomes a Latin-1 char, which is no hex digit.
    char::from(digit).to_digit(16).map(|v| v as u8)
}

impl fmt::Display for ServiceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for ServiceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ServiceId({})", self.to_hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_id_is_blake3_of_the_spec_and_round_trips_through_hex() {
        let empty = ServiceId::from_spec("");
        assert_eq!(
            empty.to_hex(),
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
        let id = ServiceId::from_spec("qwen tp=4 pd=1");
        assert_ne!(id, ServiceId::from_spec("qwen tp=8 pd=1"));
        assert_eq!(ServiceId::parse_hex(&id.to_hex()).unwrap(), id);
        assert_eq!(
            ServiceId::parse_hex(&id.to_hex().to_uppercase()).unwrap(),
            id
        );
        assert_eq!(id.to_string(), id.to_hex());
    }

    #[test]
    fn parse_hex_names_the_value_and_the_fault() {
        for (bad, why) in [
            ("abc", "3 bytes"),
            (&"g".repeat(64)[..], "position 0"),
            (&format!("{}é", "0".repeat(62))[..], "position 62"),
        ] {
            let err = ServiceId::parse_hex(bad).unwrap_err().to_string();
            assert!(err.contains(why) && err.contains(&bad[..3]), "{err}");
        }
    }

    #[test]
    fn parse_hex_reports_structured_faults() {
        assert_eq!(
            ServiceId::parse_hex("abc"),
            Err(ServiceIdError::Length {
                text: "abc".into(),
                len: 3
            })
        );
        let bad = format!("{}x{}", "0".repeat(9), "0".repeat(54));
        assert!(matches!(
            ServiceId::parse_hex(&bad),
            Err(ServiceIdError::NotHex { position: 8, .. })
        ));
    }
}
