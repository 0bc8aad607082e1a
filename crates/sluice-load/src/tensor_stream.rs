//! Running a read plan: a driver thread feeds window reads to an engine and
//! hands finished windows to the consumer, in completion order.
//!
//! The driver is the engine's [`OpSource`]: for each window it takes a buffer
//! from the pool (this is where the memory limit bites), then offers the
//! window's chunk reads. When the pool is spent it answers `Wait` while reads
//! are in flight, and blocks in the pool only when nothing is; the consumer
//! frees memory by dropping windows. Completions are tallied per window; a
//! window whose last read lands goes to the consumer's channel, or, if any of
//! its reads failed or came back short, the load stops with that error.
//!
//! A consumer that keeps every window it was given while asking for more
//! would wait forever on a driver that waits for memory. [`TensorStream::next_window`]
//! detects exactly that state (driver starved, nothing in flight, nothing
//! queued) and returns [`LoadError::MemoryLimitExhausted`] instead of hanging.
//!
//! Dropping the stream cancels it: the pool is closed (waking a blocked
//! driver), the driver stops offering reads, drains what is in flight and
//! exits, and the drop joins it, so no read can outlive its buffer.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use std::cell::Cell;

use sluice_engine::{
    page_cache, BufferPool, FileMapping, IoEngine, LentMemory, Next, OpSource, PoolError,
    PooledBuf, ReadOp, ReadTarget, Reservation, SourceFile,
};

use crate::error::LoadError;
use crate::read_plan::{window_chunks, PlannedTensor, ReadPlan, WindowPlan};

/// How often a waiting consumer checks for a starved driver. 50 ms: far
/// below human notice, far above the cost of the check.
const STARVATION_POLL: Duration = Duration::from_millis(50);
/// How long the starved state must persist before it is an error, so a
/// window being dropped on another thread at that moment is not mistaken for
/// a deadlock.
const STARVATION_GRACE: Duration = Duration::from_millis(250);

/// Where a window's bytes live.
pub enum WindowMemory {
    /// Read into a buffer from the pool.
    Pooled(Arc<PooledBuf>),
    /// Mapped straight from the page cache (every page was already cached);
    /// the reservation keeps it counted against the memory limit.
    Mapped {
        map: FileMapping,
        _budget: Reservation,
    },
}

impl WindowMemory {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            WindowMemory::Pooled(buf) => buf.as_slice(),
            WindowMemory::Mapped { map, .. } => map.as_slice(),
        }
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.as_slice().as_ptr()
    }

    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_mapped(&self) -> bool {
        matches!(self, WindowMemory::Mapped { .. })
    }
}

/// A window whose bytes have all landed.
pub struct LoadedWindow {
    pub shard_path: PathBuf,
    /// `None` only for the window of zero-byte tensors.
    pub buf: Option<WindowMemory>,
    pub tensors: Vec<PlannedTensor>,
}

impl LoadedWindow {
    /// The bytes of `tensor`, which must belong to this window.
    pub fn tensor_bytes(&self, tensor: &PlannedTensor) -> &[u8] {
        match &self.buf {
            Some(buf) => {
                &buf.as_slice()[tensor.window_offset..tensor.window_offset + tensor.byte_len]
            }
            None => &[],
        }
    }
}

/// Counters shared between the driver and the consumer.
#[derive(Default)]
pub(crate) struct Shared {
    pub cancelled: AtomicBool,
    /// Driver blocked on the pool with nothing in flight.
    pub starved: AtomicBool,
    pub bytes_read: AtomicU64,
    pub tensor_bytes_done: AtomicU64,
    /// Window bytes served by mapping cached pages instead of reading.
    pub mapped_bytes: AtomicU64,
}

/// Progress of a running load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Tensor bytes delivered so far.
    pub done_bytes: u64,
    /// Tensor bytes the plan will deliver.
    pub total_bytes: u64,
}

/// A running load; yields windows as their reads complete.
pub struct TensorStream {
    /// Behind a mutex only so the stream is `Sync` (Python objects must be);
    /// `next_window` takes `&mut self`, so the lock is never contended.
    rx: Mutex<Receiver<Result<LoadedWindow, LoadError>>>,
    shared: Arc<Shared>,
    pool: BufferPool,
    driver: Option<JoinHandle<()>>,
    total_bytes: u64,
    memory_limit: Option<u64>,
    finished: bool,
    started: Instant,
    /// Since when the driver has been waiting on the memory budget, if it is.
    starved_since: Option<Instant>,
}

