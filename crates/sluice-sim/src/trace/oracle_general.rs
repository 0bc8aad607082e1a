//! libCacheSim's oracleGeneral binary trace format.
//!
//! A file is a plain array of packed little-endian 24-byte records, no
//! header:
//!
//! | offset | type  | field               |
//! |--------|-------|---------------------|
//! | 0      | `u32` | `clock_time` (s)    |
//! | 4      | `u64` | `obj_id`            |
//! | 12     | `u32` | `obj_size` (bytes)  |
//! | 16     | `i64` | `next_access_vtime` |
//!
//! `next_access_vtime` is the **1-based** position in the file of the next
//! request for the same object, or `-1` when there is none. libCacheSim's
//! converter writes it so (it counts requests from 1), and its reader also
//! takes `INT64_MAX` for "never", which its Python binding uses. Our
//! [`Record::next_access`] is the 0-based position, [`NEVER`] for none: the
//! reader subtracts one and the writer adds one, so a file we write gives
//! libCacheSim's Belady the same ordering of next uses as ours.
//!
//! The stored `next_access_vtime`s are not trusted. libCacheSim replays
//! them as they are, so a file whose fields are wrong (a buggy converter, a
//! trace cut from a longer one) gives a wrong optimum there. Here the oracles
//! replay next accesses computed from the ids (see [`crate::trace`]); the
//! reader keeps the stored ones only so that computing them can count where
//! the file was wrong. A field that cannot be a next position at all (at or
//! before its own record, or negative other than `-1`) is still an error
//! naming the record: such a file is damaged or not oracleGeneral, and
//! `--format auto` takes any unknown extension for oracleGeneral. One past
//! the end of the file is taken (and counted as wrong): that is what a
//! trace cut from a longer one holds.
//!
//! Records of size 0 are skipped, as libCacheSim's reader does by default.
//! Their positions still count in the file's `next_access_vtime`s, so when a
//! file holds any, the stored fields are not compared with the computed ones.
//!
//! Reading decodes the file in 8 MiB pieces with `chunks_exact(24)`: a
//! sequential read and a branch-light loop, without a second in-memory
//! copy of the file.

use std::path::{Path, PathBuf};

use sluice_policy::NEVER;

use crate::error::SimError;
use crate::trace::{NextAccess, Record, Trace};

/// Bytes of one record.
pub const RECORD_BYTES: usize = 24;

/// First bytes of a zstd frame: libCacheSim's traces are often shipped
/// compressed, and saying so beats a layout error.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// Reads an oracleGeneral file.
///
/// The file is read in 8 MiB pieces decoded as they arrive, so memory holds
/// the decoded records and one piece, not a second copy of the file.
pub fn read(path: &Path) -> Result<Trace, SimError> {
    let name = path.display().to_string();
    let io_error = |source| SimError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = sluice_engine::open_regular(path, 0).map_err(io_error)?;
    let len = file.metadata().map_err(io_error)?.len();
    let len = usize::try_from(len).map_err(|_| SimError::BadTrace {
        path: path.to_path_buf(),
        message: format!("{len} bytes does not fit this machine's memory"),
    })?;
    let mut buf = vec![0u8; PIECE_RECORDS * RECORD_BYTES];
    let first = fill(&mut file, &mut buf).map_err(io_error)?;
    check_magic(&buf[..first], &name)?;
    check_length(len, &name)?;
    let mut decoder = Decoder::new(len / RECORD_BYTES, &name);
    let mut got = first;
    let mut seen = 0usize;
    loop {
        if got % RECORD_BYTES != 0 || seen + got > len {
            // The file changed size while we read it.
            return Err(SimError::BadTrace {
                path: path.to_path_buf(),
                message: format!("the file changed while being read (expected {len} bytes)"),
            });
        }
        decoder.feed(&buf[..got])?;
        seen += got;
        if got < buf.len() {
            break;
        }
        got = fill(&mut file, &mut buf).map_err(io_error)?;
        if got == 0 {
            break;
        }
    }
    if seen != len {
        return Err(SimError::BadTrace {
            path: path.to_path_buf(),
            message: format!("the file changed while being read: {seen} of {len} bytes"),
        });
    }
    Ok(decoder.finish())
}

/// Records decoded per piece of [`read`]: 8 MiB.
const PIECE_RECORDS: usize = 349_525;

