//! MAIO I/O templates: which bytes each loader worker reads, in which order,
//! while a model loads.
//!
//! Two inference services with the same model and the same runtime
//! parameters (tensor parallelism, prefill/decode split, ...) load the same
//! bytes in the same order. So the first load of a service is recorded, and
//! every later one replays the record: on a page-cache miss the `template`
//! policy finds the missed byte in the worker's sequence, prefetches from
//! there to the end of the sequence, and evicts what lies well behind it
//! (seed 000, §4.1, "I/O Template Generation").
//!
//! The moving parts:
//! - [`ServiceId`]: the blake3 hash of a user-given spec string (model path,
//!   parallel configuration, ...). It names the template.
//! - [`Recorder`]: takes accesses as they happen (`worker`, file, offset,
//!   length) and merges each into the worker's last range when it continues
//!   it, so a loader reading 1 MiB pieces leaves one range per contiguous
//!   run, not one per read.
//! - [`Template`]: the finished record. Per worker (a loader process,
//!   numbered from 0 by accelerator binding or spawn order) an ordered list
//!   of `{file, offset, len}` ranges; the files once, in a table, with the
//!   size and mtime they had so that a replay can tell the model changed.
//! - [`TemplateStore`]: a directory of `<hex service id>.sluicetpl` files,
//!   local or on shared storage.
//!
//! The file format (docs/FORMATS.md, "Warm I/O templates") is little-endian
//! LEB128 with offsets stored as deltas from the previous range's end, and a
//! blake3 trailer. A Llama-like 16 GiB model read by 4 tensor-parallel
//! workers encodes in about 11 KiB, well under the 1 KiB per GiB target.
//!
//! Templates may come from shared storage, so decoding trusts nothing:
//! every count is checked against the bytes left before anything is
//! allocated, every path must stay inside the model directory, and every
//! range inside its file as recorded.
//!
//! Merging uses a gap of [`MERGE_GAP_BYTES`] (64 KiB): an access that
//! starts at most 64 KiB past the end of the worker's last range on the
//! same file extends that range. Readers skip a few bytes of headers or
//! alignment padding between tensors; an mmap loader's faults are seen at
//! fault-around granularity (16 pages = 64 KiB), so smaller gaps are noise
//! of the observation, not structure of the load. Prefetching a skipped gap
//! costs at most 64 KiB per range (tens of microseconds at disk bandwidth),
//! while keeping the ranges apart would split one sequential stream into
//! many prefetch submissions. [`Recorder::with_merge_gap`] sets another gap.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::WarmError;

/// First bytes of every template file.
pub const MAGIC: [u8; 6] = *b"SLTPL\0";

/// The format version this build writes and reads.
pub const VERSION: u16 = 1;

/// Extension of template files in a [`TemplateStore`].
pub const EXTENSION: &str = "sluicetpl";

/// Default merge gap of [`Recorder`]: 64 KiB, the fault-around window of an
/// mmap reader (see the module documentation for why).
pub const MERGE_GAP_BYTES: u64 = 64 * 1024;

/// Largest template file [`Template::read`] accepts: 256 MiB. At the 1 KiB
/// per GiB the format reaches for sequential loaders this covers any model;
/// a bigger file is a mistake or an attack, not a template.
pub const MAX_TEMPLATE_BYTES: u64 = 256 << 20;

/// Magic, version and flags.
const HEADER_BYTES: usize = MAGIC.len() + 2 + 2;
const SERVICE_BYTES: usize = 32;
const CHECKSUM_BYTES: usize = 32;
/// Fewest bytes one file-table entry takes (three one-byte LEB128s).
const MIN_FILE_BYTES: usize = 3;
/// Fewest bytes one worker entry takes (number and range count).
const MIN_WORKER_BYTES: usize = 2;
/// Fewest bytes one range takes (file, offset delta, length).
const MIN_RANGE_BYTES: usize = 3;
/// Longest LEB128 encoding of a u64.
const MAX_LEB128_BYTES: usize = 10;

/// Identifies an inference service: the blake3 hash of its spec string.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceId(pub [u8; 32]);

impl ServiceId {
    /// The id of a service described by `spec` (model path, parallel
    /// configuration, ...): blake3 of its UTF-8 bytes. Equal specs give equal
    /// ids; callers build the spec in one canonical form.
    pub fn from_spec(spec: &str) -> ServiceId {
        ServiceId(*blake3::hash(spec.as_bytes()).as_bytes())
    }

    /// 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// Parses 64 hex digits (either case), as [`ServiceId::to_hex`] writes.
    pub fn parse_hex(s: &str) -> Result<ServiceId, WarmError> {
        let bad = |why: String| WarmError::Config(format!("service id {s:?}: {why}"));
        if s.len() != 64 {
            return Err(bad(format!("{} bytes, expected 64 hex digits", s.len())));
        }
        let mut id = [0u8; 32];
        for (i, pair) in s.as_bytes().chunks_exact(2).enumerate() {
            match (hex_value(pair[0]), hex_value(pair[1])) {
                (Some(high), Some(low)) => id[i] = high << 4 | low,
                _ => return Err(bad(format!("not a hex digit at position {}", 2 * i))),
            }
        }
        Ok(ServiceId(id))
    }
}

/// Lowercase hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 * bytes.len());
    for &byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
    out
}

fn hex_value(digit: u8) -> Option<u8> {
    char::from(digit).to_digit(16).map(|v| v as u8)
}

impl fmt::Display for ServiceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for ServiceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ServiceId({})", self.to_hex())
    }
}

/// A file of the model as it was when the template was recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateFile {
    /// Path relative to the model directory, `/`-separated, without `.`,
    /// `..` or empty components.
    pub path: String,
    /// Size in bytes at record time; every range lies inside it.
    pub size: u64,
    /// Modification time at record time, in ns since the epoch.
    pub mtime_ns: i64,
}

impl TemplateFile {
    /// Stats `model_dir/path` for a new template entry.
    pub fn from_disk(model_dir: &Path, path: &str) -> Result<TemplateFile, WarmError> {
        let (size, mtime_ns) = stamp(&model_dir.join(path))?;
        Ok(TemplateFile {
            path: path.to_string(),
            size,
            mtime_ns,
        })
    }
}

/// Size and mtime (ns) of `path`, as a template records them.
fn stamp(path: &Path) -> Result<(u64, i64), WarmError> {
    let meta = std::fs::metadata(path).map_err(WarmError::io(path))?;
    let mtime_ns = meta
        .mtime()
        .saturating_mul(1_000_000_000)
        .saturating_add(meta.mtime_nsec());
    Ok((meta.size(), mtime_ns))
}

/// `file` as a template path: relative to `model_dir`, `/`-separated.
/// Fails when `file` lies outside `model_dir` or is not UTF-8.
pub fn relative_path(model_dir: &Path, file: &Path) -> Result<String, WarmError> {
    let outside = || {
        WarmError::Config(format!(
            "{}: not a file inside the model directory {}",
            file.display(),
            model_dir.display()
        ))
    };
    let rest = file.strip_prefix(model_dir).map_err(|_| outside())?;
    let mut parts = Vec::new();
    for component in rest.components() {
        match component {
            Component::Normal(part) => parts.push(part.to_str().ok_or_else(|| {
                WarmError::Config(format!("{}: path is not UTF-8", file.display()))
            })?),
            Component::CurDir => {}
            _ => return Err(outside()),
        }
    }
    if parts.is_empty() {
        return Err(outside());
    }
    Ok(parts.join("/"))
}

/// One contiguous range a worker read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TemplateRange {
    /// Index into [`Template::files`].
    pub file: u32,
    /// First byte.
    pub offset: u64,
    /// Length in bytes, never 0.
    pub len: u64,
}

