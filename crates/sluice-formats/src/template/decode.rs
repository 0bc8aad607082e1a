//! Reading a `.sluicetpl` template from bytes nobody vouches for.
//!
//! Decoding runs in three passes (see the module documentation of `template`): the
//! structure into raw entries that remember where they start, then the checksum, then the
//! meaning. The raw entries keep their byte offsets so that a problem of meaning found on
//! the finished [`Template`] (by [`Template::validate`], the same check writers run) can
//! still say where in the input the entry at fault lies.

use super::cursor::Cursor;
use super::encode::{delta_base, unzigzag};
use super::error::{Field, InvalidTemplate, TemplateFormatError};
use super::model::{Template, TemplateFile, TemplateRange, WorkerSequence};
use super::service_id::ServiceId;
use super::{CHECKSUM_BYTES, MAGIC, SERVICE_BYTES, VERSION};

/// Fewest bytes one file-table entry takes (three one-byte LEB128s).
const MIN_FILE_BYTES: usize = 3;
/// Fewest bytes one worker entry takes (number and range count).
const MIN_WORKER_BYTES: usize = 2;
/// Fewest bytes one range takes (file, offset delta, length).
const MIN_RANGE_BYTES: usize = 3;

impl Template {
    /// Decodes a `.sluicetpl` file's bytes. Every malformed input is a
    /// [`TemplateFormatError`] saying what is wrong and at which byte; nothing panics or
    /// allocates more than the input could describe. A template that decodes passes
    /// [`Template::validate`], and [`Template::encode`] gives bytes that decode to it again:
    /// the input's own bytes, unless it spelled an integer with more LEB128 bytes than needed.
    pub fn decode(bytes: &[u8]) -> Result<Template, TemplateFormatError> {
        let mut cur = Cursor::new(bytes);
        check_header(&mut cur)?;
        let service = cur.array::<SERVICE_BYTES>(Field::Service)?;
        let spec_len = cur.uleb(Field::SpecLen)?;
        let spec_at = cur.pos();
        let spec = cur.take(spec_len, Field::Spec)?;
        let files_at = cur.pos();
        let files = read_files(&mut cur)?;
        let workers = read_workers(&mut cur)?;
        check_trailer(&mut cur)?;
        let spec = std::str::from_utf8(spec)
            .map_err(|_| TemplateFormatError::SpecNotUtf8 { offset: spec_at })?;
        let offsets = EntryOffsets::of(&files, &workers);
        let template = Template {
            service: ServiceId(service),
            spec: spec.to_string(),
            files: convert_files(files, files_at)?,
            workers: convert_workers(workers, offsets.files.len())?,
        };
        template
            .validate()
            .map_err(|problem| TemplateFormatError::Invalid {
                offset: offsets.locate(&template, &problem),
                problem,
            })?;
        Ok(template)
    }
}

fn check_header(cur: &mut Cursor<'_>) -> Result<(), TemplateFormatError> {
    let Ok(magic) = cur.take(MAGIC.len() as u64, Field::Magic) else {
        return Err(short_input(cur));
    };
    if magic != MAGIC {
        return Err(TemplateFormatError::NoMagic);
    }
    let version = cur.u16(Field::Version)?;
    if version != VERSION {
        return Err(TemplateFormatError::UnsupportedVersion { version });
    }
    let flags = cur.u16(Field::Flags)?;
    if flags != 0 {
        return Err(TemplateFormatError::UnknownFlags { flags });
    }
    Ok(())
}

/// What an input shorter than the magic is: nothing, a cut template, or something else.
fn short_input(cur: &mut Cursor<'_>) -> TemplateFormatError {
    let len = cur.remaining();
    match cur.take(len as u64, Field::Magic) {
        Ok([]) => TemplateFormatError::Empty,
        Ok(bytes) if MAGIC.starts_with(bytes) => TemplateFormatError::TruncatedMagic { len },
        _ => TemplateFormatError::NoMagic,
    }
}

/// The checksum trailer: present, last, and matching the bytes before it.
fn check_trailer(cur: &mut Cursor<'_>) -> Result<(), TemplateFormatError> {
    let body = cur.consumed();
    let stored = cur.array::<CHECKSUM_BYTES>(Field::Checksum)?;
    if cur.remaining() > 0 {
        return Err(TemplateFormatError::TrailingBytes {
            offset: cur.pos(),
            count: cur.remaining(),
        });
    }
    let computed = *blake3::hash(body).as_bytes();
    if computed != stored {
        return Err(TemplateFormatError::ChecksumMismatch { stored, computed });
    }
    Ok(())
}

