//! Decoding and checking one tensor entry of a safetensors header.
//!
//! An entry is `{"dtype": "<DTYPE>", "shape": [..], "data_offsets": [start, end]}`. The
//! rules are those of safetensors, which reads the entry with serde into a struct of
//! these three fields; decoding goes field by field so each problem gets its own error.
//! It has two steps, because safetensors types every entry but checks the arithmetic of
//! only the entries it keeps (of two entries with the same name, the last):
//!
//! 1. [`TensorEntry::parse`], structure and types:
//!    - the entry is an object in which each of the three fields appears exactly once;
//!      other fields are ignored, as serde ignores them (a typo such as `data_offset` is
//!      still caught: the real field is then missing). serde also reads a struct from an
//!      array of its fields in order, so `["F32", [2], [0, 8]]` is an entry too;
//!    - `dtype` is a string naming a known dtype, exactly spelt. serde also reads a unit
//!      enum variant from a one-key object whose value is null, so `{"F32": null}` is a
//!      dtype too;
//!    - `shape` is an array of non-negative integers that fit in `u64`, and
//!      `data_offsets` exactly two of them;
//! 2. [`TensorEntry::check`], arithmetic: `start <= end`, the byte size implied by dtype
//!    and shape does not overflow (see `tensor_info`) and is a whole number of bytes, it
//!    equals `end - start`, and `end` lies within the data section. Sluice adds one rule:
//!    an empty tensor must have a shape numpy and torch can describe.
//!
//! Checks between tensors (the layout of the data section) belong to the header parser.

use std::path::Path;

use crate::dtype::Dtype;
use crate::error::FormatError;
use crate::json_tree::{excerpt, JsonTree};
use crate::tensor_info::{expected_byte_len, SizeProblem, TensorInfo};

const DTYPE_FIELD: &str = "dtype";
const SHAPE_FIELD: &str = "shape";
const OFFSETS_FIELD: &str = "data_offsets";

const DTYPE_EXPECTED: &str = "a dtype string";
const SHAPE_EXPECTED: &str = "an array of non-negative integers";
const OFFSETS_EXPECTED: &str = "an array of exactly 2 non-negative integers [start, end]";

/// The entry being decoded: which file and tensor errors should name.
pub(crate) struct TensorEntry<'a> {
    file: &'a Path,
    tensor: &'a str,
}

