//! [`Reclaimer`]: the background thread that keeps SSD segment files under the budget's
//! high watermark, so puts rarely wait for space.
//!
//! The thread holds the SSD tier and nothing else of the store. That matters for the
//! store's lock: the store's last handle dropping must release the directory lock at once,
//! and it can only do that if no background thread keeps the store alive. Stopping joins
//! the thread, so once [`Reclaimer::stop`] returns no reclaim pass is running or can start,
//! and the lock can be handed to the next owner without two processes moving segments.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::ssd_tier::SsdTier;
use crate::store::lock;

/// How long the thread sleeps without a wake-up before it checks the watermark anyway:
/// short enough that space freed by evictions is reclaimed soon after a burst of puts.
const IDLE_CHECK: Duration = Duration::from_millis(200);

#[derive(Default)]
struct Signal {
    woken: bool,
    stopping: bool,
}

/// The reclaim thread of one store.
pub(crate) struct Reclaimer {
    signal: Arc<(Mutex<Signal>, Condvar)>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Reclaimer {
    /// Starts the thread over `ssd`.
    pub(crate) fn start(ssd: Arc<Mutex<SsdTier>>) -> std::io::Result<Reclaimer> {
        let signal: Arc<(Mutex<Signal>, Condvar)> = Arc::default();
        let theirs = Arc::clone(&signal);
        let thread = std::thread::Builder::new()
            .name("sluice-kv-reclaim".into())
            .spawn(move || run(&ssd, &theirs))?;
        Ok(Reclaimer {
            signal,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Asks for a pass now (a put left the files above the high watermark).
    pub(crate) fn wake(&self) {
        let (m, cv) = &*self.signal;
        lock(m).woken = true;
        cv.notify_one();
    }

    /// Stops the thread and waits for it: a pass in progress finishes first. Idempotent.
    pub(crate) fn stop(&self) {
        {
            let (m, cv) = &*self.signal;
            lock(m).stopping = true;
            cv.notify_one();
        }
        if let Some(t) = lock(&self.thread).take() {
            if t.join().is_err() {
                tracing::warn!("kv: the reclaim thread panicked");
            }
        }
    }
}

impl Drop for Reclaimer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(ssd: &Mutex<SsdTier>, signal: &(Mutex<Signal>, Condvar)) {
    let (m, cv) = signal;
    loop {
        {
            let mut s = lock(m);
            if !s.woken && !s.stopping {
                s = cv
                    .wait_timeout(s, IDLE_CHECK)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0);
            }
            if s.stopping {
                return;
            }
            s.woken = false;
        }
        let mut tier = lock(ssd);
        if tier.needs_reclaim() {
            tier.reclaim_to_low_watermark();
        }
    }
}