/// A file-table entry before its path is checked.
struct RawFile<'a> {
    /// Byte offset of the entry.
    at: usize,
    path: &'a [u8],
    size: u64,
    mtime_ns: i64,
}

/// A worker entry before its numbers are narrowed to u32.
struct RawWorker {
    at: usize,
    worker: u64,
    ranges: Vec<RawRange>,
}

struct RawRange {
    at: usize,
    file: u64,
    /// Absolute: the delta is already applied.
    offset: u64,
    len: u64,
}

fn read_files<'a>(cur: &mut Cursor<'a>) -> Result<Vec<RawFile<'a>>, TemplateFormatError> {
    let count = cur.count(Field::FileCount, MIN_FILE_BYTES)?;
    let mut files = Vec::with_capacity(count);
    for file in 0..count {
        let at = cur.pos();
        let path_len = cur.uleb(Field::PathLen { file })?;
        let path = cur.take(path_len, Field::Path { file })?;
        let size = cur.uleb(Field::Size { file })?;
        let mtime_ns = unzigzag(cur.uleb(Field::Mtime { file })?);
        files.push(RawFile {
            at,
            path,
            size,
            mtime_ns,
        });
    }
    Ok(files)
}

fn read_workers(cur: &mut Cursor<'_>) -> Result<Vec<RawWorker>, TemplateFormatError> {
    let count = cur.count(Field::WorkerCount, MIN_WORKER_BYTES)?;
    let mut workers = Vec::with_capacity(count);
    for entry in 0..count {
        let at = cur.pos();
        let worker = cur.uleb(Field::Worker { entry })?;
        let range_count = cur.count(Field::RangeCount { worker }, MIN_RANGE_BYTES)?;
        let mut ranges = Vec::with_capacity(range_count);
        let mut previous: Option<(u64, u64)> = None;
        for range in 0..range_count {
            let at = cur.pos();
            let file = cur.uleb(Field::RangeFile { worker, range })?;
            let delta = unzigzag(cur.uleb(Field::RangeOffset { worker, range })?);
            let len = cur.uleb(Field::RangeLen { worker, range })?;
            let offset = delta_base(previous, file).wrapping_add(delta as u64);
            ranges.push(RawRange {
                at,
                file,
                offset,
                len,
            });
            previous = Some((file, offset.saturating_add(len)));
        }
        workers.push(RawWorker { at, worker, ranges });
    }
    Ok(workers)
}

fn convert_files(
    files: Vec<RawFile<'_>>,
    count_at: usize,
) -> Result<Vec<TemplateFile>, TemplateFormatError> {
    if files.len() as u64 > u64::from(u32::MAX) + 1 {
        return Err(TemplateFormatError::TooManyFiles {
            offset: count_at,
            count: files.len(),
        });
    }
    let mut out = Vec::with_capacity(files.len());
    for (file, raw) in files.into_iter().enumerate() {
        let path = std::str::from_utf8(raw.path).map_err(|_| TemplateFormatError::PathNotUtf8 {
            file,
            offset: raw.at,
            path: raw.path.to_vec(),
        })?;
        out.push(TemplateFile {
            path: path.to_string(),
            size: raw.size,
            mtime_ns: raw.mtime_ns,
        });
    }
    Ok(out)
}

fn convert_workers(
    workers: Vec<RawWorker>,
    files: usize,
) -> Result<Vec<WorkerSequence>, TemplateFormatError> {
    let mut out = Vec::with_capacity(workers.len());
    for (entry, raw) in workers.into_iter().enumerate() {
        let worker =
            u32::try_from(raw.worker).map_err(|_| TemplateFormatError::WorkerTooLarge {
                entry,
                offset: raw.at,
                worker: raw.worker,
            })?;
        let mut ranges = Vec::with_capacity(raw.ranges.len());
        for (range, r) in raw.ranges.into_iter().enumerate() {
            let file = u32::try_from(r.file).map_err(|_| TemplateFormatError::Invalid {
                offset: r.at,
                problem: InvalidTemplate::FileIndexOutOfRange {
                    worker,
                    range,
                    file: r.file,
                    files,
                },
            })?;
            ranges.push(TemplateRange {
                file,
                offset: r.offset,
                len: r.len,
            });
        }
        out.push(WorkerSequence { worker, ranges });
    }
    Ok(out)
}

