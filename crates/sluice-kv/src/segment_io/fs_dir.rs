//! [`FsSegmentDir`]: segment files in one directory of a local or shared file system,
//! O_DIRECT where the file system takes it, with record reads and writes streamed through
//! io_uring in pieces where that works (the checksum then overlaps the transfer).

use std::fs::{File, OpenOptions};
use std::io::{self, IoSliceMut};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sluice_engine::{open_regular, open_regular_rw, retry_eintr};
use sluice_formats::kv::KV_ALIGN;

use super::{fill_then_write, read_then_consume, SegmentDir, SegmentFile};
use crate::config::DirectIo;

/// Segments as files `seg-<id as 16 hex digits>.skv` in one directory.
pub struct FsSegmentDir {
    root: PathBuf,
    direct: DirectIo,
    io_uring: bool,
    /// Opened for writing; a read-only directory opens every segment O_RDONLY and refuses
    /// to create or remove one.
    writable: bool,
}

impl FsSegmentDir {
    pub fn new(root: &Path, direct: DirectIo) -> FsSegmentDir {
        FsSegmentDir {
            root: root.to_path_buf(),
            direct,
            io_uring: false,
            writable: true,
        }
    }

    /// The segments of `root` for reading only (`kv stats`, `kv fsck` without repair): no
    /// file is opened for writing, so a read-only file system or a user who may only read
    /// the store can still read it.
    pub fn read_only(root: &Path, direct: DirectIo) -> FsSegmentDir {
        FsSegmentDir {
            writable: false,
            ..FsSegmentDir::new(root, direct)
        }
    }

    fn refuse_write(&self, id: u64) -> io::Result<()> {
        match self.writable {
            true => Ok(()),
            false => Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{}: the segment directory was opened read-only",
                    self.path_of(id).display()
                ),
            )),
        }
    }

    /// Streams O_DIRECT record reads through io_uring, in pieces, where it works
    /// ([`SegmentFile::read_streamed`]); off, each read is one `preadv`.
    pub fn with_io_uring(mut self, on: bool) -> FsSegmentDir {
        self.io_uring = on;
        self
    }

    fn open_file(&self, id: u64, create: bool) -> io::Result<FsSegment> {
        let path = self.path_of(id);
        let open = |direct: bool| {
            let flags = if direct { libc::O_DIRECT } else { 0 };
            if !create {
                // An existing segment could have been replaced by a FIFO or a directory.
                return match self.writable {
                    true => open_regular_rw(&path, flags),
                    false => open_regular(&path, flags),
                };
            }
            OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .custom_flags(flags)
                .open(&path)
        };
        let file = match self.direct {
            DirectIo::Off => open(false)?,
            DirectIo::On => open(true)?,
            DirectIo::Auto => match open(true) {
                Ok(f) => f,
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    tracing::info!(
                        "{}: O_DIRECT refused ({e}); using buffered I/O",
                        path.display()
                    );
                    open(false)?
                }
                Err(e) => return Err(e),
            },
        };
        let direct =
            self.direct == DirectIo::On || (self.direct == DirectIo::Auto && has_o_direct(&file));
        Ok(FsSegment {
            file,
            direct,
            io_uring: self.io_uring,
        })
    }
}

/// Opens another store's segment, read-only (the shared tier reads what other nodes
/// wrote; it may not write their files). O_DIRECT as `direct` says, falling back to
/// buffered reads where the file system refuses it.
pub fn open_foreign_segment(path: &Path, direct: DirectIo) -> io::Result<Arc<dyn SegmentFile>> {
    let file = match direct {
        DirectIo::Off => open_regular(path, 0)?,
        DirectIo::On => open_regular(path, libc::O_DIRECT)?,
        DirectIo::Auto => match open_regular(path, libc::O_DIRECT) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => open_regular(path, 0)?,
            Err(e) => return Err(e),
        },
    };
    let direct = has_o_direct(&file);
    Ok(Arc::new(FsSegment {
        file,
        direct,
        io_uring: false,
    }))
}

fn has_o_direct(file: &File) -> bool {
    // SAFETY: F_GETFL on a descriptor we own reads its flags and changes nothing.
    let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    flags >= 0 && flags & libc::O_DIRECT != 0
}

