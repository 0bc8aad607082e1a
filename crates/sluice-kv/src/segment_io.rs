//! Where segment files live: the storage trait of the SSD tier, its file-system
//! implementation, and a fault-injecting double.
//!
//! The segment store only ever creates a segment, writes whole slots at offsets it
//! reserved, reads slots back, syncs, lists and removes segments. [`SegmentDir`] is that
//! and nothing more, so the same store can later run over a shared file system or an
//! object store, and the tests can put [`FaultyDir`] underneath it to tear writes, fail
//! syncs, flip bits and run out of space.

use std::fs::{File, OpenOptions};
use std::io::{self, IoSliceMut};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use sluice_engine::{open_regular, open_regular_rw, retry_eintr};

use sluice_formats::kv::KV_ALIGN;

use crate::config::DirectIo;

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

/// A fault [`FaultyDir`] injects. Counters are per kind and count from 1 over the life of
/// the double (the segment header write is write 1 of each segment created).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvFault {
    /// Write number `nth` fails with EIO and writes nothing.
    FailWrite { nth: u64 },
    /// Write number `nth` writes only its first `keep` bytes, then fails (a torn write).
    TornWrite { nth: u64, keep: usize },
    /// Write number `nth` reports success but writes only its first `keep` bytes (a lost
    /// write the device acknowledged).
    SilentTornWrite { nth: u64, keep: usize },
    /// Read number `nth` fails with EIO.
    FailRead { nth: u64 },
    /// Read number `nth` returns only half of what was asked.
    ShortRead { nth: u64 },
    /// Read number `nth` comes back with byte `at` (of the whole read) flipped.
    FlipBit { nth: u64, at: usize },
    /// Sync number `nth` fails with EIO.
    FailSync { nth: u64 },
    /// Creating a segment, or writing, fails with ENOSPC once `bytes` have been written.
    NoSpaceAfter { bytes: u64 },
    /// Every write takes `millis` longer (a slow or stalled disk).
    SlowWrite { millis: u64 },
    /// Removing a segment takes `millis` longer (a slow file system under reclamation).
    SlowRemove { millis: u64 },
    /// Reads made by the store's reclaim thread wait until [`FaultyDir::release_reads`]
    /// (a compaction stalled in the middle of its copies).
    HoldReclaimReads,
}

#[derive(Default)]
struct FaultState {
    faults: Vec<KvFault>,
    writes: u64,
    reads: u64,
    syncs: u64,
    written_bytes: u64,
    /// Reads waiting under `HoldReclaimReads`.
    held: u64,
}

/// A [`SegmentDir`] over another that injects [`KvFault`]s.
pub struct FaultyDir {
    inner: Arc<dyn SegmentDir>,
    state: Arc<Mutex<FaultState>>,
    released: Arc<std::sync::Condvar>,
}

impl FaultyDir {
    pub fn new(inner: Arc<dyn SegmentDir>, faults: Vec<KvFault>) -> FaultyDir {
        FaultyDir {
            inner,
            state: Arc::new(Mutex::new(FaultState {
                faults,
                ..FaultState::default()
            })),
            released: Arc::new(std::sync::Condvar::new()),
        }
    }

    /// Replaces the fault list (counters keep running).
    pub fn set_faults(&self, faults: Vec<KvFault>) {
        lock(&self.state).faults = faults;
        self.released.notify_all();
    }

    /// Reads waiting under [`KvFault::HoldReclaimReads`] now.
    pub fn held_reads(&self) -> u64 {
        lock(&self.state).held
    }

    /// Lets held reads go on (and stops holding new ones).
    pub fn release_reads(&self) {
        let mut st = lock(&self.state);
        st.faults.retain(|f| *f != KvFault::HoldReclaimReads);
        drop(st);
        self.released.notify_all();
    }
}

fn lock(state: &Mutex<FaultState>) -> std::sync::MutexGuard<'_, FaultState> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("injected fault: {what}"))
}

fn no_space() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOSPC)
}

impl SegmentDir for FaultyDir {
    fn create(&self, id: u64, len: u64) -> io::Result<Arc<dyn SegmentFile>> {
        {
            let st = lock(&self.state);
            let full = st.faults.iter().any(
                |f| matches!(f, KvFault::NoSpaceAfter { bytes } if st.written_bytes >= *bytes),
            );
            if full {
                return Err(no_space());
            }
        }
        let inner = self.inner.create(id, len)?;
        Ok(Arc::new(FaultySegment {
            inner,
            state: Arc::clone(&self.state),
            released: Arc::clone(&self.released),
        }))
    }

