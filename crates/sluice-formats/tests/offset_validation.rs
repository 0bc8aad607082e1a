//! Property: the tensor spans must tile the data section exactly, as safetensors requires;
//! overlapping, out-of-bounds, gapped and short layouts are always rejected.
//!
//! Two approaches. First, take a valid layout and break it on purpose: move one tensor
//! into another's span, push one past the end of the data section, or drop a non-empty
//! one. Second, a differential test: `U8` tensors at random offsets, and tilings with one
//! span nudged, judged by a naive model of the rules that never sorts; the parser must
//! accept exactly the layouts the model accepts.

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

/// The naive rules: every span is in bounds, no two non-empty spans intersect, the
/// non-empty spans add up to the whole data section (so, disjoint, they cover it), and
/// no empty span lies strictly inside a non-empty one.
fn naive_is_valid(spans: &[(u64, u64)], data_len: u64) -> bool {
    let in_bounds = spans
        .iter()
        .all(|&(start, end)| start <= end && end <= data_len);
    let disjoint = spans.iter().enumerate().all(|(i, &(s1, e1))| {
        spans[i + 1..]
            .iter()
            .all(|&(s2, e2)| s1 == e1 || s2 == e2 || e1 <= s2 || e2 <= s1)
    });
    let covered: u64 = spans
        .iter()
        .map(|&(start, end)| end.saturating_sub(start))
        .sum();
    let empties_at_boundaries = spans
        .iter()
        .filter(|&&(start, end)| start == end)
        .all(|&(at, _)| spans.iter().all(|&(start, end)| !(start < at && at < end)));
    in_bounds && disjoint && covered == data_len && empties_at_boundaries
}

fn u8_tensors(spans: &[(u64, u64)]) -> Vec<TensorInfo> {
    spans
        .iter()
        .enumerate()
        .map(|(i, &(start, end))| TensorInfo {
            name: format!("t{i}"),
            dtype: Dtype::U8,
            shape: vec![end.saturating_sub(start)],
            start,
            end,
        })
        .collect()
}

/// A tiling of `lengths` (in the order given), with span `pick` moved by `nudge` bytes
/// (0 leaves it valid) and the data section `slack` bytes longer or shorter.
fn nudged_tiling(lengths: &[u64], pick: usize, nudge: i64, slack: i64) -> (Vec<(u64, u64)>, u64) {
    let mut spans = Vec::with_capacity(lengths.len());
    let mut offset = 0;
    for &len in lengths {
        spans.push((offset, offset + len));
        offset += len;
    }
    let victim = pick % spans.len();
    let (start, end) = spans[victim];
    let moved = start.saturating_add_signed(nudge);
    spans[victim] = (moved, moved + (end - start));
    (spans, offset.saturating_add_signed(slack))
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
        // Moved, the guest overlaps its host; that is reported before the gap it leaves.
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
    fn dropping_a_non_empty_tensor_is_rejected(
        file in two_or_more_nonempty(),
        pick in any::<usize>(),
    ) {
        let nonempty: Vec<usize> = (0..file.tensors.len())
            .filter(|&i| file.tensors[i].start < file.tensors[i].end)
            .collect();
        let mut tensors = file.tensors.clone();
        let dropped = tensors.remove(nonempty[pick % nonempty.len()]);
        let err = parse(&tensors, file.data_len).unwrap_err();
        // The next tensor (an empty one, perhaps) starts after a gap; with none, the
        // dropped bytes trail the last tensor.
        if tensors.iter().any(|t| t.start >= dropped.end) {
            prop_assert!(
                matches!(&err, FormatError::TensorGap { expected, .. } if *expected == dropped.start),
                "{}",
                err
            );
        } else {
            prop_assert!(matches!(err, FormatError::TrailingBytes { .. }), "{}", err);
        }
    }

    #[test]
    fn random_spans_are_accepted_exactly_when_the_naive_model_accepts(
        spans in proptest::collection::vec((0u64..40, 0u64..12), 1..8),
        data_len in 0u64..48,
    ) {
        let spans: Vec<(u64, u64)> = spans.iter().map(|&(start, len)| (start, start + len)).collect();
        let result = parse(&u8_tensors(&spans), data_len);
        prop_assert_eq!(result.is_ok(), naive_is_valid(&spans, data_len), "{:?}", result);
    }

    #[test]
    fn nudged_tilings_are_accepted_exactly_when_the_naive_model_accepts(
        lengths in proptest::collection::vec(prop_oneof![1 => Just(0u64), 3 => 1u64..6], 1..7),
        pick in any::<usize>(),
        nudge in prop_oneof![2 => Just(0i64), 3 => -4i64..5],
        slack in prop_oneof![2 => Just(0i64), 1 => -2i64..3],
    ) {
        let (spans, data_len) = nudged_tiling(&lengths, pick, nudge, slack);
        let result = parse(&u8_tensors(&spans), data_len);
        prop_assert_eq!(result.is_ok(), naive_is_valid(&spans, data_len), "{:?} {}: {:?}", spans, data_len, result);
    }
}
