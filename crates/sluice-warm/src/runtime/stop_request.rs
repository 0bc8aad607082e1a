//! [`StopRequest`]: how a signal handler asks a run to stop.
//!
//! The handler may only touch atomics, so the request is three of them:
//! the first signal (what to forward to the service), whether that signal
//! already reached the service (a terminal's Ctrl-C goes to the whole
//! foreground process group, the service included), and how many requests
//! came (a second one skips the grace period).

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};

/// A request to stop a run, set from a signal handler and read by the
/// runtime.
#[derive(Debug, Default)]
pub struct StopRequest {
    /// The first signal asked for; 0 for none.
    signal: AtomicI32,
    /// The first signal already reached the service.
    reached_service: AtomicBool,
    requests: AtomicU32,
}

impl StopRequest {
    pub const fn new() -> StopRequest {
        StopRequest {
            signal: AtomicI32::new(0),
            reached_service: AtomicBool::new(false),
            requests: AtomicU32::new(0),
        }
    }

    /// Records a request to stop because of `signal`; `reached_service`
    /// when the service got the signal too (from the terminal), so it is
    /// not sent again. Async-signal-safe: atomics only.
    pub fn request(&self, signal: i32, reached_service: bool) {
        if self
            .signal
            .compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            self.reached_service
                .store(reached_service, Ordering::SeqCst);
        }
        self.requests.fetch_add(1, Ordering::SeqCst);
    }

    /// The first signal asked for, once one was.
    pub fn signal(&self) -> Option<i32> {
        match self.requests() {
            0 => None,
            _ => Some(self.signal.load(Ordering::SeqCst)),
        }
    }

    /// Whether the service still has to be sent [`StopRequest::signal`].
    pub fn forward(&self) -> bool {
        self.signal().is_some() && !self.reached_service.load(Ordering::SeqCst)
    }

    /// How many requests came; a second one means "now".
    pub fn requests(&self) -> u32 {
        self.requests.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_signal_is_kept_and_every_request_counted() {
        let stop = StopRequest::new();
        assert_eq!(
            (stop.signal(), stop.forward(), stop.requests()),
            (None, false, 0)
        );
        stop.request(libc::SIGTERM, false);
        stop.request(libc::SIGINT, true);
        assert_eq!(stop.signal(), Some(libc::SIGTERM));
        assert!(stop.forward(), "the first signal came from kill(1)");
        assert_eq!(stop.requests(), 2);
        let ctrl_c = StopRequest::new();
        ctrl_c.request(libc::SIGINT, true);
        assert!(!ctrl_c.forward(), "the terminal sent it to the service too");
    }
}