    fn open(&self, id: u64) -> io::Result<Arc<dyn SegmentFile>> {
        let inner = self.inner.open(id)?;
        Ok(Arc::new(FaultySegment {
            inner,
            state: Arc::clone(&self.state),
            released: Arc::clone(&self.released),
        }))
    }

    fn list(&self) -> io::Result<Vec<u64>> {
        self.inner.list()
    }

    fn remove(&self, id: u64) -> io::Result<()> {
        let slow = lock(&self.state).faults.iter().find_map(|f| match f {
            KvFault::SlowRemove { millis } => Some(*millis),
            _ => None,
        });
        if let Some(ms) = slow {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        self.inner.remove(id)
    }

    fn len(&self, id: u64) -> io::Result<u64> {
        self.inner.len(id)
    }

    fn path_of(&self, id: u64) -> PathBuf {
        self.inner.path_of(id)
    }
}

struct FaultySegment {
    inner: Arc<dyn SegmentFile>,
    state: Arc<Mutex<FaultState>>,
    released: Arc<std::sync::Condvar>,
}

impl FaultySegment {
    /// Under `HoldReclaimReads`, a read on the reclaim thread waits for the release.
    fn hold_if_reclaiming(&self) {
        if std::thread::current().name() != Some("sluice-kv-reclaim") {
            return;
        }
        let mut st = lock(&self.state);
        if !st.faults.contains(&KvFault::HoldReclaimReads) {
            return;
        }
        st.held += 1;
        while st.faults.contains(&KvFault::HoldReclaimReads) {
            st = self.released.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st.held -= 1;
    }
}

impl SegmentFile for FaultySegment {
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let (n, faults, written) = {
            let mut st = lock(&self.state);
            st.writes += 1;
            (st.writes, st.faults.clone(), st.written_bytes)
        };
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        for f in &faults {
            match *f {
                KvFault::FailWrite { nth } if nth == n => return Err(eio("write failed")),
                KvFault::TornWrite { nth, keep } if nth == n => {
                    self.inner
                        .write_vectored_at(&first_bytes(bufs, keep), offset)?;
                    return Err(eio("torn write"));
                }
                KvFault::SilentTornWrite { nth, keep } if nth == n => {
                    return self
                        .inner
                        .write_vectored_at(&first_bytes(bufs, keep), offset);
                }
                KvFault::NoSpaceAfter { bytes } if written + len as u64 > bytes => {
                    return Err(no_space());
                }
                KvFault::SlowWrite { millis } => {
                    std::thread::sleep(std::time::Duration::from_millis(millis))
                }
                _ => {}
            }
        }
        self.inner.write_vectored_at(bufs, offset)?;
        lock(&self.state).written_bytes += len as u64;
        Ok(())
    }

    fn read_vectored_at(&self, bufs: &mut [IoSliceMut<'_>], offset: u64) -> io::Result<usize> {
        self.hold_if_reclaiming();
        let (n, faults) = {
            let mut st = lock(&self.state);
            st.reads += 1;
            (st.reads, st.faults.clone())
        };
        let mut got = self.inner.read_vectored_at(bufs, offset)?;
        for f in &faults {
            match *f {
                KvFault::FailRead { nth } if nth == n => return Err(eio("read failed")),
                KvFault::ShortRead { nth } if nth == n => got /= 2,
                KvFault::FlipBit { nth, at } if nth == n => flip(bufs, at),
                _ => {}
            }
        }
        Ok(got)
    }

    fn sync(&self) -> io::Result<()> {
        let (n, faults) = {
            let mut st = lock(&self.state);
            st.syncs += 1;
            (st.syncs, st.faults.clone())
        };
        if faults
            .iter()
            .any(|f| matches!(f, KvFault::FailSync { nth } if *nth == n))
        {
            return Err(eio("sync failed"));
        }
        self.inner.sync()
    }

    fn is_direct(&self) -> bool {
        self.inner.is_direct()
    }
}

/// The first `keep` bytes of `bufs` (a torn write's part that reaches the disk).
fn first_bytes<'a>(bufs: &[&'a [u8]], mut keep: usize) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    for b in bufs {
        let n = keep.min(b.len());
        if n == 0 {
            break;
        }
        out.push(&b[..n]);
        keep -= n;
    }
    out
}

fn flip(bufs: &mut [IoSliceMut<'_>], mut at: usize) {
    for b in bufs.iter_mut() {
        if at < b.len() {
            b[at] ^= 0x01;
            return;
        }
        at -= b.len();
    }
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