/// Where each entry of a decoded template starts in its input.
struct EntryOffsets {
    files: Vec<usize>,
    workers: Vec<usize>,
    /// Per worker entry, per range.
    ranges: Vec<Vec<usize>>,
}

impl EntryOffsets {
    fn of(files: &[RawFile<'_>], workers: &[RawWorker]) -> EntryOffsets {
        EntryOffsets {
            files: files.iter().map(|f| f.at).collect(),
            workers: workers.iter().map(|w| w.at).collect(),
            ranges: workers
                .iter()
                .map(|w| w.ranges.iter().map(|r| r.at).collect())
                .collect(),
        }
    }

    /// The offset of the entry `problem` is about (0 if it names none, which a problem
    /// found on `template` cannot).
    fn locate(&self, template: &Template, problem: &InvalidTemplate) -> usize {
        let found = match *problem {
            InvalidTemplate::UnsafePath { file, .. } => self.files.get(file),
            InvalidTemplate::WorkersOutOfOrder { entry, .. } => self.workers.get(entry),
            InvalidTemplate::FileIndexOutOfRange { worker, range, .. }
            | InvalidTemplate::EmptyRange { worker, range }
            | InvalidTemplate::RangeBeyondFile { worker, range, .. } => template
                .workers
                .iter()
                .position(|w| w.worker == worker)
                .and_then(|entry| self.ranges.get(entry)?.get(range)),
        };
        found.copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::super::encode::{put_bytes, put_uleb};
    use super::super::fixtures::{body_start, range, sample, sealed};
    use super::super::path::UnsafePathReason;
    use super::super::HEADER_BYTES;
    use super::*;

    fn decode_error(bytes: &[u8]) -> TemplateFormatError {
        match Template::decode(bytes) {
            Err(err) => err,
            Ok(t) => panic!("expected an error, decoded {t:?}"),
        }
    }

    fn message(bytes: &[u8]) -> String {
        decode_error(bytes).to_string()
    }

    #[test]
    fn rejects_files_that_are_not_templates() {
        assert_eq!(decode_error(b""), TemplateFormatError::Empty);
        assert!(message(b"").contains("not a Sluice template"));
        assert!(message(b"PK\x03\x04 a zip file").contains("not a Sluice template"));
        assert!(message(b"PK").contains("not a Sluice template"));
        assert_eq!(
            decode_error(b"SLT"),
            TemplateFormatError::TruncatedMagic { len: 3 }
        );
        assert!(message(b"SLT").contains("truncated at magic"));
    }

    #[test]
    fn rejects_unknown_versions_and_flags() {
        let mut bytes = sample().encode();
        bytes[6] = 2;
        let err = message(&bytes);
        assert!(err.contains("version 2 is not supported"), "{err}");
        let mut bytes = sample().encode();
        bytes[8] = 1;
        assert_eq!(
            decode_error(&bytes),
            TemplateFormatError::UnknownFlags { flags: 1 }
        );
        let err = message(&bytes);
        assert!(err.contains("unknown flags 0x0001"), "{err}");
    }

    #[test]
    fn a_flipped_byte_is_a_checksum_mismatch() {
        let bytes = sample().encode();
        let spec_at = HEADER_BYTES + SERVICE_BYTES + 1;
        for at in [HEADER_BYTES, spec_at, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[at] ^= 0x20;
            let err = message(&bad);
            assert!(err.contains("checksum mismatch"), "byte {at}: {err}");
        }
    }

    #[test]
    fn every_flipped_byte_is_rejected_without_panicking() {
        let bytes = sample().encode();
        for at in 0..bytes.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut bad = bytes.clone();
                bad[at] ^= flip;
                assert!(
                    Template::decode(&bad).is_err(),
                    "byte {at} ^ {flip:#x} accepted"
                );
            }
        }
    }

    #[test]
    fn every_truncation_is_rejected_without_panicking() {
        let bytes = sample().encode();
        for len in 0..bytes.len() {
            let err = message(&bytes[..len]);
            let explained = ["truncated", "cannot fit", "not a Sluice template"];
            assert!(
                explained.iter().any(|e| err.contains(e)),
                "cut at {len}: {err}"
            );
        }
        let spec_at = HEADER_BYTES + SERVICE_BYTES + 3;
        assert!(message(&bytes[..spec_at]).contains("truncated at spec"));
        let err = message(&bytes[..bytes.len() - 1]);
        assert!(err.contains("truncated at checksum trailer"), "{err}");
    }

