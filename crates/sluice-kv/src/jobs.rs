//! Non-blocking batches: `submit_put` / `submit_get` return a [`KvJob`] at once; a few
//! job threads run the batches through the same data path as the blocking calls.
//!
//! - Arguments are checked when a job is submitted, so a bad key or buffer is an error of
//!   the submit call, never a silently failed job.
//! - A job owns its buffers ([`JobBuffer`]) until it finishes; then [`KvJob::take_buffers`]
//!   hands them back (a get's bytes are in them).
//! - Every finished job is reported once: by [`KvStore::poll`](crate::KvStore::poll), or
//!   by a `wait` on it, whichever comes first.
//! - Submits wait while `MAX_QUEUED_JOBS` jobs are queued (backpressure), and `close`
//!   waits for queued and running jobs before it releases the store.
//! - A job that panics (a bug) fails every key of its batch: a miss, never a hang.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::sync::lock;

/// Jobs a store runs at once. Two: a put and a get of an engine overlap, and each batch
/// already spreads its blocks over `io_threads`.
pub(crate) const JOB_THREADS: usize = 2;

/// Jobs queued before `submit_*` waits: enough for an engine's whole scheduler step, few
/// enough that a stalled disk pushes back on the submitter instead of growing a queue.
pub(crate) const MAX_QUEUED_JOBS: usize = 1024;

/// A host buffer a job reads from (put) or writes into (get). The job owns it until it
/// finishes, so the memory outlives every read and write into it.
pub trait JobBuffer: Send + 'static {
    fn bytes(&self) -> &[u8];
    fn bytes_mut(&mut self) -> &mut [u8];
}

impl JobBuffer for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

impl JobBuffer for Box<[u8]> {
    fn bytes(&self) -> &[u8] {
        self
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

/// What a job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobKind {
    Put,
    Get,
}

impl JobKind {
    pub fn name(self) -> &'static str {
        match self {
            JobKind::Put => "put",
            JobKind::Get => "get",
        }
    }
}

/// The work of a job: returns per-key success and the buffers.
pub(crate) type JobWork =
    Box<dyn FnOnce(Vec<Box<dyn JobBuffer>>) -> (Vec<bool>, Vec<Box<dyn JobBuffer>>) + Send>;

/// What runs a job's batch, already checked at submit: the store itself, or a sidecar
/// client.
pub(crate) trait BatchRunner: Send + 'static {
    fn run_put(&self, keys: &[&[u8]], blocks: &[&[u8]]) -> Vec<bool>;
    fn run_get(&self, keys: &[&[u8]], bufs: &mut [&mut [u8]]) -> Vec<bool>;
}

/// A job that runs a `kind` batch of `keys` over its buffers with `runner`.
pub(crate) fn batch_work(runner: impl BatchRunner, kind: JobKind, keys: Vec<Vec<u8>>) -> JobWork {
    Box::new(move |mut bufs| {
        let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
        let ok = match kind {
            JobKind::Put => {
                let blocks: Vec<&[u8]> = bufs.iter().map(|b| b.bytes()).collect();
                runner.run_put(&refs, &blocks)
            }
            JobKind::Get => {
                let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.bytes_mut()).collect();
                runner.run_get(&refs, &mut slices)
            }
        };
        (ok, bufs)
    })
}

struct JobState {
    id: u64,
    kind: JobKind,
    keys: usize,
    outcome: Mutex<Option<Outcome>>,
    done: Condvar,
    queue: Weak<JobQueue>,
    /// Reported by `wait` or `result`; set under the queue's lock, where the worker that
    /// ran the job decides whether to list it for `poll`.
    reported: AtomicBool,
}

struct Outcome {
    ok: Vec<bool>,
    buffers: Vec<Box<dyn JobBuffer>>,
}

/// A submitted batch. Cheap to clone; every clone is the same job.
#[derive(Clone)]
pub struct KvJob {
    state: Arc<JobState>,
}

impl std::fmt::Debug for KvJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvJob")
            .field("id", &self.state.id)
            .field("kind", &self.state.kind)
            .field("keys", &self.state.keys)
            .field("done", &self.is_done())
            .finish()
    }
}

impl KvJob {
    pub fn id(&self) -> u64 {
        self.state.id
    }

    pub fn kind(&self) -> JobKind {
        self.state.kind
    }

    /// Keys in the batch.
    pub fn len(&self) -> usize {
        self.state.keys
    }

    pub fn is_empty(&self) -> bool {
        self.state.keys == 0
    }

    pub fn is_done(&self) -> bool {
        lock(&self.state.outcome).is_some()
    }

    /// Per-key success once the job is done, else `None`. Counts as the job's report.
    pub fn result(&self) -> Option<Vec<bool>> {
        let ok = lock(&self.state.outcome).as_ref().map(|o| o.ok.clone())?;
        self.collected();
        Some(ok)
    }