impl TemplateRange {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.len)
    }

    /// Whether byte `offset` of `file` lies in this range.
    pub fn contains(&self, file: u32, offset: u64) -> bool {
        self.file == file && offset >= self.offset && offset - self.offset < self.len
    }
}

/// The ranges one worker read, in the order it read them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSequence {
    /// Logical worker number (0, 1, ...): the accelerator it is bound to, or
    /// its spawn order.
    pub worker: u32,
    /// Ranges in access order.
    pub ranges: Vec<TemplateRange>,
}

/// The I/O template of one service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// The service this template belongs to.
    pub service: ServiceId,
    /// The spec string the service id was derived from, for people reading
    /// a template store.
    pub spec: String,
    /// The model's files, referenced by index from the ranges.
    pub files: Vec<TemplateFile>,
    /// One sequence per worker, sorted by worker number, numbers unique.
    pub workers: Vec<WorkerSequence>,
}

/// How a model file differs from what a template recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileChange {
    /// The file cannot be stat'ed now (missing, or no permission).
    Unavailable(String),
    /// The size differs.
    Size { recorded: u64, now: u64 },
    /// Same size, different modification time.
    Mtime { recorded: i64, now: i64 },
}

/// A model file that changed since its template was recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangedFile {
    /// Index into [`Template::files`].
    pub file: u32,
    /// The file's template path.
    pub path: String,
    /// What changed.
    pub change: FileChange,
}

impl Template {
    /// Bytes the template covers: the sum of all range lengths.
    pub fn total_bytes(&self) -> u64 {
        self.ranges().fold(0u64, |sum, r| sum.saturating_add(r.len))
    }

    /// Ranges in all workers.
    pub fn range_count(&self) -> usize {
        self.workers.iter().map(|w| w.ranges.len()).sum()
    }

    fn ranges(&self) -> impl Iterator<Item = &TemplateRange> {
        self.workers.iter().flat_map(|w| w.ranges.iter())
    }

    /// The sequence of worker number `worker`, if it read anything.
    pub fn worker(&self, worker: u32) -> Option<&WorkerSequence> {
        self.workers.iter().find(|w| w.worker == worker)
    }

    /// Index of the first range of `worker`'s sequence that contains byte
    /// `offset` of `file`. O(ranges); see [`Template::position_from`] for
    /// the usual case of a reader moving forward.
    pub fn position_of(&self, worker: u32, file: u32, offset: u64) -> Option<usize> {
        self.position_from(worker, file, offset, 0)
    }

    /// Like [`Template::position_of`], but the search starts at range
    /// `hint` (the last position found) and wraps around, so a reader that
    /// moves forward is found in a step or two.
    pub fn position_from(&self, worker: u32, file: u32, offset: u64, hint: usize) -> Option<usize> {
        let ranges = &self.worker(worker)?.ranges;
        let (before, after) = ranges.split_at(hint.min(ranges.len()));
        let hit = |r: &TemplateRange| r.contains(file, offset);
        match after.iter().position(hit) {
            Some(i) => Some(before.len() + i),
            None => before.iter().position(hit),
        }
    }

    /// The model files that changed (size, mtime, or gone) since recording,
    /// `model_dir` being the directory the paths are relative to. Empty when
    /// the template still describes the model.
    pub fn changed_files(&self, model_dir: &Path) -> Vec<ChangedFile> {
        let mut changed = Vec::new();
        for (index, file) in self.files.iter().enumerate() {
            let change = match stamp(&model_dir.join(&file.path)) {
                Err(e) => FileChange::Unavailable(e.to_string()),
                Ok((size, _)) if size != file.size => FileChange::Size {
                    recorded: file.size,
                    now: size,
                },
                Ok((_, mtime)) if mtime != file.mtime_ns => FileChange::Mtime {
                    recorded: file.mtime_ns,
                    now: mtime,
                },
                Ok(_) => continue,
            };
            changed.push(ChangedFile {
                file: u32::try_from(index).unwrap_or(u32::MAX),
                path: file.path.clone(),
                change,
            });
        }
        changed
    }

    /// Checks what [`Template::decode`] checks of a decoded template: safe
    /// relative paths, worker numbers increasing, every range non-empty,
    /// on a listed file and inside its recorded size. `path` names the
    /// template in the error.
    pub fn validate(&self, path: &Path) -> Result<(), WarmError> {
        self.check().map_err(|message| WarmError::BadTemplate {
            path: path.to_path_buf(),
            message,
        })
    }

    fn check(&self) -> Result<(), String> {
        for (i, file) in self.files.iter().enumerate() {
            check_relative_path(&file.path).map_err(|why| format!("file {i}: {why}"))?;
        }
        for pair in self.workers.windows(2) {
            if pair[0].worker >= pair[1].worker {
                return Err(format!(
                    "worker {} listed after worker {}: worker numbers must increase",
                    pair[1].worker, pair[0].worker
                ));
            }
        }
        for seq in &self.workers {
            for (i, range) in seq.ranges.iter().enumerate() {
                self.check_range(range)
                    .map_err(|why| format!("worker {} range {i}: {why}", seq.worker))?;
            }
        }
        Ok(())
    }

    fn check_range(&self, range: &TemplateRange) -> Result<(), String> {
        let Some(file) = self.files.get(range.file as usize) else {
            return Err(format!(
                "file index {} out of range ({} files)",
                range.file,
                self.files.len()
            ));
        };
        if range.len == 0 {
            return Err("empty range".into());
        }
        match range.offset.checked_add(range.len) {
            Some(end) if end <= file.size => Ok(()),
            _ => Err(format!(
                "bytes {}+{} lie beyond the recorded size {} of {}",
                range.offset, range.len, file.size, file.path
            )),
        }
    }

