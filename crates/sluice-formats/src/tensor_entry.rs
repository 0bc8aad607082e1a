//! Decoding and checking one tensor entry of a safetensors header.
//!
//! An entry must be exactly `{"dtype": "<DTYPE>", "shape": [..], "data_offsets": [start,
//! end]}`. Decoding goes field by field so each problem gets its own error:
//!
//! 1. structure: the entry is an object, each of the three fields appears exactly once and
//!    nothing else appears (unknown fields are refused rather than ignored, so a typo such
//!    as `data_offset` cannot silently produce a different tensor);
//! 2. types: `dtype` is a string naming a known dtype, `shape` is an array of non-negative
//!    integers, `data_offsets` is exactly two non-negative integers;
//! 3. arithmetic: `start <= end`, the byte size implied by dtype and shape does not
//!    overflow and is a whole number of bytes, it equals `end - start`, and `end` lies
//!    within the data section.
//!
//! Checks between tensors (duplicate names, overlapping spans) belong to the header parser.

use std::path::Path;

use crate::dtype::Dtype;
use crate::error::FormatError;
use crate::json_tree::{excerpt, JsonTree};
use crate::tensor_info::{expected_byte_len, SizeProblem, TensorInfo};

const DTYPE_FIELD: &str = "dtype";
const SHAPE_FIELD: &str = "shape";
const OFFSETS_FIELD: &str = "data_offsets";

const SHAPE_EXPECTED: &str = "an array of non-negative integers";
const OFFSETS_EXPECTED: &str = "an array of exactly 2 non-negative integers [start, end]";

/// The entry being decoded: which file and tensor errors should name.
pub(crate) struct TensorEntry<'a> {
    file: &'a Path,
    tensor: &'a str,
}

/// The three raw field values of an entry, each present exactly once.
struct RawFields<'t> {
    dtype: &'t JsonTree,
    shape: &'t JsonTree,
    data_offsets: &'t JsonTree,
}

impl<'a> TensorEntry<'a> {
    pub(crate) fn new(file: &'a Path, tensor: &'a str) -> Self {
        TensorEntry { file, tensor }
    }

    /// Decodes `value` into a [`TensorInfo`] whose span fits a data section of
    /// `data_len` bytes.
    pub(crate) fn decode(
        &self,
        value: &JsonTree,
        data_len: u64,
    ) -> Result<TensorInfo, FormatError> {
        let fields = self.fields(value)?;
        let dtype = self.dtype(fields.dtype)?;
        let shape = self.shape(fields.shape)?;
        let (start, end) = self.offsets(fields.data_offsets)?;
        self.check_span(dtype, &shape, start, end, data_len)?;
        Ok(TensorInfo {
            name: self.tensor.to_string(),
            dtype,
            shape,
            start,
            end,
        })
    }