/// What [`TensorStream::poll_window`] found within its wait.
pub enum Polled {
    /// The next window, an error, or `None` at the end (as `next_window`).
    Ready(Option<Result<LoadedWindow, LoadError>>),
    /// Nothing yet: the caller may do other work (check for Ctrl-C) and ask again.
    Pending,
}

/// Everything the driver needs, moved into its thread.
pub(crate) struct DriverInput {
    pub plan: ReadPlan,
    pub files: Vec<Arc<SourceFile>>,
    pub engine: Arc<dyn IoEngine>,
    pub pool: BufferPool,
    pub chunk_bytes: usize,
    pub drop_cache: bool,
    /// Deliver windows in plan order (bounded streams) rather than as they land.
    pub in_order: bool,
    /// Map windows whose pages are all cached instead of reading them.
    pub map_cached: bool,
    /// When set, buffered windows are read into this scratch buffer (the
    /// bytes are never looked at: the reads only pull pages into the cache)
    /// and then mapped. Shared by every read in flight.
    pub scratch: Option<Arc<PooledBuf>>,
    /// Read into the caller's memory instead ([`crate::Loader::stream_into`]):
    /// each tensor's destination, by name. A window of one tensor is read
    /// straight into it; a window of several small ones is read into a pooled
    /// buffer and copied out. Windows are then delivered without memory.
    pub into: Option<HashMap<String, Arc<LentMemory>>>,
}

impl TensorStream {
    pub(crate) fn start(
        input: DriverInput,
        memory_limit: Option<u64>,
    ) -> Result<TensorStream, LoadError> {
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared::default());
        let pool = input.pool.clone();
        let total_bytes = input.plan.tensor_bytes;
        if !input.plan.empty.is_empty() {
            let shard_path = input
                .files
                .first()
                .map(|f| f.path().to_path_buf())
                .unwrap_or_default();
            let empty = LoadedWindow {
                shard_path,
                buf: None,
                tensors: input.plan.empty.clone(),
            };
            let _ = tx.send(Ok(empty));
        }
        let driver_shared = Arc::clone(&shared);
        let driver = std::thread::Builder::new()
            .name("sluice-load".into())
            .spawn(move || drive(input, &driver_shared, tx))
            .map_err(LoadError::Thread)?;
        Ok(TensorStream {
            rx: Mutex::new(rx),
            shared,
            pool,
            driver: Some(driver),
            total_bytes,
            memory_limit,
            finished: false,
            started: Instant::now(),
            starved_since: None,
        })
    }

    /// The next finished window, blocking until one lands; `None` at the end.
    /// After an error the stream is finished.
    pub fn next_window(&mut self) -> Option<Result<LoadedWindow, LoadError>> {
        loop {
            if let Polled::Ready(next) = self.poll_window(Duration::from_secs(3600)) {
                return next;
            }
        }
    }

    /// As [`TensorStream::next_window`], but gives up after about `wait` with
    /// [`Polled::Pending`], so a caller blocked on a slow source (a remote
    /// store) can check for interrupts between waits.
    pub fn poll_window(&mut self, wait: Duration) -> Polled {
        if self.finished {
            return Polled::Ready(None);
        }
        let deadline = Instant::now() + wait;
        loop {
            let received = self
                .rx
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .recv_timeout(STARVATION_POLL.min(wait));
            match received {
                Ok(Ok(window)) => {
                    let bytes: u64 = window.tensors.iter().map(|t| t.byte_len as u64).sum();
                    self.shared
                        .tensor_bytes_done
                        .fetch_add(bytes, Ordering::Relaxed);
                    self.starved_since = None;
                    return Polled::Ready(Some(Ok(window)));
                }
                Ok(Err(e)) => return Polled::Ready(Some(Err(self.finish_with(e)))),
                Err(RecvTimeoutError::Disconnected) => {
                    self.finished = true;
                    return Polled::Ready(None);
                }
                Err(RecvTimeoutError::Timeout) => {
                    if !self.shared.starved.load(Ordering::Acquire) {
                        self.starved_since = None;
                    } else {
                        let since = *self.starved_since.get_or_insert_with(Instant::now);
                        if since.elapsed() >= STARVATION_GRACE {
                            let held = self.pool.stats().held_bytes;
                            let limit = self.memory_limit.unwrap_or(u64::MAX);
                            let e = LoadError::MemoryLimitExhausted { limit, held };
                            return Polled::Ready(Some(Err(self.finish_with(e))));
                        }
                    }
                    if Instant::now() >= deadline {
                        return Polled::Pending;
                    }
                }
            }
        }
    }

    fn finish_with(&mut self, e: LoadError) -> LoadError {
        self.finished = true;
        self.cancel();
        e
    }

    pub fn progress(&self) -> Progress {
        Progress {
            done_bytes: self.shared.tensor_bytes_done.load(Ordering::Relaxed),
            total_bytes: self.total_bytes,
        }
    }

    /// Window bytes served from the page cache by mapping, not reading.
    pub fn mapped_bytes(&self) -> u64 {
        self.shared.mapped_bytes.load(Ordering::Relaxed)
    }

    /// Bytes read from storage so far (aligned ranges, so a little above the
    /// tensor bytes).
    pub fn bytes_read(&self) -> u64 {
        self.shared.bytes_read.load(Ordering::Relaxed)
    }

    pub fn pool(&self) -> &BufferPool {
        &self.pool
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    fn cancel(&mut self) {
        self.shared.cancelled.store(true, Ordering::Release);
        self.pool.close();
        if let Some(driver) = self.driver.take() {
            // Windows still queued hold buffers; drop them before joining.
            let rx = self.rx.get_mut().unwrap_or_else(|p| p.into_inner());
            while rx.try_recv().is_ok() {}
            let _ = driver.join();
        }
    }
}

