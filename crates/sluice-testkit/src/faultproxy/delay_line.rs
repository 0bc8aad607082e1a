//! One direction of a proxied connection as a delay line, plus the socket
//! calls the proxy needs on a shared `TcpStream`.
//!
//! The reader task reads whatever the source has (up to [`CHUNK_BYTES`]),
//! stamps it with `read time + delay`, takes permits for its size from a
//! per-direction byte budget and queues it. The writer task takes chunks in
//! order, sleeps until each is due and writes it, then releases its
//! permits. End of stream travels as an empty chunk, so the FIN is delayed
//! like data; a reader error closes the queue without one, which the writer
//! reports as [`PumpEnd::Failed`].
//!
//! The writer also enforces the response limits: a per-connection fault
//! after `fault_remaining` bytes and the proxy-wide die budget. It writes
//! exactly up to the limit, waits (bounded) until the kernel has sent those
//! bytes, so an RST cannot overtake them, and reports why it stopped.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{ResponseFault, Shared};

/// 256 KiB reads: few enough syscalls and wakeups per byte for multi-GB/s
/// loopback, and about what one read drains from a full socket buffer.
pub(super) const CHUNK_BYTES: usize = 256 << 10;

/// Reads shorter than this are copied into a right-sized buffer, so a
/// stream of small chunks does not pin 256 KiB each.
const COPY_BELOW_BYTES: usize = CHUNK_BYTES / 4;

/// 2 s: a client that is reading drains its socket in microseconds; one
/// that has stopped reading should not hold a fault back for long.
const SEND_DRAIN_LIMIT: Duration = Duration::from_secs(2);

/// `SIOCOUTQNSD` from `<linux/sockios.h>` (not in the `libc` crate): bytes
/// in a TCP socket's send queue that have not been sent yet.
const SIOCOUTQNSD: libc::Ioctl = 0x894B;

/// How one direction forwards and when it stops.
#[derive(Clone)]
pub(super) struct DirectionPlan {
    pub delay: Duration,
    pub max_in_flight_bytes: usize,
    pub fault: Option<ResponseFault>,
    /// Bytes still to forward before `fault` applies.
    pub fault_remaining: u64,
    /// Present on the response direction: counts against the die budget.
    pub die: Option<Arc<Shared>>,
}

impl DirectionPlan {
    pub fn plain(delay: Duration, max_in_flight_bytes: usize) -> Self {
        Self {
            delay,
            max_in_flight_bytes,
            fault: None,
            fault_remaining: 0,
            die: None,
        }
    }
}

/// Why a direction's writer stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PumpEnd {
    /// The source ended; the FIN was forwarded.
    Finished,
    /// The fault's byte count was reached.
    Fault(ResponseFault),
    /// The die budget is spent (by this connection or another).
    Died,
    /// Reading or writing failed.
    Failed,
}

/// A chunk in the delay line; empty means end of stream.
struct Segment {
    due: Instant,
    data: Vec<u8>,
    /// Its share of the direction's byte budget, returned when written.
    _permit: OwnedSemaphorePermit,
}

/// Starts the reader and writer tasks of one direction.
pub(super) fn spawn(
    src: Arc<TcpStream>,
    dst: Arc<TcpStream>,
    plan: DirectionPlan,
) -> (JoinHandle<()>, JoinHandle<PumpEnd>) {
    let (queue, queued) = mpsc::unbounded_channel();
    let (spare, spares) = mpsc::unbounded_channel();
    let budget_bytes = plan.max_in_flight_bytes.max(1);
    let intake = Intake {
        queue,
        spares,
        delay: plan.delay,
        budget: Arc::new(Semaphore::new(budget_bytes)),
        budget_bytes,
    };
    let reader = tokio::spawn(read_side(src, intake));
    let writer = tokio::spawn(write_side(dst, queued, spare, plan));
    (reader, writer)
}

/// The reader's end of a delay line.
struct Intake {
    queue: mpsc::UnboundedSender<Segment>,
    /// Written 256 KiB buffers coming back from the writer: reusing them
    /// saves faulting in (and zeroing) fresh pages for every chunk.
    spares: mpsc::UnboundedReceiver<Vec<u8>>,
    delay: Duration,
    budget: Arc<Semaphore>,
    budget_bytes: usize,
}

impl Intake {
    fn buffer(&mut self) -> Vec<u8> {
        self.spares
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(CHUNK_BYTES))
    }

    /// Queues `data` (read just now) once the budget has room for it;
    /// `false` when the writer has gone.
    async fn push(&self, data: Vec<u8>) -> bool {
        let due = Instant::now() + self.delay;
        // Charged by capacity (what the chunk pins), never more than the
        // whole budget, so one chunk cannot wait forever.
        let cost = data.capacity().clamp(1, self.budget_bytes);
        let cost = u32::try_from(cost).unwrap_or(u32::MAX);
        let Ok(permit) = self.budget.clone().acquire_many_owned(cost).await else {
            return false;
        };
        let segment = Segment {
            due,
            data,
            _permit: permit,
        };
        self.queue.send(segment).is_ok()
    }
}