/// An entry's typed fields, before any arithmetic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParsedEntry {
    dtype: Dtype,
    shape: Vec<u64>,
    start: u64,
    end: u64,
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
    /// `data_len` bytes: [`TensorEntry::parse`], then [`TensorEntry::check`].
    #[cfg(test)]
    pub(crate) fn decode(
        &self,
        value: &JsonTree,
        data_len: u64,
    ) -> Result<TensorInfo, FormatError> {
        self.check(self.parse(value)?, data_len)
    }

    /// The entry's fields, typed: the checks safetensors applies to every entry.
    pub(crate) fn parse(&self, value: &JsonTree) -> Result<ParsedEntry, FormatError> {
        let fields = self.fields(value)?;
        let dtype = self.dtype(fields.dtype)?;
        let shape = self.shape(fields.shape)?;
        let (start, end) = self.offsets(fields.data_offsets)?;
        Ok(ParsedEntry {
            dtype,
            shape,
            start,
            end,
        })
    }

    /// The arithmetic checks of a parsed entry, in a data section of `data_len` bytes.
    pub(crate) fn check(
        &self,
        entry: ParsedEntry,
        data_len: u64,
    ) -> Result<TensorInfo, FormatError> {
        let ParsedEntry {
            dtype,
            shape,
            start,
            end,
        } = entry;
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
        match value {
            JsonTree::Object(entries) => self.object_fields(entries),
            // serde's sequence form of a struct: the fields in declaration order.
            JsonTree::Array(items) => match &items[..] {
                [dtype, shape, data_offsets] => Ok(RawFields {
                    dtype,
                    shape,
                    data_offsets,
                }),
                _ => Err(self.invalid_entry(value)),
            },
            _ => Err(self.invalid_entry(value)),
        }
    }

    fn object_fields<'t>(
        &self,
        entries: &'t [(String, JsonTree)],
    ) -> Result<RawFields<'t>, FormatError> {
        let (mut dtype, mut shape, mut data_offsets) = (None, None, None);
        for (key, field_value) in entries {
            let slot = match key.as_str() {
                DTYPE_FIELD => &mut dtype,
                SHAPE_FIELD => &mut shape,
                OFFSETS_FIELD => &mut data_offsets,
                // Ignored, as safetensors' serde struct ignores unknown fields.
                _ => continue,
            };
            if slot.replace(field_value).is_some() {
                return Err(FormatError::DuplicateTensorField {
                    file: self.file.to_path_buf(),
                    tensor: self.tensor.to_string(),
                    field: excerpt(key),
                });
            }
        }
        Ok(RawFields {
            dtype: dtype.ok_or_else(|| self.missing(DTYPE_FIELD))?,
            shape: shape.ok_or_else(|| self.missing(SHAPE_FIELD))?,
            data_offsets: data_offsets.ok_or_else(|| self.missing(OFFSETS_FIELD))?,
        })
    }

    fn dtype(&self, value: &JsonTree) -> Result<Dtype, FormatError> {
        let name = match value {
            JsonTree::String(name) => name,
            // serde's map form of a unit enum variant: `{"F32": null}`.
            JsonTree::Object(entries) => match &entries[..] {
                [(name, JsonTree::Null)] => name,
                _ => return Err(self.invalid(DTYPE_FIELD, DTYPE_EXPECTED, value.describe())),
            },
            _ => return Err(self.invalid(DTYPE_FIELD, DTYPE_EXPECTED, value.describe())),
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

    /// Offsets in order, a byte size that matches them, inside the data.
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
                SizeProblem::TooLarge => FormatError::ShapeTooLarge {
                    file,
                    tensor,
                    dtype,
                    shape: shape.to_vec(),
                },
            }
        })
    }

    fn invalid_entry(&self, value: &JsonTree) -> FormatError {
        FormatError::InvalidTensorEntry {
            file: self.file.to_path_buf(),
            tensor: self.tensor.to_string(),
            found: value.describe(),
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
    fn rejects_entry_that_is_neither_an_object_nor_an_array_of_three() {
        for json in [
            "[1, 2]",
            "[]",
            r#"["U8",[1],[0,1],1]"#,
            "null",
            "\"U8\"",
            "5",
        ] {
            let err = decode(json, 16).unwrap_err();
            assert!(
                matches!(err, FormatError::InvalidTensorEntry { .. }),
                "{json}: {err}"
            );
        }
    }

    #[test]
    fn accepts_the_array_form_of_an_entry_as_serde_does() {
        let info = decode(r#"["F32", [2], [8, 16]]"#, 16).unwrap();
        assert_eq!(
            (info.dtype, info.shape, info.start, info.end),
            (Dtype::F32, vec![2], 8, 16)
        );
        let err = decode(r#"[[2], "F32", [8, 16]]"#, 16).unwrap_err();
        assert!(
            matches!(err, FormatError::InvalidTensorField { field: "dtype", .. }),
            "{err}"
        );
    }

    #[test]
    fn accepts_the_map_form_of_a_dtype_as_serde_does() {
        let json = r#"{"dtype":{"BF16":null},"shape":[2],"data_offsets":[0,4]}"#;
        assert_eq!(decode(json, 4).unwrap().dtype, Dtype::Bf16);
        for dtype in [
            r#"{"BF16":{}}"#,
            r#"{"BF16":1}"#,
            r#"{"BF16":null,"U8":null}"#,
            "{}",
        ] {
            let json = format!(r#"{{"dtype":{dtype},"shape":[2],"data_offsets":[0,4]}}"#);
            let err = decode(&json, 4).unwrap_err();
            assert!(
                matches!(err, FormatError::InvalidTensorField { field: "dtype", .. }),
                "{dtype}: {err}"
            );
        }
        let err = decode(
            r#"{"dtype":{"X9":null},"shape":[2],"data_offsets":[0,4]}"#,
            4,
        )
        .unwrap_err();
        assert!(
            matches!(&err, FormatError::UnknownDtype { dtype, .. } if dtype == "X9"),
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
    fn ignores_unknown_fields_as_safetensors_does() {
        let json =
            r#"{"dtype":"U8","extra":{"x":[1,{}]},"x":1,"x":2,"shape":[1],"data_offsets":[0,1]}"#;
        let info = decode(json, 16).unwrap();
        assert_eq!((info.start, info.end), (0, 1));
    }

    #[test]
    fn a_misspelt_field_is_still_caught_as_the_real_one_missing() {
        let json = r#"{"dtype":"U8","shape":[1],"data_offset":[0,1]}"#;
        let err = decode(json, 16).unwrap_err();
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
    fn rejects_empty_tensor_numpy_and_torch_cannot_describe() {
        let huge = 1u64 << 63;
        let json = format!(r#"{{"dtype":"U8","shape":[0,{huge},{huge}],"data_offsets":[0,0]}}"#);
        let err = decode(&json, 0).unwrap_err();
        assert!(matches!(err, FormatError::ShapeTooLarge { .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with("m.safetensors: tensor 'w' of shape"),
            "{err}"
        );
        // Overflow before the zero is safetensors' own overflow error.
        let json = format!(r#"{{"dtype":"U8","shape":[{huge},{huge},0],"data_offsets":[0,0]}}"#);
        let err = decode(&json, 0).unwrap_err();
        assert!(
            matches!(err, FormatError::TensorSizeOverflow { .. }),
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
