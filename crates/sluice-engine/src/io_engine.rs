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

/// Fill `len` bytes of `buf` at `buf_offset` from `file` at `offset`.
pub struct ReadOp {
    pub file: Arc<SourceFile>,
    pub offset: u64,
    pub len: usize,
    pub buf: Arc<PooledBuf>,
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
                        self.buf.len()
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