async fn read_side(src: Arc<TcpStream>, mut intake: Intake) {
    let mut buf = intake.buffer();
    loop {
        if src.readable().await.is_err() {
            return;
        }
        let data = match src.try_read_buf(&mut buf) {
            Ok(0) => Vec::new(),
            Ok(n) if n >= COPY_BELOW_BYTES => {
                let next = intake.buffer();
                std::mem::replace(&mut buf, next)
            }
            Ok(_) => {
                let small = buf.clone();
                buf.clear();
                small
            }
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => continue,
            Err(_) => return,
        };
        let eof = data.is_empty();
        if !intake.push(data).await || eof {
            return;
        }
    }
}

async fn write_side(
    dst: Arc<TcpStream>,
    mut queued: mpsc::UnboundedReceiver<Segment>,
    spare: mpsc::UnboundedSender<Vec<u8>>,
    mut plan: DirectionPlan,
) -> PumpEnd {
    while let Some(Segment { due, mut data, .. }) = queued.recv().await {
        if due > Instant::now() {
            tokio::time::sleep_until(due).await;
        }
        if data.is_empty() {
            shutdown_write(&dst);
            return PumpEnd::Finished;
        }
        let (allowed, stop) = plan.take(data.len() as u64);
        if write_all(&dst, &data[..allowed as usize]).await.is_err() {
            return PumpEnd::Failed;
        }
        if let Some(end) = stop {
            wait_until_sent(&dst).await;
            if let (PumpEnd::Died, Some(shared)) = (end, &plan.die) {
                shared.died.send_replace(true);
            }
            return end;
        }
        if data.capacity() == CHUNK_BYTES {
            data.clear();
            let _ = spare.send(data);
        }
    }
    PumpEnd::Failed
}

impl DirectionPlan {
    /// How many of the next `len` bytes may be forwarded, and whether the
    /// direction stops after them.
    fn take(&mut self, len: u64) -> (u64, Option<PumpEnd>) {
        let mut allowed = len;
        if self.fault.is_some() {
            allowed = allowed.min(self.fault_remaining);
        }
        let mut died = false;
        if let Some(budget) = self.die.as_ref().and_then(|s| s.die_budget.as_ref()) {
            (allowed, died) = reserve(budget, allowed);
        }
        self.fault_remaining = self.fault_remaining.saturating_sub(allowed);
        let stop = match self.fault {
            _ if died => Some(PumpEnd::Died),
            Some(fault) if self.fault_remaining == 0 => Some(PumpEnd::Fault(fault)),
            _ => None,
        };
        (allowed, stop)
    }
}

/// Takes up to `want` bytes from the die budget: the bytes granted, and
/// whether the budget is now spent.
fn reserve(budget: &AtomicU64, want: u64) -> (u64, bool) {
    let before = budget
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
            Some(left - left.min(want))
        })
        .unwrap_or_else(|left| left);
    let granted = before.min(want);
    (granted, before == granted)
}

async fn write_all(dst: &TcpStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        dst.writable().await?;
        match dst.try_write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

/// Waits until the kernel has sent everything written to `sock`, or
/// [`SEND_DRAIN_LIMIT`] passes (the peer stopped reading), so a following
/// RST does not discard bytes the fault promised to deliver.
async fn wait_until_sent(sock: &TcpStream) {
    let deadline = Instant::now() + SEND_DRAIN_LIMIT;
    while unsent_bytes(sock) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn unsent_bytes(sock: &TcpStream) -> libc::c_int {
    let mut unsent: libc::c_int = 0;
    // SAFETY: the descriptor is open while `sock` is borrowed, and
    // SIOCOUTQNSD writes one int into `unsent`, which we own.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), SIOCOUTQNSD, &mut unsent) };
    if rc == 0 {
        unsent
    } else {
        0
    }
}

/// Sends a FIN on `sock` now, while keeping it open for reading.
pub(super) fn shutdown_write(sock: &TcpStream) {
    // SAFETY: the descriptor is open while `sock` is borrowed; shutdown only
    // reads its integer arguments. Failure (peer gone) needs no handling.
    unsafe { libc::shutdown(sock.as_raw_fd(), libc::SHUT_WR) };
}

/// Makes the socket's close send an RST instead of a FIN.
pub(super) fn reset_on_close(sock: &TcpStream) {
    let _ = sock.set_zero_linger();
}