    fn fields<'t>(&self, value: &'t JsonTree) -> Result<RawFields<'t>, FormatError> {
        let JsonTree::Object(entries) = value else {
            return Err(FormatError::TensorEntryNotObject {
                file: self.file.to_path_buf(),
                tensor: self.tensor.to_string(),
                found: value.describe(),
            });
        };
        let (mut dtype, mut shape, mut data_offsets) = (None, None, None);
        for (key, field_value) in entries {
            let slot = match key.as_str() {
                DTYPE_FIELD => &mut dtype,
                SHAPE_FIELD => &mut shape,
                OFFSETS_FIELD => &mut data_offsets,
                _ => return Err(self.field_error(key, true)),
            };
            if slot.replace(field_value).is_some() {
                return Err(self.field_error(key, false));
            }
        }
        Ok(RawFields {
            dtype: dtype.ok_or_else(|| self.missing(DTYPE_FIELD))?,
            shape: shape.ok_or_else(|| self.missing(SHAPE_FIELD))?,
            data_offsets: data_offsets.ok_or_else(|| self.missing(OFFSETS_FIELD))?,
        })
    }

    fn dtype(&self, value: &JsonTree) -> Result<Dtype, FormatError> {
        let JsonTree::String(name) = value else {
            return Err(self.invalid(DTYPE_FIELD, "a string", value.describe()));
        };
        Dtype::parse(name).ok_or_else(|| FormatError::UnknownDtype {
            file: self.file.to_path_buf(),
            tensor: self.tensor.to_string(),
            dtype: excerpt(name),
        })
    }

    fn shape(&self, value: &JsonTree) -> Result<Vec<u64>, FormatError> {
        let JsonTree::Array(items) = value else {
            return Err(self.invalid(SHAPE_FIELD, SHAPE_EXPECTED, value.describe()));
        };
        self.unsigned_items(SHAPE_FIELD, SHAPE_EXPECTED, items)
    }

    fn offsets(&self, value: &JsonTree) -> Result<(u64, u64), FormatError> {
        let JsonTree::Array(items) = value else {
            return Err(self.invalid(OFFSETS_FIELD, OFFSETS_EXPECTED, value.describe()));
        };
        match self.unsigned_items(OFFSETS_FIELD, OFFSETS_EXPECTED, items)?[..] {
            [start, end] => Ok((start, end)),
            _ => Err(self.invalid(OFFSETS_FIELD, OFFSETS_EXPECTED, value.describe())),
        }
    }

    /// Every item of `items` as a `u64`, or an error naming the first bad item.
    fn unsigned_items(
        &self,
        field: &'static str,
        expected: &'static str,
        items: &[JsonTree],
    ) -> Result<Vec<u64>, FormatError> {
        items
            .iter()
            .enumerate()
            .map(|(position, item)| {
                item.as_u64().ok_or_else(|| {
                    let found = format!("{} at position {position}", item.describe());
                    self.invalid(field, expected, found)
                })
            })
            .collect()
    }

    /// Offsets in order, a representable byte size that matches them, inside the data.
    fn check_span(
        &self,
        dtype: Dtype,
        shape: &[u64],
        start: u64,
        end: u64,
        data_len: u64,
    ) -> Result<(), FormatError> {
        let (file, tensor) = (self.file, self.tensor);
        if start > end {
            let (file, tensor) = (file.to_path_buf(), tensor.to_string());
            return Err(FormatError::InvertedOffsets {
                file,
                tensor,
                start,
                end,
            });
        }
        let expected_bytes = self.byte_size(dtype, shape)?;
        if expected_bytes != end - start {
            return Err(FormatError::TensorSizeMismatch {
                file: file.to_path_buf(),
                tensor: tensor.to_string(),
                dtype,
                shape: shape.to_vec(),
                expected_bytes,
                start,
                end,
            });
        }
        if end > data_len {
            let (file, tensor) = (file.to_path_buf(), tensor.to_string());
            return Err(FormatError::TensorOutOfBounds {
                file,
                tensor,
                end,
                data_len,
            });
        }
        Ok(())
    }

    fn byte_size(&self, dtype: Dtype, shape: &[u64]) -> Result<u64, FormatError> {
        expected_byte_len(dtype, shape).map_err(|problem| {
            let (file, tensor) = (self.file.to_path_buf(), self.tensor.to_string());
            match problem {
                SizeProblem::Overflow => {
                    let shape = shape.to_vec();
                    FormatError::TensorSizeOverflow {
                        file,
                        tensor,
                        dtype,
                        shape,
                    }
                }
                SizeProblem::PartialByte {
                    elements,
                    total_bits,
                } => FormatError::PartialByteTensor {
                    file,
                    tensor,
                    dtype,
                    elements,
                    total_bits,
                },
            }
        })
    }

    /// An unknown field (`unknown == true`) or a repeated known one.
    fn field_error(&self, field: &str, unknown: bool) -> FormatError {
        let (file, tensor) = (self.file.to_path_buf(), self.tensor.to_string());
        let field = excerpt(field);
        if unknown {
            FormatError::UnknownTensorField {
                file,
                tensor,
                field,
            }
        } else {
            FormatError::DuplicateTensorField {
                file,
                tensor,
                field,
            }
        }
    }

    fn missing(&self, field: &'static str) -> FormatError {
        FormatError::MissingTensorField {
            file: self.file.to_path_buf(),
            tensor: self.tensor.to_string(),
            field,
        }
    }

    fn invalid(&self, field: &'static str, expected: &'static str, found: String) -> FormatError {
        FormatError::InvalidTensorField {
            file: self.file.to_path_buf(),
            tensor: self.tensor.to_string(),
            field,
            expected,
            found,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::JsonDocument;

    /// Decodes `json` as the entry of tensor "w" in a data section of `data_len` bytes.
    fn decode(json: &str, data_len: u64) -> Result<TensorInfo, FormatError> {
        let file = Path::new("m.safetensors");
        let tree = JsonTree::parse(file, JsonDocument::Header, json.as_bytes()).unwrap();
        TensorEntry::new(file, "w").decode(&tree, data_len)
    }

    #[test]
    fn decodes_a_valid_entry() {
        let info = decode(
            r#"{"dtype":"BF16","shape":[2,3],"data_offsets":[4,16]}"#,
            16,
        )
        .unwrap();
        assert_eq!(
            info,
            TensorInfo {
                name: "w".into(),
                dtype: Dtype::Bf16,
                shape: vec![2, 3],
                start: 4,
                end: 16
            }
        );
    }

    #[test]
    fn rejects_entry_that_is_not_an_object() {
        let err = decode("[1, 2]", 16).unwrap_err();
        assert!(
            matches!(err, FormatError::TensorEntryNotObject { .. }),
            "{err}"
        );
    }

    #[test]
    fn rejects_duplicate_field_inside_entry() {
        let json = r#"{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}"#;
        let err = decode(json, 16).unwrap_err();
        assert!(
            matches!(&err, FormatError::DuplicateTensorField { field, tensor, .. } if field == "dtype" && tensor == "w"),
            "{err}"
        );
    }

    #[test]
    fn rejects_unknown_field() {
        let json = r#"{"dtype":"U8","shape":[1],"data_offsets":[0,1],"data_offset":[0,1]}"#;
        let err = decode(json, 16).unwrap_err();
        assert!(
            matches!(&err, FormatError::UnknownTensorField { field, .. } if field == "data_offset"),
            "{err}"
        );
    }

    #[test]
    fn rejects_missing_field() {
        let err = decode(r#"{"dtype":"U8","shape":[1]}"#, 16).unwrap_err();
        assert!(
            matches!(
                err,
                FormatError::MissingTensorField {
                    field: "data_offsets",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn rejects_dtype_that_is_not_a_string() {
        let err = decode(r#"{"dtype":7,"shape":[1],"data_offsets":[0,1]}"#, 16).unwrap_err();
        assert!(
            matches!(err, FormatError::InvalidTensorField { field: "dtype", .. }),
            "{err}"
        );
    }

    #[test]
    fn rejects_unknown_dtype_and_names_it() {
        let err = decode(r#"{"dtype":"F12","shape":[1],"data_offsets":[0,1]}"#, 16).unwrap_err();
        assert!(
            matches!(&err, FormatError::UnknownDtype { dtype, .. } if dtype == "F12"),
            "{err}"
        );
    }

    #[test]
    fn rejects_negative_or_fractional_shape_elements() {
        for shape in [
            "[-1]",
            "[1.5]",
            "[\"2\"]",
            "3",
            "[null]",
            "[18446744073709551616]",
        ] {
            let json = format!(r#"{{"dtype":"U8","shape":{shape},"data_offsets":[0,1]}}"#);
            let err = decode(&json, 16).unwrap_err();
            assert!(
                matches!(err, FormatError::InvalidTensorField { field: "shape", .. }),
                "{err}"
            );
        }
    }

    #[test]
    fn rejects_data_offsets_without_exactly_two_integers() {
        for offsets in ["[0]", "[0,1,2]", "[]", "[0,-1]", "{\"a\":1}", "[0, 1.0]"] {
            let json = format!(r#"{{"dtype":"U8","shape":[1],"data_offsets":{offsets}}}"#);
            let err = decode(&json, 16).unwrap_err();
            assert!(
                matches!(
                    err,
                    FormatError::InvalidTensorField {
                        field: "data_offsets",
                        ..
                    }
                ),
                "{offsets}: {err}"
            );
        }
    }

    #[test]
    fn rejects_start_after_end() {
        let err = decode(r#"{"dtype":"U8","shape":[0],"data_offsets":[5,4]}"#, 16).unwrap_err();
        assert!(
            matches!(
                err,
                FormatError::InvertedOffsets {
                    start: 5,
                    end: 4,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn rejects_shape_whose_byte_size_overflows() {
        let json = r#"{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,1]}"#;
        let err = decode(json, 16).unwrap_err();
        assert!(
            matches!(err, FormatError::TensorSizeOverflow { .. }),
            "{err}"
        );
    }

    #[test]
    fn rejects_sub_byte_tensor_with_partial_last_byte() {
        let err = decode(r#"{"dtype":"F4","shape":[3],"data_offsets":[0,2]}"#, 16).unwrap_err();
        assert!(
            matches!(
                err,
                FormatError::PartialByteTensor {
                    elements: 3,
                    total_bits: 12,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn rejects_span_that_disagrees_with_shape_and_dtype() {
        let err = decode(r#"{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}"#, 64).unwrap_err();
        assert!(
            matches!(
                err,
                FormatError::TensorSizeMismatch {
                    expected_bytes: 24,
                    start: 0,
                    end: 20,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn rejects_tensor_ending_past_the_data_section() {
        let err = decode(r#"{"dtype":"U8","shape":[8],"data_offsets":[10,18]}"#, 16).unwrap_err();
        assert!(
            matches!(
                err,
                FormatError::TensorOutOfBounds {
                    end: 18,
                    data_len: 16,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn accepts_scalar_and_empty_tensors() {
        let scalar = decode(r#"{"dtype":"F32","shape":[],"data_offsets":[0,4]}"#, 4).unwrap();
        assert_eq!(scalar.num_elements(), 1);
        let empty = decode(r#"{"dtype":"F32","shape":[0,5],"data_offsets":[4,4]}"#, 4).unwrap();
        assert_eq!(empty.byte_len(), 0);
    }
}
