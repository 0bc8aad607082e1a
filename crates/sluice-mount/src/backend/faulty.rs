//! [`FaultyBackend`]: the [`Backend`] test double (the `testing` feature).

use std::io;
use std::sync::Arc;

use super::{Backend, Entry};

/// A [`Backend`] test double: passes to another, counts reads per (file, offset), and
/// fails the next reads it is told to, or delays every read.
pub struct FaultyBackend {
    inner: Arc<dyn Backend>,
    fail_next: std::sync::atomic::AtomicUsize,
    delay: std::time::Duration,
    reads: std::sync::Mutex<std::collections::HashMap<(String, u64), usize>>,
}

impl FaultyBackend {
    pub fn new(inner: Arc<dyn Backend>, delay: std::time::Duration) -> FaultyBackend {
        FaultyBackend {
            inner,
            fail_next: std::sync::atomic::AtomicUsize::new(0),
            delay,
            reads: Default::default(),
        }
    }

    /// Fails the next `n` reads with EIO-like errors.
    pub fn fail_next(&self, n: usize) {
        self.fail_next.store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Reads so far, per (path, offset).
    pub fn reads(&self) -> std::collections::HashMap<(String, u64), usize> {
        self.reads.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Backend for FaultyBackend {
    fn list(&self) -> io::Result<Vec<Entry>> {
        self.inner.list()
    }

    fn read(&self, entry: &Entry, offset: u64, dst: &mut [u8]) -> io::Result<usize> {
        use std::sync::atomic::Ordering;
        *self
            .reads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((entry.path.clone(), offset))
            .or_default() += 1;
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        let failing = self
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Err(io::Error::other(format!(
                "{}: injected failure at {offset}",
                entry.path
            )));
        }
        self.inner.read(entry, offset, dst)
    }

    fn describe(&self) -> String {
        format!("faulty({})", self.inner.describe())
    }
}
