//! A thread-pool reader: `threads` workers each run blocking `pread`s.
//!
//! This is the fallback where io_uring is missing or refused (old kernels,
//! seccomp in containers). Blocking reads on N threads give the device a
//! queue depth of N, which is all O_DIRECT needs to reach full bandwidth; for
//! buffered reads of cached data the threads also spread the memory copy
//! over cores. The calling thread feeds a job queue and reports completions.

use std::io;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use crate::io_engine::{EngineKind, IoEngine, Next, OpSource, ReadOp, Sink};
use crate::pread::pread_full;

/// Reads with a pool of blocking threads.
#[derive(Debug)]
pub struct ThreadEngine {
    threads: usize,
}

impl ThreadEngine {
    /// An engine with `threads` workers (at least 1).
    pub fn new(threads: usize) -> Self {
        ThreadEngine {
            threads: threads.max(1),
        }
    }
}

impl IoEngine for ThreadEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Threads
    }

    fn run(&self, source: &mut dyn OpSource, sink: &mut Sink<'_>) -> io::Result<()> {
        let (job_tx, job_rx) = mpsc::channel::<ReadOp>();
        let job_rx = Arc::new(Mutex::new(job_rx));
        let (done_tx, done_rx) = mpsc::channel::<(ReadOp, io::Result<usize>)>();
        std::thread::scope(|scope| {
            for i in 0..self.threads {
                let jobs = Arc::clone(&job_rx);
                let done = done_tx.clone();
                std::thread::Builder::new()
                    .name(format!("sluice-read-{i}"))
                    .spawn_scoped(scope, move || worker(&jobs, &done))
                    .map_err(|e| io::Error::other(format!("cannot start reader thread: {e}")))?;
            }
            drop(done_tx);
            let mut submit = |op: ReadOp| {
                job_tx
                    .send(op)
                    .map_err(|_| io::Error::other("reader threads exited"))
            };
            let result = drive(self.threads, source, sink, &mut submit, &done_rx);
            drop(job_tx);
            result
        })
    }
}

fn worker(jobs: &Mutex<mpsc::Receiver<ReadOp>>, done: &mpsc::Sender<(ReadOp, io::Result<usize>)>) {
    loop {
        let job = {
            let Ok(rx) = jobs.lock() else { return };
            rx.recv()
        };
        let Ok(op) = job else { return };
        let outcome = pread_full(&op);
        if done.send((op, outcome)).is_err() {
            return;
        }
    }
}

/// The loop of an engine whose reads finish elsewhere (threads, async tasks): hands up to
/// `depth` ops to `submit`, and reports each completion that arrives on `done` to `sink`,
/// until the source is done and nothing is in flight. Every op submitted must come back
/// on `done` exactly once.
pub fn drive(
    depth: usize,
    source: &mut dyn OpSource,
    sink: &mut Sink<'_>,
    submit: &mut dyn FnMut(ReadOp) -> io::Result<()>,
    done: &mpsc::Receiver<(ReadOp, io::Result<usize>)>,
) -> io::Result<()> {
    let mut in_flight = 0usize;
    let mut source_done = false;
    loop {
        while !source_done && in_flight < depth {
            match source.next_op(in_flight == 0) {
                Next::Op(op) => {
                    submit(op)?;
                    in_flight += 1;
                }
                Next::Wait if in_flight == 0 => std::thread::yield_now(),
                Next::Wait => break,
                Next::Done => source_done = true,
            }
        }
        if in_flight == 0 {
            return Ok(());
        }
        let (op, outcome) = done
            .recv()
            .map_err(|_| io::Error::other("readers exited without reporting"))?;
        in_flight -= 1;
        sink(op, outcome);
        while let Ok((op, outcome)) = done.try_recv() {
            in_flight -= 1;
            sink(op, outcome);
        }
    }
}
