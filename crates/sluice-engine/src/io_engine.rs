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
