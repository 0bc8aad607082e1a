//! The I/O engine contract shared by every reader implementation.
//!
//! An engine pulls [`ReadOp`]s from an [`OpSource`], keeps up to its queue
//! depth in flight, and reports each finished op to a sink in completion
//! order. The source decides what to read next and may refuse for now
//! ([`Next::Wait`]) when, say, its buffer budget is spent; the engine then
//! only reaps completions, which is what eventually frees budget. The engine
//! asks with `may_block = true` only when nothing is in flight, so a source
//! that blocks can never starve completions that would unblock it.

use std::io;
use std::sync::Arc;

use crate::buffer_pool::PooledBuf;
use crate::source_file::SourceFile;

/// Memory a read may land in: a pooled buffer, or memory the caller lent
/// ([`LentMemory`]). Implementations hand out pointers only inside their
/// bounds.
pub trait ReadTarget: Send + Sync {
    /// Start of `len` bytes at `offset`, or `None` if the range leaves the memory.
    fn ptr_range(&self, offset: usize, len: usize) -> Option<*mut u8>;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// True for zero-length memory.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl ReadTarget for PooledBuf {
    fn ptr_range(&self, offset: usize, len: usize) -> Option<*mut u8> {
        (**self).ptr_range(offset, len)
    }
    fn len(&self) -> usize {
        (**self).len()
    }
}

/// Memory owned by someone else (a caller's tensor), lent to reads for as
/// long as this value lives.
#[derive(Debug)]
pub struct LentMemory {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: `LentMemory` is a bounds-checked pointer; the lender promises (see
// `LentMemory::new`) that the memory stays valid and is written only by the
// reads given it, which the engines never overlap.
unsafe impl Send for LentMemory {}
// SAFETY: as above; shared references only hand out raw pointers.
unsafe impl Sync for LentMemory {}

impl LentMemory {
    /// # Safety
    /// `ptr .. ptr + len` must be writable memory that stays valid, and is
    /// neither read nor written by anyone else, until every `Arc` of this
    /// value is dropped and every read given it has completed.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> LentMemory {
        LentMemory { ptr, len }
    }
}

impl ReadTarget for LentMemory {
    fn ptr_range(&self, offset: usize, len: usize) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        // SAFETY: offset <= self.len, so the result stays inside the lent range.
        Some(unsafe { self.ptr.add(offset) })
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// The address ranges this process may write, as `/proc/self/maps` lists them: what a
/// lender checks its memory against, so that memory mapped read-only (a tensor over a
/// read-only file mapping) is refused up front rather than faulting in the copy that fills it.
#[derive(Debug)]
pub struct WritableRanges {
    /// Sorted, disjoint `[start, end)` ranges, neighbours merged.
    ranges: Vec<(usize, usize)>,
}

impl WritableRanges {
    /// This process's writable mappings now.
    pub fn of_this_process() -> io::Result<WritableRanges> {
        let maps = std::fs::read_to_string("/proc/self/maps")?;
        Ok(WritableRanges::parse(&maps))
    }

    /// Parses `/proc/<pid>/maps` text; lines it cannot read are skipped.
    pub fn parse(maps: &str) -> WritableRanges {
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        for line in maps.lines() {
            let mut fields = line.split_ascii_whitespace();
            let (Some(span), Some(perms)) = (fields.next(), fields.next()) else {
                continue;
            };
            if perms.as_bytes().get(1) != Some(&b'w') {
                continue;
            }
            let Some((start, end)) = span.split_once('-') else {
                continue;
            };
            let (Ok(start), Ok(end)) = (
                usize::from_str_radix(start, 16),
                usize::from_str_radix(end, 16),
            ) else {
                continue;
            };
            match ranges.last_mut() {
                Some(last) if last.1 == start => last.1 = end,
                _ => ranges.push((start, end)),
            }
        }
        ranges.sort_unstable();
        WritableRanges { ranges }
    }

    /// Whether every byte of `start .. start + len` may be written.
    pub fn covers(&self, start: usize, len: usize) -> bool {
        if len == 0 {
            return true;
        }
        let Some(end) = start.checked_add(len) else {
            return false;
        };
        let i = self.ranges.partition_point(|&(_, e)| e <= start);
        self.ranges
            .get(i)
            .is_some_and(|&(s, e)| s <= start && end <= e)
    }
}

/// Fill `len` bytes of `buf` at `buf_offset` from `file` at `offset`.
pub struct ReadOp {
    pub file: Arc<SourceFile>,
    pub offset: u64,
    pub len: usize,
    pub buf: Arc<dyn ReadTarget>,
    pub buf_offset: usize,
    /// Caller's tag, returned untouched with the completion.
    pub token: u64,
}

impl ReadOp {
    /// Destination pointer, or an error if the range leaves the buffer.
    pub fn dst(&self) -> io::Result<*mut u8> {
        self.buf
            .ptr_range(self.buf_offset, self.len)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "read of {} bytes at buffer offset {} overruns a {}-byte buffer",
                        self.len,
                        self.buf_offset,
                        ReadTarget::len(&*self.buf)
                    ),
                )
            })
    }
}