    /// The template in the `.sluicetpl` format (docs/FORMATS.md).
    pub fn encode(&self) -> Vec<u8> {
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

    /// Decodes a `.sluicetpl` file's bytes. `path` only names the template
    /// in errors. Every malformed input is a [`WarmError::BadTemplate`]
    /// saying what is wrong and where; nothing panics or allocates more
    /// than the input could describe.
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Template, WarmError> {
        decode_bytes(bytes).map_err(|message| WarmError::BadTemplate {
            path: path.to_path_buf(),
            message,
        })
    }

    /// Writes the template to `path` atomically: a temporary sibling is
    /// filled, synced and renamed over `path`, so readers on shared storage
    /// see the old template or the new one, never a part. Refuses a template
    /// that [`Template::decode`] would reject.
    pub fn write(&self, path: &Path) -> Result<(), WarmError> {
        self.validate(path)?;
        write_atomically(path, &self.encode())
    }

    /// Reads and decodes the template at `path`.
    pub fn read(path: &Path) -> Result<Template, WarmError> {
        let file = File::open(path).map_err(WarmError::io(path))?;
        let too_big = |len: u64| WarmError::BadTemplate {
            path: path.to_path_buf(),
            message: format!("{len} bytes, more than the {MAX_TEMPLATE_BYTES}-byte limit"),
        };
        let len = file.metadata().map_err(WarmError::io(path))?.len();
        if len > MAX_TEMPLATE_BYTES {
            return Err(too_big(len));
        }
        let mut bytes = Vec::with_capacity(len as usize);
        file.take(MAX_TEMPLATE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(WarmError::io(path))?;
        if bytes.len() as u64 > MAX_TEMPLATE_BYTES {
            return Err(too_big(bytes.len() as u64));
        }
        Template::decode(&bytes, path)
    }
}

/// Offsets are stored relative to this: the previous range's end when it is
/// on the same file (sequential loaders then store 0), else 0 (absolute).
fn delta_base(previous: Option<(u64, u64)>, file: u64) -> u64 {
    match previous {
        Some((prev_file, prev_end)) if prev_file == file => prev_end,
        _ => 0,
    }
}

/// Why a template path could not be trusted, if it cannot.
fn check_relative_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("empty path".into());
    }
    if path.starts_with('/') {
        return Err(format!(
            "absolute path {path:?}; template paths are relative to the model directory"
        ));
    }
    if path.contains('\0') {
        return Err(format!("path {path:?} contains a NUL byte"));
    }
    for part in path.split('/') {
        let why = match part {
            "" => "an empty component (doubled or trailing '/')",
            "." => "a '.' component",
            ".." => "a '..' component, which would leave the model directory",
            _ => continue,
        };
        return Err(format!("path {path:?} has {why}"));
    }
    Ok(())
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

fn put_uleb(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_uleb(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// A field of the format, for "truncated at ..." messages.
#[derive(Clone, Copy)]
enum Field {
    Version,
    Flags,
    Service,
    SpecLen,
    Spec,
    FileCount,
    PathLen(usize),
    Path(usize),
    Size(usize),
    Mtime(usize),
    WorkerCount,
    Worker(usize),
    RangeCount(u64),
    RangeFile(u64, usize),
    RangeOffset(u64, usize),
    RangeLen(u64, usize),
    Checksum,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Field::Version => write!(f, "version"),
            Field::Flags => write!(f, "flags"),
            Field::Service => write!(f, "service id"),
            Field::SpecLen => write!(f, "spec length"),
            Field::Spec => write!(f, "spec"),
            Field::FileCount => write!(f, "file count"),
            Field::PathLen(i) => write!(f, "file {i} path length"),
            Field::Path(i) => write!(f, "file {i} path"),
            Field::Size(i) => write!(f, "file {i} size"),
            Field::Mtime(i) => write!(f, "file {i} mtime"),
            Field::WorkerCount => write!(f, "worker count"),
            Field::Worker(i) => write!(f, "worker entry {i} number"),
            Field::RangeCount(w) => write!(f, "worker {w} range count"),
            Field::RangeFile(w, r) => write!(f, "worker {w} range {r} file index"),
            Field::RangeOffset(w, r) => write!(f, "worker {w} range {r} offset"),
            Field::RangeLen(w, r) => write!(f, "worker {w} range {r} length"),
            Field::Checksum => write!(f, "checksum trailer"),
        }
    }
}

/// Reads fields off the front of a template's bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn truncated(&self, field: Field) -> String {
        format!(
            "truncated at {field} (byte {} of {})",
            self.pos,
            self.bytes.len()
        )
    }

    fn take(&mut self, n: u64, field: Field) -> Result<&'a [u8], String> {
        if n > self.remaining() as u64 {
            return Err(format!(
                "{} ({n} bytes needed, {} left)",
                self.truncated(field),
                self.remaining()
            ));
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.bytes[start..self.pos])
    }

    fn u16(&mut self, field: Field) -> Result<u16, String> {
        let b = self.take(2, field)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn uleb(&mut self, field: Field) -> Result<u64, String> {
        let start = self.pos;
        let mut value = 0u64;
        for i in 0..MAX_LEB128_BYTES {
            let Some(&byte) = self.bytes.get(self.pos) else {
                return Err(self.truncated(field));
            };
            self.pos += 1;
            let low = u64::from(byte & 0x7f);
            if i == MAX_LEB128_BYTES - 1 && low > 1 {
                return Err(format!(
                    "{field} at byte {start}: LEB128 value exceeds 64 bits"
                ));
            }
            value |= low << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(format!(
            "{field} at byte {start}: LEB128 longer than {MAX_LEB128_BYTES} bytes"
        ))
    }

    /// A count of entries of at least `min_bytes` each, refused when the
    /// bytes left (less the checksum) cannot hold that many, so a hostile
    /// count never sizes an allocation.
    fn count(&mut self, field: Field, min_bytes: usize) -> Result<usize, String> {
        let at = self.pos;
        let count = self.uleb(field)?;
        let room = self.remaining().saturating_sub(CHECKSUM_BYTES) / min_bytes;
        if count > room as u64 {
            return Err(format!(
                "{field} {count} at byte {at} cannot fit the {} bytes left \
                 (each entry takes at least {min_bytes}): corrupt or hostile",
                self.remaining()
            ));
        }
        Ok(count as usize)
    }
}

/// A file-table entry before its path is checked.
struct RawFile<'a> {
    path: &'a [u8],
    size: u64,
    mtime_ns: i64,
}

/// A worker entry before its numbers are narrowed to u32.
struct RawWorker {
    worker: u64,
    /// `(file, offset, len)` with offsets already absolute.
    ranges: Vec<(u64, u64, u64)>,
}

/// Decodes in three passes: the structure (so a cut file says where it was
/// cut), then the checksum (so a flipped byte says "corrupt"), then the
/// meaning (paths, indices, bounds: a hostile file can carry a valid
/// checksum).
fn decode_bytes(bytes: &[u8]) -> Result<Template, String> {
    let mut cur = Cursor { bytes, pos: 0 };
    check_header(&mut cur)?;
    let service = cur.take(SERVICE_BYTES as u64, Field::Service)?;
    let spec_len = cur.uleb(Field::SpecLen)?;
    let spec = cur.take(spec_len, Field::Spec)?;
    let files = read_files(&mut cur)?;
    let workers = read_workers(&mut cur)?;
    let body_end = cur.pos;
    let stored = cur.take(CHECKSUM_BYTES as u64, Field::Checksum)?;
    if cur.remaining() > 0 {
        return Err(format!(
            "{} bytes after the checksum trailer",
            cur.remaining()
        ));
    }
    let computed = blake3::hash(&bytes[..body_end]);
    if computed.as_bytes().as_slice() != stored {
        return Err(format!(
            "checksum mismatch (stored {}, computed {}): the file is corrupt",
            hex(stored),
            computed.to_hex()
        ));
    }
    let mut service_id = [0u8; SERVICE_BYTES];
    service_id.copy_from_slice(service);
    let template = Template {
        service: ServiceId(service_id),
        spec: String::from_utf8(spec.to_vec()).map_err(|_| "spec is not UTF-8".to_string())?,
        files: convert_files(files)?,
        workers: convert_workers(workers)?,
    };
    template.check()?;
    Ok(template)
}

fn check_header(cur: &mut Cursor<'_>) -> Result<(), String> {
    let bytes = cur.bytes;
    if !bytes.starts_with(&MAGIC) {
        return Err(if bytes.is_empty() {
            "empty file: not a Sluice template".into()
        } else if MAGIC.starts_with(bytes) {
            format!("truncated at magic ({} bytes)", bytes.len())
        } else {
            "not a Sluice template (no SLTPL magic)".into()
        });
    }
    cur.pos = MAGIC.len();
    let version = cur.u16(Field::Version)?;
    if version != VERSION {
        return Err(format!(
            "version {version} is not supported (this build reads version {VERSION})"
        ));
    }
    let flags = cur.u16(Field::Flags)?;
    if flags != 0 {
        return Err(format!(
            "unknown flags {flags:#06x} (version {VERSION} defines none)"
        ));
    }
    Ok(())
}

fn read_files<'a>(cur: &mut Cursor<'a>) -> Result<Vec<RawFile<'a>>, String> {
    let count = cur.count(Field::FileCount, MIN_FILE_BYTES)?;
    let mut files = Vec::with_capacity(count);
    for i in 0..count {
        let path_len = cur.uleb(Field::PathLen(i))?;
        let path = cur.take(path_len, Field::Path(i))?;
        let size = cur.uleb(Field::Size(i))?;
        let mtime_ns = unzigzag(cur.uleb(Field::Mtime(i))?);
        files.push(RawFile {
            path,
            size,
            mtime_ns,
        });
    }
    Ok(files)
}

