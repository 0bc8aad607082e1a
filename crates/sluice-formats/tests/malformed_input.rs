//! Property: no input makes the parsers panic, and whatever they accept is safe to read.
//!
//! Inputs are arbitrary bytes, and valid files (or indexes) damaged by bit flips,
//! truncation, insertion, deletion and a rewritten length prefix. Every accepted header is
//! checked against the bytes it came from: sorted by offset, the tensor spans must tile
//! the data section exactly (each inside the buffer, none overlapping, no byte left
//! over), which is what "no out-of-bounds read" and "the format's layout" mean for a
//! loader that trusts the header.

mod common;

use std::path::Path;

use proptest::prelude::*;
use sluice_formats::{parse_file_bytes, parse_index, Header};

#[derive(Debug, Clone)]
enum Mutation {
    FlipBit { position: usize, bit: u8 },
    Truncate { keep: usize },
    Insert { position: usize, byte: u8 },
    Delete { position: usize },
    SetPrefix { header_len: u64 },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), 0u8..8).prop_map(|(position, bit)| Mutation::FlipBit { position, bit }),
        1 => any::<usize>().prop_map(|keep| Mutation::Truncate { keep }),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(position, byte)| Mutation::Insert { position, byte }),
        2 => any::<usize>().prop_map(|position| Mutation::Delete { position }),
        1 => prop_oneof![any::<u64>(), 0u64..512].prop_map(|header_len| Mutation::SetPrefix { header_len }),
    ]
}

fn apply(bytes: &mut Vec<u8>, mutation: &Mutation) {
    let len = bytes.len();
    match *mutation {
        Mutation::FlipBit { position, bit } if len > 0 => bytes[position % len] ^= 1 << bit,
        Mutation::Truncate { keep } => bytes.truncate(keep % (len + 1)),
        Mutation::Insert { position, byte } => bytes.insert(position % (len + 1), byte),
        Mutation::Delete { position } if len > 0 => {
            bytes.remove(position % len);
        }
        Mutation::SetPrefix { header_len } if len >= 8 => {
            bytes[..8].copy_from_slice(&header_len.to_le_bytes())
        }
        _ => {}
    }
}

/// An accepted header must describe only bytes that exist, and all of them, once.
fn assert_safe_to_read(header: &Header, bytes: &[u8]) -> Result<(), TestCaseError> {
    prop_assert_eq!(header.data_start + header.data_len, bytes.len() as u64);
    let mut covered = 0;
    for tensor in &header.tensors {
        prop_assert!(tensor.start <= tensor.end);
        prop_assert_eq!(
            tensor.start,
            covered,
            "{} does not start where the last ended",
            &tensor.name
        );
        let start = (header.data_start + tensor.start) as usize;
        let end = (header.data_start + tensor.end) as usize;
        prop_assert!(
            bytes.get(start..end).is_some(),
            "{} out of bounds",
            tensor.name
        );
        covered = tensor.end;
    }
    prop_assert_eq!(covered, header.data_len, "trailing bytes");
    Ok(())
}

fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(header) = parse_file_bytes(Path::new("fuzz.safetensors"), bytes) {
        assert_safe_to_read(&header, bytes)?;
    }
    let _ = parse_index(Path::new("fuzz.index.json"), bytes);
    Ok(())
}

fn index_json(file: &common::BuiltFile) -> Vec<u8> {
    let weight_map: serde_json::Map<_, _> = file
        .tensors
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                serde_json::Value::from("model-00001.safetensors"),
            )
        })
        .collect();
    serde_json::json!({"metadata": {"total_size": file.data_len}, "weight_map": weight_map})
        .to_string()
        .into_bytes()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        check(&bytes)?;
    }

    #[test]
    fn arbitrary_bytes_behind_a_plausible_prefix_never_panic(
        body in proptest::collection::vec(any::<u8>(), 0..256),
        header_len in 0u64..300,
    ) {
        let mut bytes = header_len.to_le_bytes().to_vec();
        bytes.extend(body);
        check(&bytes)?;
    }

    #[test]
    fn mutated_valid_files_never_panic(
        file in common::valid_file(6),
        mutations in proptest::collection::vec(mutation(), 1..6),
    ) {
        let mut bytes = file.bytes.clone();
        for mutation in &mutations {
            apply(&mut bytes, mutation);
        }
        check(&bytes)?;
    }

    #[test]
    fn mutated_valid_indexes_never_panic(
        file in common::valid_file(6),
        mutations in proptest::collection::vec(mutation(), 1..6),
    ) {
        let mut bytes = index_json(&file);
        prop_assert!(parse_index(Path::new("i.json"), &bytes).is_ok());
        for mutation in &mutations {
            apply(&mut bytes, mutation);
        }
        check(&bytes)?;
    }
}
