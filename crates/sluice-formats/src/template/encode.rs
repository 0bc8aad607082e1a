//! Writing a template in the `.sluicetpl` format, and the integer encodings both
//! directions share.
//!
//! Integers are unsigned LEB128 (7 bits per byte, low groups first). Signed values (mtimes,
//! offset deltas) are zigzag-mapped first, so small magnitudes of either sign stay short.
//! A range's offset is stored relative to [`delta_base`]: the previous range's end when it
//! is on the same file, so a sequential loader stores 0, one byte, per range.

use super::model::Template;
use super::{CHECKSUM_BYTES, HEADER_BYTES, MAGIC, SERVICE_BYTES, VERSION};

impl Template {
    /// The template in the `.sluicetpl` format (docs/FORMATS.md). Encodes whatever it is
    /// given; [`Template::validate`] first if the template was not built by a recorder or
    /// a decoder, since [`Template::decode`] refuses invalid ones.
    pub fn encode(&self) -> Vec<u8> {
        // A guess to avoid regrowing: paths of about 60 bytes, ranges of about 12.
        let mut out = Vec::with_capacity(
            HEADER_BYTES
                + SERVICE_BYTES
                + CHECKSUM_BYTES
                + self.spec.len()
                + 64 * self.files.len()
                + 12 * self.range_count(),
        );
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&self.service.0);
        put_bytes(&mut out, self.spec.as_bytes());
        put_uleb(&mut out, self.files.len() as u64);
        for file in &self.files {
            put_bytes(&mut out, file.path.as_bytes());
            put_uleb(&mut out, file.size);
            put_uleb(&mut out, zigzag(file.mtime_ns));
        }
        put_uleb(&mut out, self.workers.len() as u64);
        for seq in &self.workers {
            put_uleb(&mut out, u64::from(seq.worker));
            put_uleb(&mut out, seq.ranges.len() as u64);
            let mut previous: Option<(u64, u64)> = None;
            for range in &seq.ranges {
                let file = u64::from(range.file);
                let delta = range.offset.wrapping_sub(delta_base(previous, file)) as i64;
                put_uleb(&mut out, file);
                put_uleb(&mut out, zigzag(delta));
                put_uleb(&mut out, range.len);
                previous = Some((file, range.end()));
            }
        }
        let checksum = blake3::hash(&out);
        out.extend_from_slice(checksum.as_bytes());
        out
    }
}

/// Offsets are stored relative to this: the previous range's `(file, end)` when it is on
/// the same file (sequential loaders then store 0), else 0 (absolute).
pub(super) fn delta_base(previous: Option<(u64, u64)>, file: u64) -> u64 {
    match previous {
        Some((prev_file, prev_end)) if prev_file == file => prev_end,
        _ => 0,
    }
}

pub(super) fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

pub(super) fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

pub(super) fn put_uleb(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A LEB128 length, then the bytes.
pub(super) fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_uleb(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{range, sample, MIB};
    use super::super::model::WorkerSequence;
    use super::*;

    /// `sample()` as the first release of `sluice warm` (sluice-warm's template.rs at
    /// ae2481d) encoded it: the format must not drift.
    const SAMPLE_V1: &[u8] = include_bytes!("../../tests/data/template-sample-v1.sluicetpl");

    #[test]
    fn encode_then_decode_returns_the_same_template() {
        let t = sample();
        let bytes = t.encode();
        assert!(bytes.starts_with(b"SLTPL\0\x01\x00\x00\x00"));
        assert_eq!(Template::decode(&bytes).unwrap(), t);
    }

    #[test]
    fn encoding_is_byte_for_byte_that_of_the_first_release() {
        assert_eq!(sample().encode(), SAMPLE_V1);
        assert_eq!(Template::decode(SAMPLE_V1).unwrap(), sample());
    }

    #[test]
    fn sequential_ranges_store_zero_offset_deltas() {
        let mut t = sample();
        let ranges = (0..100).map(|i| range(0, i * 2 * MIB, MIB)).collect();
        t.workers = vec![WorkerSequence { worker: 0, ranges }];
        let gapped = t.encode().len();
        for (i, r) in t.workers[0].ranges.iter_mut().enumerate() {
            r.offset = i as u64 * MIB;
        }
        let contiguous = t.encode().len();
        // Delta 1 MiB (zigzag 2^21: 4 LEB128 bytes) vs 0 (1 byte), in every range but the
        // first, which is absolute in both.
        assert_eq!(gapped - contiguous, 99 * 3, "{gapped} vs {contiguous}");
    }

    #[test]
    fn zigzag_keeps_small_magnitudes_small_and_round_trips_extremes() {
        assert_eq!(
            [0, -1, 1, -2, 2].map(zigzag),
            [0, 1, 2, 3, 4],
            "alternating signs"
        );
        for v in [i64::MIN, i64::MIN + 1, -42, 0, 42, i64::MAX] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
    }

    #[test]
    fn leb128_uses_seven_bits_per_byte() {
        for (v, len) in [(0u64, 1), (127, 1), (128, 2), (1 << 21, 4), (u64::MAX, 10)] {
            let mut out = Vec::new();
            put_uleb(&mut out, v);
            assert_eq!(out.len(), len, "{v}");
        }
    }
}
