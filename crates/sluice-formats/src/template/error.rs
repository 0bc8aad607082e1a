//! What can be wrong with a template's bytes ([`TemplateFormatError`]) or with a template's
//! meaning ([`InvalidTemplate`]).
//!
//! Errors name the field or entry at fault ([`Field`], or a file, worker and range number),
//! the byte offset where it starts in the input, and the value that was wrong. They do not
//! name the file: decoding works on bytes, and the caller that read them adds the path.

use std::fmt;

use super::path::UnsafePathReason;
use super::service_id::hex;
use super::VERSION;

/// A field of the `.sluicetpl` layout, for "truncated at ..." and LEB128 errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Magic,
    Version,
    Flags,
    Service,
    SpecLen,
    Spec,
    FileCount,
    /// The path length of file-table entry `file`.
    PathLen {
        file: usize,
    },
    Path {
        file: usize,
    },
    Size {
        file: usize,
    },
    Mtime {
        file: usize,
    },
    WorkerCount,
    /// The worker number of worker entry `entry` (counted from 0 in file order).
    Worker {
        entry: usize,
    },
    /// The range count of the worker numbered `worker`.
    RangeCount {
        worker: u64,
    },
    RangeFile {
        worker: u64,
        range: usize,
    },
    RangeOffset {
        worker: u64,
        range: usize,
    },
    RangeLen {
        worker: u64,
        range: usize,
    },
    Checksum,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Field::Magic => write!(f, "magic"),
            Field::Version => write!(f, "version"),
            Field::Flags => write!(f, "flags"),
            Field::Service => write!(f, "service id"),
            Field::SpecLen => write!(f, "spec length"),
            Field::Spec => write!(f, "spec"),
            Field::FileCount => write!(f, "file count"),
            Field::PathLen { file } => write!(f, "file {file} path length"),
            Field::Path { file } => write!(f, "file {file} path"),
            Field::Size { file } => write!(f, "file {file} size"),
            Field::Mtime { file } => write!(f, "file {file} mtime"),
            Field::WorkerCount => write!(f, "worker count"),
            Field::Worker { entry } => write!(f, "worker entry {entry} number"),
            Field::RangeCount { worker } => write!(f, "worker {worker} range count"),
            Field::RangeFile { worker, range } => {
                write!(f, "worker {worker} range {range} file index")
            }
            Field::RangeOffset { worker, range } => {
                write!(f, "worker {worker} range {range} offset")
            }
            Field::RangeLen { worker, range } => write!(f, "worker {worker} range {range} length"),
            Field::Checksum => write!(f, "checksum trailer"),
        }
    }
}

