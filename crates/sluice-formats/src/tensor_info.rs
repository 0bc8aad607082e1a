//! One tensor's entry in a safetensors header, and the size arithmetic behind it.
//!
//! A tensor occupies `product(shape) * bits / 8` bytes. A 0-d tensor (`shape: []`) is a
//! scalar with one element; any zero dimension makes the tensor empty. Shapes come from
//! untrusted JSON, so the arithmetic is checked, and it is checked the way safetensors
//! checks it, so that both readers accept the same files:
//!
//! - the element count is the product of the dimensions taken left to right, and it
//!   overflows when a prefix of the shape does: `[0, 2^63, 2^63]` is an empty tensor but
//!   `[2^63, 2^63, 0]` overflows before it reaches the zero;
//! - `elements * bits` must fit in 64 bits, and be a whole number of bytes (sub-byte
//!   dtypes).
//!
//! One rule is Sluice's own: an empty tensor's non-zero dimensions must multiply to at
//! most `2^63 - 1` elements and bytes. safetensors accepts `[0, 2^63, 2^63]`, and then
//! numpy and torch, whose sizes are signed 64-bit, cannot build the tensor and raise an
//! error that names no file. A non-empty tensor always passes this rule, because its
//! bytes are in the file.

use crate::dtype::Dtype;

/// The most elements, or bytes, numpy and torch can describe: their sizes are `i64`.
pub const MAX_TENSOR_SIZE: u64 = i64::MAX as u64;

/// A tensor as described by a validated header. `start` and `end` are byte offsets
/// relative to the start of the data section (file offset `8 + header_len`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    pub start: u64,
    pub end: u64,
}

/// Why a dtype and shape have no byte size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SizeProblem {
    /// The element count or bit count does not fit in `u64` (safetensors' rule).
    Overflow,
    /// The bit count is not a multiple of 8 (sub-byte dtypes only).
    PartialByte { elements: u64, total_bits: u64 },
    /// An empty tensor whose other dimensions numpy and torch cannot describe.
    TooLarge,
}

