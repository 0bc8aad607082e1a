//! Where the runtime's access events come from.
//!
//! The loop in [`super::Runtime`] asks each [`EventSource`] in turn for the
//! events it has. The first source may block for a short while when the
//! runtime has nothing else to do (that is how an idle runtime waits
//! without spinning); the others answer at once. Sources are told about
//! every event the runtime hands to the policy ([`EventSource::observe`]),
//! which is how the samplers learn whom to follow.
//!
//! - [`FanotifySource`]: the kernel's open, read and mmap events.
//! - [`TriggerSource`]: explicit triggers written to a named pipe.
//! - [`super::Samplers`]: the progress of readers that fanotify cannot see
//!   read by read (mmap, read(), pread() loaders).
//! - [`MemoryEvents`]: scripted events, for tests and embedding.
//! - [`Idle`]: no events at all; it only waits.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::fanotify::{Level, Watch};
use crate::policy::AccessEvent;
use crate::trigger::TriggerPipe;

/// A source of access events.
pub trait EventSource {
    /// The events ready now. When none is ready and `wait` is not zero, a
    /// source that can block waits up to `wait` for one; a source that
    /// cannot returns at once. Never blocks longer than `wait`.
    fn poll(&mut self, wait: Duration) -> Vec<AccessEvent>;

    /// Sees every event the runtime hands to the policy, with the file as
    /// the kernel names it (`real`, which differs from `event.path` for a
    /// symlinked model file). The default ignores it.
    fn observe(&mut self, event: &AccessEvent, real: &Path) {
        let _ = (event, real);
    }

    /// What the source has counted, for the run's report.
    fn counts(&self) -> SourceCounts {
        SourceCounts::default()
    }
}

/// Counters a source reports at the end of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceCounts {
    /// Events the source saw (including ones it dropped).
    pub events: u64,
    /// Permission events answered.
    pub answered: u64,
    /// Permission events the kernel did not take an answer for.
    pub unanswered: u64,
    /// Events dropped because the runtime was behind, or malformed.
    pub dropped: u64,
}

/// fanotify events from a [`Watch`].
pub struct FanotifySource {
    watch: Watch,
}

impl FanotifySource {
    pub fn new(watch: Watch) -> FanotifySource {
        FanotifySource { watch }
    }

    /// What the watch can see.
    pub fn level(&self) -> Level {
        self.watch.level
    }

    /// From now on only `pid` and its descendants count (see
    /// [`Watch::only_tree_of`]).
    pub fn only_tree_of(&self, pid: i32) {
        self.watch.only_tree_of(pid);
    }

    /// A service will be launched, not yet (see [`Watch::no_service_yet`]).
    pub fn no_service_yet(&self) {
        self.watch.no_service_yet();
    }

    /// A service is being launched (see [`Watch::awaiting_service`]).
    pub fn awaiting_service(&self) {
        self.watch.awaiting_service();
    }
}

impl EventSource for FanotifySource {
    fn poll(&mut self, wait: Duration) -> Vec<AccessEvent> {
        let first = match wait.is_zero() {
            true => None,
            false => self.watch.recv_timeout(wait),
        };
        first.into_iter().chain(self.watch.drain()).collect()
    }

    fn counts(&self) -> SourceCounts {
        let s = &self.watch.stats;
        SourceCounts {
            events: s.events.load(Ordering::Relaxed),
            answered: s.answered.load(Ordering::Relaxed),
            unanswered: s.unanswered.load(Ordering::Relaxed),
            dropped: s.dropped.load(Ordering::Relaxed) + s.malformed.load(Ordering::Relaxed),
        }
    }
}

/// Explicit triggers from a named pipe, for files of one model directory.
pub struct TriggerSource {
    pipe: TriggerPipe,
    model_dir: PathBuf,
}

impl TriggerSource {
    pub fn new(pipe: TriggerPipe, model_dir: PathBuf) -> TriggerSource {
        TriggerSource { pipe, model_dir }
    }
}

impl EventSource for TriggerSource {
    fn poll(&mut self, _wait: Duration) -> Vec<AccessEvent> {
        self.pipe.poll(&self.model_dir)
    }
}

/// Scripted events: each poll hands over the next batch, in order. Shared
/// with the code that scripts it through [`MemoryEvents::handle`], so a
/// test can add events between turns.
#[derive(Clone, Default)]
pub struct MemoryEvents {
    batches: std::rc::Rc<std::cell::RefCell<VecDeque<Vec<AccessEvent>>>>,
    observed: std::rc::Rc<std::cell::RefCell<Vec<AccessEvent>>>,
}

impl MemoryEvents {
    pub fn new() -> MemoryEvents {
        MemoryEvents::default()
    }

    /// Another handle on the same script.
    pub fn handle(&self) -> MemoryEvents {
        self.clone()
    }

    /// Queues a batch, delivered by one poll after the batches before it.
    pub fn push(&self, batch: Vec<AccessEvent>) {
        self.batches.borrow_mut().push_back(batch);
    }

    /// Batches not delivered yet.
    pub fn pending(&self) -> usize {
        self.batches.borrow().len()
    }

    /// Every event the runtime has handed to the policy so far.
    pub fn observed(&self) -> Vec<AccessEvent> {
        self.observed.borrow().clone()
    }
}

impl EventSource for MemoryEvents {
    fn poll(&mut self, _wait: Duration) -> Vec<AccessEvent> {
        self.batches.borrow_mut().pop_front().unwrap_or_default()
    }

    fn observe(&mut self, event: &AccessEvent, _real: &Path) {
        self.observed.borrow_mut().push(event.clone());
    }
}

/// No events: waits out the time it is given, so a runtime with no other
/// blocking source does not spin.
pub struct Idle;

impl EventSource for Idle {
    fn poll(&mut self, wait: Duration) -> Vec<AccessEvent> {
        std::thread::sleep(wait);
        Vec::new()
    }
}
