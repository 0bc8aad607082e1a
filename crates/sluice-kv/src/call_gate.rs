//! [`CallGate`]: the calls running on a store, and its closing.
//!
//! `close()` lets go of the segment files and hands the directory lock to the next owner.
//! A put still running on another thread at that moment went on writing afterwards: it
//! was acknowledged after the next owner's recovery had sealed the segment it wrote into
//! without it, so no later open found the block; in write-back, a put that landed in DRAM
//! after `close()` had flushed DRAM was never written at all. So every call enters the
//! gate and leaves it when done, and `close()` shuts the gate (from then on calls fail
//! with `Closed` at once) and waits until the calls inside have left.

use std::sync::{Condvar, Mutex};

use crate::sync::lock;

#[derive(Default)]
struct GateState {
    /// Calls inside now.
    inside: usize,
    /// `close()` began: no call enters any more.
    shut: bool,
    /// A `close()` waits for the calls inside (what tests observe).
    closer_waiting: bool,
}

#[derive(Default)]
pub(crate) struct CallGate {
    state: Mutex<GateState>,
    left: Condvar,
}

/// One call inside the gate; leaving is dropping it.
pub(crate) struct Call<'a> {
    gate: &'a CallGate,
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        let mut g = lock(&self.gate.state);
        g.inside -= 1;
        if g.inside == 0 {
            self.gate.left.notify_all();
        }
    }
}

impl CallGate {
    /// Enters for one call; `None` once the gate is shut.
    pub(crate) fn enter(&self) -> Option<Call<'_>> {
        let mut g = lock(&self.state);
        if g.shut {
            return None;
        }
        g.inside += 1;
        Some(Call { gate: self })
    }

    pub(crate) fn is_shut(&self) -> bool {
        lock(&self.state).shut
    }

    /// Shuts the gate and waits until every call inside has left; `true` if it was shut
    /// already (the store was closed before).
    pub(crate) fn shut(&self) -> bool {
        let mut g = lock(&self.state);
        let was_shut = std::mem::replace(&mut g.shut, true);
        while g.inside > 0 {
            g.closer_waiting = true;
            g = self.left.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        g.closer_waiting = false;
        was_shut
    }

    /// Whether a `close()` is waiting for calls still inside.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn closer_waiting(&self) -> bool {
        lock(&self.state).closer_waiting
    }
}