    /// Waits for the job (`None`: for ever) and returns per-key success; `None` if the
    /// timeout passed first. Counts as the job's report: `poll` will not return it. A
    /// timeout past what the clock can hold waits for ever.
    pub fn wait(&self, timeout: Option<Duration>) -> Option<Vec<bool>> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut g = lock(&self.state.outcome);
        loop {
            if let Some(o) = g.as_ref() {
                let ok = o.ok.clone();
                drop(g);
                self.collected();
                return Some(ok);
            }
            g = match deadline {
                None => self.state.done.wait(g).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    self.state
                        .done
                        .wait_timeout(g, left)
                        .map(|(g, _)| g)
                        .unwrap_or_else(|p| p.into_inner().0)
                }
            };
        }
    }

    /// The job's buffers, once it is done (a get's bytes are in them); empty before, or
    /// after they were taken.
    pub fn take_buffers(&self) -> Vec<Box<dyn JobBuffer>> {
        lock(&self.state.outcome)
            .as_mut()
            .map(|o| std::mem::take(&mut o.buffers))
            .unwrap_or_default()
    }

    /// Takes the job off the store's list of finished, unreported jobs, or keeps it off:
    /// a waiter can see the outcome before the worker that set it lists the job.
    fn collected(&self) {
        if let Some(q) = self.state.queue.upgrade() {
            let mut g = lock(&q.state);
            self.state.reported.store(true, Ordering::Relaxed);
            g.finished.retain(|j| !Arc::ptr_eq(&j.state, &self.state));
        }
    }

    fn finish(&self, ok: Vec<bool>, buffers: Vec<Box<dyn JobBuffer>>) {
        *lock(&self.state.outcome) = Some(Outcome { ok, buffers });
        self.state.done.notify_all();
    }
}

struct Task {
    job: KvJob,
    work: JobWork,
    buffers: Vec<Box<dyn JobBuffer>>,
}

#[derive(Default)]
struct QueueState {
    tasks: VecDeque<Task>,
    running: usize,
    workers: usize,
    /// No new jobs (the store is closing).
    closing: bool,
    /// The store is gone: workers exit once the queue is empty.
    shutdown: bool,
    finished: Vec<KvJob>,
    next_id: u64,
}

/// The store's job queue and its worker threads (started on the first submit).
#[derive(Default)]
pub(crate) struct JobQueue {
    state: Mutex<QueueState>,
    work: Condvar,
    idle: Condvar,
}

impl JobQueue {
    /// Queues a job; `None` once the store is closing.
    pub(crate) fn submit(
        self: &Arc<Self>,
        kind: JobKind,
        keys: usize,
        buffers: Vec<Box<dyn JobBuffer>>,
        work: JobWork,
    ) -> Option<KvJob> {
        let mut g = lock(&self.state);
        while g.tasks.len() >= MAX_QUEUED_JOBS && !g.closing {
            g = self.idle.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        if g.closing {
            return None;
        }
        g.next_id += 1;
        let job = KvJob {
            state: Arc::new(JobState {
                id: g.next_id,
                kind,
                keys,
                outcome: Mutex::new(None),
                done: Condvar::new(),
                queue: Arc::downgrade(self),
                reported: AtomicBool::new(false),
            }),
        };
        g.tasks.push_back(Task {
            job: job.clone(),
            work,
            buffers,
        });
        if g.workers < JOB_THREADS {
            let q = Arc::clone(self);
            let spawned = std::thread::Builder::new()
                .name("sluice-kv-job".into())
                .spawn(move || q.worker());
            match spawned {
                Ok(_) => g.workers += 1,
                Err(e) if g.workers == 0 => {
                    // No thread at all: run it here rather than never.
                    tracing::warn!("kv: cannot start a job thread ({e}); running the job inline");
                    let task = g.tasks.pop_back().expect("just queued");
                    drop(g);
                    run(task);
                    return Some(job);
                }
                Err(e) => tracing::warn!("kv: cannot start another job thread: {e}"),
            }
        }
        self.work.notify_one();
        Some(job)
    }

    fn worker(self: Arc<Self>) {
        loop {
            let task = {
                let mut g = lock(&self.state);
                loop {
                    if let Some(t) = g.tasks.pop_front() {
                        g.running += 1;
                        break t;
                    }
                    if g.shutdown {
                        g.workers -= 1;
                        self.idle.notify_all();
                        return;
                    }
                    g = self.work.wait(g).unwrap_or_else(|p| p.into_inner());
                }
            };
            self.idle.notify_all(); // room in the queue
            let job = task.job.clone();
            run(task);
            let mut g = lock(&self.state);
            g.running -= 1;
            if !job.state.reported.load(Ordering::Relaxed) {
                g.finished.push(job);
            }
            drop(g);
            self.idle.notify_all();
        }
    }

    /// Finished jobs not reported yet, each once.
    pub(crate) fn poll(&self) -> Vec<KvJob> {
        std::mem::take(&mut lock(&self.state).finished)
    }

    /// Stops new submits and waits until every queued and running job has finished.
    pub(crate) fn drain(&self) {
        let mut g = lock(&self.state);
        g.closing = true;
        self.idle.notify_all();
        while !g.tasks.is_empty() || g.running > 0 {
            g = self.idle.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Lets the workers exit (the store is being dropped).
    pub(crate) fn shutdown(&self) {
        let mut g = lock(&self.state);
        g.closing = true;
        g.shutdown = true;
        drop(g);
        self.work.notify_all();
        self.idle.notify_all();
    }
}

/// Runs one task; a panic fails the batch instead of killing the worker.
fn run(task: Task) {
    let Task { job, work, buffers } = task;
    let keys = job.len();
    match std::panic::catch_unwind(AssertUnwindSafe(move || work(buffers))) {
        Ok((ok, buffers)) => job.finish(ok, buffers),
        Err(_) => {
            tracing::error!(
                "kv job {} ({}) panicked; every key of it is a miss",
                job.id(),
                job.kind().name()
            );
            job.finish(vec![false; keys], Vec::new());
        }
    }
}
