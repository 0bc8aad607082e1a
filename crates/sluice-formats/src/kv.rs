//! The on-disk format of `sluice kv`'s segment store: segment headers and block records.
//!
//! A segment is one file of fixed-size slots. Slot 0 holds the [`SegmentHeader`]; every
//! later slot holds one block record: a 4 KiB record header (fixed fields, then the key)
//! followed by the block's bytes, padded to 4 KiB. Because every block of a store has the
//! same size, every slot has the same size too, so a reader finds record `i` at
//! `i * slot_bytes` without reading the ones before it. That is what makes recovery robust
//! to concurrent appends: a hole left by a write that never finished is one bad slot,
//! skipped, not the end of the segment.
//!
//! Trust is layered. The record header carries a 16-byte BLAKE3 of its fixed fields and the
//! key, so a torn or stale header is recognised without touching the payload; it also
//! carries the payload's full BLAKE3, checked on every read (a mismatch is a miss, never
//! bytes). All integers are little-endian. docs/FORMATS.md has the byte tables.
//!
//! This module only encodes and decodes byte slices; the store in `sluice-kv` does the I/O.

use thiserror::Error;

/// Every record header and payload starts on this boundary, so O_DIRECT can read a payload
/// straight into a page-aligned caller buffer.
pub const KV_ALIGN: usize = 4096;
/// Bytes of a record header: the fixed fields, then the key, then zeros.
pub const RECORD_HEADER_BYTES: usize = KV_ALIGN;
/// Bytes of the fixed part of a record header (the key starts here).
pub const RECORD_FIXED_BYTES: usize = 96;
/// The longest key a record can hold: what is left of the header after the fixed fields.
pub const MAX_KEY_BYTES: usize = RECORD_HEADER_BYTES - RECORD_FIXED_BYTES;
/// The current on-disk version of segment headers and records.
pub const KV_FORMAT_VERSION: u32 = 1;

const SEGMENT_MAGIC: &[u8; 8] = b"SLUICEKV";
const RECORD_MAGIC: &[u8; 4] = b"SKVR";
const SEGMENT_FIXED_BYTES: usize = 80;

/// A decoding failure. Offsets are within the slice handed in.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum KvFormatError {
    #[error("not a sluice kv segment (magic {found:02x?})")]
    BadSegmentMagic { found: Vec<u8> },
    #[error("segment format version {found}, this build reads version {KV_FORMAT_VERSION}")]
    UnsupportedVersion { found: u32 },
    #[error("segment header checksum does not match")]
    SegmentChecksum,
    #[error("slot holds no record (magic {found:02x?})")]
    NoRecord { found: Vec<u8> },
    #[error("record header checksum does not match (torn or stale write)")]
    RecordChecksum,
    #[error("record field {field} = {value} is invalid")]
    BadField { field: &'static str, value: u64 },
    #[error("{what} needs {needed} bytes, got {got}")]
    TooShort {
        what: &'static str,
        needed: usize,
        got: usize,
    },
}

/// Rounds `n` up to a multiple of [`KV_ALIGN`], or `None` on overflow.
pub fn align_up(n: u64) -> Option<u64> {
    let a = KV_ALIGN as u64;
    n.checked_add(a - 1).map(|v| v / a * a)
}

/// The slot size of a store whose blocks are `block_bytes` long: header plus padded payload.
pub fn slot_bytes(block_bytes: u64) -> Option<u64> {
    align_up(block_bytes)?.checked_add(RECORD_HEADER_BYTES as u64)
}

/// Slot 0 of every segment file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentHeader {
    /// The store this segment belongs to (a segment copied from another store is refused).
    pub store_id: [u8; 16],
    pub segment_id: u64,
    /// Every block in the store has exactly this many bytes.
    pub block_bytes: u64,
    /// Seconds since the epoch when the segment was created (informational).
    pub created_unix: u64,
}

