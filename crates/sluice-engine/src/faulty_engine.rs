//! A fault-injecting engine for reliability tests.
//!
//! It reads like [`SyncEngine`](crate::SyncEngine) and sabotages chosen ops
//! (counted from 0 in submission order): fail with an errno, return a short
//! read as if the file had ended, or flip a byte of what landed. Tests use it
//! to prove that every layer above turns such faults into typed errors and
//! never into wrong bytes or a partial result.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::io_engine::{EngineKind, IoEngine, Next, OpSource, Sink};
use crate::pread::pread_full;

/// One injected fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Op `n` fails with this errno.
    FailWith { op: u64, errno: i32 },
    /// Op `n` returns half its bytes, as if the file ended there.
    ShortRead { op: u64 },
    /// Op `n` succeeds but its first byte is flipped.
    Corrupt { op: u64 },
}

/// Reads one op at a time and applies `faults`.
#[derive(Debug, Default)]
pub struct FaultyEngine {
    faults: Vec<Fault>,
    ops_seen: AtomicU64,
}

impl FaultyEngine {
    pub fn new(faults: Vec<Fault>) -> Self {
        FaultyEngine {
            faults,
            ops_seen: AtomicU64::new(0),
        }
    }

    /// How many ops this engine has been given so far.
    pub fn ops_seen(&self) -> u64 {
        self.ops_seen.load(Ordering::Relaxed)
    }

    fn fault_for(&self, index: u64) -> Option<Fault> {
        self.faults.iter().copied().find(|f| match f {
            Fault::FailWith { op, .. } | Fault::ShortRead { op } | Fault::Corrupt { op } => {
                *op == index
            }
        })
    }
}

impl IoEngine for FaultyEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Sync
    }

    fn run(&self, source: &mut dyn OpSource, sink: &mut Sink<'_>) -> io::Result<()> {
        loop {
            let op = match source.next_op(true) {
                Next::Op(op) => op,
                Next::Wait => {
                    std::thread::yield_now();
                    continue;
                }
                Next::Done => return Ok(()),
            };
            let index = self.ops_seen.fetch_add(1, Ordering::Relaxed);
            let outcome = match self.fault_for(index) {
                Some(Fault::FailWith { errno, .. }) => Err(io::Error::from_raw_os_error(errno)),
                Some(Fault::ShortRead { .. }) => pread_full(&op).map(|n| n / 2),
                Some(Fault::Corrupt { .. }) => pread_full(&op).inspect(|&n| {
                    if n > 0 {
                        let dst = op.dst().expect("pread_full checked the range");
                        // SAFETY: the read just filled at least one byte at
                        // `dst`, and no other writer touches this op's range.
                        unsafe { *dst ^= 0xFF };
                    }
                }),
                None => pread_full(&op),
            };
            sink(op, outcome);
        }
    }
}
