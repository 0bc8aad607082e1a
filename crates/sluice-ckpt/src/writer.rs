//! [`WriteJob`]: one rank's share of a save, staged into a byte-budgeted pool, then written
//! and made durable in the background.
//!
//! A save has two moments a trainer cares about. *Staged*: every byte this rank must write
//! has been copied out of the live state, so training may mutate its parameters again.
//! *Durable*: every chunk is in the store and synced. Between them the bytes live in a
//! [`StagingPool`], which never holds more than its budget: when the share is larger, the
//! stager waits for writers to free buffers, and the save streams through the pool (staged
//! then comes later, at the pace of the disk, but memory stays bounded).
//!
//! Only the chunks this rank was planned to write are staged, not its whole state: chunks
//! the store already holds (an incremental save) and chunks another rank writes (dedup)
//! cost no memory here at all.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use sluice_engine::AlignedBuf;

use crate::chunk_store::ChunkStore;
use crate::chunking::{ChunkRef, Digest};
use crate::error::CkptError;

/// Host buffers for staged chunks, all `chunk_bytes` large (page-aligned, for O_DIRECT
/// writes), at most `budget` bytes of them.
pub struct StagingPool {
    chunk_bytes: usize,
    max_buffers: usize,
    inner: Mutex<PoolState>,
    freed: Condvar,
    peak_bytes: AtomicU64,
}

struct PoolState {
    free: Vec<AlignedBuf>,
    allocated: usize,
}

impl StagingPool {
    /// A pool of at most `budget` bytes of `chunk_bytes` buffers; the budget must hold one.
    pub fn new(budget: u64, chunk_bytes: u64) -> Result<Arc<StagingPool>, CkptError> {
        if chunk_bytes == 0 || budget < chunk_bytes {
            return Err(CkptError::arg(
                "staging budget",
                format!("{budget} bytes cannot hold one {chunk_bytes}-byte chunk"),
            ));
        }
        Ok(Arc::new(StagingPool {
            chunk_bytes: chunk_bytes as usize,
            max_buffers: (budget / chunk_bytes) as usize,
            inner: Mutex::new(PoolState {
                free: Vec::new(),
                allocated: 0,
            }),
            freed: Condvar::new(),
            peak_bytes: AtomicU64::new(0),
        }))
    }

    /// The most bytes of buffers this pool ever held at once.
    pub fn peak_bytes(&self) -> u64 {
        self.peak_bytes.load(Ordering::Relaxed)
    }

    /// A buffer whose first bytes are a copy of `src`; waits while the budget is spent,
    /// until `stop`.
    fn stage(&self, src: &[u8], stop: &AtomicBool) -> Option<Result<AlignedBuf, CkptError>> {
        debug_assert!(src.len() <= self.chunk_bytes);
        let mut st = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut buf = loop {
            if stop.load(Ordering::Relaxed) {
                return None;
            }
            if let Some(b) = st.free.pop() {
                break b;
            }
            if st.allocated < self.max_buffers {
                st.allocated += 1;
                let held = (st.allocated * self.chunk_bytes) as u64;
                self.peak_bytes.fetch_max(held, Ordering::Relaxed);
                match AlignedBuf::new(self.chunk_bytes.next_multiple_of(4096)) {
                    Ok(b) => break b,
                    Err(e) => {
                        st.allocated -= 1;
                        return Some(Err(CkptError::io("staging buffer")(e)));
                    }
                }
            }
            // Woken by a writer returning a buffer, or by a stop (which notifies too); the
            // timeout only bounds a missed wake-up.
            st = self
                .freed
                .wait_timeout(st, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        };
        drop(st);
        buf.as_mut_slice()[..src.len()].copy_from_slice(src);
        Some(Ok(buf))
    }

    fn give_back(&self, buf: AlignedBuf) {
        let mut st = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        st.free.push(buf);
        drop(st);
        self.freed.notify_one();
    }

    fn wake_all(&self) {
        let _g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        self.freed.notify_all();
    }
}

/// A staged buffer lent out as an upload's body: it goes back to its pool when the last
/// reference to the body is dropped (an object store's client may keep one for a retry
/// until the put returns), so an upload reads the staged bytes in place, uncopied.
struct Lent {
    buf: Option<AlignedBuf>,
    len: usize,
    pool: Arc<StagingPool>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        match &self.buf {
            Some(b) => &b.as_slice()[..self.len],
            None => &[],
        }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            self.pool.give_back(b);
        }
    }
}