    #[test]
    fn a_truncation_names_the_field_and_where_it_starts() {
        let bytes = sample().encode();
        let cut = HEADER_BYTES + SERVICE_BYTES + 3;
        assert_eq!(
            decode_error(&bytes[..cut]),
            TemplateFormatError::FieldPastEnd {
                field: Field::Spec,
                offset: HEADER_BYTES + SERVICE_BYTES + 1,
                needed: 15,
                input_len: cut
            }
        );
    }

    #[test]
    fn rejects_bytes_after_the_checksum() {
        let mut bytes = sample().encode();
        bytes.push(0);
        assert!(message(&bytes).contains("1 bytes after the checksum"));
        assert_eq!(
            decode_error(&bytes),
            TemplateFormatError::TrailingBytes {
                offset: bytes.len() - 1,
                count: 1
            }
        );
    }

    #[test]
    fn rejects_hostile_counts_before_allocating() {
        let mut huge_files = body_start();
        let count_at = huge_files.len();
        put_uleb(&mut huge_files, u64::MAX);
        let err = decode_error(&sealed(huge_files));
        assert!(
            matches!(
                err,
                TemplateFormatError::CountTooLarge { field: Field::FileCount, offset, count, .. }
                    if offset == count_at && count == u64::MAX
            ),
            "{err}"
        );
        let err = err.to_string();
        assert!(
            err.contains("file count") && err.contains("cannot fit"),
            "{err}"
        );

        let mut huge_workers = body_start();
        put_uleb(&mut huge_workers, 0);
        put_uleb(&mut huge_workers, 1 << 40);
        let err = message(&sealed(huge_workers));
        assert!(
            err.contains("worker count") && err.contains("cannot fit"),
            "{err}"
        );

        let mut huge_ranges = body_start();
        put_uleb(&mut huge_ranges, 0);
        put_uleb(&mut huge_ranges, 1);
        put_uleb(&mut huge_ranges, 0);
        put_uleb(&mut huge_ranges, 1 << 50);
        let err = message(&sealed(huge_ranges));
        assert!(
            err.contains("range count") && err.contains("cannot fit"),
            "{err}"
        );

        let mut huge_spec = MAGIC.to_vec();
        huge_spec.extend_from_slice(&[1, 0, 0, 0]);
        huge_spec.extend_from_slice(&[0; 32]);
        put_uleb(&mut huge_spec, u64::MAX);
        let err = message(&sealed(huge_spec));
        assert!(err.contains("truncated at spec"), "{err}");
    }

    #[test]
    fn rejects_leb128_overflow() {
        let mut too_long = body_start();
        let at = too_long.len();
        too_long.extend_from_slice(&[0x80; 10]);
        too_long.push(0);
        let err = decode_error(&sealed(too_long));
        assert!(err.to_string().contains("longer than 10 bytes"), "{err}");
        assert!(matches!(
            err,
            TemplateFormatError::LebTooLong { field: Field::FileCount, offset, .. } if offset == at
        ));
        let mut too_big = body_start();
        too_big.extend_from_slice(&[0xff; 9]);
        too_big.push(0x02);
        let err = message(&sealed(too_big));
        assert!(err.contains("exceeds 64 bits"), "{err}");
    }

    #[test]
    fn rejects_file_indices_out_of_range() {
        let mut t = sample();
        t.workers[1].ranges[0].file = 5;
        let err = message(&t.encode());
        assert!(
            err.contains("worker 3 range 0: file index 5 out of range"),
            "{err}"
        );

        let mut beyond_u32 = body_start();
        put_uleb(&mut beyond_u32, 0);
        put_uleb(&mut beyond_u32, 1);
        put_uleb(&mut beyond_u32, 7);
        put_uleb(&mut beyond_u32, 1);
        let range_at = beyond_u32.len();
        put_uleb(&mut beyond_u32, 1 << 32);
        put_uleb(&mut beyond_u32, 0);
        put_uleb(&mut beyond_u32, 1);
        assert_eq!(
            decode_error(&sealed(beyond_u32)),
            TemplateFormatError::Invalid {
                offset: range_at,
                problem: InvalidTemplate::FileIndexOutOfRange {
                    worker: 7,
                    range: 0,
                    file: 1 << 32,
                    files: 0
                }
            }
        );
    }