fn read_workers(cur: &mut Cursor<'_>) -> Result<Vec<RawWorker>, String> {
    let count = cur.count(Field::WorkerCount, MIN_WORKER_BYTES)?;
    let mut workers = Vec::with_capacity(count);
    for i in 0..count {
        let worker = cur.uleb(Field::Worker(i))?;
        let range_count = cur.count(Field::RangeCount(worker), MIN_RANGE_BYTES)?;
        let mut ranges = Vec::with_capacity(range_count);
        let mut previous: Option<(u64, u64)> = None;
        for r in 0..range_count {
            let file = cur.uleb(Field::RangeFile(worker, r))?;
            let delta = unzigzag(cur.uleb(Field::RangeOffset(worker, r))?);
            let len = cur.uleb(Field::RangeLen(worker, r))?;
            let offset = delta_base(previous, file).wrapping_add(delta as u64);
            ranges.push((file, offset, len));
            previous = Some((file, offset.saturating_add(len)));
        }
        workers.push(RawWorker { worker, ranges });
    }
    Ok(workers)
}

fn convert_files(files: Vec<RawFile<'_>>) -> Result<Vec<TemplateFile>, String> {
    if files.len() as u64 > u64::from(u32::MAX) + 1 {
        return Err(format!(
            "{} files: more than u32 indices can name",
            files.len()
        ));
    }
    let mut out = Vec::with_capacity(files.len());
    for (i, file) in files.into_iter().enumerate() {
        let path = std::str::from_utf8(file.path)
            .map_err(|_| format!("file {i}: path {:?} is not UTF-8", file.path))?;
        out.push(TemplateFile {
            path: path.to_string(),
            size: file.size,
            mtime_ns: file.mtime_ns,
        });
    }
    Ok(out)
}

fn convert_workers(workers: Vec<RawWorker>) -> Result<Vec<WorkerSequence>, String> {
    let mut out = Vec::with_capacity(workers.len());
    for raw in workers {
        let worker = u32::try_from(raw.worker)
            .map_err(|_| format!("worker number {} does not fit u32", raw.worker))?;
        let mut ranges = Vec::with_capacity(raw.ranges.len());
        for (r, (file, offset, len)) in raw.ranges.into_iter().enumerate() {
            let file = u32::try_from(file).map_err(|_| {
                format!("worker {worker} range {r}: file index {file} out of range")
            })?;
            ranges.push(TemplateRange { file, offset, len });
        }
        out.push(WorkerSequence { worker, ranges });
    }
    Ok(out)
}