/// Reads until `buf` is full or the file ends; returns the bytes read.
fn fill(file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    use std::io::Read;
    let mut got = 0;
    while got < buf.len() {
        match file.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Decodes oracleGeneral bytes; `name` is the trace's name and the path in
/// errors. An empty input is an empty trace.
pub fn parse(bytes: &[u8], name: &str) -> Result<Trace, SimError> {
    check_magic(bytes, name)?;
    check_length(bytes.len(), name)?;
    let mut decoder = Decoder::new(bytes.len() / RECORD_BYTES, name);
    decoder.feed(bytes)?;
    Ok(decoder.finish())
}

/// Turns whole records into [`Record`]s, piece by piece.
struct Decoder<'a> {
    name: &'a str,
    /// Records decoded so far (skipped ones included).
    index: u64,
    skipped: u64,
    records: Vec<Record>,
}

impl<'a> Decoder<'a> {
    fn new(total: usize, name: &'a str) -> Decoder<'a> {
        Decoder {
            name,
            index: 0,
            skipped: 0,
            records: Vec::with_capacity(total),
        }
    }

    /// Decodes `bytes`, a whole number of records.
    fn feed(&mut self, bytes: &[u8]) -> Result<(), SimError> {
        for chunk in bytes.chunks_exact(RECORD_BYTES) {
            let raw = RawRecord::decode(chunk);
            let next_access = next_access(raw.next_vtime, self.index, self.name)?;
            self.index += 1;
            if raw.size == 0 {
                self.skipped += 1;
                continue;
            }
            self.records.push(Record {
                time: u64::from(raw.time),
                id: raw.id,
                size: u64::from(raw.size),
                next_access,
            });
        }
        Ok(())
    }

    fn finish(self) -> Trace {
        let next_access = if self.skipped > 0 {
            // The stored positions count the skipped records: not comparable.
            tracing::debug!(
                trace = self.name,
                skipped = self.skipped,
                "skipped zero-size records"
            );
            NextAccess::Missing
        } else {
            NextAccess::Stored
        };
        Trace {
            name: self.name.to_string(),
            records: self.records,
            request_starts: Vec::new(),
            next_access,
        }
    }
}

/// Writes `trace` as oracleGeneral, computing every `next_access_vtime` from
/// the ids (whatever the records' `next_access` hold).
pub fn write(trace: &Trace, path: &Path) -> Result<(), SimError> {
    let bytes = encode(trace, path)?;
    crate::atomic::write_file(path, |out| out.write_all(&bytes))
}

/// The bytes [`write`] puts in a file. `path` only names the destination in
/// errors: a time or size that does not fit 32 bits, or a size of 0 (which
/// every reader would drop), fails with the 1-based record number.
pub fn encode(trace: &Trace, path: &Path) -> Result<Vec<u8>, SimError> {
    let next = next_positions(&trace.records);
    let mut out = Vec::with_capacity(trace.records.len() * RECORD_BYTES);
    for (index, (record, next)) in trace.records.iter().zip(next).enumerate() {
        let field_error = |field: &str, message: String| SimError::BadField {
            path: path.to_path_buf(),
            line: index as u64 + 1,
            field: field.to_string(),
            message,
        };
        let time = u32::try_from(record.time)
            .map_err(|_| field_error("clock_time", format!("{} does not fit u32", record.time)))?;
        let size = match u32::try_from(record.size) {
            Ok(0) => {
                return Err(field_error(
                    "obj_size",
                    "0 would be skipped by readers".into(),
                ))
            }
            Ok(size) => size,
            Err(_) => {
                let message = format!("{} does not fit u32 (4 GiB - 1 at most)", record.size);
                return Err(field_error("obj_size", message));
            }
        };
        out.extend_from_slice(&time.to_le_bytes());
        out.extend_from_slice(&record.id.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&next.to_le_bytes());
    }
    Ok(out)
}

/// One record as stored.
struct RawRecord {
    time: u32,
    id: u64,
    size: u32,
    next_vtime: i64,
}

impl RawRecord {
    /// Decodes one `chunks_exact(RECORD_BYTES)` chunk.
    fn decode(chunk: &[u8]) -> RawRecord {
        let rec: &[u8; RECORD_BYTES] = chunk.try_into().expect("chunks_exact yields whole records");
        // Fixed ranges of a fixed-size array: the conversions cannot fail
        // and compile to plain loads.
        let four = |at: usize| -> [u8; 4] { rec[at..at + 4].try_into().expect("4 bytes") };
        let eight = |at: usize| -> [u8; 8] { rec[at..at + 8].try_into().expect("8 bytes") };
        RawRecord {
            time: u32::from_le_bytes(four(0)),
            id: u64::from_le_bytes(eight(4)),
            size: u32::from_le_bytes(four(12)),
            next_vtime: i64::from_le_bytes(eight(16)),
        }
    }
}

fn check_magic(head: &[u8], name: &str) -> Result<(), SimError> {
    if head.starts_with(&ZSTD_MAGIC) {
        return Err(SimError::BadTrace {
            path: PathBuf::from(name),
            message: "zstd-compressed; decompress it first (zstd -d)".into(),
        });
    }
    Ok(())
}

fn check_length(len: usize, name: &str) -> Result<(), SimError> {
    let trailing = len % RECORD_BYTES;
    if trailing != 0 {
        return Err(SimError::BadTrace {
            path: PathBuf::from(name),
            message: format!(
                "{len} bytes is not a whole number of {RECORD_BYTES}-byte oracleGeneral records: \
                 {trailing} trailing bytes (truncated, or not an oracleGeneral file)"
            ),
        });
    }
    Ok(())
}

/// Translates the stored 1-based `next_vtime` of the record at 0-based
/// `index` into a 0-based position, rejecting values that point at or before
/// the record itself. A position past the end of the file is kept as it is
/// (it cannot match a computed one, so it counts as wrong).
fn next_access(next_vtime: i64, index: u64, name: &str) -> Result<u64, SimError> {
    if next_vtime == -1 || next_vtime == i64::MAX {
        return Ok(NEVER);
    }
    match u64::try_from(next_vtime) {
        Ok(v) if v > index + 1 => Ok(v - 1),
        _ => Err(SimError::BadField {
            path: PathBuf::from(name),
            line: index + 1,
            field: "next_access_vtime".into(),
            message: format!(
                "{next_vtime} points backwards: the next access of record {} must come after it \
                 (1-based; -1 means never)",
                index + 1
            ),
        }),
    }
}

/// The `next_access_vtime` to store for each record: the 1-based position of
/// the next record with the same id, or -1.
fn next_positions(records: &[Record]) -> Vec<i64> {
    let mut next_seen = sluice_policy::id_map::id_map_with_capacity::<i64>(1024);
    let mut next = vec![-1i64; records.len()];
    for (i, record) in records.iter().enumerate().rev() {
        // Positions are below the record count, which fits i64 on any
        // machine that holds the records.
        let one_based = i as i64 + 1;
        next[i] = next_seen.insert(record.id, one_based).unwrap_or(-1);
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(time: u32, id: u64, size: u32, next: i64) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&time.to_le_bytes());
        b.extend_from_slice(&id.to_le_bytes());
        b.extend_from_slice(&size.to_le_bytes());
        b.extend_from_slice(&next.to_le_bytes());
        b
    }

    fn file(records: &[(u32, u64, u32, i64)]) -> Vec<u8> {
        records
            .iter()
            .flat_map(|&(t, id, sz, nx)| raw(t, id, sz, nx))
            .collect()
    }

    fn trace_of(ids: &[u64]) -> Trace {
        Trace {
            name: "t".into(),
            records: ids
                .iter()
                .enumerate()
                .map(|(i, &id)| Record {
                    time: i as u64,
                    id,
                    size: 100 + id % 1000,
                    next_access: 0,
                })
                .collect(),
            ..Trace::default()
        }
    }

    #[test]
    fn stored_next_access_is_one_based_and_minus_one_is_never() {
        let bytes = file(&[(0, 7, 10, 3), (1, 8, 10, -1), (2, 7, 10, i64::MAX)]);
        let t = parse(&bytes, "x").unwrap();
        let next: Vec<u64> = t.records.iter().map(|r| r.next_access).collect();
        assert_eq!(next, [2, NEVER, NEVER]);
        assert_eq!(t.next_access, NextAccess::Stored);
        assert!(!t.has_next_access(), "stored fields are not trusted");
    }

    #[test]
    fn wrong_stored_next_accesses_are_replaced_and_counted() {
        // Record 1's object is next requested at record 3, not 2; record 2's
        // points past the end of a trace cut from a longer one.
        let bytes = file(&[(0, 7, 10, 2), (1, 8, 10, 9), (2, 7, 10, -1)]);
        let mut t = parse(&bytes, "x").unwrap();
        let check = t.fill_next_access();
        let next: Vec<u64> = t.records.iter().map(|r| r.next_access).collect();
        assert_eq!(next, [2, NEVER, NEVER]);
        assert_eq!((check.records, check.disagreed), (3, 2));
        assert_eq!(
            check.first.unwrap().to_string(),
            "record 1 stored its next request at record 2, the trace has it at record 3"
        );
    }

    #[test]
    fn encode_writes_one_based_positions_and_minus_one() {
        let bytes = encode(&trace_of(&[1, 2, 1]), Path::new("o")).unwrap();
        let nexts: Vec<i64> = bytes
            .chunks_exact(RECORD_BYTES)
            .map(|c| RawRecord::decode(c).next_vtime)
            .collect();
        assert_eq!(nexts, [3, -1, -1]);
    }

    #[test]
    fn write_then_read_round_trips_records_and_next_access() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.oracleGeneral.bin");
        let mut original = trace_of(&[5, 6, 5, 7, 6, 5, u64::MAX]);
        original.records[3].size = u64::from(u32::MAX);
        write(&original, &path).unwrap();
        let mut back = read(&path).unwrap();
        original.fill_next_access();
        assert_eq!(back.records, original.records);
        assert_eq!(back.fill_next_access().disagreed, 0);
    }

    #[test]
    fn reading_a_file_of_several_pieces_matches_parsing_its_bytes() {
        // More records than one 8 MiB piece, with a zero-size record in the
        // second piece and an error-free next-access chain across pieces.
        let n = PIECE_RECORDS as u64 + 1_000;
        let mut bytes = Vec::with_capacity(n as usize * RECORD_BYTES);
        for i in 0..n {
            let id = i % 5_000;
            let next = if i + 5_000 < n {
                (i + 5_000 + 1) as i64
            } else {
                -1
            };
            let size = if i == PIECE_RECORDS as u64 + 10 {
                0
            } else {
                1 + (id % 7) as u32
            };
            bytes.extend(raw(i as u32, id, size, next));
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.oracleGeneral");
        std::fs::write(&path, &bytes).unwrap();
        let read_back = read(&path).unwrap();
        let parsed = parse(&bytes, &path.display().to_string()).unwrap();
        assert_eq!(read_back.records.len(), n as usize - 1);
        assert_eq!(read_back.records, parsed.records);
        assert_eq!(
            read_back.records[PIECE_RECORDS + 10].id,
            (PIECE_RECORDS as u64 + 11) % 5_000
        );
        // Truncating the file by a few bytes is named, whatever the piece.
        std::fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
        let err = read(&path).unwrap_err();
        assert!(err.to_string().contains("19 trailing bytes"), "{err}");
    }

    #[test]
    fn zero_size_records_are_skipped_and_next_access_recomputed() {
        // Record 2 (size 0) is where record 1's stored next access points.
        let bytes = file(&[(0, 1, 10, 2), (1, 1, 0, 3), (2, 1, 10, -1)]);
        let mut t = parse(&bytes, "x").unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t.next_access, NextAccess::Missing);
        assert_eq!(t.fill_next_access().disagreed, 0, "not comparable");
        assert_eq!(t.records[0].next_access, 1);
        assert_eq!(t.records[1].next_access, NEVER);
    }

    #[test]
    fn empty_file_is_an_empty_trace() {
        let t = parse(&[], "x").unwrap();
        assert!(t.is_empty());
    }

    #[test]
    fn truncated_file_names_the_trailing_bytes() {
        let mut bytes = file(&[(0, 1, 10, -1)]);
        bytes.extend_from_slice(&[0; 5]);
        let err = parse(&bytes, "t.bin").unwrap_err().to_string();
        assert!(err.starts_with("t.bin: 29 bytes"), "{err}");
        assert!(err.contains("5 trailing bytes"), "{err}");
    }

    #[test]
    fn zstd_input_is_named_as_such() {
        let mut bytes = ZSTD_MAGIC.to_vec();
        bytes.resize(48, 0);
        let err = parse(&bytes, "t.zst").unwrap_err().to_string();
        assert!(err.contains("zstd"), "{err}");
    }

    #[test]
    fn backward_next_access_names_the_record() {
        let bytes = file(&[(0, 1, 10, 2), (1, 1, 10, 1)]);
        let err = parse(&bytes, "t.bin").unwrap_err();
        assert!(matches!(err, SimError::BadField { line: 2, .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.starts_with("t.bin:2: field next_access_vtime: 1 points backwards"),
            "{text}"
        );
    }

    #[test]
    fn next_access_pointing_at_itself_or_zero_is_backwards() {
        for bad in [0, 1, -2] {
            let bytes = file(&[(0, 1, 10, bad), (1, 1, 10, -1)]);
            let err = parse(&bytes, "t").unwrap_err().to_string();
            assert!(err.contains("points backwards"), "{bad}: {err}");
        }
    }

    #[test]
    fn encode_rejects_sizes_and_times_over_32_bits() {
        let mut t = trace_of(&[1, 2]);
        t.records[1].size = u64::from(u32::MAX) + 1;
        let err = encode(&t, Path::new("o")).unwrap_err().to_string();
        assert!(
            err.starts_with("o:2: field obj_size: 4294967296 does not fit u32"),
            "{err}"
        );
        let mut t = trace_of(&[1]);
        t.records[0].time = u64::from(u32::MAX) + 1;
        assert!(encode(&t, Path::new("o")).is_err());
    }

    #[test]
    fn encode_rejects_zero_sizes() {
        let mut t = trace_of(&[1]);
        t.records[0].size = 0;
        let err = encode(&t, Path::new("o")).unwrap_err().to_string();
        assert!(err.contains("obj_size: 0 would be skipped"), "{err}");
    }

    #[test]
    fn missing_file_is_an_io_error_naming_it() {
        let err = read(Path::new("/nonexistent/x.bin")).unwrap_err();
        assert!(matches!(err, SimError::Io { .. }));
        assert!(err.to_string().starts_with("/nonexistent/x.bin"));
    }
}
