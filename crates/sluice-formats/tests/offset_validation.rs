//! Property: overlapping and out-of-bounds tensor spans are always rejected.
//!
//! Two approaches. First, take a valid layout and break it on purpose: move one tensor
//! into another's span, or push one past the end of the data section. Second, a
//! differential test: random `U8` tensors at random offsets, judged by a naive quadratic
//! model of the rules; the parser must accept exactly the layouts the model accepts.

mod common;

use std::path::Path;

use proptest::prelude::*;
use sluice_formats::{parse_file_bytes, Dtype, FormatError, TensorInfo};

fn parse(tensors: &[TensorInfo], data_len: u64) -> Result<sluice_formats::Header, FormatError> {
    let bytes = common::write_file(tensors, None, data_len);
    parse_file_bytes(Path::new("gen.safetensors"), &bytes)
}

/// A valid file with at least two non-empty tensors.
fn two_or_more_nonempty() -> impl Strategy<Value = common::BuiltFile> {
    common::valid_file(10).prop_filter("needs two non-empty tensors", |file| {
        file.tensors.iter().filter(|t| t.start < t.end).count() >= 2
    })
}

/// The naive rules: every span is in bounds and no two non-empty spans intersect.
fn naive_is_valid(spans: &[(u64, u64)], data_len: u64) -> bool {
    let in_bounds = spans
        .iter()
        .all(|&(start, end)| start <= end && end <= data_len);
    let disjoint = spans.iter().enumerate().all(|(i, &(s1, e1))| {
        spans[i + 1..]
            .iter()
            .all(|&(s2, e2)| s1 == e1 || s2 == e2 || e1 <= s2 || e2 <= s1)
    });
    in_bounds && disjoint
}

proptest! {
    #[test]
    fn moving_a_tensor_into_another_is_rejected(
        file in two_or_more_nonempty(),
        pick in any::<(usize, usize, u64)>(),
    ) {
        let nonempty: Vec<usize> = (0..file.tensors.len())
            .filter(|&i| file.tensors[i].start < file.tensors[i].end)
            .collect();
        let host = nonempty[pick.0 % nonempty.len()];
        let mut guest = nonempty[pick.1 % nonempty.len()];
        if guest == host {
            guest = nonempty[(pick.1 + 1) % nonempty.len()];
        }
        let mut tensors = file.tensors.clone();
        let (host_start, host_end) = (tensors[host].start, tensors[host].end);
        let size = tensors[guest].end - tensors[guest].start;
        tensors[guest].start = host_start + pick.2 % (host_end - host_start);
        tensors[guest].end = tensors[guest].start + size;
        let err = parse(&tensors, file.data_len).unwrap_err();
        if tensors[guest].end <= file.data_len {
            prop_assert!(matches!(err, FormatError::OverlappingTensors { .. }), "{}", err);
        } else {
            prop_assert!(matches!(err, FormatError::TensorOutOfBounds { .. }), "{}", err);
        }
    }

    #[test]
    fn pushing_a_tensor_past_the_data_section_is_rejected(
        file in two_or_more_nonempty(),
        pick in any::<usize>(),
        overshoot in 1u64..1_000_000,
    ) {
        let mut tensors = file.tensors.clone();
        let victim = pick % tensors.len();
        let size = tensors[victim].end - tensors[victim].start;
        tensors[victim].end = file.data_len + overshoot;
        tensors[victim].start = tensors[victim].end - size;
        let err = parse(&tensors, file.data_len).unwrap_err();
        prop_assert!(
            matches!(&err, FormatError::TensorOutOfBounds { tensor, .. } if *tensor == tensors[victim].name),
            "{}",
            err
        );
    }

    #[test]
    fn random_spans_are_accepted_exactly_when_the_naive_model_accepts(
        spans in proptest::collection::vec((0u64..40, 0u64..12), 1..8),
        data_len in 0u64..48,
    ) {
        let spans: Vec<(u64, u64)> = spans.iter().map(|&(start, len)| (start, start + len)).collect();
        let tensors: Vec<TensorInfo> = spans
            .iter()
            .enumerate()
            .map(|(i, &(start, end))| TensorInfo {
                name: format!("t{i}"),
                dtype: Dtype::U8,
                shape: vec![end - start],
                start,
                end,
            })
            .collect();
        let result = parse(&tensors, data_len);
        prop_assert_eq!(result.is_ok(), naive_is_valid(&spans, data_len), "{:?}", result);
    }
}
