//! The plain reference engine: one blocking read at a time on the calling
//! thread. Slow, obviously correct, and the base of the fault injector.

use std::io;

use crate::io_engine::{EngineKind, IoEngine, Next, OpSource, Sink};
use crate::pread::pread_full;

/// Reads ops one by one, in order.
#[derive(Debug, Default)]
pub struct SyncEngine;

impl IoEngine for SyncEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Sync
    }

    fn run(&self, source: &mut dyn OpSource, sink: &mut Sink<'_>) -> io::Result<()> {
        loop {
            match source.next_op(true) {
                Next::Op(op) => {
                    let outcome = pread_full(&op);
                    sink(op, outcome);
                }
                Next::Wait => std::thread::yield_now(),
                Next::Done => return Ok(()),
            }
        }
    }
}
