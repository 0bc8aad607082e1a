//! One tensor's entry in a safetensors header, and the size arithmetic behind it.
//!
//! A tensor occupies `product(shape) * bits / 8` bytes. A 0-d tensor (`shape: []`) is a
//! scalar with one element; any zero dimension makes the tensor empty. The product is
//! computed with checked arithmetic because shapes come from untrusted JSON, and a zero
//! dimension short-circuits to zero so that `[2^40, 2^40, 0]` is an empty tensor rather
//! than an overflow. For sub-byte dtypes the bit total must be a whole number of bytes.

use crate::dtype::Dtype;

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
    /// The element count or bit count does not fit in `u64`.
    Overflow,
    /// The bit count is not a multiple of 8 (sub-byte dtypes only).
    PartialByte { elements: u64, total_bits: u64 },
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

/// `product(shape)` with overflow checks; a zero dimension gives 0 even when the other
/// dimensions would overflow.
pub(crate) fn checked_num_elements(shape: &[u64]) -> Option<u64> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape
        .iter()
        .try_fold(1u64, |count, &dim| count.checked_mul(dim))
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
    fn zero_dimension_gives_zero_bytes_even_beside_huge_dimensions() {
        assert_eq!(expected_byte_len(Dtype::F64, &[0, 7]), Ok(0));
        assert_eq!(expected_byte_len(Dtype::F64, &[1 << 40, 1 << 40, 0]), Ok(0));
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