impl Drop for TensorStream {
    fn drop(&mut self) {
        self.cancel();
    }
}

/// Per-window completion tally.
struct InFlightWindow {
    plan: WindowPlan,
    landing: Landing,
    reads_left: usize,
    failure: Option<LoadError>,
}

/// Where a window's reads put their bytes.
enum Landing {
    /// Into the window's own buffer.
    Pooled(Arc<PooledBuf>),
    /// Straight into the caller's memory for the window's one tensor.
    Lent(Arc<LentMemory>),
    /// Through the page cache into a shared scratch buffer, after which the
    /// window is mapped from the cache; the reservation holds its budget.
    Staged {
        budget: Reservation,
        scratch: Arc<PooledBuf>,
    },
}

impl Landing {
    /// Destination buffer and offset for a read at `window_offset`.
    fn target(&self, window_offset: usize) -> (Arc<dyn ReadTarget>, usize) {
        match self {
            Landing::Pooled(buf) => (Arc::clone(buf) as Arc<dyn ReadTarget>, window_offset),
            Landing::Lent(dst) => (Arc::clone(dst) as Arc<dyn ReadTarget>, window_offset),
            Landing::Staged { scratch, .. } => (Arc::clone(scratch) as Arc<dyn ReadTarget>, 0),
        }
    }
}

/// The engine's op source: windows in plan order, each cut into chunks.
struct PlanSource<'a> {
    input: &'a DriverInput,
    shared: &'a Shared,
    next_window: usize,
    pending: std::vec::IntoIter<ReadOp>,
    windows: &'a RefCell<HashMap<u64, InFlightWindow>>,
    outbox: &'a Outbox<'a>,
    failure: Option<LoadError>,
}