/// One chunk to write: its name and where its bytes are in the live state.
#[derive(Clone, Copy, Debug)]
pub struct WriteTask {
    pub chunk: ChunkRef,
    /// Address of the chunk's first byte; valid until the job reports staged.
    pub src: usize,
}

/// What a finished job did.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct JobReport {
    pub chunks_written: usize,
    pub bytes_written: u64,
    /// Chunks planned for this rank that were already stored when it came to them.
    pub chunks_present: usize,
    pub staging_peak_bytes: u64,
    pub staged_s: f64,
    pub durable_s: f64,
    /// Bytes written over the time spent writing them (the rank's measured bandwidth).
    pub write_bytes_per_s: f64,
}

type Outcome<T> = Option<Result<T, CkptError>>;

/// A chunk staged into the pool, on its way to a writer thread.
type Staged = (ChunkRef, AlignedBuf);

struct Shared {
    staged: Mutex<Outcome<f64>>,
    durable: Mutex<Outcome<JobReport>>,
    /// Waiters sleep on `changed` under `gate`; outcomes are set under it too.
    gate: Mutex<()>,
    changed: Condvar,
    stop: AtomicBool,
    first_error: Mutex<Option<CkptError>>,
    pool: Arc<StagingPool>,
    /// Where pushed chunks go: the writers' queue while pushes are expected.
    pushes: Mutex<Option<mpsc::Sender<Staged>>>,
    /// Set once the front end pushed its last chunk (or at once when none are expected).
    pushes_done: Mutex<bool>,
    pushes_ended: Condvar,
    /// Digests of pushed chunks, for the final sync.
    pushed: Mutex<Vec<Digest>>,
    /// Chunks this job created (not those it found stored): what a failed save removes.
    created: Mutex<Vec<Digest>>,
}

impl Shared {
    fn fail(&self, e: CkptError) {
        let mut first = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
        if first.is_none() {
            *first = Some(e);
        }
        drop(first);
        self.stop.store(true, Ordering::Relaxed);
        self.pool.wake_all();
        self.end_pushes();
    }

    fn error(&self) -> Option<CkptError> {
        self.first_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn end_pushes(&self) {
        *self.pushes_done.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.pushes_ended.notify_all();
    }

    fn set<T>(&self, slot: &Mutex<Outcome<T>>, v: Result<T, CkptError>) {
        let _g = self.gate.lock().unwrap_or_else(|p| p.into_inner());
        *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(v);
        self.changed.notify_all();
    }
}

/// One rank's write share of a save, running in the background.
pub struct WriteJob {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl WriteJob {
    /// Starts staging and writing `tasks` into `chunks` on `writers` threads. `keep` is
    /// whatever keeps the tasks' source memory alive; the job drops it once staged.
    ///
    /// # Safety
    /// Each task's `src..src + chunk.len` must be readable, and must not change, until the
    /// job reports staged (or is dropped: drop waits for the stager).
    pub unsafe fn start(
        chunks: ChunkStore,
        tasks: Vec<WriteTask>,
        pool: Arc<StagingPool>,
        writers: usize,
        keep: Box<dyn Send>,
    ) -> Result<WriteJob, CkptError> {
        // SAFETY: the caller's contract.
        unsafe { WriteJob::start_with_pushes(chunks, tasks, pool, writers, keep, false) }
    }

