//! [`RingBatch`]: reads and writes of one file in flight together through a per-thread
//! io_uring ring, with the CPU free to work while they run.
//!
//! A store that checksums its blocks would otherwise alternate: read a whole block, then
//! hash it; or hash a whole block, then write it. For a 32 MiB block that is about 5 ms of
//! BLAKE3 beside a 16 ms transfer. With the block split into parts submitted together:
//! - a reader hashes part `i` as soon as parts `0..=i` have landed ([`read_in_order`]),
//!   while later parts are still being read;
//! - a writer submits the payload's parts, hashes the payload while the device writes them,
//!   then submits the header that carries the hash.
//!
//! Each thread keeps one ring, made on first use. A short transfer is resubmitted for its
//! remainder; EINTR and EAGAIN resubmit as is. A batch never ends with anything in flight:
//! [`RingBatch::wait_all`] reaps everything, and dropping a batch does too, because the
//! kernel reads and writes the caller's buffers.

use std::cell::RefCell;
use std::io;
use std::os::fd::RawFd;

use io_uring::{opcode, types, IoUring};

use crate::uring_engine::probe_io_uring;

/// Parts in flight at once per thread.
pub const MAX_PARTS: usize = 64;

thread_local! {
    static RING: RefCell<Option<IoUring>> = const { RefCell::new(None) };
}

/// One transfer: `len` bytes between `ptr` and file offset `offset`.
#[derive(Debug, Clone, Copy)]
pub struct Part {
    pub offset: u64,
    pub ptr: *mut u8,
    pub len: usize,
    /// Write `ptr`'s bytes to the file (else read the file into `ptr`).
    pub write: bool,
}

/// Progress of one part.
#[derive(Clone, Copy)]
struct State {
    part: Part,
    done: usize,
    complete: bool,
}

/// Transfers of one file in flight on this thread's ring.
pub struct RingBatch<'r> {
    ring: &'r mut IoUring,
    fd: RawFd,
    parts: Vec<State>,
    in_flight: usize,
    failed: Option<io::Error>,
    next_ready: usize,
}

/// Runs `f` with a batch on this thread's ring for `fd`. `Unsupported` when io_uring does
/// not work here (nothing was submitted then).
pub fn with_ring<R>(fd: RawFd, f: impl FnOnce(&mut RingBatch<'_>) -> R) -> io::Result<R> {
    probe_io_uring().map_err(|reason| io::Error::new(io::ErrorKind::Unsupported, reason))?;
    RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(IoUring::new(MAX_PARTS as u32)?);
        }
        let mut batch = RingBatch {
            ring: slot.as_mut().expect("just made"),
            fd,
            parts: Vec::new(),
            in_flight: 0,
            failed: None,
            next_ready: 0,
        };
        Ok(f(&mut batch))
    })
}

impl RingBatch<'_> {
    /// Submits `part` (it starts at once); returns its index.
    ///
    /// # Safety
    /// `part.ptr` must be valid for `len` bytes (writable for a read), not overlap a part
    /// being read, and stay untouched by anyone else until the batch has been waited for.
    pub unsafe fn submit(&mut self, part: Part) -> io::Result<usize> {
        if self.parts.len() >= MAX_PARTS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("more than {MAX_PARTS} parts in one batch"),
            ));
        }
        if u32::try_from(part.len).is_err() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a part of 4 GiB or more",
            ));
        }
        let index = self.parts.len();
        self.parts.push(State {
            part,
            done: 0,
            complete: part.len == 0,
        });
        if part.len > 0 {
            // SAFETY: the caller's contract on `part`.
            unsafe { self.push(index)? };
            self.ring.submit()?;
        }
        Ok(index)
    }

    /// Waits until nothing is in flight, calling `ready(i)` for each part in index order as
    /// soon as parts `0..=i` are complete. A transfer the file ends inside is an
    /// `UnexpectedEof` error; parts after a failure are not handed out.
    pub fn wait_all(&mut self, ready: &mut dyn FnMut(usize)) -> io::Result<()> {
        self.hand_out(ready);
        while self.in_flight > 0 {
            if let Err(e) = self.ring.submit_and_wait(1) {
                // Transfers of the caller's buffers are in flight: wait on through "try
                // again"; anything else means the ring itself is broken.
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                ) {
                    continue;
                }
                return Err(e);
            }
            let done: Vec<(usize, i32)> = self
                .ring
                .completion()
                .map(|c| (c.user_data() as usize, c.result()))
                .collect();
            for (i, res) in done {
                self.in_flight -= 1;
                self.complete(i, res);
            }
            self.hand_out(ready);
        }
        match self.failed.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn hand_out(&mut self, ready: &mut dyn FnMut(usize)) {
        while self.failed.is_none()
            && self.next_ready < self.parts.len()
            && self.parts[self.next_ready].complete
        {
            ready(self.next_ready);
            self.next_ready += 1;
        }
    }

    fn complete(&mut self, i: usize, res: i32) {
        let s = &mut self.parts[i];
        let p = s.part;
        match res {
            n if n > 0 => {
                s.done += n as usize;
                if s.done >= p.len {
                    s.complete = true;
                } else if self.failed.is_none() {
                    self.resubmit(i);
                }
            }
            0 => {
                let what = format!("bytes {}..{}", p.offset, p.offset + p.len as u64);
                let e = io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the file ends inside {what}"),
                );
                self.failed.get_or_insert(e);
            }
            e if (e == -libc::EINTR || e == -libc::EAGAIN) && self.failed.is_none() => {
                self.resubmit(i)
            }
            e => {
                self.failed.get_or_insert(io::Error::from_raw_os_error(-e));
            }
        }
    }

    fn resubmit(&mut self, i: usize) {
        // SAFETY: the rest of a part whose buffer the caller vouched for at `submit`.
        let pushed = unsafe { self.push(i) }.and_then(|()| self.ring.submit().map(|_| ()));
        if let Err(e) = pushed {
            self.failed.get_or_insert(e);
        }
    }

    /// Queues what is left of part `i`.
    unsafe fn push(&mut self, i: usize) -> io::Result<()> {
        let s = self.parts[i];
        let (p, done) = (s.part, s.done);
        let len = u32::try_from(p.len - done).expect("checked at submit");
        // SAFETY: `done < len`, so the pointer stays inside the part's buffer.
        let ptr = unsafe { p.ptr.add(done) };
        let at = p.offset + done as u64;
        let fd = types::Fd(self.fd);
        let entry = match p.write {
            true => opcode::Write::new(fd, ptr, len).offset(at).build(),
            false => opcode::Read::new(fd, ptr, len).offset(at).build(),
        };
        // SAFETY: the buffer outlives the transfer (the caller's contract, and the batch
        // never ends with anything in flight).
        unsafe { self.ring.submission().push(&entry.user_data(i as u64)) }
            .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        self.in_flight += 1;
        Ok(())
    }
}

