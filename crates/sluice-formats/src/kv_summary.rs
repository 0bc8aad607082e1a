//! Segment summaries: the record list of a sealed KV segment, written beside it
//! (`seg-<id>.summary`) when it is sealed.
//!
//! A summary lets a reader learn what a segment holds with one small read instead of one
//! 4 KiB read per slot: the owner at reopen, and other stores that share a directory (the
//! shared tier reads other nodes' summaries to find their blocks). It is only an index:
//! every read still checks the record's own header and payload checksum, so a stale or
//! wrong summary costs a miss, never bytes. A summary that does not decode is ignored and
//! the segment scanned slot by slot instead.
//!
//! Layout, little-endian: a 64-byte header (magic `SKVSUMRY`, version, store id, segment
//! id, block bytes, entry count), the entries (slot u32, key length u16, reserved u16,
//! sequence u64, namespace digest 16 bytes, key), then a 32-byte BLAKE3 of everything
//! before it.

use crate::kv::{KvFormatError, MAX_KEY_BYTES};

const MAGIC: &[u8; 8] = b"SKVSUMRY";
/// The current summary version.
pub const SUMMARY_VERSION: u32 = 1;
const HEADER_BYTES: usize = 64;
const ENTRY_FIXED_BYTES: usize = 32;
const TRAILER_BYTES: usize = 32;

/// One record of a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryEntry {
    pub slot: u32,
    pub seq: u64,
    pub namespace_id: [u8; 16],
    pub key: Vec<u8>,
}

/// The records of one sealed segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentSummary {
    pub store_id: [u8; 16],
    pub segment_id: u64,
    pub block_bytes: u64,
    pub entries: Vec<SummaryEntry>,
}

impl SegmentSummary {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            HEADER_BYTES + self.entries.len() * (ENTRY_FIXED_BYTES + 32) + TRAILER_BYTES,
        );
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&SUMMARY_VERSION.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.store_id);
        out.extend_from_slice(&self.segment_id.to_le_bytes());
        out.extend_from_slice(&self.block_bytes.to_le_bytes());
        out.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        out.resize(HEADER_BYTES, 0);
        for e in &self.entries {
            out.extend_from_slice(&e.slot.to_le_bytes());
            out.extend_from_slice(&(e.key.len() as u16).to_le_bytes());
            out.extend_from_slice(&0u16.to_le_bytes());
            out.extend_from_slice(&e.seq.to_le_bytes());
            out.extend_from_slice(&e.namespace_id);
            out.extend_from_slice(&e.key);
        }
        let sum = blake3::hash(&out);
        out.extend_from_slice(sum.as_bytes());
        out
    }

    /// Decodes a summary file's bytes; every length is checked before it is used.
    pub fn decode(bytes: &[u8]) -> Result<SegmentSummary, KvFormatError> {
        let short = |what, needed| KvFormatError::TooShort {
            what,
            needed,
            got: bytes.len(),
        };
        if bytes.len() < HEADER_BYTES + TRAILER_BYTES {
            return Err(short("segment summary", HEADER_BYTES + TRAILER_BYTES));
        }
        let (body, trailer) = bytes.split_at(bytes.len() - TRAILER_BYTES);
        if &body[..8] != MAGIC {
            return Err(KvFormatError::NoRecord {
                found: body[..8].to_vec(),
            });
        }
        let version = u32_at(body, 8);
        if version != SUMMARY_VERSION {
            return Err(KvFormatError::BadField {
                field: "summary version",
                value: version.into(),
            });
        }
        if blake3::hash(body).as_bytes() != trailer {
            return Err(KvFormatError::RecordChecksum);
        }
        let mut store_id = [0u8; 16];
        store_id.copy_from_slice(&body[16..32]);
        let count = u32_at(body, 48) as usize;
        let mut entries = Vec::with_capacity(count.min(body.len() / ENTRY_FIXED_BYTES));
        let mut at = HEADER_BYTES;
        for _ in 0..count {
            let fixed = body
                .get(at..at + ENTRY_FIXED_BYTES)
                .ok_or_else(|| short("summary entry", at + ENTRY_FIXED_BYTES))?;
            let key_len = u16::from_le_bytes([fixed[4], fixed[5]]) as usize;
            if key_len == 0 || key_len > MAX_KEY_BYTES {
                return Err(KvFormatError::BadField {
                    field: "summary key length",
                    value: key_len as u64,
                });
            }
            let key_at = at + ENTRY_FIXED_BYTES;
            let key = body
                .get(key_at..key_at + key_len)
                .ok_or_else(|| short("summary key", key_at + key_len))?;
            let mut namespace_id = [0u8; 16];
            namespace_id.copy_from_slice(&fixed[16..32]);
            entries.push(SummaryEntry {
                slot: u32_at(fixed, 0),
                seq: u64_at(fixed, 8),
                namespace_id,
                key: key.to_vec(),
            });
            at = key_at + key_len;
        }
        if at != body.len() {
            return Err(KvFormatError::BadField {
                field: "summary trailing bytes",
                value: (body.len() - at) as u64,
            });
        }
        Ok(SegmentSummary {
            store_id,
            segment_id: u64_at(body, 32),
            block_bytes: u64_at(body, 40),
            entries,
        })
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> SegmentSummary {
        SegmentSummary {
            store_id: [7; 16],
            segment_id: 42,
            block_bytes: 2 << 20,
            entries: vec![
                SummaryEntry {
                    slot: 1,
                    seq: 10,
                    namespace_id: [1; 16],
                    key: b"prefix-hash-1".to_vec(),
                },
                SummaryEntry {
                    slot: 3,
                    seq: 12,
                    namespace_id: [2; 16],
                    key: vec![0xAB; MAX_KEY_BYTES],
                },
            ],
        }
    }

    #[test]
    fn a_summary_round_trips() {
        let s = sample();
        assert_eq!(SegmentSummary::decode(&s.encode()).unwrap(), s);
        let empty = SegmentSummary {
            entries: vec![],
            ..sample()
        };
        assert_eq!(SegmentSummary::decode(&empty.encode()).unwrap(), empty);
    }

    #[test]
    fn truncation_and_bit_flips_are_refused() {
        let bytes = sample().encode();
        for cut in 0..bytes.len() {
            assert!(
                SegmentSummary::decode(&bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        for at in (0..bytes.len()).step_by(7) {
            let mut b = bytes.clone();
            b[at] ^= 0x10;
            assert!(SegmentSummary::decode(&b).is_err(), "flip at {at}");
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = SegmentSummary::decode(&bytes);
        }

        #[test]
        fn a_count_that_lies_is_refused_even_with_a_good_checksum(count in 3u32..u32::MAX) {
            let mut bytes = sample().encode();
            bytes.truncate(bytes.len() - TRAILER_BYTES);
            bytes[48..52].copy_from_slice(&count.to_le_bytes());
            let sum = blake3::hash(&bytes);
            bytes.extend_from_slice(sum.as_bytes());
            prop_assert!(SegmentSummary::decode(&bytes).is_err());
        }
    }
}