impl SegmentDir for FsSegmentDir {
    fn create(&self, id: u64, len: u64) -> io::Result<Arc<dyn SegmentFile>> {
        self.refuse_write(id)?;
        let seg = self.open_file(id, true)?;
        // Reserving the extent up front keeps appends from allocating blocks one by one;
        // where the file system cannot, writes allocate as they go.
        // SAFETY: fallocate on a descriptor we own; mode 0 only allocates.
        let rc = unsafe { libc::fallocate(seg.file.as_raw_fd(), 0, 0, len as libc::off_t) };
        if rc != 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ENOSPC) {
                drop(seg);
                let _ = std::fs::remove_file(self.path_of(id));
                return Err(err);
            }
            tracing::debug!("{}: fallocate: {err}", self.path_of(id).display());
        }
        Ok(Arc::new(seg))
    }

    fn open(&self, id: u64) -> io::Result<Arc<dyn SegmentFile>> {
        Ok(Arc::new(self.open_file(id, false)?))
    }

    fn list(&self) -> io::Result<Vec<u64>> {
        let mut ids = Vec::new();
        for entry in std::fs::read_dir(&self.root)? {
            let name = entry?.file_name();
            match classify(&name) {
                Entry::Segment(id) => ids.push(id),
                Entry::Companion => {}
                Entry::Stray(why) => {
                    tracing::warn!("{}: {why}; skipped", self.root.join(&name).display())
                }
            }
        }
        Ok(ids)
    }

    fn remove(&self, id: u64) -> io::Result<()> {
        self.refuse_write(id)?;
        std::fs::remove_file(self.path_of(id))
    }

    fn len(&self, id: u64) -> io::Result<u64> {
        Ok(std::fs::metadata(self.path_of(id))?.len())
    }

    fn path_of(&self, id: u64) -> PathBuf {
        self.root.join(format!("seg-{id:016x}.skv"))
    }
}

/// What a name in a segment directory is.
#[derive(Debug, PartialEq, Eq)]
enum Entry {
    /// `seg-<id as 16 lowercase hex digits>.skv`, exactly as [`FsSegmentDir::path_of`] names it.
    Segment(u64),
    /// A segment's `.sealed` marker or `.summary`, or a hidden temporary file.
    Companion,
    /// Anything else: never written by the store, so never read or removed by it.
    Stray(&'static str),
}

fn classify(name: &std::ffi::OsStr) -> Entry {
    let Some(name) = name.to_str() else {
        return Entry::Stray("not a name this store writes");
    };
    if name.starts_with('.') {
        return Entry::Companion;
    }
    let Some((stem, ext)) = name.rsplit_once('.') else {
        return Entry::Stray("not a name this store writes");
    };
    let id = stem
        .strip_prefix("seg-")
        .filter(|hex| {
            hex.len() == 16 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        })
        .and_then(|hex| u64::from_str_radix(hex, 16).ok());
    match (ext, id) {
        ("skv", Some(id)) => Entry::Segment(id),
        ("sealed" | "summary", Some(_)) => Entry::Companion,
        ("skv", None) => {
            Entry::Stray("not a segment name this store writes (seg-<16 hex digits>.skv)")
        }
        _ => Entry::Stray("not a name this store writes"),
    }
}

struct FsSegment {
    file: File,
    direct: bool,
    /// Stream reads through io_uring (direct files only).
    io_uring: bool,
}

impl SegmentFile for FsSegment {
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        if let [one] = bufs {
            return self.file.write_all_at(one, offset);
        }
        let wanted: usize = bufs.iter().map(|b| b.len()).sum();
        let mut done = 0usize;
        while done < wanted {
            match pwritev_from(&self.file, bufs, done, offset + done as u64)? {
                0 => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                n => done += n,
            }
        }
        Ok(())
    }

    fn read_vectored_at(&self, bufs: &mut [IoSliceMut<'_>], offset: u64) -> io::Result<usize> {
        let mut done = 0usize;
        let wanted: usize = bufs.iter().map(|b| b.len()).sum();
        while done < wanted {
            let n = preadv_from(&self.file, bufs, done, offset + done as u64)?;
            if n == 0 {
                break;
            }
            done += n;
        }
        Ok(done)
    }

    fn read_streamed(
        &self,
        offset: u64,
        head: &mut [u8],
        payload: &mut [u8],
        piece: usize,
        consume: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        // A payload of one piece gains nothing from streaming, and its header would cost
        // a second device request: one vectored read instead.
        if !(self.io_uring && self.direct) || payload.len() <= piece {
            return read_then_consume(self, offset, head, payload, consume);
        }
        match stream_through_uring(&self.file, offset, head, payload, piece, consume) {
            Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                read_then_consume(self, offset, head, payload, consume)
            }
            other => other,
        }
    }