/// Why bytes are not a valid `.sluicetpl` template. `offset` fields are byte offsets into
/// the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TemplateFormatError {
    // ---- structure ----
    #[error("empty file: not a Sluice template")]
    Empty,

    #[error("not a Sluice template (no SLTPL magic)")]
    NoMagic,

    #[error("truncated at magic ({len} bytes)")]
    TruncatedMagic { len: usize },

    #[error("version {version} is not supported (this build reads version {VERSION})")]
    UnsupportedVersion { version: u16 },

    #[error("unknown flags {flags:#06x} (version {VERSION} defines none)")]
    UnknownFlags { flags: u16 },

    /// The input ends inside a LEB128 integer that starts at `offset`.
    #[error("truncated at {field} (byte {offset} of {input_len})")]
    Truncated {
        field: Field,
        offset: usize,
        input_len: usize,
    },

    /// A field of `needed` bytes starting at `offset` runs past the end of the input.
    #[error("truncated at {field} (byte {offset} of {input_len}) ({needed} bytes needed, {} left)", left(.input_len, .offset))]
    FieldPastEnd {
        field: Field,
        offset: usize,
        needed: u64,
        input_len: usize,
    },

    #[error("{field} at byte {offset}: LEB128 value exceeds 64 bits")]
    LebOverflow { field: Field, offset: usize },

    #[error("{field} at byte {offset}: LEB128 longer than {max_bytes} bytes")]
    LebTooLong {
        field: Field,
        offset: usize,
        max_bytes: usize,
    },

    /// A count whose entries could not fit in the bytes left before the checksum, even at
    /// their smallest encoding: refused before it sizes an allocation.
    #[error("{field} {count} at byte {offset} cannot fit the {bytes_left} bytes left (each entry takes at least {min_entry_bytes}): corrupt or hostile")]
    CountTooLarge {
        field: Field,
        offset: usize,
        count: u64,
        bytes_left: usize,
        min_entry_bytes: usize,
    },

    #[error("{count} bytes after the checksum trailer, which ends at byte {offset}")]
    TrailingBytes { offset: usize, count: usize },

    // ---- checksum ----
    #[error("checksum mismatch (stored {}, computed {}): the file is corrupt", hex(.stored), hex(.computed))]
    ChecksumMismatch {
        stored: [u8; 32],
        computed: [u8; 32],
    },

    // ---- meaning ----
    #[error("spec at byte {offset} is not UTF-8")]
    SpecNotUtf8 { offset: usize },

    #[error("file {file}: path \"{}\" at byte {offset} is not UTF-8", .path.escape_ascii())]
    PathNotUtf8 {
        file: usize,
        offset: usize,
        path: Vec<u8>,
    },

    #[error("file count {count} at byte {offset}: more than u32 indices can name")]
    TooManyFiles { offset: usize, count: usize },

    #[error("worker entry {entry}: worker number {worker} does not fit u32 (byte {offset})")]
    WorkerTooLarge {
        entry: usize,
        offset: usize,
        worker: u64,
    },

    /// The template decodes but says something impossible; `offset` is where the entry at
    /// fault (file, worker or range) starts.
    #[error("{problem} (entry at byte {offset})")]
    Invalid {
        offset: usize,
        problem: InvalidTemplate,
    },
}

/// Why a template, decoded or built in memory, could not be replayed safely.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidTemplate {
    #[error("file {file}: unsafe path {path:?}: {reason}")]
    UnsafePath {
        file: usize,
        path: String,
        reason: UnsafePathReason,
    },

    /// Worker entry `entry` is numbered `worker`, not above the entry before it.
    #[error("worker {worker} listed after worker {previous}: worker numbers must increase")]
    WorkersOutOfOrder {
        entry: usize,
        previous: u32,
        worker: u32,
    },

    #[error("worker {worker} range {range}: file index {file} out of range ({files} files)")]
    FileIndexOutOfRange {
        worker: u32,
        range: usize,
        file: u64,
        files: usize,
    },

    #[error("worker {worker} range {range}: empty range")]
    EmptyRange { worker: u32, range: usize },

    #[error("worker {worker} range {range}: bytes {offset}+{len} lie beyond the recorded size {file_size} of {path}")]
    RangeBeyondFile {
        worker: u32,
        range: usize,
        offset: u64,
        len: u64,
        file_size: u64,
        path: String,
    },
}

/// Bytes of the input from `offset` on.
fn left(input_len: &usize, offset: &usize) -> usize {
    input_len.saturating_sub(*offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_field_the_offset_and_the_value() {
        let err = TemplateFormatError::FieldPastEnd {
            field: Field::RangeLen {
                worker: 3,
                range: 17,
            },
            offset: 90,
            needed: 12,
            input_len: 100,
        };
        assert_eq!(
            err.to_string(),
            "truncated at worker 3 range 17 length (byte 90 of 100) (12 bytes needed, 10 left)"
        );
        let err = TemplateFormatError::PathNotUtf8 {
            file: 2,
            offset: 77,
            path: b"a\xffb".to_vec(),
        };
        assert_eq!(
            err.to_string(),
            "file 2: path \"a\\xffb\" at byte 77 is not UTF-8"
        );
        let err = TemplateFormatError::Invalid {
            offset: 61,
            problem: InvalidTemplate::EmptyRange {
                worker: 1,
                range: 4,
            },
        };
        assert_eq!(
            err.to_string(),
            "worker 1 range 4: empty range (entry at byte 61)"
        );
    }
}