impl SegmentHeader {
    /// The header as a zero-padded [`KV_ALIGN`]-byte block.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![0u8; KV_ALIGN];
        out[0..8].copy_from_slice(SEGMENT_MAGIC);
        out[8..12].copy_from_slice(&KV_FORMAT_VERSION.to_le_bytes());
        out[16..32].copy_from_slice(&self.store_id);
        out[32..40].copy_from_slice(&self.segment_id.to_le_bytes());
        out[40..48].copy_from_slice(&self.block_bytes.to_le_bytes());
        out[48..56].copy_from_slice(&self.created_unix.to_le_bytes());
        let sum = checksum16(&[&out[..64]]);
        out[64..SEGMENT_FIXED_BYTES].copy_from_slice(&sum);
        out
    }

    /// Decodes slot 0 of a segment.
    pub fn decode(bytes: &[u8]) -> Result<SegmentHeader, KvFormatError> {
        let fixed = bytes
            .get(..SEGMENT_FIXED_BYTES)
            .ok_or(KvFormatError::TooShort {
                what: "segment header",
                needed: SEGMENT_FIXED_BYTES,
                got: bytes.len(),
            })?;
        if &fixed[0..8] != SEGMENT_MAGIC {
            return Err(KvFormatError::BadSegmentMagic {
                found: fixed[0..8].to_vec(),
            });
        }
        let version = u32_at(fixed, 8);
        if version != KV_FORMAT_VERSION {
            return Err(KvFormatError::UnsupportedVersion { found: version });
        }
        if checksum16(&[&fixed[..64]]) != fixed[64..80] {
            return Err(KvFormatError::SegmentChecksum);
        }
        let block_bytes = u64_at(fixed, 40);
        if block_bytes == 0 || slot_bytes(block_bytes).is_none() {
            return Err(KvFormatError::BadField {
                field: "block_bytes",
                value: block_bytes,
            });
        }
        Ok(SegmentHeader {
            store_id: array16(&fixed[16..32]),
            segment_id: u64_at(fixed, 32),
            block_bytes,
            created_unix: u64_at(fixed, 48),
        })
    }
}

/// The header of one block record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordHeader {
    /// The namespace the key lives in (model, dtype, layout, format, salt), as a digest.
    pub namespace_id: [u8; 16],
    /// The store-wide write sequence number: later records of a key win on recovery.
    pub seq: u64,
    pub payload_len: u64,
    /// BLAKE3 of the payload bytes (not the padding).
    pub payload_checksum: [u8; 32],
    /// The engine's key, opaque bytes.
    pub key: Vec<u8>,
}

impl RecordHeader {
    /// Writes the header into `out[..RECORD_HEADER_BYTES]`, zero-filling the rest of it.
    /// Fails when the key is empty or too long, or `out` is short.
    pub fn encode_into(&self, out: &mut [u8]) -> Result<(), KvFormatError> {
        let got = out.len();
        let out = out
            .get_mut(..RECORD_HEADER_BYTES)
            .ok_or(KvFormatError::TooShort {
                what: "record header buffer",
                needed: RECORD_HEADER_BYTES,
                got,
            })?;
        check_key_len(self.key.len())?;
        out.fill(0);
        out[0..4].copy_from_slice(RECORD_MAGIC);
        out[4..6].copy_from_slice(&(KV_FORMAT_VERSION as u16).to_le_bytes());
        out[8..24].copy_from_slice(&self.namespace_id);
        out[24..32].copy_from_slice(&self.seq.to_le_bytes());
        out[32..40].copy_from_slice(&self.payload_len.to_le_bytes());
        out[40..44].copy_from_slice(&(self.key.len() as u32).to_le_bytes());
        out[48..80].copy_from_slice(&self.payload_checksum);
        let key_end = RECORD_FIXED_BYTES + self.key.len();
        out[RECORD_FIXED_BYTES..key_end].copy_from_slice(&self.key);
        let sum = checksum16(&[&out[..80], &self.key]);
        out[80..96].copy_from_slice(&sum);
        Ok(())
    }

    /// Decodes a record header, checking its magic, version, lengths and checksum.
    pub fn decode(bytes: &[u8]) -> Result<RecordHeader, KvFormatError> {
        let head = bytes
            .get(..RECORD_HEADER_BYTES)
            .ok_or(KvFormatError::TooShort {
                what: "record header",
                needed: RECORD_HEADER_BYTES,
                got: bytes.len(),
            })?;
        if &head[0..4] != RECORD_MAGIC {
            return Err(KvFormatError::NoRecord {
                found: head[0..4].to_vec(),
            });
        }
        let version = u16::from_le_bytes([head[4], head[5]]) as u32;
        if version != KV_FORMAT_VERSION {
            return Err(KvFormatError::UnsupportedVersion { found: version });
        }
        let key_len = u32_at(head, 40) as usize;
        check_key_len(key_len)?;
        let key = head[RECORD_FIXED_BYTES..RECORD_FIXED_BYTES + key_len].to_vec();
        if checksum16(&[&head[..80], &key]) != head[80..96] {
            return Err(KvFormatError::RecordChecksum);
        }
        let mut payload_checksum = [0u8; 32];
        payload_checksum.copy_from_slice(&head[48..80]);
        Ok(RecordHeader {
            namespace_id: array16(&head[8..24]),
            seq: u64_at(head, 24),
            payload_len: u64_at(head, 32),
            payload_checksum,
            key,
        })
    }
}

