//! Element types a safetensors header may name.
//!
//! The spelling of each dtype is the exact string the safetensors format writes in the
//! `"dtype"` field (`"BF16"`, `"F8_E4M3"`, ...). The list follows the safetensors crate as of
//! its 0.7 series: the classic integer and float types, the FP8 variants (including the AMD
//! `FNUZ` flavours and the `E8M0` scale type), `C64`, and the sub-byte MX types `F4`,
//! `F6_E2M3` and `F6_E3M2`.
//!
//! Sizes are given in bits rather than bytes because the sub-byte types pack several
//! elements into one byte; a tensor's byte length is `elements * bits / 8`, and the header
//! parser rejects tensors whose bit count is not a whole number of bytes.

use std::fmt;

/// The element type of a tensor, as spelled in a safetensors header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    /// Boolean, stored as one byte per element.
    Bool,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 16-bit integer.
    U16,
    /// Signed 16-bit integer.
    I16,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 64-bit integer.
    U64,
    /// Signed 64-bit integer.
    I64,
    /// IEEE half precision.
    F16,
    /// Brain floating point (8-bit exponent, 7-bit mantissa).
    Bf16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
    /// FP8 with 4 exponent and 3 mantissa bits (OCP E4M3FN).
    F8E4m3,
    /// FP8 with 5 exponent and 2 mantissa bits.
    F8E5m2,
    /// FP8 exponent-only scale type (MX block scales).
    F8E8m0,
    /// FP8 E4M3 with AMD's finite, no-negative-zero encoding.
    F8E4m3Fnuz,
    /// FP8 E5M2 with AMD's finite, no-negative-zero encoding.
    F8E5m2Fnuz,
    /// Complex number made of two `F32`s.
    C64,
    /// 4-bit float (MX FP4 E2M1), two elements per byte.
    F4,
    /// 6-bit float with 2 exponent and 3 mantissa bits.
    F6E2m3,
    /// 6-bit float with 3 exponent and 2 mantissa bits.
    F6E3m2,
}

impl Dtype {
    /// Every dtype, in declaration order.
    pub const ALL: &'static [Dtype] = &[
        Dtype::Bool,
        Dtype::U8,
        Dtype::I8,
        Dtype::U16,
        Dtype::I16,
        Dtype::U32,
        Dtype::I32,
        Dtype::U64,
        Dtype::I64,
        Dtype::F16,
        Dtype::Bf16,
        Dtype::F32,
        Dtype::F64,
        Dtype::F8E4m3,
        Dtype::F8E5m2,
        Dtype::F8E8m0,
        Dtype::F8E4m3Fnuz,
        Dtype::F8E5m2Fnuz,
        Dtype::C64,
        Dtype::F4,
        Dtype::F6E2m3,
        Dtype::F6E3m2,
    ];

    /// Parses the exact safetensors spelling (`"BF16"` → [`Dtype::Bf16`]). Case matters:
    /// safetensors itself rejects `"bf16"`, so we do too.
    pub fn parse(s: &str) -> Option<Dtype> {
        Dtype::ALL.iter().copied().find(|dtype| dtype.as_str() == s)
    }

    /// The safetensors spelling; the inverse of [`Dtype::parse`].
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::U16 => "U16",
            Dtype::I16 => "I16",
            Dtype::U32 => "U32",
            Dtype::I32 => "I32",
            Dtype::U64 => "U64",
            Dtype::I64 => "I64",
            Dtype::F16 => "F16",
            Dtype::Bf16 => "BF16",
            Dtype::F32 => "F32",
            Dtype::F64 => "F64",
            Dtype::F8E4m3 => "F8_E4M3",
            Dtype::F8E5m2 => "F8_E5M2",
            Dtype::F8E8m0 => "F8_E8M0",
            Dtype::F8E4m3Fnuz => "F8_E4M3FNUZ",
            Dtype::F8E5m2Fnuz => "F8_E5M2FNUZ",
            Dtype::C64 => "C64",
            Dtype::F4 => "F4",
            Dtype::F6E2m3 => "F6_E2M3",
            Dtype::F6E3m2 => "F6_E3M2",
        }
    }

    /// Width of one element in bits (`16` for BF16, `4` for F4).
    pub fn bits(self) -> u64 {
        match self {
            Dtype::F4 => 4,
            Dtype::F6E2m3 | Dtype::F6E3m2 => 6,
            Dtype::Bool
            | Dtype::U8
            | Dtype::I8
            | Dtype::F8E4m3
            | Dtype::F8E5m2
            | Dtype::F8E8m0
            | Dtype::F8E4m3Fnuz
            | Dtype::F8E5m2Fnuz => 8,
            Dtype::U16 | Dtype::I16 | Dtype::F16 | Dtype::Bf16 => 16,
            Dtype::U32 | Dtype::I32 | Dtype::F32 => 32,
            Dtype::U64 | Dtype::I64 | Dtype::F64 | Dtype::C64 => 64,
        }
    }

    /// True for dtypes that pack more than one element per byte.
    pub fn is_sub_byte(self) -> bool {
        self.bits() < 8
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_inverts_as_str_for_every_dtype() {
        for &dtype in Dtype::ALL {
            assert_eq!(Dtype::parse(dtype.as_str()), Some(dtype));
        }
    }

    #[test]
    fn all_lists_each_dtype_once() {
        let mut seen = std::collections::HashSet::new();
        for &dtype in Dtype::ALL {
            assert!(seen.insert(dtype), "{dtype} listed twice");
        }
        assert_eq!(seen.len(), 22);
    }

    #[test]
    fn parse_is_case_sensitive_and_exact() {
        assert_eq!(Dtype::parse("BF16"), Some(Dtype::Bf16));
        assert_eq!(Dtype::parse("bf16"), None);
        assert_eq!(Dtype::parse("BF16 "), None);
        assert_eq!(Dtype::parse(""), None);
        assert_eq!(Dtype::parse("F8_E4M3FN"), None);
    }

    #[test]
    fn bits_match_the_safetensors_widths() {
        assert_eq!(Dtype::Bf16.bits(), 16);
        assert_eq!(Dtype::F4.bits(), 4);
        assert_eq!(Dtype::F6E2m3.bits(), 6);
        assert_eq!(Dtype::Bool.bits(), 8);
        assert_eq!(Dtype::C64.bits(), 64);
        assert_eq!(Dtype::F8E8m0.bits(), 8);
    }

    #[test]
    fn only_f4_and_f6_are_sub_byte() {
        let sub_byte: Vec<Dtype> = Dtype::ALL
            .iter()
            .copied()
            .filter(|d| d.is_sub_byte())
            .collect();
        assert_eq!(sub_byte, vec![Dtype::F4, Dtype::F6E2m3, Dtype::F6E3m2]);
    }
}