impl PlanSource<'_> {
    fn stopped(&self) -> bool {
        self.failure.is_some() || self.shared.cancelled.load(Ordering::Acquire)
    }

    /// Takes a buffer for the next window, blocking only if allowed.
    fn open_window(&mut self, may_block: bool) -> Result<bool, LoadError> {
        let index = self.next_window;
        let plan = &self.input.plan.windows[index];
        if let Some(opened) = self.map_if_cached(index, may_block)? {
            return Ok(opened);
        }
        let file = &self.input.files[plan.shard];
        let pool = &self.input.pool;
        let scratch = self.input.scratch.as_ref().filter(|_| !file.is_direct());
        let lent = self.lent_landing(plan, file);
        let landing = if let Some(lent) = lent {
            Some(Landing::Lent(lent))
        } else if let Some(scratch) = scratch {
            let charge = pool.capacity_for(plan.read_len) as u64;
            self.budgeted(may_block, |block| match block {
                true => pool.reserve(charge).map(Some),
                false => pool.try_reserve(charge),
            })?
            .map(|budget| Landing::Staged {
                budget,
                scratch: Arc::clone(scratch),
            })
        } else {
            self.budgeted(may_block, |block| match block {
                true => pool.acquire(plan.read_len).map(Some),
                false => pool.try_acquire(plan.read_len),
            })?
            .map(|buf| Landing::Pooled(Arc::new(buf)))
        };
        let Some(landing) = landing else {
            return Ok(false);
        };
        let ops: Vec<ReadOp> = window_chunks(plan, self.input.chunk_bytes)
            .map(|(offset, window_offset, len)| {
                let (buf, buf_offset) = landing.target(window_offset);
                ReadOp {
                    file: Arc::clone(file),
                    offset,
                    len,
                    buf,
                    buf_offset,
                    token: index as u64,
                }
            })
            .collect();
        self.windows.borrow_mut().insert(
            index as u64,
            InFlightWindow {
                plan: plan.clone(),
                landing,
                reads_left: ops.len(),
                failure: None,
            },
        );
        self.pending = ops.into_iter();
        self.next_window += 1;
        Ok(true)
    }

    /// The caller's memory for a window of exactly one tensor starting at
    /// the window's start, read without alignment: the read lands there.
    fn lent_landing(&self, plan: &WindowPlan, file: &SourceFile) -> Option<Arc<LentMemory>> {
        let into = self.input.into.as_ref()?;
        let [tensor] = plan.tensors.as_slice() else {
            return None;
        };
        if file.is_direct() || tensor.window_offset != 0 || plan.read_len != tensor.byte_len {
            return None;
        }
        into.get(&tensor.name).cloned()
    }

    /// Runs a budget request, blocking only if allowed, and flags the driver
    /// as starved while it blocks (see [`TensorStream::next_window`]).
    fn budgeted<T>(
        &self,
        may_block: bool,
        request: impl FnOnce(bool) -> Result<Option<T>, PoolError>,
    ) -> Result<Option<T>, LoadError> {
        if !may_block {
            return Ok(request(false)?);
        }
        self.shared.starved.store(true, Ordering::Release);
        let got = request(true);
        self.shared.starved.store(false, Ordering::Release);
        Ok(got?)
    }

    /// Serves window `index` from the page cache when every page of it is
    /// already there: no read, no copy. `None` when the window must be read;
    /// `Some(false)` when it could be mapped but the budget is spent now.
    fn map_if_cached(&mut self, index: usize, may_block: bool) -> Result<Option<bool>, LoadError> {
        let plan = &self.input.plan.windows[index];
        let file = &self.input.files[plan.shard];
        let map_len = (plan.read_len as u64).min(file.len().saturating_sub(plan.file_offset));
        let Some(fd) = file.buffered_fd() else {
            return Ok(None);
        };
        if !self.input.map_cached
            || map_len < plan.needed_len as u64
            || !page_cache::range_is_cached(fd, plan.file_offset, map_len)
        {
            return Ok(None);
        }
        let pool = &self.input.pool;
        let charge = pool.capacity_for(plan.read_len) as u64;
        let Some(budget) = self.budgeted(may_block, |block| match block {
            true => pool.reserve(charge).map(Some),
            false => pool.try_reserve(charge),
        })?
        else {
            return Ok(Some(false));
        };
        let map = match map_window(file, plan) {
            Ok(map) => map,
            Err(e @ LoadError::Truncated { .. }) => return Err(e),
            Err(e) => {
                tracing::debug!(error = %e, "mapping failed; reading instead");
                return Ok(None);
            }
        };
        self.shared
            .mapped_bytes
            .fetch_add(map_len, Ordering::Relaxed);
        let window = LoadedWindow {
            shard_path: file.path().to_path_buf(),
            buf: Some(WindowMemory::Mapped {
                map,
                _budget: budget,
            }),
            tensors: plan.tensors.clone(),
        };
        self.next_window += 1;
        self.outbox.send(index as u64, Ok(window));
        Ok(Some(true))
    }
}

