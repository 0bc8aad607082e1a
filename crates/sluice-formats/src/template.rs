//! MAIO I/O templates and their `.sluicetpl` file format.
//!
//! A template records, for one inference service, which bytes each loader worker read while
//! the model loaded, in order (seed 000, §4.1, "I/O Template Generation"). `sluice warm`
//! records one on a service's first load and replays it afterwards; the recording, the
//! template directory and the file-system checks live in `sluice-warm`. This module holds
//! what needs no file system:
//!
//! - the model ([`Template`], [`TemplateFile`], [`TemplateRange`], [`WorkerSequence`]) and
//!   the [`ServiceId`] that names a template;
//! - [`Template::encode`] and [`Template::decode`] over byte slices;
//! - [`relative_path`] and [`check_relative_path`], which decide how a model file is named
//!   inside a template and which names a template may hold.
//!
//! The format (docs/FORMATS.md, "Warm I/O templates") is a fixed header (magic, version,
//! flags, service id), then little-endian LEB128 integers: the spec string, a file table
//! (path, size, mtime), and per worker its ranges with each offset stored as a delta from
//! the previous range's end, so a sequential loader stores one byte per offset. A blake3
//! trailer covers every byte before it.
//!
//! Templates may come from shared storage, so decoding trusts nothing. It runs three passes:
//!
//! 1. the structure, so a cut file says which field it was cut in: every count is checked
//!    against the bytes left before anything is allocated, so a hostile count fails
//!    instead of reserving memory;
//! 2. the checksum, so a flipped byte reads as "corrupt" rather than as whatever the flip
//!    happened to mean;
//! 3. the meaning, because a hostile file can carry a valid checksum: UTF-8, paths that stay
//!    inside the model directory, worker numbers that increase, ranges that are non-empty
//!    and lie inside their file as recorded.
//!
//! Every failure is a [`TemplateFormatError`] naming the field or entry, its byte offset and
//! the value that was wrong; the caller adds the file's path. [`Template::validate`] runs the
//! third pass alone on a template built in memory, so a writer can refuse what readers
//! would reject.

mod cursor;
mod decode;
mod encode;
mod error;
mod model;
mod path;
mod service_id;

#[cfg(test)]
mod fixtures;

pub use error::{Field, InvalidTemplate, TemplateFormatError};
pub use model::{Template, TemplateFile, TemplateRange, WorkerSequence};
pub use path::{check_relative_path, relative_path, RelativePathError, UnsafePathReason};
pub use service_id::{ServiceId, ServiceIdError};

/// First bytes of every template file.
pub const MAGIC: [u8; 6] = *b"SLTPL\0";

/// The format version this build writes and reads.
pub const VERSION: u16 = 1;

/// Extension of template files (`<hex service id>.sluicetpl`).
pub const EXTENSION: &str = "sluicetpl";

/// Magic, version and flags.
const HEADER_BYTES: usize = MAGIC.len() + 2 + 2;
/// A blake3 hash: the service id.
const SERVICE_BYTES: usize = 32;
/// A blake3 hash: the trailer.
const CHECKSUM_BYTES: usize = 32;
