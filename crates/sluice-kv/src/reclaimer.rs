//! [`Reclaimer`]: the background thread that keeps segment files under each tier's high
//! watermark, so puts rarely wait for space, and keeps the shared tier current: it seals
//! this store's open shared segment once it is `shared_refresh_ms` old (other stores only
//! see sealed segments) and looks for segments other stores sealed.
//!
//! With the shared tier in an object store a second thread of the same kind
//! (`sluice-kv-remote`) does the network's part, so a slow or stalled server never holds
//! up reclaiming local space: it seals our open shared segment when old, runs the
//! uploader's pass and lists the other stores; when the store closes it seals and
//! uploads what is left, once, if the last pass went through.
//!
//! The thread holds the segment tiers and nothing else of the store. That matters for the
//! store's lock: the store's last handle dropping must release the directory lock at once,
//! and it can only do that if no background thread keeps the store alive. Stopping joins
//! the thread, so once [`Reclaimer::stop`] returns no reclaim pass is running or can start,
//! and the lock can be handed to the next owner without two processes moving segments.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::foreign::{self, ForeignIndex};
use crate::fork_guard::ForkGuard;
use crate::remote_tier::Uploader;
use crate::ssd_tier::SsdTier;
use crate::sync::lock;

/// How long the thread sleeps without a wake-up before it checks the watermark anyway:
/// short enough that space freed by evictions is reclaimed soon after a burst of puts.
const IDLE_CHECK: Duration = Duration::from_millis(200);

#[derive(Default)]
struct Signal {
    woken: bool,
    stopping: bool,
}

/// The tiers the thread looks after.
pub(crate) struct Tended {
    /// Segment tiers to keep under their watermarks (local SSD, own shared segments).
    pub tiers: Vec<Arc<Mutex<SsdTier>>>,
    /// This store's own shared segments, sealed when old.
    pub shared: Option<Arc<Mutex<SsdTier>>>,
    /// Other stores' segments, refreshed.
    pub foreign: Option<Arc<Mutex<ForeignIndex>>>,
    /// Our shared segments' uploads and deletes (the shared tier in an object store).
    pub uploader: Option<Arc<Uploader>>,
    pub refresh: Duration,
}

/// The reclaim thread of one store.
pub(crate) struct Reclaimer {
    signal: Arc<(Mutex<Signal>, Condvar)>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The thread exists only in the process that started it, not in a forked child.
    fork: ForkGuard,
}

impl Reclaimer {
    /// Starts the thread.
    pub(crate) fn start(tended: Tended) -> std::io::Result<Reclaimer> {
        let signal: Arc<(Mutex<Signal>, Condvar)> = Arc::default();
        let theirs = Arc::clone(&signal);
        let name = match tended.uploader {
            Some(_) => "sluice-kv-remote",
            None => "sluice-kv-reclaim",
        };
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || run(&tended, &theirs))?;
        Ok(Reclaimer {
            signal,
            thread: Mutex::new(Some(thread)),
            fork: ForkGuard::this_process(),
        })
    }

    /// Asks for a pass now (a put left the files above the high watermark).
    pub(crate) fn wake(&self) {
        let (m, cv) = &*self.signal;
        lock(m).woken = true;
        cv.notify_one();
    }

    /// Stops the thread and waits for it: a pass in progress finishes first. Idempotent.
    /// In a forked child, where the thread does not exist, it only forgets it.
    pub(crate) fn stop(&self) {
        if let Some(t) = self.signal_stop() {
            if t.join().is_err() {
                tracing::warn!("kv: the reclaim thread panicked");
            }
        }
    }

    /// Stops the thread, waiting for it as long as `progress` (a count that grows while
    /// its work moves) changed within the last `stall`: the remote thread's last pass may
    /// take as long as its uploads do, but a server that stopped answering does not hold
    /// `close()` for its requests' timeouts. A thread left running ends when its request
    /// fails, without a last pass (the object store was unreachable).
    pub(crate) fn stop_unless_stalled(&self, stall: Duration, progress: impl Fn() -> u64) {
        let Some(t) = self.signal_stop() else { return };
        let (mut seen, mut moved) = (progress(), Instant::now());
        while !t.is_finished() {
            if moved.elapsed() >= stall {
                tracing::warn!(
                    "kv remote tier: no progress in {stall:?}; closing without waiting for the \
                     upload in flight (the object store is not answering)"
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
            let now = progress();
            if now != seen {
                (seen, moved) = (now, Instant::now());
            }
        }
        if t.join().is_err() {
            tracing::warn!("kv: the remote thread panicked");
        }
    }

    /// Tells the thread to stop; its handle, unless already taken or in a forked child
    /// (where the thread does not exist: it is forgotten).
    fn signal_stop(&self) -> Option<JoinHandle<()>> {
        if self.fork.is_forked() {
            std::mem::forget(lock(&self.thread).take());
            return None;
        }
        {
            let (m, cv) = &*self.signal;
            lock(m).stopping = true;
            cv.notify_one();
        }
        lock(&self.thread).take()
    }
}

impl Drop for Reclaimer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(tended: &Tended, signal: &(Mutex<Signal>, Condvar)) {
    let (m, cv) = signal;
    let mut refreshed = Instant::now();
    // Whether the object store answered the last pass (the closing pass needs it).
    let mut reachable = true;
    loop {
        {
            let mut s = lock(m);
            if !s.woken && !s.stopping {
                s = cv
                    .wait_timeout(s, IDLE_CHECK.min(tended.refresh))
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0);
            }
            if s.stopping {
                drop(s);
                if let (Some(u), true) = (&tended.uploader, reachable) {
                    if let Some(s) = &tended.shared {
                        lock(s).seal_active_if_older(Duration::ZERO);
                    }
                    u.run_once();
                }
                return;
            }
            s.woken = false;
        }
        for t in &tended.tiers {
            if lock(t).needs_reclaim() {
                crate::ssd_tier::reclaim_unlocked(t);
            }
        }
        if refreshed.elapsed() >= tended.refresh {
            refreshed = Instant::now();
            if let Some(s) = &tended.shared {
                lock(s).seal_active_if_older(tended.refresh);
            }
            if let Some(u) = &tended.uploader {
                reachable = u.run_once();
            }
            if let Some(f) = &tended.foreign {
                if let Err(e) = foreign::refresh(f) {
                    tracing::debug!("kv remote tier: listing the other stores: {e}");
                }
            }
        }
    }
}