impl std::fmt::Debug for ReadOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadOp")
            .field("file", &self.file.path())
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("token", &self.token)
            .finish()
    }
}

/// What an [`OpSource`] has to offer.
#[derive(Debug)]
pub enum Next {
    /// Submit this read.
    Op(ReadOp),
    /// Nothing can start now; ask again after a completion.
    Wait,
    /// No more reads will come.
    Done,
}

/// Supplies reads to an engine.
pub trait OpSource {
    /// The next read. With `may_block`, nothing is in flight and the source
    /// may block until it can answer `Op` or `Done`; it should not answer
    /// `Wait` then (the engine would have to poll).
    fn next_op(&mut self, may_block: bool) -> Next;
}

/// Receives finished reads: `Ok(n)` holds the bytes read, which is below
/// `op.len` only when the file ended first.
pub type Sink<'a> = dyn FnMut(ReadOp, io::Result<usize>) + 'a;

/// Which implementation runs the reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    IoUring,
    Threads,
    /// One read at a time on the calling thread: the plain reference engine.
    Sync,
    /// Ranged GETs of remote objects, as futures on an async runtime.
    ObjectStore,
}

impl EngineKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::IoUring => "io_uring",
            EngineKind::Threads => "threads",
            EngineKind::Sync => "sync",
            EngineKind::ObjectStore => "object_store",
        }
    }
}

/// Runs reads at some queue depth until the source is done.
pub trait IoEngine: Send + Sync {
    fn kind(&self) -> EngineKind;

    /// Runs every op the source gives, calling `sink` once per op, and
    /// returns when the source said `Done` and nothing is in flight. An
    /// `Err` means the engine itself broke (e.g. ring setup), not a read.
    fn run(&self, source: &mut dyn OpSource, sink: &mut Sink<'_>) -> io::Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writable_ranges_follow_the_maps_permissions() {
        let maps = "\
1000-3000 rw-p 00000000 00:00 0
3000-4000 rw-p 00000000 00:00 0 [heap]
5000-6000 r--p 00000000 fd:01 42 /model.bin
6000-7000 ---p 00000000 00:00 0
7000-8000 rwxp 00000000 00:00 0
bad line
";
        let w = WritableRanges::parse(maps);
        assert!(w.covers(0x1000, 0x3000), "neighbours merge");
        assert!(w.covers(0x3fff, 1));
        assert!(!w.covers(0x3fff, 2), "runs into an unmapped gap");
        assert!(!w.covers(0x5000, 16), "read-only");
        assert!(!w.covers(0x6000, 1), "no access");
        assert!(w.covers(0x7000, 0x1000));
        assert!(!w.covers(0x0, 1));
        assert!(w.covers(0x5000, 0), "nothing to write");
        assert!(!w.covers(usize::MAX, 2));
    }

    #[test]
    fn this_process_can_write_its_own_heap_and_not_its_code() {
        let heap = vec![0u8; 1 << 20];
        let w = WritableRanges::of_this_process().unwrap();
        assert!(w.covers(heap.as_ptr() as usize, heap.len()));
        let code = this_process_can_write_its_own_heap_and_not_its_code as fn() as usize;
        assert!(!w.covers(code, 16));
    }

    #[test]
    fn lent_memory_hands_out_only_ranges_inside_it() {
        let mut backing = [0u8; 64];
        // SAFETY: `backing` outlives `lent` and nothing else touches it meanwhile.
        let lent = unsafe { LentMemory::new(backing.as_mut_ptr().add(8), 32) };
        assert_eq!(ReadTarget::len(&lent), 32);
        assert!(lent.ptr_range(0, 32).is_some());
        assert!(lent.ptr_range(31, 1).is_some());
        assert!(lent.ptr_range(31, 2).is_none());
        assert!(lent.ptr_range(33, 0).is_none());
        assert!(lent.ptr_range(usize::MAX, 2).is_none());
        let start = lent.ptr_range(4, 4).unwrap();
        // SAFETY: inside the lent range, checked just above.
        unsafe { start.write_bytes(7, 4) };
        assert_eq!(&backing[12..16], &[7; 4]);
        assert!(backing[..12].iter().chain(&backing[16..]).all(|&b| b == 0));
    }
}