    #[test]
    fn rejects_ranges_beyond_the_recorded_size_and_empty_ranges() {
        let mut t = sample();
        t.workers[1].ranges[0] = range(1, 4000, 1001);
        let err = message(&t.encode());
        assert!(err.contains("beyond the recorded size 5000"), "{err}");
        t.workers[1].ranges[0] = range(1, u64::MAX, 2); // end overflows
        assert!(message(&t.encode()).contains("beyond the recorded size"));
        t.workers[1].ranges[0] = range(1, 10, 0);
        assert!(message(&t.encode()).contains("empty range"));
    }

    #[test]
    fn a_problem_of_meaning_names_the_byte_where_its_entry_starts() {
        let mut t = sample();
        t.workers[1].ranges[0] = range(1, 10, 0);
        let bytes = t.encode();
        // Worker 3's only range is its last three bytes before the checksum: file 1,
        // absolute offset 10, length 0.
        let range_at = bytes.len() - CHECKSUM_BYTES - 3;
        assert_eq!(bytes[range_at..range_at + 3], [1, 20, 0]);
        assert_eq!(
            decode_error(&bytes),
            TemplateFormatError::Invalid {
                offset: range_at,
                problem: InvalidTemplate::EmptyRange {
                    worker: 3,
                    range: 0
                }
            }
        );
    }

    #[test]
    fn rejects_worker_numbers_out_of_order_or_beyond_u32() {
        let mut t = sample();
        t.workers.swap(0, 1);
        let err = message(&t.encode());
        assert!(err.contains("worker numbers must increase"), "{err}");
        t.workers[1].worker = 3;
        assert!(message(&t.encode()).contains("worker numbers must increase"));

        let mut big = body_start();
        put_uleb(&mut big, 0);
        put_uleb(&mut big, 1);
        let worker_at = big.len();
        put_uleb(&mut big, 1 << 32);
        put_uleb(&mut big, 0);
        let err = decode_error(&sealed(big));
        assert!(
            err.to_string()
                .contains("worker number 4294967296 does not fit u32"),
            "{err}"
        );
        assert_eq!(
            err,
            TemplateFormatError::WorkerTooLarge {
                entry: 0,
                offset: worker_at,
                worker: 1 << 32
            }
        );
    }

    #[test]
    fn rejects_non_utf8_paths() {
        let mut body = body_start();
        put_uleb(&mut body, 1);
        let file_at = body.len();
        put_bytes(&mut body, &[b'a', 0xff, 0xfe]);
        put_uleb(&mut body, 10);
        put_uleb(&mut body, 0);
        put_uleb(&mut body, 0);
        let err = decode_error(&sealed(body));
        assert_eq!(
            err,
            TemplateFormatError::PathNotUtf8 {
                file: 0,
                offset: file_at,
                path: vec![b'a', 0xff, 0xfe]
            }
        );
        let err = err.to_string();
        assert!(
            err.contains("file 0: path") && err.contains("not UTF-8"),
            "{err}"
        );
    }

    #[test]
    fn rejects_a_spec_that_is_not_utf8() {
        let mut body = MAGIC.to_vec();
        body.extend_from_slice(&[1, 0, 0, 0]);
        body.extend_from_slice(&[0; 32]);
        put_bytes(&mut body, &[0xc3]);
        put_uleb(&mut body, 0);
        put_uleb(&mut body, 0);
        assert_eq!(
            decode_error(&sealed(body)),
            TemplateFormatError::SpecNotUtf8 {
                offset: HEADER_BYTES + SERVICE_BYTES + 1
            }
        );
    }

    #[test]
    fn rejects_paths_that_leave_the_model_directory() {
        for (path, why, reason) in [
            ("/etc/passwd", "absolute", UnsafePathReason::Absolute),
            ("../secret", "'..'", UnsafePathReason::ParentDir),
            ("a/../../b", "'..'", UnsafePathReason::ParentDir),
            ("a/..", "'..'", UnsafePathReason::ParentDir),
            ("a//b", "empty component", UnsafePathReason::EmptyComponent),
            ("./a", "'.'", UnsafePathReason::CurrentDir),
            ("", "empty path", UnsafePathReason::Empty),
            ("a\0b", "NUL", UnsafePathReason::ContainsNul),
        ] {
            let mut t = sample();
            t.files[1].path = path.into();
            let err = decode_error(&t.encode());
            assert!(
                matches!(
                    &err,
                    TemplateFormatError::Invalid {
                        problem: InvalidTemplate::UnsafePath { file: 1, reason: r, .. },
                        ..
                    } if *r == reason
                ),
                "{path:?}: {err:?}"
            );
            let err = err.to_string();
            assert!(
                err.contains("file 1") && err.contains(why),
                "{path:?}: {err}"
            );
        }
    }
}