impl Drop for RingBatch<'_> {
    fn drop(&mut self) {
        // A batch abandoned with transfers in flight (an early return or a panic) still
        // waits for them: the kernel is using the caller's buffers.
        if self.in_flight > 0 {
            let _ = self.wait_all(&mut |_| {});
        }
    }
}

/// Reads every part of `fd` (at most [`MAX_PARTS`]), all in flight at once; calls
/// `ready(i)` for each in index order as soon as parts `0..=i` are complete.
///
/// # Safety
/// As for [`RingBatch::submit`], for every part.
pub unsafe fn read_in_order(
    fd: RawFd,
    parts: &[Part],
    ready: &mut dyn FnMut(usize),
) -> io::Result<()> {
    with_ring(fd, |batch| {
        for p in parts {
            // SAFETY: the caller's contract, passed on.
            unsafe { batch.submit(Part { write: false, ..*p })? };
        }
        batch.wait_all(ready)
    })?
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;

    fn parts_of(buf: &mut [u8], chunk: usize, base: u64, write: bool) -> Vec<Part> {
        buf.chunks_mut(chunk)
            .enumerate()
            .map(|(i, c)| Part {
                offset: base + (i * chunk) as u64,
                ptr: c.as_mut_ptr(),
                len: c.len(),
                write,
            })
            .collect()
    }

    #[test]
    fn parts_arrive_whole_and_are_handed_out_in_order() {
        if probe_io_uring().is_err() {
            return; // no io_uring here: the callers' fallback is tested instead
        }
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&data).unwrap();
        let mut buf = vec![0u8; 290_000];
        let parts = parts_of(&mut buf, 40_000, 10_000, false);
        let mut order = Vec::new();
        // SAFETY: the parts cover disjoint pieces of `buf`, untouched until the call ends.
        unsafe { read_in_order(f.as_raw_fd(), &parts, &mut |i| order.push(i)) }.unwrap();
        assert_eq!(order, (0..parts.len()).collect::<Vec<_>>());
        assert_eq!(&buf[..], &data[10_000..300_000]);
    }

    #[test]
    fn writes_in_flight_leave_the_cpu_free_and_land_whole() {
        if probe_io_uring().is_err() {
            return;
        }
        let f = tempfile::tempfile().unwrap();
        let mut payload: Vec<u8> = (0..200_000u32).map(|i| (i % 249) as u8).collect();
        let mut head = *b"head";
        let mut worked = false;
        with_ring(f.as_raw_fd(), |b| {
            for p in parts_of(&mut payload, 50_000, 4, true) {
                // SAFETY: disjoint parts of `payload`, which outlives the batch.
                unsafe { b.submit(p).unwrap() };
            }
            worked = true; // the caller's work (a hash) runs here, writes in flight
            let p = Part {
                offset: 0,
                ptr: head.as_mut_ptr(),
                len: 4,
                write: true,
            };
            // SAFETY: as above.
            unsafe { b.submit(p).unwrap() };
            b.wait_all(&mut |_| {}).unwrap();
        })
        .unwrap();
        assert!(worked);
        let mut back = vec![0u8; 200_004];
        f.read_exact_at(&mut back, 0).unwrap();
        assert_eq!(&back[..4], b"head");
        assert_eq!(&back[4..], &payload[..]);
    }

    #[test]
    fn a_file_that_ends_early_is_an_error_and_nothing_is_handed_out_after_it() {
        if probe_io_uring().is_err() {
            return;
        }
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&[7u8; 50_000]).unwrap();
        let mut buf = vec![0u8; 80_000];
        let parts = parts_of(&mut buf, 20_000, 0, false);
        let mut order = Vec::new();
        // SAFETY: as above.
        let err = unsafe { read_in_order(f.as_raw_fd(), &parts, &mut |i| order.push(i)) };
        assert_eq!(err.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
        assert!(order.len() <= 2, "{order:?}");
        // SAFETY: as above.
        let bad = unsafe { read_in_order(-1, &parts[..1], &mut |_| {}) };
        assert!(bad.is_err());
    }
}