impl TensorInfo {
    /// Length of the tensor's bytes, `end - start` (saturating, so a hand-built
    /// `TensorInfo` with `start > end` reports 0 rather than panicking).
    pub fn byte_len(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// Number of elements, `product(shape)`; 1 for a 0-d tensor. Saturates at
    /// `u64::MAX` for hand-built shapes; validated headers never get near it.
    pub fn num_elements(&self) -> u64 {
        checked_num_elements(&self.shape).unwrap_or(u64::MAX)
    }
}

/// `product(shape)` as safetensors computes it: left to right with overflow checks, so a
/// zero dimension hides the dimensions after it but not those before it.
pub(crate) fn checked_num_elements(shape: &[u64]) -> Option<u64> {
    shape
        .iter()
        .try_fold(1u64, |count, &dim| count.checked_mul(dim))
}

/// Whether numpy and torch can describe a tensor of `dtype` and `shape`: the product of
/// its non-zero dimensions, and that many elements' bytes, are at most
/// [`MAX_TENSOR_SIZE`]. Then every dimension, stride and byte offset fits in an `i64`.
pub(crate) fn is_describable(dtype: Dtype, shape: &[u64]) -> bool {
    let nonzero = shape
        .iter()
        .filter(|&&dim| dim != 0)
        .try_fold(1u64, |count, &dim| count.checked_mul(dim));
    match nonzero {
        Some(elements) => {
            let bytes = (u128::from(elements) * u128::from(dtype.bits())).div_ceil(8);
            elements <= MAX_TENSOR_SIZE && bytes <= u128::from(MAX_TENSOR_SIZE)
        }
        None => false,
    }
}

/// The number of bytes a tensor of `dtype` and `shape` must occupy.
pub(crate) fn expected_byte_len(dtype: Dtype, shape: &[u64]) -> Result<u64, SizeProblem> {
    let elements = checked_num_elements(shape).ok_or(SizeProblem::Overflow)?;
    let total_bits = elements
        .checked_mul(dtype.bits())
        .ok_or(SizeProblem::Overflow)?;
    if total_bits % 8 != 0 {
        return Err(SizeProblem::PartialByte {
            elements,
            total_bits,
        });
    }
    // A non-empty tensor whose bits fit in 64 bits is always describable (elements ≤ 2^62
    // with at least 4 bits each); only an empty one can hide huge non-zero dimensions.
    if elements == 0 && !is_describable(dtype, shape) {
        return Err(SizeProblem::TooLarge);
    }
    Ok(total_bits / 8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalar_has_one_element() {
        assert_eq!(checked_num_elements(&[]), Some(1));
        assert_eq!(expected_byte_len(Dtype::F32, &[]), Ok(4));
    }

    #[test]
    fn zero_dimension_gives_zero_bytes_beside_describable_dimensions() {
        assert_eq!(expected_byte_len(Dtype::F64, &[0, 7]), Ok(0));
        assert_eq!(expected_byte_len(Dtype::U8, &[1 << 31, 1 << 31, 0]), Ok(0));
        assert_eq!(expected_byte_len(Dtype::U8, &[0, MAX_TENSOR_SIZE]), Ok(0));
        assert_eq!(expected_byte_len(Dtype::F32, &[0, 1 << 60]), Ok(0));
        assert_eq!(expected_byte_len(Dtype::U8, &[1 << 61, 0]), Ok(0));
    }

    #[test]
    fn a_zero_hides_later_dimensions_from_the_overflow_check_but_not_earlier_ones() {
        // safetensors multiplies left to right: [2^63, 2^63, 0] overflows before the zero.
        let huge = 1u64 << 63;
        assert_eq!(checked_num_elements(&[0, huge, huge]), Some(0));
        assert_eq!(checked_num_elements(&[huge, huge, 0]), None);
        assert_eq!(
            expected_byte_len(Dtype::U8, &[huge, huge, 0]),
            Err(SizeProblem::Overflow)
        );
        assert_eq!(
            expected_byte_len(Dtype::U8, &[1 << 40, 1 << 40, 0]),
            Err(SizeProblem::Overflow)
        );
    }

    #[test]
    fn empty_tensors_numpy_and_torch_cannot_describe_are_too_large() {
        let huge = 1u64 << 63;
        for shape in [
            vec![0, huge, huge],
            vec![0, huge],
            vec![0, 1 << 62, 1 << 62],
            vec![0, 1 << 31, 1 << 32],
            vec![1 << 62, 0, 4],
        ] {
            assert_eq!(
                expected_byte_len(Dtype::U8, &shape),
                Err(SizeProblem::TooLarge),
                "{shape:?}"
            );
        }
        // 2^61 four-byte elements are 2^63 bytes, one more than an i64 holds.
        assert_eq!(
            expected_byte_len(Dtype::F32, &[0, 1 << 61]),
            Err(SizeProblem::TooLarge)
        );
        assert!(is_describable(Dtype::F4, &[0, MAX_TENSOR_SIZE]));
        assert!(!is_describable(Dtype::F4, &[0, huge]));
    }

    #[test]
    fn non_empty_tensors_that_fit_64_bits_are_always_describable() {
        // elements * bits < 2^64 bounds bytes by 2^61 and elements by 2^62.
        assert_eq!(
            expected_byte_len(Dtype::F4, &[(1 << 62) - 2]),
            Ok((1 << 61) - 1)
        );
        assert_eq!(expected_byte_len(Dtype::U8, &[1 << 60]), Ok(1 << 60));
    }

    #[test]
    fn element_count_overflow_is_reported() {
        assert_eq!(
            expected_byte_len(Dtype::U8, &[1 << 32, 1 << 32]),
            Err(SizeProblem::Overflow)
        );
    }

    #[test]
    fn bit_count_overflow_is_reported() {
        assert_eq!(
            expected_byte_len(Dtype::F64, &[1 << 60]),
            Err(SizeProblem::Overflow)
        );
    }

    #[test]
    fn sub_byte_tensors_must_fill_whole_bytes() {
        assert_eq!(expected_byte_len(Dtype::F4, &[2, 3]), Ok(3));
        assert_eq!(
            expected_byte_len(Dtype::F4, &[3]),
            Err(SizeProblem::PartialByte {
                elements: 3,
                total_bits: 12
            })
        );
        assert_eq!(expected_byte_len(Dtype::F6E3m2, &[4]), Ok(3));
        assert!(expected_byte_len(Dtype::F6E2m3, &[2]).is_err());
    }

    #[test]
    fn byte_len_and_num_elements_never_panic_on_hand_built_values() {
        let info = TensorInfo {
            name: "t".into(),
            dtype: Dtype::U8,
            shape: vec![u64::MAX, 2],
            start: 10,
            end: 4,
        };
        assert_eq!(info.byte_len(), 0);
        assert_eq!(info.num_elements(), u64::MAX);
    }
}