impl OpSource for PlanSource<'_> {
    fn next_op(&mut self, may_block: bool) -> Next {
        loop {
            if self.stopped() {
                return Next::Done;
            }
            if let Some(op) = self.pending.next() {
                return Next::Op(op);
            }
            if self.next_window >= self.input.plan.windows.len() {
                return Next::Done;
            }
            match self.open_window(may_block) {
                Ok(true) => continue,
                Ok(false) => return Next::Wait,
                Err(LoadError::Pool(PoolError::Closed)) => return Next::Done,
                Err(e) => {
                    self.failure = Some(e);
                    return Next::Done;
                }
            }
        }
    }
}

fn drive(input: DriverInput, shared: &Shared, tx: Sender<Result<LoadedWindow, LoadError>>) {
    run_plan(&input, shared, &tx);
}

fn run_plan(input: &DriverInput, shared: &Shared, tx: &Sender<Result<LoadedWindow, LoadError>>) {
    // The source registers windows and the sink retires them; both run on
    // this thread, one at a time, so RefCells are all the sharing needed.
    let windows: RefCell<HashMap<u64, InFlightWindow>> = RefCell::new(HashMap::new());
    let outbox = Outbox {
        delivery: RefCell::new(Delivery {
            in_order: input.in_order,
            next: 0,
            ready: BTreeMap::new(),
        }),
        tx,
        shared,
        failed: Cell::new(false),
    };
    let mut source = PlanSource {
        input,
        shared,
        next_window: 0,
        pending: Vec::new().into_iter(),
        windows: &windows,
        outbox: &outbox,
        failure: None,
    };
    let result = input.engine.run(&mut source, &mut |op, outcome| {
        let token = op.token;
        if let Some(done) = on_read(&mut windows.borrow_mut(), input, shared, op, outcome) {
            outbox.send(token, done);
        }
    });
    if input.drop_cache {
        // Per-read drops can miss pages that were still locked under
        // readahead at the time; one pass at the end catches them.
        for file in input.files.iter().filter(|f| !f.is_direct()) {
            if let Some(fd) = file.buffered_fd() {
                page_cache::drop_range(fd, 0, 0);
            }
        }
    }
    if let Some(e) = source.failure.take() {
        let _ = tx.send(Err(e));
    } else if let Err(e) = result {
        let _ = tx.send(Err(LoadError::EngineFailed {
            engine: input.engine.kind().as_str(),
            source: e,
        }));
    }
}

/// The driver's side of the consumer channel: ordering, and stopping the
/// load after the first error.
struct Outbox<'a> {
    delivery: RefCell<Delivery>,
    tx: &'a Sender<Result<LoadedWindow, LoadError>>,
    shared: &'a Shared,
    failed: Cell<bool>,
}

impl Outbox<'_> {
    fn send(&self, token: u64, done: Result<LoadedWindow, LoadError>) {
        if self.failed.get() {
            return;
        }
        let is_err = done.is_err();
        for item in self.delivery.borrow_mut().accept(token, done) {
            if self.tx.send(item).is_err() {
                self.shared.cancelled.store(true, Ordering::Release);
            }
        }
        if is_err {
            self.failed.set(true);
            self.shared.cancelled.store(true, Ordering::Release);
        }
    }
}

/// Releases finished windows to the consumer, in plan order when asked.
///
/// A bounded stream delivers in plan order because its memory check assumes
/// the consumer holds the window *before* the one being read in that order;
/// a tiny window finishing ahead of a huge one must not change who is held
/// next to whom. Errors go out at once.
struct Delivery {
    in_order: bool,
    next: u64,
    ready: BTreeMap<u64, LoadedWindow>,
}

impl Delivery {
    fn accept(
        &mut self,
        token: u64,
        done: Result<LoadedWindow, LoadError>,
    ) -> Vec<Result<LoadedWindow, LoadError>> {
        let window = match done {
            Ok(w) if self.in_order => w,
            other => return vec![other],
        };
        self.ready.insert(token, window);
        let mut out = Vec::new();
        while let Some(w) = self.ready.remove(&self.next) {
            out.push(Ok(w));
            self.next += 1;
        }
        out
    }
}

