//! An io_uring reader: one thread, one ring, up to `queue_depth` reads in
//! flight.
//!
//! The driving thread fills the submission queue from the source, submits,
//! and waits for at least one completion. A short read is resubmitted for
//! its remainder; EINVAL on a direct read demotes the file to buffered reads
//! and resubmits; EINTR and EAGAIN resubmit as is. Before `run` returns it
//! always drains the ring, because the kernel writes into buffers the ops
//! own, and those must outlive every read in flight.

use std::io;
use std::sync::OnceLock;

use io_uring::{opcode, types, IoUring};

use crate::io_engine::{EngineKind, IoEngine, Next, OpSource, ReadOp, Sink};

/// Largest single read submitted: io_uring takes a u32 length, and 1 GiB
/// keeps every read far from that limit while never splitting a sane chunk.
const MAX_SUBMIT_BYTES: usize = 1 << 30;

/// Reads through io_uring.
#[derive(Debug)]
pub struct UringEngine {
    queue_depth: u32,
}

/// One op in flight, indexed by its ring slot.
struct Slot {
    op: ReadOp,
    done: usize,
    submitted_direct: bool,
}

impl UringEngine {
    /// An engine keeping up to `queue_depth` reads in flight (at least 1).
    pub fn new(queue_depth: u32) -> Self {
        UringEngine {
            queue_depth: queue_depth.max(1),
        }
    }
}

/// Whether io_uring works here: creates a ring and runs a no-op through it.
/// The answer is computed once per process; containers often refuse
/// `io_uring_setup` with EPERM even on new kernels, so the kernel version
/// alone proves nothing.
pub fn probe_io_uring() -> Result<(), String> {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    PROBE.get_or_init(run_probe).clone()
}

fn run_probe() -> Result<(), String> {
    let mut ring = IoUring::new(2).map_err(|e| format!("io_uring_setup failed: {e}"))?;
    let nop = opcode::Nop::new().build().user_data(7);
    // SAFETY: a no-op references no memory.
    unsafe { ring.submission().push(&nop) }.map_err(|_| "submission queue full".to_string())?;
    ring.submit_and_wait(1)
        .map_err(|e| format!("io_uring_enter failed: {e}"))?;
    let first = ring
        .completion()
        .next()
        .map(|c| (c.user_data(), c.result()));
    match first {
        Some((7, result)) if result >= 0 => Ok(()),
        Some((_, result)) => Err(format!("no-op completed with {result}")),
        None => Err("no completion for a no-op".into()),
    }
}

impl IoEngine for UringEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::IoUring
    }

    fn run(&self, source: &mut dyn OpSource, sink: &mut Sink<'_>) -> io::Result<()> {
        let mut ring = IoUring::new(self.queue_depth.next_power_of_two())?;
        let mut slots: Vec<Option<Slot>> = (0..self.queue_depth).map(|_| None).collect();
        let mut in_flight = 0usize;
        let mut source_done = false;
        loop {
            while !source_done && in_flight < slots.len() {
                match source.next_op(in_flight == 0) {
                    Next::Op(op) => {
                        let slot = slots
                            .iter()
                            .position(Option::is_none)
                            .expect("in_flight < slots.len()");
                        match submit(
                            &mut ring,
                            slot,
                            Slot {
                                op,
                                done: 0,
                                submitted_direct: false,
                            },
                        ) {
                            Ok(s) => {
                                slots[slot] = Some(s);
                                in_flight += 1;
                            }
                            Err((s, e)) => sink(s.op, Err(e)),
                        }
                    }
                    Next::Wait if in_flight == 0 => std::thread::yield_now(),
                    Next::Wait => break,
                    Next::Done => source_done = true,
                }
            }
            if in_flight == 0 {
                return Ok(());
            }
            if let Err(e) = wait_one(&mut ring) {
                // Reads may still be in flight into the slots' buffers; leak
                // them rather than free memory the kernel could still write.
                std::mem::forget(slots);
                return Err(e);
            }
            let finished: Vec<(u64, i32)> = ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            for (user_data, result) in finished {
                let index = user_data as usize;
                let Some(slot) = slots.get_mut(index).and_then(Option::take) else {
                    continue;
                };
                in_flight -= 1;
                match advance(slot, result) {
                    Step::Finished(op, outcome) => sink(op, outcome),
                    Step::Resubmit(slot) => match submit(&mut ring, index, slot) {
                        Ok(s) => {
                            slots[index] = Some(s);
                            in_flight += 1;
                        }
                        Err((s, e)) => sink(s.op, Err(e)),
                    },
                }
            }
        }
    }
}

/// Submits until the kernel has taken it, retrying on EINTR.
fn wait_one(ring: &mut IoUring) -> io::Result<()> {
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

enum Step {
    Finished(ReadOp, io::Result<usize>),
    Resubmit(Slot),
}

/// Applies one completion's result to its slot.
fn advance(mut slot: Slot, result: i32) -> Step {
    if result < 0 {
        let err = io::Error::from_raw_os_error(-result);
        return match -result {
            libc::EINTR | libc::EAGAIN => Step::Resubmit(slot),
            libc::EINVAL if slot.submitted_direct => {
                slot.op.file.demote(&err);
                Step::Resubmit(slot)
            }
            _ => Step::Finished(slot.op, Err(err)),
        };
    }
    if result == 0 {
        let done = slot.done;
        return Step::Finished(slot.op, Ok(done));
    }
    slot.done += result as usize;
    if slot.done >= slot.op.len {
        let done = slot.done;
        return Step::Finished(slot.op, Ok(done));
    }
    Step::Resubmit(slot)
}

/// Pushes the remainder of `slot` into the ring under `index`.
fn submit(ring: &mut IoUring, index: usize, mut slot: Slot) -> Result<Slot, (Slot, io::Error)> {
    let dst = match slot.op.dst() {
        Ok(dst) => dst,
        Err(e) => return Err((slot, e)),
    };
    let remaining = (slot.op.len - slot.done).min(MAX_SUBMIT_BYTES);
    slot.submitted_direct = slot.op.file.is_direct();
    let fd = match slot.op.file.read_fd() {
        Ok(fd) => types::Fd(fd),
        Err(e) => return Err((slot, e)),
    };
    // SAFETY: `dst + done` stays inside the op's buffer (checked by `dst()`).
    let ptr = unsafe { dst.add(slot.done) };
    let sqe = opcode::Read::new(fd, ptr, remaining as u32)
        .offset(slot.op.offset + slot.done as u64)
        .build()
        .user_data(index as u64);
    loop {
        // SAFETY: the buffer behind `ptr` is owned by the op, which the slot
        // keeps alive until this read's completion has been reaped.
        if unsafe { ring.submission().push(&sqe) }.is_ok() {
            return Ok(slot);
        }
        // Submission queue full: hand what is queued to the kernel first.
        if let Err(e) = ring.submit() {
            return Err((slot, e));
        }
    }
}

impl UringEngine {
    pub fn queue_depth(&self) -> u32 {
        self.queue_depth
    }
}
