//! Shared fixtures for the property tests: a small safetensors writer and generators of
//! valid headers.
//!
//! The writer is deliberately independent of the parser under test: it builds the header
//! with `serde_json` and lays tensors out itself, so a round trip checks the parser
//! against an outside description of the format rather than against its own idea of it.

#![allow(dead_code)] // each test binary uses a different subset

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::{json, Map, Value};
use sluice_formats::{Dtype, TensorInfo};

/// One generated tensor before layout.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
}

impl TensorSpec {
    /// Byte size; generators keep shapes tiny, so plain arithmetic cannot overflow.
    pub fn byte_len(&self) -> u64 {
        self.shape.iter().product::<u64>() * self.dtype.bits() / 8
    }
}

/// A generated file: its bytes and the tensors a correct parser must report.
#[derive(Debug, Clone)]
pub struct BuiltFile {
    pub bytes: Vec<u8>,
    pub tensors: Vec<TensorInfo>,
    pub metadata: Option<BTreeMap<String, String>>,
    pub header_len: u64,
    pub data_len: u64,
}

/// Writes a safetensors file holding `tensors` at the given offsets, with a data section
/// of `data_len` bytes (filled with a byte pattern) and the header padded to 8 bytes as
/// the safetensors writer does.
pub fn write_file(
    tensors: &[TensorInfo],
    metadata: Option<&BTreeMap<String, String>>,
    data_len: u64,
) -> Vec<u8> {
    let mut header = Map::new();
    for tensor in tensors {
        let entry = json!({
            "dtype": tensor.dtype.as_str(),
            "shape": tensor.shape,
            "data_offsets": [tensor.start, tensor.end],
        });
        header.insert(tensor.name.clone(), entry);
    }
    if let Some(metadata) = metadata {
        header.insert("__metadata__".into(), json!(metadata));
    }
    let mut header_bytes = Value::Object(header).to_string().into_bytes();
    header_bytes.resize(header_bytes.len().div_ceil(8) * 8, b' ');
    let mut bytes = (header_bytes.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&header_bytes);
    bytes.extend((0..data_len).map(|i| (i % 251) as u8));
    bytes
}

/// Lays `specs` out back to back in the given order, then appends `trailing` spare bytes
/// (which make the file invalid: safetensors forbids them).
pub fn build_file(
    specs: &[TensorSpec],
    metadata: Option<BTreeMap<String, String>>,
    trailing: u64,
) -> BuiltFile {
    let mut offset = 0;
    let mut tensors: Vec<TensorInfo> = specs
        .iter()
        .map(|spec| {
            let start = offset;
            offset += spec.byte_len();
            TensorInfo {
                name: spec.name.clone(),
                dtype: spec.dtype,
                shape: spec.shape.clone(),
                start,
                end: offset,
            }
        })
        .collect();
    let data_len = offset + trailing;
    let bytes = write_file(&tensors, metadata.as_ref(), data_len);
    tensors.sort_by(|a, b| (a.start, a.end, &a.name).cmp(&(b.start, b.end, &b.name)));
    let header_len = bytes.len() as u64 - 8 - data_len;
    BuiltFile {
        bytes,
        tensors,
        metadata,
        header_len,
        data_len,
    }
}

pub fn dtype() -> impl Strategy<Value = Dtype> {
    proptest::sample::select(Dtype::ALL)
}

/// Tensor names: mostly identifier-like, sometimes arbitrary Unicode (escapes and all),
/// now and then the empty name (safetensors accepts it).
pub fn tensor_name() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => "[a-z][a-z0-9_.]{0,24}",
        2 => "\\PC{1,12}",
        1 => Just(String::new()),
    ]
    .prop_filter("reserved key", |name| name != "__metadata__")
}

/// A shape of up to 4 small dimensions (0 allowed); sub-byte dtypes get an extra
/// dimension of 8 when needed so the tensor fills whole bytes.
pub fn tensor_spec(name: String) -> impl Strategy<Value = TensorSpec> {
    (dtype(), proptest::collection::vec(0u64..7, 0..4)).prop_map(move |(dtype, mut shape)| {
        let elements: u64 = shape.iter().product();
        if elements * dtype.bits() % 8 != 0 {
            shape.push(8);
        }
        TensorSpec {
            name: name.clone(),
            dtype,
            shape,
        }
    })
}

/// Up to `max` tensors with distinct names, in a random layout order.
pub fn tensor_specs(max: usize) -> impl Strategy<Value = Vec<TensorSpec>> {
    proptest::collection::btree_set(tensor_name(), 0..max).prop_flat_map(|names| {
        let specs: Vec<_> = names.into_iter().map(tensor_spec).collect();
        specs.prop_shuffle()
    })
}

pub fn metadata() -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
    proptest::option::of(proptest::collection::btree_map(
        "\\PC{0,10}",
        "\\PC{0,20}",
        0..4,
    ))
}

/// A whole valid file: tensors back to back and metadata.
pub fn valid_file(max_tensors: usize) -> impl Strategy<Value = BuiltFile> {
    (tensor_specs(max_tensors), metadata())
        .prop_map(|(specs, metadata)| build_file(&specs, metadata, 0))
}