/// BLAKE3 of a block's bytes, as stored in its record.
pub fn payload_checksum(payload: &[u8]) -> [u8; 32] {
    *blake3::hash(payload).as_bytes()
}

fn check_key_len(len: usize) -> Result<(), KvFormatError> {
    if len == 0 || len > MAX_KEY_BYTES {
        return Err(KvFormatError::BadField {
            field: "key_len",
            value: len as u64,
        });
    }
    Ok(())
}

fn checksum16(parts: &[&[u8]]) -> [u8; 16] {
    let mut h = blake3::Hasher::new();
    for p in parts {
        h.update(p);
    }
    array16(&h.finalize().as_bytes()[..16])
}

fn array16(b: &[u8]) -> [u8; 16] {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[..16]);
    a
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(
        b[at..at + 4]
            .try_into()
            .expect("4-byte range of a checked slice"),
    )
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(
        b[at..at + 8]
            .try_into()
            .expect("8-byte range of a checked slice"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: &[u8]) -> RecordHeader {
        RecordHeader {
            namespace_id: [7; 16],
            seq: 42,
            payload_len: 2 << 20,
            payload_checksum: payload_checksum(b"abc"),
            key: key.to_vec(),
        }
    }

    #[test]
    fn record_headers_round_trip() {
        let mut buf = vec![0xAAu8; RECORD_HEADER_BYTES];
        let r = record(b"block-hash-0001");
        r.encode_into(&mut buf).unwrap();
        assert_eq!(RecordHeader::decode(&buf).unwrap(), r);
    }

    #[test]
    fn a_flipped_bit_anywhere_in_the_fixed_fields_or_key_is_refused() {
        let mut buf = vec![0u8; RECORD_HEADER_BYTES];
        record(b"k").encode_into(&mut buf).unwrap();
        for byte in 0..RECORD_FIXED_BYTES + 1 {
            let mut bad = buf.clone();
            bad[byte] ^= 0x10;
            assert!(
                RecordHeader::decode(&bad).is_err(),
                "flip at byte {byte} accepted"
            );
        }
    }

    #[test]
    fn keys_that_are_empty_or_too_long_are_refused() {
        let mut buf = vec![0u8; RECORD_HEADER_BYTES];
        assert!(record(b"").encode_into(&mut buf).is_err());
        assert!(record(&vec![1; MAX_KEY_BYTES + 1])
            .encode_into(&mut buf)
            .is_err());
        record(&vec![1; MAX_KEY_BYTES])
            .encode_into(&mut buf)
            .unwrap();
    }

    #[test]
    fn a_zeroed_slot_is_no_record() {
        let err = RecordHeader::decode(&[0u8; RECORD_HEADER_BYTES]).unwrap_err();
        assert!(matches!(err, KvFormatError::NoRecord { .. }));
    }

    #[test]
    fn segment_headers_round_trip_and_reject_damage() {
        let h = SegmentHeader {
            store_id: [3; 16],
            segment_id: 9,
            block_bytes: 256 << 10,
            created_unix: 1,
        };
        let buf = h.encode();
        assert_eq!(SegmentHeader::decode(&buf).unwrap(), h);
        let mut bad = buf.clone();
        bad[33] ^= 1;
        assert_eq!(
            SegmentHeader::decode(&bad),
            Err(KvFormatError::SegmentChecksum)
        );
        let mut other = buf;
        other[0] = b'X';
        assert!(matches!(
            SegmentHeader::decode(&other),
            Err(KvFormatError::BadSegmentMagic { .. })
        ));
    }

    #[test]
    fn slot_sizes_round_up_and_never_overflow() {
        assert_eq!(slot_bytes(1), Some(8192));
        assert_eq!(slot_bytes(4096), Some(8192));
        assert_eq!(slot_bytes(2 << 20), Some((2 << 20) + 4096));
        assert_eq!(slot_bytes(u64::MAX), None);
    }

    proptest::proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(0u8..=255, 0..5000)) {
            let _ = RecordHeader::decode(&bytes);
            let _ = SegmentHeader::decode(&bytes);
        }
    }
}
