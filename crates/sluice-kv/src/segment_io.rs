//! Where segment files live: the storage trait of the SSD tier. Its file-system
//! implementation is in `fs_dir.rs`, its fault-injecting double (tests and the `testing`
//! feature only) in `faulty.rs`.
//!
//! The segment store only ever creates a segment, writes whole slots at offsets it
//! reserved, reads slots back, syncs, lists and removes segments. [`SegmentDir`] is that
//! and nothing more, so the same store can later run over a shared file system or an
//! object store, and the tests can put [`FaultyDir`] underneath it to tear writes, fail
//! syncs, flip bits and run out of space.

use std::io::{self, IoSliceMut};
use std::path::PathBuf;
use std::sync::Arc;

mod fs_dir;
pub use fs_dir::{open_foreign_segment, FsSegmentDir};

#[cfg(any(test, feature = "testing"))]
mod faulty;
#[cfg(any(test, feature = "testing"))]
pub use faulty::{FaultyDir, KvFault};

/// One segment file. Offsets and lengths handed in by the store are multiples of 4 KiB and
/// buffers are page-aligned, so an O_DIRECT implementation can take them as they are.
pub trait SegmentFile: Send + Sync {
    /// Writes all of `bufs`, in order, from `offset`, or fails. With O_DIRECT every slice
    /// must be 4 KiB-aligned in address and length (the store stages what is not).
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`, or fails.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_vectored_at(&[buf], offset)
    }
    /// Reads into `bufs` in order from `offset`; returns the bytes read, short only at the
    /// end of the file.
    fn read_vectored_at(&self, bufs: &mut [IoSliceMut<'_>], offset: u64) -> io::Result<usize>;
    /// Reads `head` then `payload`, contiguous in the file from `offset`, handing the
    /// payload to `consume` in order, `piece` bytes at a time, as it lands: the caller can
    /// hash what arrived while the rest is still being read. Returns the bytes read, short
    /// only at the end of the file (`consume` has then not seen all of the payload).
    fn read_streamed(
        &self,
        offset: u64,
        head: &mut [u8],
        payload: &mut [u8],
        piece: usize,
        consume: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        let _ = piece;
        read_then_consume(self, offset, head, payload, consume)
    }
    /// Writes a record whose header depends on its payload (it carries the payload's hash):
    /// `payload` right after `head` from `offset`, `head` filled by `fill_head` first.
    /// Where it can, the payload is already being written, `piece` bytes per transfer,
    /// while `fill_head` runs (hashing it), and the header goes last: a record whose header
    /// never landed is an empty slot to every reader.
    fn write_record(
        &self,
        offset: u64,
        head: &mut [u8],
        payload: &[u8],
        piece: usize,
        fill_head: &mut dyn FnMut(&mut [u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        let _ = piece;
        fill_then_write(self, offset, head, payload, fill_head)
    }
    /// Makes every completed write durable (`fdatasync`).
    fn sync(&self) -> io::Result<()>;
    /// Whether reads and writes bypass the page cache (then buffers must be aligned).
    fn is_direct(&self) -> bool;
}

/// A directory of segment files named by id.
pub trait SegmentDir: Send + Sync {
    /// Creates segment `id` (it must not exist), sized `len` bytes if the file system can
    /// reserve space.
    fn create(&self, id: u64, len: u64) -> io::Result<Arc<dyn SegmentFile>>;
    fn open(&self, id: u64) -> io::Result<Arc<dyn SegmentFile>>;
    /// Ids of every segment present, in any order.
    fn list(&self) -> io::Result<Vec<u64>>;
    fn remove(&self, id: u64) -> io::Result<()>;
    /// Bytes segment `id` occupies (its file length).
    fn len(&self, id: u64) -> io::Result<u64>;
    /// The path of segment `id`, for messages.
    fn path_of(&self, id: u64) -> PathBuf;
}

/// [`SegmentFile::read_streamed`] without streaming: one vectored read, then the whole
/// payload handed on.
fn read_then_consume(
    file: &(impl SegmentFile + ?Sized),
    offset: u64,
    head: &mut [u8],
    payload: &mut [u8],
    consume: &mut dyn FnMut(&[u8]),
) -> io::Result<usize> {
    let want = head.len() + payload.len();
    let n = file.read_vectored_at(
        &mut [IoSliceMut::new(head), IoSliceMut::new(payload)],
        offset,
    )?;
    if n >= want {
        consume(payload);
    }
    Ok(n)
}

/// [`SegmentFile::write_record`] without overlap: the header filled, then one write.
fn fill_then_write(
    file: &(impl SegmentFile + ?Sized),
    offset: u64,
    head: &mut [u8],
    payload: &[u8],
    fill_head: &mut dyn FnMut(&mut [u8]) -> io::Result<()>,
) -> io::Result<()> {
    fill_head(head)?;
    file.write_vectored_at(&[head, payload], offset)
}