    /// [`WriteJob::start`], with more chunks to come through [`WriteJob::push`] when
    /// `pushes` (bytes that pass through a window, such as a device tensor's): the job is
    /// staged once its tasks are and [`WriteJob::end_pushes`] was called.
    ///
    /// # Safety
    /// As for [`WriteJob::start`].
    pub unsafe fn start_with_pushes(
        chunks: ChunkStore,
        tasks: Vec<WriteTask>,
        pool: Arc<StagingPool>,
        writers: usize,
        keep: Box<dyn Send>,
        pushes: bool,
    ) -> Result<WriteJob, CkptError> {
        if let Some(t) = tasks
            .iter()
            .find(|t| t.chunk.len as usize > pool.chunk_bytes)
        {
            return Err(CkptError::arg(
                format!("chunk {}", t.chunk.digest),
                format!(
                    "{} bytes exceed the pool's {}",
                    t.chunk.len, pool.chunk_bytes
                ),
            ));
        }
        // The channel exists before the thread does: a push made the moment `start` returns
        // must find it (it raced the thread's start and lost under load).
        let (tx, rx) = mpsc::channel::<Staged>();
        let shared = Arc::new(Shared {
            staged: Mutex::new(None),
            durable: Mutex::new(None),
            gate: Mutex::new(()),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            first_error: Mutex::new(None),
            pool,
            pushes: Mutex::new(pushes.then(|| tx.clone())),
            pushes_done: Mutex::new(!pushes),
            pushes_ended: Condvar::new(),
            pushed: Mutex::new(Vec::new()),
            created: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("sluice-ckpt-save".into())
            .spawn(move || run(&s, &chunks, tasks, writers.max(1), keep, (tx, rx)))
            .map_err(CkptError::io("sluice-ckpt-save thread"))?;
        Ok(WriteJob {
            shared,
            thread: Some(thread),
        })
    }

    /// Waits until staged (training may mutate the state again); seconds it took.
    pub fn wait_staged(&self, timeout: Option<Duration>) -> Option<Result<f64, CkptError>> {
        self.wait(&self.shared.staged, timeout)
    }

    /// Waits until every chunk of the share is written and synced.
    pub fn wait_durable(&self, timeout: Option<Duration>) -> Option<Result<JobReport, CkptError>> {
        self.wait(&self.shared.durable, timeout)
    }

    fn wait<T: Clone>(
        &self,
        slot: &Mutex<Outcome<T>>,
        timeout: Option<Duration>,
    ) -> Option<Result<T, CkptError>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut g = self.shared.gate.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(r) = &*slot.lock().unwrap_or_else(|p| p.into_inner()) {
                return Some(match r {
                    Ok(v) => Ok(v.clone()),
                    Err(e) => Err(e.clone()),
                });
            }
            let step = match deadline {
                Some(d) => d.checked_duration_since(Instant::now())?,
                None => Duration::from_secs(1),
            };
            g = self
                .shared
                .changed
                .wait_timeout(g, step.min(Duration::from_secs(1)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Asks the job to stop; waits for staged and durable then report it.
    pub fn cancel(&self, why: &str) {
        self.shared.fail(CkptError::Cancelled(why.to_string()));
    }

    /// Stages `chunks` — (chunk, address of its bytes) — and queues them for writing;
    /// returns once they are copied out (the caller may reuse the memory), waiting while
    /// the pool's budget is spent.
    ///
    /// # Safety
    /// Each address must point at the chunk's bytes, readable until this call returns.
    pub unsafe fn push(&self, chunks: &[(ChunkRef, usize)]) -> Result<(), CkptError> {
        let s = &self.shared;
        for (c, src) in chunks {
            if c.len as usize > s.pool.chunk_bytes {
                return Err(CkptError::arg(
                    format!("chunk {}", c.digest),
                    format!("{} bytes exceed the pool's {}", c.len, s.pool.chunk_bytes),
                ));
            }
            let tx = s.pushes.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let Some(tx) = tx else {
                return Err(s
                    .error()
                    .unwrap_or_else(|| CkptError::arg("push", "the job takes no more chunks")));
            };
            // SAFETY: the caller's contract.
            let bytes = unsafe { std::slice::from_raw_parts(*src as *const u8, c.len as usize) };
            match s.pool.stage(bytes, &s.stop) {
                Some(Ok(buf)) => {
                    s.pushed
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(c.digest);
                    if tx.send((*c, buf)).is_err() {
                        break;
                    }
                }
                Some(Err(e)) => {
                    s.fail(e.clone());
                    return Err(e);
                }
                None => break,
            }
        }
        match s.error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// No more pushes: the job becomes staged once its own tasks are.
    pub fn end_pushes(&self) {
        self.shared.end_pushes();
    }

    /// The chunks this job created (not the ones it found stored).
    pub fn created(&self) -> Vec<Digest> {
        self.shared
            .created
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for WriteJob {
    /// A job dropped unfinished is cancelled, and drop waits for its thread: the source
    /// memory it reads is only guaranteed alive while the job exists.
    fn drop(&mut self) {
        if self.wait_durable(Some(Duration::ZERO)).is_none() {
            self.cancel("the save handle was dropped");
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A task's source, readable from the stager thread (the caller's safety contract).
struct Src(usize);
// SAFETY: `WriteJob::start`'s contract: the memory stays valid and unchanged until staged.
unsafe impl Send for Src {}

fn run(
    s: &Arc<Shared>,
    chunks: &ChunkStore,
    tasks: Vec<WriteTask>,
    writers: usize,
    keep: Box<dyn Send>,
    (tx, rx): (mpsc::Sender<Staged>, mpsc::Receiver<Staged>),
) {
    let t0 = Instant::now();
    let rx = Mutex::new(rx);
    let written = AtomicU64::new(0);
    let written_chunks = AtomicU64::new(0);
    let present = AtomicU64::new(0);
    let busy_ns = AtomicU64::new(0);
    let mut staged_s = 0.0;
    std::thread::scope(|scope| {
        for _ in 0..writers {
            scope.spawn(|| loop {
                let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                let Ok((c, mut buf)) = next else { return };
                if s.stop.load(Ordering::Relaxed) {
                    s.pool.give_back(buf);
                    continue;
                }
                let t = Instant::now();
                let outcome = match chunks.object() {
                    // The body is the staged buffer itself, back to the pool once sent.
                    Some(_) => {
                        let lent = Lent {
                            buf: Some(buf),
                            len: c.len as usize,
                            pool: Arc::clone(&s.pool),
                        };
                        chunks.write_bytes(&c, bytes::Bytes::from_owner(lent))
                    }
                    None => {
                        let r = chunks.write_aligned(&c, &mut buf);
                        s.pool.give_back(buf);
                        r
                    }
                };
                match outcome {
                    Ok(true) => {
                        written.fetch_add(c.len, Ordering::Relaxed);
                        written_chunks.fetch_add(1, Ordering::Relaxed);
                        s.created
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(c.digest);
                    }
                    Ok(false) => {
                        present.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => s.fail(e),
                }
                busy_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            });
        }
        for t in &tasks {
            if s.stop.load(Ordering::Relaxed) {
                break;
            }
            let src = Src(t.src);
            // SAFETY: the caller's contract for `WriteJob::start`.
            let bytes =
                unsafe { std::slice::from_raw_parts(src.0 as *const u8, t.chunk.len as usize) };
            match s.pool.stage(bytes, &s.stop) {
                Some(Ok(buf)) => {
                    if tx.send((t.chunk, buf)).is_err() {
                        break;
                    }
                }
                Some(Err(e)) => {
                    s.fail(e);
                    break;
                }
                None => break,
            }
        }
        drop(keep); // the live state is no longer read
                    // Pushed chunks (streamed through a window) stage on the pushing thread.
        let mut done = s.pushes_done.lock().unwrap_or_else(|p| p.into_inner());
        while !*done {
            done = s.pushes_ended.wait(done).unwrap_or_else(|p| p.into_inner());
        }
        drop(done);
        s.pushes.lock().unwrap_or_else(|p| p.into_inner()).take();
        staged_s = t0.elapsed().as_secs_f64();
        let staged = match s.error() {
            Some(e) => Err(e),
            None => Ok(staged_s),
        };
        s.set(&s.staged, staged);
        drop(tx);
    });
    let result = match s.error() {
        Some(e) => Err(e),
        None => {
            let mut digests: Vec<Digest> = tasks.iter().map(|t| t.chunk.digest).collect();
            digests.extend(s.pushed.lock().unwrap_or_else(|p| p.into_inner()).iter());
            chunks.sync(&digests).map(|()| {
                let bytes = written.load(Ordering::Relaxed);
                let busy = busy_ns.load(Ordering::Relaxed) as f64 / 1e9 / writers as f64;
                JobReport {
                    chunks_written: written_chunks.load(Ordering::Relaxed) as usize,
                    bytes_written: bytes,
                    chunks_present: present.load(Ordering::Relaxed) as usize,
                    staging_peak_bytes: s.pool.peak_bytes(),
                    staged_s,
                    durable_s: t0.elapsed().as_secs_f64(),
                    write_bytes_per_s: if busy > 0.0 { bytes as f64 / busy } else { 0.0 },
                }
            })
        }
    };
    if let Err(e) = &result {
        s.fail(e.clone());
    }
    s.set(&s.durable, result);
}