/// Tallies one finished read; returns the window's outcome when it was the
/// window's last read.
fn on_read(
    windows: &mut HashMap<u64, InFlightWindow>,
    input: &DriverInput,
    shared: &Shared,
    op: ReadOp,
    outcome: std::io::Result<usize>,
) -> Option<Result<LoadedWindow, LoadError>> {
    let entry = windows.get_mut(&op.token)?;
    entry.reads_left -= 1;
    match outcome {
        Ok(n) => {
            shared.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
            let needed = needed_bytes(&entry.plan, op.offset, op.len);
            if (n as u64) < needed && entry.failure.is_none() {
                entry.failure = Some(LoadError::Truncated {
                    path: op.file.path().to_path_buf(),
                    offset: op.offset,
                    expected: needed,
                    got: n as u64,
                });
            }
            let buffered = op.file.buffered_fd().filter(|_| !op.file.is_direct());
            if let Some(fd) = buffered.filter(|_| input.drop_cache && input.scratch.is_none()) {
                page_cache::drop_range(fd, op.offset, op.len as u64);
            }
        }
        Err(source) => {
            if entry.failure.is_none() {
                entry.failure = Some(LoadError::read(op.file.path(), op.offset, op.len, source));
            }
        }
    }
    if entry.reads_left > 0 {
        return None;
    }
    let done = windows.remove(&op.token)?;
    if let Some(e) = done.failure {
        return Some(Err(e));
    }
    let file = &input.files[done.plan.shard];
    let memory = match done.landing {
        // The bytes are in the caller's memory: the window carries none.
        Landing::Lent(_) => None,
        Landing::Pooled(buf) => match &input.into {
            Some(into) => {
                copy_out(&buf, &done.plan.tensors, into);
                None
            }
            None => Some(WindowMemory::Pooled(buf)),
        },
        Landing::Staged { budget, .. } => match map_window(file, &done.plan) {
            Ok(map) => {
                shared
                    .mapped_bytes
                    .fetch_add(map.len() as u64, Ordering::Relaxed);
                Some(WindowMemory::Mapped {
                    map,
                    _budget: budget,
                })
            }
            Err(e) => return Some(Err(e)),
        },
    };
    Some(Ok(LoadedWindow {
        shard_path: file.path().to_path_buf(),
        buf: memory,
        tensors: done.plan.tensors,
    }))
}

/// Copies each tensor of a window read into a pooled buffer to the caller's
/// memory for it. The plan was built from the same names, and
/// `Loader::stream_into` checked every destination's length.
fn copy_out(buf: &PooledBuf, tensors: &[PlannedTensor], into: &HashMap<String, Arc<LentMemory>>) {
    let bytes = buf.as_slice();
    for t in tensors {
        let Some(dst) = into.get(&t.name) else {
            continue;
        };
        let src = &bytes[t.window_offset..t.window_offset + t.byte_len];
        if let Some(ptr) = dst.ptr_range(0, t.byte_len) {
            // SAFETY: `ptr` is `byte_len` bytes of lent memory (bounds checked
            // above), which only this copy writes: a tensor is in one window.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), ptr, t.byte_len) };
        }
    }
}

/// Maps a window's range of `file`, clipped to the file's end.
fn map_window(file: &SourceFile, plan: &WindowPlan) -> Result<FileMapping, LoadError> {
    let map_len = (plan.read_len as u64).min(file.len().saturating_sub(plan.file_offset));
    FileMapping::map(file, plan.file_offset, map_len as usize).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            LoadError::Truncated {
                path: file.path().to_path_buf(),
                offset: plan.file_offset,
                expected: map_len,
                got: file
                    .current_len()
                    .unwrap_or(0)
                    .saturating_sub(plan.file_offset),
            }
        } else {
            LoadError::io(file.path(), "map", e)
        }
    })
}

/// Bytes of a read at file offset `offset` that the window's tensors need:
/// the read's overlap with the window's first `needed_len` bytes.
fn needed_bytes(plan: &WindowPlan, offset: u64, len: usize) -> u64 {
    let start = offset.saturating_sub(plan.file_offset);
    let end = (start + len as u64).min(plan.needed_len as u64);
    end.saturating_sub(start)
}
