//! Properties of the `.sluicetpl` codec.
//!
//! - Every valid template a generator can build encodes and decodes back to itself.
//! - No input makes the decoder panic: arbitrary bytes, bytes behind a valid header, and
//!   valid templates damaged by bit flips, truncation, insertion and deletion, with their
//!   checksum left stale or recomputed (a hostile writer can seal anything, so the checks
//!   of meaning must hold on their own).
//! - Whatever decodes is a template a replay can trust: it passes `validate`, and it
//!   re-encodes to bytes that decode to the same template.

use proptest::prelude::*;
use sluice_formats::template::{
    ServiceId, Template, TemplateFile, TemplateFormatError, TemplateRange, WorkerSequence,
};

/// Bytes of the blake3 trailer.
const CHECKSUM_BYTES: usize = 32;

fn arb_template() -> impl Strategy<Value = Template> {
    let size = prop_oneof![1u64..(1 << 40), 1u64..];
    let file = (
        "[a-z0-9_-]{1,8}(/[a-z0-9_-]{1,8}(\\.[a-z]{1,4})?){0,2}",
        size,
        any::<i64>(),
    )
        .prop_map(|(path, size, mtime_ns)| TemplateFile {
            path,
            size,
            mtime_ns,
        });
    let files = prop::collection::vec(file, 1..5);
    let seeds = prop::collection::vec((any::<u32>(), any::<u64>(), any::<u64>()), 0..20);
    let workers = prop::collection::btree_map(any::<u32>(), seeds, 0..5);
    (any::<[u8; 32]>(), "\\PC{0,20}", files, workers).prop_map(|(id, spec, files, workers)| {
        let workers = workers
            .into_iter()
            .map(|(worker, seeds)| {
                let ranges = seeds
                    .into_iter()
                    .map(|(f, o, l)| {
                        let file = f % files.len() as u32;
                        let size = files[file as usize].size;
                        let offset = o % size;
                        let len = 1 + l % (size - offset);
                        TemplateRange { file, offset, len }
                    })
                    .collect();
                WorkerSequence { worker, ranges }
            })
            .collect();
        Template {
            service: ServiceId(id),
            spec,
            files,
            workers,
        }
    })
}

#[derive(Debug, Clone)]
enum Mutation {
    FlipBit { position: usize, bit: u8 },
    Truncate { keep: usize },
    Insert { position: usize, byte: u8 },
    Delete { position: usize },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), 0u8..8).prop_map(|(position, bit)| Mutation::FlipBit { position, bit }),
        1 => any::<usize>().prop_map(|keep| Mutation::Truncate { keep }),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(position, byte)| Mutation::Insert { position, byte }),
        2 => any::<usize>().prop_map(|position| Mutation::Delete { position }),
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
        _ => {}
    }
}

/// `bytes` with its last 32 bytes replaced by the blake3 of the rest, as a hostile writer
/// would seal a forged template.
fn resealed(mut bytes: Vec<u8>) -> Vec<u8> {
    let body_len = bytes.len().saturating_sub(CHECKSUM_BYTES);
    bytes.truncate(body_len);
    let checksum = blake3::hash(&bytes);
    bytes.extend_from_slice(checksum.as_bytes());
    bytes
}

/// The decoder's whole contract on one input: an error, or a template that is valid and
/// survives a second round trip unchanged.
fn check(bytes: &[u8]) -> Result<Option<TemplateFormatError>, TestCaseError> {
    match Template::decode(bytes) {
        Err(err) => {
            prop_assert!(!err.to_string().is_empty());
            Ok(Some(err))
        }
        Ok(template) => {
            prop_assert_eq!(template.validate(), Ok(()));
            let again = template.encode();
            prop_assert_eq!(Template::decode(&again), Ok(template.clone()));
            prop_assert!(
                again.len() <= bytes.len(),
                "canonical encoding is the shortest"
            );
            Ok(None)
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_templates_round_trip(t in arb_template()) {
        prop_assert_eq!(t.validate(), Ok(()));
        let bytes = t.encode();
        prop_assert_eq!(Template::decode(&bytes), Ok(t.clone()));
        prop_assert_eq!(check(&bytes)?, None);
    }

    #[test]
    fn arbitrary_bytes_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..200),
        keep_header in any::<bool>(),
    ) {
        let mut bytes = bytes;
        if keep_header {
            bytes.splice(0..0, b"SLTPL\0\x01\x00\x00\x00".iter().copied());
        }
        prop_assert!(Template::decode(&bytes).is_err());
        // With a valid checksum the bytes may even decode; they must not panic.
        bytes.extend_from_slice(&[0; CHECKSUM_BYTES]);
        check(&resealed(bytes))?;
    }

    #[test]
    fn mutated_templates_never_panic_and_decode_only_to_valid_templates(
        t in arb_template(),
        mutations in prop::collection::vec(mutation(), 1..4),
        reseal in any::<bool>(),
    ) {
        let mut bytes = t.encode();
        for mutation in &mutations {
            apply(&mut bytes, mutation);
        }
        if reseal {
            bytes = resealed(bytes);
        }
        check(&bytes)?;
    }

    #[test]
    fn a_stale_checksum_is_always_caught(
        t in arb_template(),
        position in any::<usize>(),
        bit in 0u8..8,
    ) {
        let mut bytes = t.encode();
        let len = bytes.len();
        bytes[position % len] ^= 1 << bit;
        prop_assert!(Template::decode(&bytes).is_err());
    }
}