    fn write_record(
        &self,
        offset: u64,
        head: &mut [u8],
        payload: &[u8],
        piece: usize,
        fill_head: &mut dyn FnMut(&mut [u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        // Overlapping the hash with the write costs the header a request of its own; below
        // a few pieces the hash is shorter than that request (BLAKE3 does 1 MiB in about
        // 0.17 ms here), so small records go as one vectored write.
        if !(self.io_uring && self.direct) || payload.len() <= OVERLAP_MIN_PIECES * piece {
            return fill_then_write(self, offset, head, payload, fill_head);
        }
        let fd = self.file.as_raw_fd();
        let written = sluice_engine::with_ring(fd, |batch| {
            write_record_through(batch, offset, head, payload, piece, fill_head)
        });
        match written {
            Ok(result) => result,
            Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                fill_then_write(self, offset, head, payload, fill_head)
            }
            Err(e) => Err(e),
        }
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn is_direct(&self) -> bool {
        self.direct
    }
}

/// The size of a record's pieces: about an eighth of the payload, between `piece` and
/// [`MAX_PIECE_BYTES`], few enough that the header and every piece fit in one ring batch,
/// and a multiple of 4 KiB, which O_DIRECT needs of every transfer's offset and length (an
/// odd size here made 32 MiB records fail with EINVAL).
fn piece_bytes(piece: usize, payload: usize) -> usize {
    (payload / TARGET_PIECES)
        .clamp(piece, MAX_PIECE_BYTES.max(piece))
        .max(payload.div_ceil(sluice_engine::MAX_PARTS - 1))
        .next_multiple_of(KV_ALIGN)
}

/// Pieces per record aimed at: enough that hashing the last one adds little to a read (an
/// eighth of a 32 MiB block hashes in 0.7 ms), few enough that each is a large request.
const TARGET_PIECES: usize = 8;

/// The largest piece: 4 MiB, a virtio or NVMe queue's usual largest request
/// (`max_sectors_kb`); 64 pieces of 512 KiB read a 32 MiB block 40% slower than its peers'
/// single read on this machine.
const MAX_PIECE_BYTES: usize = 4 << 20;

/// Pieces a record's payload must exceed before its write is overlapped with its hash.
const OVERLAP_MIN_PIECES: usize = 4;

/// [`SegmentFile::write_record`] on a ring: the payload's pieces submitted, the header
/// filled (the payload hashed) while they are written, then the header submitted.
fn write_record_through(
    batch: &mut sluice_engine::RingBatch<'_>,
    offset: u64,
    head: &mut [u8],
    payload: &[u8],
    piece: usize,
    fill_head: &mut dyn FnMut(&mut [u8]) -> io::Result<()>,
) -> io::Result<()> {
    let piece = piece_bytes(piece, payload.len());
    let payload_at = offset + head.len() as u64;
    for start in (0..payload.len()).step_by(piece) {
        let part = sluice_engine::Part {
            offset: payload_at + start as u64,
            // The kernel only reads a written part; `*mut` is what the descriptor takes.
            ptr: payload[start..].as_ptr().cast_mut(),
            len: piece.min(payload.len() - start),
            write: true,
        };
        // SAFETY: the part lies inside `payload`, borrowed until the batch is waited for
        // (here, or by the batch's drop on an early return).
        unsafe { batch.submit(part)? };
    }
    fill_head(head)?;
    let part = sluice_engine::Part {
        offset,
        ptr: head.as_mut_ptr(),
        len: head.len(),
        write: true,
    };
    // SAFETY: as above, for `head`.
    unsafe { batch.submit(part)? };
    batch.wait_all(&mut |_| {})
}

/// [`SegmentFile::read_streamed`] over io_uring: the header and every piece of the
/// payload submitted at once, the pieces handed on in order as they complete.
fn stream_through_uring(
    file: &File,
    offset: u64,
    head: &mut [u8],
    payload: &mut [u8],
    piece: usize,
    consume: &mut dyn FnMut(&[u8]),
) -> io::Result<usize> {
    let piece = piece_bytes(piece, payload.len());
    let base = payload.as_mut_ptr();
    let mut parts = vec![sluice_engine::Part {
        offset,
        ptr: head.as_mut_ptr(),
        len: head.len(),
        write: false,
    }];
    let payload_at = offset + head.len() as u64;
    for start in (0..payload.len()).step_by(piece) {
        parts.push(sluice_engine::Part {
            offset: payload_at + start as u64,
            // SAFETY: `start < payload.len()`.
            ptr: unsafe { base.add(start) },
            len: piece.min(payload.len() - start),
            write: false,
        });
    }
    let mut landed = 0usize;
    let mut ready = |i: usize| {
        let p = parts[i];
        landed += p.len;
        if i > 0 {
            // SAFETY: part `i` is complete, and no read is in flight into it; the other
            // parts' ranges do not overlap it.
            consume(unsafe { std::slice::from_raw_parts(p.ptr, p.len) });
        }
    };
    // SAFETY: the parts cover disjoint ranges of `head` and `payload`, which this function
    // borrows mutably until the call returns.
    let read = unsafe { sluice_engine::read_in_order(file.as_raw_fd(), &parts, &mut ready) };
    match read {
        Ok(()) => Ok(landed),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(landed),
        Err(e) => Err(e),
    }
}

/// The iovecs of `bufs` (start, length) less their first `skip` bytes.
fn iovecs_from(bufs: impl Iterator<Item = (*mut u8, usize)>, skip: usize) -> Vec<libc::iovec> {
    let mut iov = Vec::new();
    let mut skip = skip;
    for (ptr, len) in bufs {
        if skip >= len {
            skip -= len;
            continue;
        }
        iov.push(libc::iovec {
            // SAFETY: `skip < len`, so the pointer stays inside the buffer.
            iov_base: unsafe { ptr.add(skip) }.cast(),
            iov_len: len - skip,
        });
        skip = 0;
    }
    iov
}

/// One `preadv` of `bufs` starting `skip` bytes into them.
fn preadv_from(
    file: &File,
    bufs: &mut [IoSliceMut<'_>],
    skip: usize,
    at: u64,
) -> io::Result<usize> {
    let iov = iovecs_from(bufs.iter_mut().map(|b| (b.as_mut_ptr(), b.len())), skip);
    // SAFETY: every iovec points into a live, exclusively borrowed buffer.
    retry_eintr(|| unsafe {
        libc::preadv(
            file.as_raw_fd(),
            iov.as_ptr(),
            iov.len() as libc::c_int,
            at as libc::off_t,
        )
    })
}

/// One `pwritev` of `bufs` starting `skip` bytes into them.
fn pwritev_from(file: &File, bufs: &[&[u8]], skip: usize, at: u64) -> io::Result<usize> {
    // The kernel only reads through these pointers; the cast to `*mut` is what iovec wants.
    let iov = iovecs_from(bufs.iter().map(|b| (b.as_ptr().cast_mut(), b.len())), skip);
    // SAFETY: every iovec points into a live, borrowed buffer the kernel only reads.
    retry_eintr(|| unsafe {
        libc::pwritev(
            file.as_raw_fd(),
            iov.as_ptr(),
            iov.len() as libc::c_int,
            at as libc::off_t,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_names_the_store_writes_are_segments() {
        let c = |n: &str| classify(std::ffi::OsStr::new(n));
        assert_eq!(c("seg-000000000000002a.skv"), Entry::Segment(42));
        assert_eq!(c("seg-000000000000002a.sealed"), Entry::Companion);
        assert_eq!(c("seg-000000000000002a.summary"), Entry::Companion);
        assert_eq!(c(".tmp-summary-1"), Entry::Companion);
        for stray in [
            "seg-5.skv",
            "seg-000000000000002A.skv",
            "seg-+00000000000002a.skv",
            "x.skv",
        ] {
            assert!(matches!(c(stray), Entry::Stray(_)), "{stray}");
        }
        assert!(matches!(c("notes.txt"), Entry::Stray(_)));
    }

    #[test]
    fn pieces_are_4k_multiples_and_fit_one_ring_batch_at_every_size() {
        for payload in [4096, 1 << 20, (16 << 20) + (64 << 10), 32 << 20, 1 << 30] {
            let piece = piece_bytes(256 << 10, payload);
            assert_eq!(piece % KV_ALIGN, 0, "{payload}: {piece}");
            assert!(
                payload.div_ceil(piece) < sluice_engine::MAX_PARTS,
                "{payload}"
            );
        }
    }
}