/// Distinguishes the temporary files of concurrent writers in one process.
static TEMP_SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// Writes `bytes` to `path` through a synced temporary sibling and a rename.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), WarmError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "template".into());
    let tmp = path.with_file_name(format!(
        ".{name}.tmp-{}-{}",
        std::process::id(),
        TEMP_SEQUENCE.fetch_add(1, Ordering::Relaxed)
    ));
    let outcome = (|| {
        let mut file = File::options().write(true).create_new(true).open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if outcome.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    outcome.map_err(WarmError::io(path))?;
    // Make the rename itself durable. Best effort: NFS and some FUSE file
    // systems refuse fsync on a directory, and the rename is atomic anyway.
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if let Ok(dir) = File::open(parent) {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// Records accesses as they happen, merging each into its worker's last
/// range when it continues it.
///
/// Merge rule: an access on the same file as the worker's last range,
/// starting inside `[last.offset, last.end + merge gap]`, extends the last
/// range to the union of both (so overlaps and re-reads are absorbed);
/// anything else starts a new range. Zero-length accesses are ignored, and
/// accesses are clipped to the file's size (fanotify rounds ranges up to
/// whole pages, past the end of the last one).
#[derive(Debug, Clone)]
pub struct Recorder {
    service: ServiceId,
    spec: String,
    files: Vec<TemplateFile>,
    by_path: HashMap<String, u32>,
    workers: BTreeMap<u32, Vec<TemplateRange>>,
    merge_gap_bytes: u64,
}

impl Recorder {
    /// An empty recording for `service`, merging with [`MERGE_GAP_BYTES`].
    pub fn new(service: ServiceId, spec: String) -> Recorder {
        Recorder {
            service,
            spec,
            files: Vec::new(),
            by_path: HashMap::new(),
            workers: BTreeMap::new(),
            merge_gap_bytes: MERGE_GAP_BYTES,
        }
    }

    /// Merges accesses up to `gap_bytes` past a range's end into it (0:
    /// only adjacent or overlapping accesses merge).
    pub fn with_merge_gap(mut self, gap_bytes: u64) -> Recorder {
        self.merge_gap_bytes = gap_bytes;
        self
    }

    /// Interns a file and returns its index. `path` is relative to the model
    /// directory (see [`relative_path`]); `size` and `mtime_ns` are its stat
    /// now. A path seen before returns its first index and keeps its first
    /// stat.
    pub fn file(&mut self, path: String, size: u64, mtime_ns: i64) -> u32 {
        if let Some(&index) = self.by_path.get(&path) {
            return index;
        }
        let Ok(index) = u32::try_from(self.files.len()) else {
            tracing::warn!(path, "template recorder: file table full; file ignored");
            return u32::MAX;
        };
        self.by_path.insert(path.clone(), index);
        self.files.push(TemplateFile {
            path,
            size,
            mtime_ns,
        });
        index
    }

    /// Records that `worker` read `len` bytes of `file` at `offset`.
    pub fn access(&mut self, worker: u32, file: u32, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let Some(size) = self.files.get(file as usize).map(|f| f.size) else {
            tracing::warn!(
                file,
                worker,
                "template recorder: access to a file index it never issued; ignored"
            );
            return;
        };
        if offset >= size {
            return;
        }
        let end = offset.saturating_add(len).min(size);
        let ranges = self.workers.entry(worker).or_default();
        if let Some(last) = ranges.last_mut() {
            let reach = last.end().saturating_add(self.merge_gap_bytes);
            if last.file == file && offset >= last.offset && offset <= reach {
                last.len = end.max(last.end()) - last.offset;
                return;
            }
        }
        ranges.push(TemplateRange {
            file,
            offset,
            len: end - offset,
        });
    }

    /// The template: workers sorted by number.
    pub fn finish(self) -> Template {
        Template {
            service: self.service,
            spec: self.spec,
            files: self.files,
            workers: self
                .workers
                .into_iter()
                .map(|(worker, ranges)| WorkerSequence { worker, ranges })
                .collect(),
        }
    }
}

/// A directory of templates, one file per service named
/// `<hex service id>.sluicetpl`. May be on shared storage: writes are
/// atomic renames, and reads check the id inside the file.
#[derive(Debug, Clone)]
pub struct TemplateStore {
    dir: PathBuf,
}

impl TemplateStore {
    /// A store in `dir` (created on the first save).
    pub fn new(dir: impl Into<PathBuf>) -> TemplateStore {
        TemplateStore { dir: dir.into() }
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the template of `service` lives.
    pub fn path_for(&self, service: &ServiceId) -> PathBuf {
        self.dir.join(format!("{}.{EXTENSION}", service.to_hex()))
    }

    /// The template of `service`; `None` when there is none yet (the caller
    /// records one). A file holding another service's template is an error.
    pub fn load(&self, service: &ServiceId) -> Result<Option<Template>, WarmError> {
        let path = self.path_for(service);
        let template = match Template::read(&path) {
            Ok(template) => template,
            Err(WarmError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        if template.service != *service {
            return Err(WarmError::BadTemplate {
                path,
                message: format!(
                    "holds the template of service {}, not {service} (renamed or copied?)",
                    template.service
                ),
            });
        }
        Ok(Some(template))
    }

    /// Saves `template` under its service id, creating the directory if
    /// needed; returns the file's path.
    pub fn save(&self, template: &Template) -> Result<PathBuf, WarmError> {
        std::fs::create_dir_all(&self.dir).map_err(WarmError::io(&self.dir))?;
        let path = self.path_for(&template.service);
        template.write(&path)?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NAME: &str = "t.sluicetpl";
    const MIB: u64 = 1 << 20;
    const PAGE: u64 = 4096;

    fn range(file: u32, offset: u64, len: u64) -> TemplateRange {
        TemplateRange { file, offset, len }
    }

    fn file(path: &str, size: u64) -> TemplateFile {
        TemplateFile {
            path: path.into(),
            size,
            mtime_ns: 1_700_000_000_123_456_789,
        }
    }

    fn sample() -> Template {
        Template {
            service: ServiceId::from_spec("llama-3-8b tp=2"),
            spec: "llama-3-8b tp=2".into(),
            files: vec![
                file("model-00001-of-00002.safetensors", 10 << 30),
                TemplateFile {
                    mtime_ns: -42,
                    ..file("sub/model-00002-of-00002.safetensors", 5000)
                },
            ],
            workers: vec![
                WorkerSequence {
                    worker: 0,
                    ranges: vec![
                        range(0, 0, 4096),
                        range(0, 8192, MIB),
                        range(1, 100, 900),
                        range(0, 4096, 10),
                        range(0, (10 << 30) - 1, 1),
                    ],
                },
                WorkerSequence {
                    worker: 3,
                    ranges: vec![range(1, 4000, 1000)],
                },
            ],
        }
    }

    fn message(result: Result<Template, WarmError>) -> String {
        match result {
            Err(WarmError::BadTemplate { path, message }) => {
                assert_eq!(path, Path::new(NAME), "the error names the template");
                message
            }
            Err(other) => panic!("expected BadTemplate, got {other}"),
            Ok(t) => panic!("expected an error, decoded {t:?}"),
        }
    }

    fn decode(bytes: &[u8]) -> Result<Template, WarmError> {
        Template::decode(bytes, Path::new(NAME))
    }

    fn decode_error(bytes: &[u8]) -> String {
        message(decode(bytes))
    }

    /// Header, service id and a one-byte spec, as a hand-made body starts.
    fn body_start() -> Vec<u8> {
        let mut body = MAGIC.to_vec();
        body.extend_from_slice(&VERSION.to_le_bytes());
        body.extend_from_slice(&0u16.to_le_bytes());
        body.extend_from_slice(&[7u8; 32]);
        put_bytes(&mut body, b"s");
        body
    }

    /// `body` with a valid checksum, as a hostile writer would make it.
    fn sealed(mut body: Vec<u8>) -> Vec<u8> {
        let checksum = blake3::hash(&body);
        body.extend_from_slice(checksum.as_bytes());
        body
    }

    #[test]
    fn service_id_is_blake3_of_the_spec_and_round_trips_through_hex() {
        let empty = ServiceId::from_spec("");
        assert_eq!(
            empty.to_hex(),
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
        let id = ServiceId::from_spec("qwen tp=4 pd=1");
        assert_ne!(id, ServiceId::from_spec("qwen tp=8 pd=1"));
        assert_eq!(ServiceId::parse_hex(&id.to_hex()).unwrap(), id);
        assert_eq!(
            ServiceId::parse_hex(&id.to_hex().to_uppercase()).unwrap(),
            id
        );
        assert_eq!(id.to_string(), id.to_hex());
    }

    #[test]
    fn parse_hex_names_the_value_and_the_fault() {
        for (bad, why) in [
            ("abc", "3 bytes"),
            (&"g".repeat(64)[..], "position 0"),
            (&format!("{}é", "0".repeat(62))[..], "position 62"),
        ] {
            let err = ServiceId::parse_hex(bad).unwrap_err().to_string();
            assert!(err.contains(why) && err.contains(&bad[..3]), "{err}");
        }
    }

    #[test]
    fn encode_then_decode_returns_the_same_template() {
        let t = sample();
        let bytes = t.encode();
        assert!(bytes.starts_with(b"SLTPL\0\x01\x00\x00\x00"));
        assert_eq!(decode(&bytes).unwrap(), t);
        assert_eq!(t.total_bytes(), 4096 + MIB + 900 + 10 + 1 + 1000);
        assert_eq!(t.range_count(), 6);
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
        // Delta 1 MiB (zigzag 2^21: 4 LEB128 bytes) vs 0 (1 byte), in every
        // range but the first, which is absolute in both.
        assert_eq!(gapped - contiguous, 99 * 3, "{gapped} vs {contiguous}");
    }

    #[test]
    fn write_then_read_returns_the_same_template_and_leaves_no_temporaries() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(NAME);
        let mut t = sample();
        t.write(&path).unwrap();
        assert_eq!(Template::read(&path).unwrap(), t);
        t.spec = "replaced".into();
        t.write(&path).unwrap();
        assert_eq!(Template::read(&path).unwrap(), t);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn write_refuses_a_template_that_readers_would_reject() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(NAME);
        let mut t = sample();
        t.files[1].path = "/etc/passwd".into();
        let err = t.write(&path).unwrap_err().to_string();
        assert!(err.contains("absolute") && err.contains(NAME), "{err}");
        assert!(!path.exists());
    }

    #[test]
    fn read_refuses_files_over_the_size_limit_without_reading_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(NAME);
        let f = File::create(&path).unwrap();
        f.set_len(MAX_TEMPLATE_BYTES + 1).unwrap(); // sparse
        let err = Template::read(&path).unwrap_err().to_string();
        assert!(err.contains("limit") && err.contains(NAME), "{err}");
    }

    #[test]
    fn read_of_a_missing_file_is_an_io_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(NAME);
        let err = Template::read(&path).unwrap_err();
        assert!(matches!(err, WarmError::Io { .. }), "{err}");
        assert!(err.to_string().contains(NAME));
    }

    fn recorder() -> Recorder {
        let mut rec = Recorder::new(ServiceId::from_spec("x"), "x".into());
        assert_eq!(rec.file("a.safetensors".into(), 100 * MIB, 1), 0);
        assert_eq!(rec.file("b.safetensors".into(), 100 * MIB, 2), 1);
        rec
    }

    fn ranges_of(t: &Template, worker: u32) -> Vec<TemplateRange> {
        t.worker(worker).unwrap().ranges.clone()
    }

    #[test]
    fn recorder_merges_adjacent_accesses_into_one_range() {
        let mut rec = recorder();
        for i in 0..8 {
            rec.access(0, 0, i * MIB, MIB);
        }
        assert_eq!(ranges_of(&rec.finish(), 0), [range(0, 0, 8 * MIB)]);
    }

    #[test]
    fn recorder_absorbs_overlaps_and_rereads() {
        let mut rec = recorder();
        rec.access(0, 0, 1000, 100);
        rec.access(0, 0, 1050, 100); // overlaps the end
        rec.access(0, 0, 1010, 20); // re-read inside
        rec.access(0, 0, 1000, 150); // exact re-read
        assert_eq!(ranges_of(&rec.finish(), 0), [range(0, 1000, 150)]);
    }

    #[test]
    fn recorder_merges_gaps_up_to_the_merge_gap_only() {
        let mut rec = recorder();
        rec.access(0, 0, 0, 100);
        rec.access(0, 0, 100 + MERGE_GAP_BYTES, 10); // gap of exactly 64 KiB
        let end = 110 + MERGE_GAP_BYTES;
        rec.access(0, 0, end + MERGE_GAP_BYTES + 1, 10); // one byte too far
        let expect = [range(0, 0, end), range(0, end + MERGE_GAP_BYTES + 1, 10)];
        assert_eq!(ranges_of(&rec.finish(), 0), expect);
    }

    #[test]
    fn a_zero_merge_gap_keeps_gapped_accesses_apart() {
        let mut rec = recorder().with_merge_gap(0);
        rec.access(0, 0, 0, 100);
        rec.access(0, 0, 100, 100); // adjacent still merges
        rec.access(0, 0, 201, 100);
        let expect = [range(0, 0, 200), range(0, 201, 100)];
        assert_eq!(ranges_of(&rec.finish(), 0), expect);
    }

    #[test]
    fn recorder_starts_a_new_range_on_another_file_or_going_backwards() {
        let mut rec = recorder();
        rec.access(0, 0, MIB, MIB);
        rec.access(0, 1, 2 * MIB, MIB); // same offsets, other file
        rec.access(0, 0, 2 * MIB, MIB); // back to file 0, not merged across
        rec.access(0, 0, 0, 10); // backwards on the same file
        let expect = [
            range(0, MIB, MIB),
            range(1, 2 * MIB, MIB),
            range(0, 2 * MIB, MIB),
            range(0, 0, 10),
        ];
        assert_eq!(ranges_of(&rec.finish(), 0), expect);
    }

    #[test]
    fn recorder_keeps_workers_apart_and_sorts_them() {
        let mut rec = recorder();
        for i in 0..4 {
            rec.access(2, 0, (2 * i + 1) * MIB, MIB);
            rec.access(0, 0, 2 * i * MIB, MIB);
        }
        let t = rec.finish();
        let numbers: Vec<u32> = t.workers.iter().map(|w| w.worker).collect();
        assert_eq!(numbers, [0, 2]);
        // Worker 0 read even MiBs, 1 MiB apart: more than the merge gap.
        assert_eq!(ranges_of(&t, 0).len(), 4);
        assert_eq!(ranges_of(&t, 2)[0], range(0, MIB, MIB));
    }

    #[test]
    fn recorder_ignores_empty_unknown_and_past_the_end_accesses() {
        let mut rec = recorder();
        rec.access(5, 0, 0, 0); // zero-length: no worker entry either
        rec.access(6, 9, 0, 10); // file index never issued
        rec.access(7, 0, 100 * MIB, 4096); // at EOF
        rec.access(8, 0, 100 * MIB - 100, 4096); // straddles EOF: clipped
        let t = rec.finish();
        assert_eq!(t.workers.len(), 1);
        assert_eq!(ranges_of(&t, 8), [range(0, 100 * MIB - 100, 100)]);
        t.validate(Path::new(NAME)).unwrap();
    }

    #[test]
    fn recorder_interns_each_path_once_with_its_first_stat() {
        let mut rec = recorder();
        assert_eq!(rec.file("a.safetensors".into(), 1, 1), 0);
        assert_eq!(rec.file("c.safetensors".into(), 1, 1), 2);
        let t = rec.finish();
        assert_eq!(t.files.len(), 3);
        assert_eq!(t.files[0].size, 100 * MIB);
    }

    #[test]
    fn position_of_finds_the_range_holding_a_byte() {
        let t = sample();
        assert_eq!(t.position_of(0, 0, 8192), Some(1));
        assert_eq!(t.position_of(0, 0, 8192 + MIB - 1), Some(1));
        assert_eq!(t.position_of(0, 0, 8192 + MIB), None, "ends are exclusive");
        assert_eq!(t.position_of(0, 1, 100), Some(2));
        assert_eq!(t.position_of(0, 1, 99), None);
        assert_eq!(t.position_of(0, 0, 4100), Some(3));
        assert_eq!(t.position_of(3, 1, 4999), Some(0));
        assert_eq!(t.position_of(3, 0, 0), None, "other file");
        assert_eq!(t.position_of(1, 0, 0), None, "unknown worker");
    }

    #[test]
    fn position_from_starts_at_the_hint_and_wraps_around() {
        let mut t = sample();
        t.workers[0].ranges = vec![range(0, 0, 10), range(1, 0, 10), range(0, 0, 10)];
        assert_eq!(t.position_of(0, 0, 5), Some(0));
        assert_eq!(t.position_from(0, 0, 5, 1), Some(2));
        assert_eq!(t.position_from(0, 1, 5, 2), Some(1), "wraps");
        assert_eq!(t.position_from(0, 0, 5, 99), Some(0), "hint past the end");
    }

    #[test]
    fn rejects_files_that_are_not_templates() {
        assert!(decode_error(b"").contains("not a Sluice template"));
        assert!(decode_error(b"PK\x03\x04 a zip file").contains("not a Sluice template"));
        assert!(decode_error(b"SLT").contains("truncated at magic"));
    }

    #[test]
    fn rejects_unknown_versions_and_flags() {
        let mut bytes = sample().encode();
        bytes[6] = 2;
        let err = decode_error(&bytes);
        assert!(err.contains("version 2 is not supported"), "{err}");
        let mut bytes = sample().encode();
        bytes[8] = 1;
        let err = decode_error(&bytes);
        assert!(err.contains("unknown flags 0x0001"), "{err}");
    }

    #[test]
    fn a_flipped_byte_is_a_checksum_mismatch() {
        let bytes = sample().encode();
        let spec_at = HEADER_BYTES + SERVICE_BYTES + 1;
        for at in [HEADER_BYTES, spec_at, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[at] ^= 0x20;
            let err = decode_error(&bad);
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
                assert!(decode(&bad).is_err(), "byte {at} ^ {flip:#x} accepted");
            }
        }
    }

    #[test]
    fn every_truncation_is_rejected_without_panicking() {
        let bytes = sample().encode();
        for len in 0..bytes.len() {
            let err = decode_error(&bytes[..len]);
            let explained = ["truncated", "cannot fit", "not a Sluice template"];
            assert!(
                explained.iter().any(|e| err.contains(e)),
                "cut at {len}: {err}"
            );
        }
        let spec_at = HEADER_BYTES + SERVICE_BYTES + 3;
        assert!(decode_error(&bytes[..spec_at]).contains("truncated at spec"));
        let err = decode_error(&bytes[..bytes.len() - 1]);
        assert!(err.contains("truncated at checksum trailer"), "{err}");
    }

    #[test]
    fn rejects_bytes_after_the_checksum() {
        let mut bytes = sample().encode();
        bytes.push(0);
        assert!(decode_error(&bytes).contains("1 bytes after the checksum"));
    }

    #[test]
    fn rejects_hostile_counts_before_allocating() {
        let mut huge_files = body_start();
        put_uleb(&mut huge_files, u64::MAX);
        let err = decode_error(&sealed(huge_files));
        assert!(
            err.contains("file count") && err.contains("cannot fit"),
            "{err}"
        );

        let mut huge_workers = body_start();
        put_uleb(&mut huge_workers, 0);
        put_uleb(&mut huge_workers, 1 << 40);
        let err = decode_error(&sealed(huge_workers));
        assert!(
            err.contains("worker count") && err.contains("cannot fit"),
            "{err}"
        );

        let mut huge_ranges = body_start();
        put_uleb(&mut huge_ranges, 0);
        put_uleb(&mut huge_ranges, 1);
        put_uleb(&mut huge_ranges, 0);
        put_uleb(&mut huge_ranges, 1 << 50);
        let err = decode_error(&sealed(huge_ranges));
        assert!(
            err.contains("range count") && err.contains("cannot fit"),
            "{err}"
        );

        let mut huge_spec = MAGIC.to_vec();
        huge_spec.extend_from_slice(&[1, 0, 0, 0]);
        huge_spec.extend_from_slice(&[0; 32]);
        put_uleb(&mut huge_spec, u64::MAX);
        let err = decode_error(&sealed(huge_spec));
        assert!(err.contains("truncated at spec"), "{err}");
    }

    #[test]
    fn rejects_leb128_overflow() {
        let mut too_long = body_start();
        too_long.extend_from_slice(&[0x80; 10]);
        too_long.push(0);
        let err = decode_error(&sealed(too_long));
        assert!(err.contains("longer than 10 bytes"), "{err}");
        let mut too_big = body_start();
        too_big.extend_from_slice(&[0xff; 9]);
        too_big.push(0x02);
        let err = decode_error(&sealed(too_big));
        assert!(err.contains("exceeds 64 bits"), "{err}");
    }

    #[test]
    fn rejects_file_indices_out_of_range() {
        let mut t = sample();
        t.workers[1].ranges[0].file = 5;
        let err = decode_error(&t.encode());
        assert!(
            err.contains("worker 3 range 0: file index 5 out of range"),
            "{err}"
        );
    }

    #[test]
    fn rejects_ranges_beyond_the_recorded_size_and_empty_ranges() {
        let mut t = sample();
        t.workers[1].ranges[0] = range(1, 4000, 1001);
        let err = decode_error(&t.encode());
        assert!(err.contains("beyond the recorded size 5000"), "{err}");
        t.workers[1].ranges[0] = range(1, u64::MAX, 2); // end overflows
        assert!(decode_error(&t.encode()).contains("beyond the recorded size"));
        t.workers[1].ranges[0] = range(1, 10, 0);
        assert!(decode_error(&t.encode()).contains("empty range"));
    }

    #[test]
    fn rejects_worker_numbers_out_of_order_or_beyond_u32() {
        let mut t = sample();
        t.workers.swap(0, 1);
        let err = decode_error(&t.encode());
        assert!(err.contains("worker numbers must increase"), "{err}");
        t.workers[1].worker = 3;
        assert!(decode_error(&t.encode()).contains("worker numbers must increase"));

        let mut big = body_start();
        put_uleb(&mut big, 0);
        put_uleb(&mut big, 1);
        put_uleb(&mut big, 1 << 32);
        put_uleb(&mut big, 0);
        let err = decode_error(&sealed(big));
        assert!(
            err.contains("worker number 4294967296 does not fit u32"),
            "{err}"
        );
    }

    #[test]
    fn rejects_non_utf8_paths() {
        let mut body = body_start();
        put_uleb(&mut body, 1);
        put_bytes(&mut body, &[b'a', 0xff, 0xfe]);
        put_uleb(&mut body, 10);
        put_uleb(&mut body, 0);
        put_uleb(&mut body, 0);
        let err = decode_error(&sealed(body));
        assert!(
            err.contains("file 0: path") && err.contains("not UTF-8"),
            "{err}"
        );
    }

    #[test]
    fn rejects_paths_that_leave_the_model_directory() {
        for (path, why) in [
            ("/etc/passwd", "absolute"),
            ("../secret", "'..'"),
            ("a/../../b", "'..'"),
            ("a/..", "'..'"),
            ("a//b", "empty component"),
            ("./a", "'.'"),
            ("", "empty path"),
            ("a\0b", "NUL"),
        ] {
            let mut t = sample();
            t.files[1].path = path.into();
            let err = decode_error(&t.encode());
            assert!(
                err.contains("file 1") && err.contains(why),
                "{path:?}: {err}"
            );
        }
    }

    #[test]
    fn store_load_of_a_missing_service_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let id = ServiceId::from_spec("nothing recorded");
        assert!(TemplateStore::new(dir.path()).load(&id).unwrap().is_none());
        let absent_dir = TemplateStore::new(dir.path().join("not-yet"));
        assert!(absent_dir.load(&id).unwrap().is_none());
    }

    #[test]
    fn store_saves_under_the_hex_id_and_loads_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = TemplateStore::new(dir.path().join("templates"));
        let t = sample();
        let path = store.save(&t).unwrap();
        let name = format!("{}.sluicetpl", t.service.to_hex());
        assert_eq!(path, dir.path().join("templates").join(&name));
        assert_eq!(store.path_for(&t.service), path);
        assert_eq!(store.load(&t.service).unwrap(), Some(t));
    }

    #[test]
    fn store_rejects_a_file_holding_another_service() {
        let dir = tempfile::tempdir().unwrap();
        let store = TemplateStore::new(dir.path());
        let t = sample();
        let saved = store.save(&t).unwrap();
        let other = ServiceId::from_spec("other");
        std::fs::rename(saved, store.path_for(&other)).unwrap();
        let err = store.load(&other).unwrap_err().to_string();
        assert!(err.contains("holds the template of service"), "{err}");
        assert!(err.contains(&other.to_hex()), "{err}");
    }

    #[test]
    fn relative_path_strips_the_model_directory_and_refuses_outside() {
        let dir = Path::new("/models/llama");
        let inside = Path::new("/models/llama/sub/./m.safetensors");
        assert_eq!(relative_path(dir, inside).unwrap(), "sub/m.safetensors");
        for outside in ["/models/other/m", "/models/llama", "/models/llama/../x"] {
            let err = relative_path(dir, Path::new(outside)).unwrap_err();
            assert!(
                err.to_string().contains("not a file inside"),
                "{outside}: {err}"
            );
        }
    }

    #[test]
    fn changed_files_reports_size_mtime_and_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["same", "grown", "touched", "gone"] {
            std::fs::write(dir.path().join(name), b"0123").unwrap();
        }
        let mut rec = Recorder::new(ServiceId::from_spec("m"), "m".into());
        for name in ["same", "grown", "touched", "gone"] {
            let f = TemplateFile::from_disk(dir.path(), name).unwrap();
            rec.file(f.path, f.size, f.mtime_ns);
        }
        let t = rec.finish();
        assert!(t.changed_files(dir.path()).is_empty());
        std::fs::write(dir.path().join("grown"), b"012345").unwrap();
        let touched = File::options()
            .write(true)
            .open(dir.path().join("touched"))
            .unwrap();
        let earlier = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        touched.set_modified(earlier).unwrap();
        std::fs::remove_file(dir.path().join("gone")).unwrap();
        let changed = t.changed_files(dir.path());
        let kinds: Vec<(&str, &FileChange)> = changed
            .iter()
            .map(|c| (c.path.as_str(), &c.change))
            .collect();
        assert_eq!(kinds.len(), 3, "{changed:?}");
        assert_eq!(
            kinds[0].1,
            &FileChange::Size {
                recorded: 4,
                now: 6
            }
        );
        assert!(
            matches!(kinds[1].1, FileChange::Mtime { now, .. } if *now == 1_000_000_000_000_000)
        );
        assert!(
            matches!(kinds[2].1, FileChange::Unavailable(_)),
            "{changed:?}"
        );
    }

    /// One safetensors-style shard of the synthetic model.
    struct Shard {
        /// Bytes of the 8-byte length plus JSON header.
        header_bytes: u64,
        /// `(offset, len, split)` per tensor; `split` tensors are divided
        /// among tensor-parallel workers, the others (norms) replicated.
        tensors: Vec<(u64, u64, bool)>,
        size: u64,
    }

    /// A Llama-like bf16 checkpoint of about 16 GiB in 4 shards: embeddings
    /// and LM head of 128256 x 4096, 32 layers of q/k/v/o (16-32 MiB), a
    /// gate/up/down MLP of 118 MiB each and two 8 KiB norms.
    fn llama_like_shards() -> Vec<Shard> {
        let (hidden, kv, ffn, vocab) = (4096u64, 2048u64, 15104u64, 128_256u64);
        let mut tensors = vec![(vocab * hidden * 2, true)];
        for _ in 0..32 {
            tensors.extend([
                (hidden * 2, false),
                (hidden * hidden * 2, true),
                (kv * hidden * 2, true),
                (kv * hidden * 2, true),
                (hidden * hidden * 2, true),
                (hidden * 2, false),
                (ffn * hidden * 2, true),
                (ffn * hidden * 2, true),
                (ffn * hidden * 2, true),
            ]);
        }
        tensors.push((hidden * 2, false));
        tensors.push((vocab * hidden * 2, true));
        let total: u64 = tensors.iter().map(|t| t.0).sum();
        let mut groups: Vec<Vec<(u64, bool)>> = vec![Vec::new()];
        let mut in_group = 0;
        for t in tensors {
            if in_group >= total / 4 && groups.len() < 4 {
                groups.push(Vec::new());
                in_group = 0;
            }
            in_group += t.0;
            groups.last_mut().unwrap().push(t);
        }
        groups
            .into_iter()
            .map(|group| {
                // ~120 bytes of JSON per tensor, padded to 8 as safetensors does.
                let header_bytes = 8 + (group.len() as u64 * 120).next_multiple_of(8);
                let mut offset = header_bytes;
                let tensors = group
                    .into_iter()
                    .map(|(len, split)| {
                        offset += len;
                        (offset - len, len, split)
                    })
                    .collect();
                Shard {
                    header_bytes,
                    tensors,
                    size: offset,
                }
            })
            .collect()
    }

    /// Plays `[start, end)` into the recorder as a loader's accesses arrive:
    /// 1 MiB pieces, rounded out to whole pages as fanotify reports them.
    fn pieces(start: u64, end: u64) -> Vec<(u64, u64)> {
        (start..end)
            .step_by(MIB as usize)
            .map(|s| {
                let e = (s + MIB).min(end).next_multiple_of(PAGE);
                let s = s / PAGE * PAGE;
                (s, e - s)
            })
            .collect()
    }

    /// Records `workers` loader processes reading the shards in tensor
    /// order; with several workers each reads its quarter (row block) of
    /// every split tensor, their accesses interleaved piece by piece.
    fn record_load(shards: &[Shard], workers: u32) -> Template {
        let spec = format!("llama-like-16g tp={workers}");
        let mut rec = Recorder::new(ServiceId::from_spec(&spec), spec);
        for (i, shard) in shards.iter().enumerate() {
            let f = rec.file(
                format!("model-{:05}-of-00004.safetensors", i + 1),
                shard.size,
                0,
            );
            for w in 0..workers {
                rec.access(w, f, 0, 8);
                rec.access(w, f, 8, shard.header_bytes - 8);
            }
            for &(offset, len, split) in &shard.tensors {
                let parts: Vec<(u32, Vec<(u64, u64)>)> = (0..workers)
                    .map(|w| {
                        let (n, w64) = (u64::from(workers), u64::from(w));
                        let part = if split {
                            pieces(offset + w64 * len / n, offset + (w64 + 1) * len / n)
                        } else {
                            pieces(offset, offset + len)
                        };
                        (w, part)
                    })
                    .collect();
                let most = parts.iter().map(|p| p.1.len()).max().unwrap_or(0);
                for k in 0..most {
                    for (w, part) in &parts {
                        if let Some(&(o, l)) = part.get(k) {
                            rec.access(*w, f, o, l);
                        }
                    }
                }
            }
        }
        rec.finish()
    }

    #[test]
    fn a_16_gib_model_encodes_in_under_1_kib_per_gib() {
        let shards = llama_like_shards();
        assert_eq!(shards.len(), 4);
        let model_bytes: u64 = shards.iter().map(|s| s.size).sum();
        let model_gib = model_bytes as f64 / (1u64 << 30) as f64;
        assert!((15.5..16.5).contains(&model_gib), "{model_gib} GiB");
        let budget = 1024.0 * model_gib;
        for workers in [1u32, 4] {
            let t = record_load(&shards, workers);
            let bytes = t.encode();
            eprintln!(
                "template size: {:.2} GiB model, {workers} worker(s): {} ranges, {} bytes \
                 ({:.0} bytes/GiB, budget {budget:.0})",
                model_gib,
                t.range_count(),
                bytes.len(),
                bytes.len() as f64 / model_gib
            );
            assert!((bytes.len() as f64) <= budget, "{} bytes", bytes.len());
            assert_eq!(decode(&bytes).unwrap(), t);
            // Every byte is read by someone; replication and page rounding
            // add little.
            assert!(t.total_bytes() >= model_bytes);
            assert!(t.total_bytes() <= model_bytes + 64 * MIB);
            if workers == 1 {
                assert_eq!(t.range_count(), 4, "one range per shard");
            }
        }
    }

    fn arb_template() -> impl Strategy<Value = Template> {
        let size = prop_oneof![1u64..(1 << 40), 1u64..];
        let file = (
            "[a-z0-9_-]{1,8}(/[a-z0-9_-]{1,8}(\\.[a-z]{1,4})?){0,2}",
            size,
            any::<i64>(),
        )
            .prop_map(|(path, size, mtime_ns)| TemplateFile {
                path,
                size,
                mtime_ns,
            });
        let files = prop::collection::vec(file, 1..5);
        let seeds = prop::collection::vec((any::<u32>(), any::<u64>(), any::<u64>()), 0..20);
        let workers = prop::collection::btree_map(any::<u32>(), seeds, 0..5);
        (any::<[u8; 32]>(), "\\PC{0,20}", files, workers).prop_map(|(id, spec, files, workers)| {
            let workers = workers
                .into_iter()
                .map(|(worker, seeds)| {
                    let ranges = seeds
                        .into_iter()
                        .map(|(f, o, l)| {
                            let file = f % files.len() as u32;
                            let size = files[file as usize].size;
                            let offset = o % size;
                            range(file, offset, 1 + l % (size - offset))
                        })
                        .collect();
                    WorkerSequence { worker, ranges }
                })
                .collect();
            Template {
                service: ServiceId(id),
                spec,
                files,
                workers,
            }
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn arbitrary_templates_round_trip(t in arb_template()) {
            prop_assert_eq!(decode(&t.encode()).unwrap(), t);
        }

        #[test]
        fn arbitrary_bytes_never_panic(
            bytes in prop::collection::vec(any::<u8>(), 0..200),
            keep_header in any::<bool>(),
        ) {
            let mut bytes = bytes;
            if keep_header {
                bytes.splice(0..0, b"SLTPL\0\x01\x00\x00\x00".iter().copied());
            }
            prop_assert!(decode(&bytes).is_err());
            // With a valid checksum the bytes may even decode; they must
            // not panic.
            let _ = decode(&sealed(bytes));
        }

        #[test]
        fn recordings_are_valid_and_cover_every_access(
            accesses in prop::collection::vec((0u32..3, 0u32..2, 0u64..4096, 0u64..600), 0..60),
        ) {
            let mut rec = Recorder::new(ServiceId::from_spec("p"), "p".into()).with_merge_gap(64);
            rec.file("a".into(), 3000, 0);
            rec.file("b".into(), 5000, 0);
            for &(w, f, o, l) in &accesses {
                rec.access(w, f, o, l);
            }
            let t = rec.finish();
            t.validate(Path::new(NAME)).unwrap();
            prop_assert_eq!(decode(&t.encode()).unwrap(), t.clone());
            let size = [3000u64, 5000];
            for &(w, f, o, l) in &accesses {
                let end = (o + l).min(size[f as usize]);
                for byte in [o, end.saturating_sub(1)] {
                    if l > 0 && o < end {
                        prop_assert!(t.position_of(w, f, byte).is_some(), "{} {} {}", w, f, byte);
                    }
                }
            }
        }
    }
}
