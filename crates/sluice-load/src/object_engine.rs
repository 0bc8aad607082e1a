//! [`ObjectEngine`]: runs the reads of remote objects as futures on the shared runtime.
//!
//! The thread engine can read objects too (a blocking `read_at` per thread), but each of
//! its threads then parks and wakes for every chunk of every response, which on a small
//! machine costs as much CPU as the bytes themselves. Here every op is one task on the
//! runtime's workers, which read the sockets and copy the bodies into the pooled buffers
//! themselves; the calling thread only feeds ops and reports completions, as every engine
//! does. Ops of local files, if a load mixes them in, are read inline.

use std::io;
use std::sync::mpsc;

use sluice_engine::{EngineKind, IoEngine, OpSource, ReadOp, Sink};

use crate::shard_file::RemoteObject;

/// Keeps up to `depth` remote reads in flight.
#[derive(Debug)]
pub struct ObjectEngine {
    depth: usize,
}

impl ObjectEngine {
    pub fn new(depth: usize) -> ObjectEngine {
        ObjectEngine {
            depth: depth.max(1),
        }
    }
}

/// One op's read, run on the runtime; the op travels with it, and with it the buffer it
/// fills, so an engine that stops early never frees memory a task still writes.
async fn read_op(op: &ReadOp) -> io::Result<usize> {
    let Some(object) = op
        .file
        .remote_reader()
        .and_then(|r| r.as_any().downcast_ref::<RemoteObject>())
    else {
        return Err(io::Error::other("not a remote object"));
    };
    let dst = op.dst()?;
    // SAFETY: `dst .. dst + len` lies inside the op's buffer (checked by `op.dst()`), the
    // op (holding the buffer) lives in this task until the read ends, and only this op
    // writes that range.
    let dst = unsafe { std::slice::from_raw_parts_mut(dst, op.len) };
    object.read_into(op.offset, dst).await
}

/// An op's way back to the engine. A task that ends without reporting (it panicked, or
/// the runtime dropped it) reports a failure from here, so the engine never waits forever.
struct Reply {
    op: Option<ReadOp>,
    done: mpsc::Sender<(ReadOp, io::Result<usize>)>,
}

impl Drop for Reply {
    fn drop(&mut self) {
        if let Some(op) = self.op.take() {
            let failed = io::Error::other("the remote read task ended without finishing");
            let _ = self.done.send((op, Err(failed)));
        }
    }
}

impl IoEngine for ObjectEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::ObjectStore
    }

    fn run(&self, source: &mut dyn OpSource, sink: &mut Sink<'_>) -> io::Result<()> {
        let runtime = sluice_remote::runtime_handle().map_err(io::Error::other)?;
        let (done_tx, done_rx) = mpsc::channel::<(ReadOp, io::Result<usize>)>();
        let mut submit = |op: ReadOp| {
            if !op.file.is_remote() {
                // A local file in a remote load: read inline, reported like the rest.
                let outcome = sluice_engine::pread_full(&op);
                let _ = done_tx.send((op, outcome));
                return Ok(());
            }
            let mut reply = Reply {
                op: Some(op),
                done: done_tx.clone(),
            };
            runtime.spawn(async move {
                let outcome = match &reply.op {
                    Some(op) => read_op(op).await,
                    None => return,
                };
                if let Some(op) = reply.op.take() {
                    let _ = reply.done.send((op, outcome));
                }
            });
            Ok(())
        };
        sluice_engine::drive(self.depth, source, sink, &mut submit, &done_rx)
    }
}
