//! `block_runs` against an element-by-element gather.

use proptest::prelude::*;

use super::{block_runs, Run};

/// The block's bytes gathered one element at a time from a row-major buffer.
fn gather(data: &[u8], shape: &[u64], item: usize, ranges: &[(u64, u64)]) -> Vec<u8> {
    let mut out = Vec::new();
    if ranges.iter().any(|&(lo, hi)| lo == hi) {
        return out;
    }
    let mut index: Vec<u64> = ranges.iter().map(|&(lo, _)| lo).collect();
    loop {
        let mut flat = 0u64;
        for (d, &i) in index.iter().enumerate() {
            flat = flat * shape[d] + i;
        }
        let at = flat as usize * item;
        out.extend_from_slice(&data[at..at + item]);
        let mut d = index.len();
        loop {
            if d == 0 {
                return out;
            }
            d -= 1;
            index[d] += 1;
            if index[d] < ranges[d].1 {
                break;
            }
            index[d] = ranges[d].0;
        }
    }
}

fn apply(data: &[u8], base: u64, runs: &[Run]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in runs {
        let at = (r.file_offset - base) as usize;
        out.extend_from_slice(&data[at..at + r.len]);
    }
    out
}

fn shape_and_ranges() -> impl Strategy<Value = (Vec<u64>, Vec<(u64, u64)>)> {
    prop::collection::vec(1u64..6, 0..5).prop_flat_map(|shape| {
        let ranges: Vec<_> = shape
            .iter()
            .map(|&n| (0..=n).prop_flat_map(move |lo| (Just(lo), lo..=n)))
            .collect();
        (Just(shape), ranges)
    })
}

proptest! {
    #[test]
    fn runs_cover_exactly_the_block((shape, ranges) in shape_and_ranges(), item in prop::sample::select(vec![1usize, 2, 4, 8])) {
        let elems: u64 = shape.iter().product();
        let data: Vec<u8> = (0..elems as usize * item).map(|i| (i * 7 + 3) as u8).collect();
        let base = 1000;
        let runs = block_runs(&shape, item as u64 * 8, &ranges, base);
        prop_assert_eq!(apply(&data, base, &runs), gather(&data, &shape, item, &ranges));
        // Runs are in file order and never touch (touching ones are merged).
        for pair in runs.windows(2) {
            prop_assert!(pair[0].file_offset + (pair[0].len as u64) < pair[1].file_offset);
        }
    }
}

#[test]
fn a_cut_of_the_first_dimension_is_one_run() {
    let runs = block_runs(&[8, 4, 2], 32, &[(2, 5), (0, 4), (0, 2)], 0);
    assert_eq!(
        runs,
        vec![Run {
            file_offset: 2 * 4 * 2 * 4,
            len: 3 * 4 * 2 * 4
        }]
    );
}

#[test]
fn a_cut_of_the_last_dimension_is_one_run_per_row() {
    let runs = block_runs(&[3, 10], 16, &[(0, 3), (4, 6)], 0);
    assert_eq!(runs.len(), 3);
    assert!(runs.iter().all(|r| r.len == 4));
}

#[test]
fn packed_four_bit_values_cut_at_whole_bytes() {
    // F4: shape [2, 8] is 2 rows of 4 bytes; columns 2..6 are bytes 1..3.
    let runs = block_runs(&[2, 8], 4, &[(0, 2), (2, 6)], 0);
    assert_eq!(
        runs,
        vec![
            Run {
                file_offset: 1,
                len: 2
            },
            Run {
                file_offset: 5,
                len: 2
            }
        ]
    );
}
