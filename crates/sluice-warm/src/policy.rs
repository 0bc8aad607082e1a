//! The programmable part of `sluice warm`: what a page-cache policy sees and
//! what it may ask for.
//!
//! A policy is told about accesses ([`AccessEvent`]: a reader opened, read,
//! mapped or advanced through a file) and answers with ranges to prefetch
//! ([`Prefetch`]) and, when memory runs short, ranges to evict
//! ([`FileRange`]). Its answers are recommendations: the cache manager
//! chunks, orders, throttles and drops them as the machine allows, as seed
//! 000's PPC does.
//!
//! **Fail open.** A policy never stands between an application and its
//! data. The runtime answers every fanotify permission event with ALLOW
//! *before* it hands the event to the policy (on another thread), so a slow
//! or stuck policy delays prefetching, never the reader. A policy that
//! returns an error or panics is disabled by [`Guarded`]: the fault is
//! logged once, later calls return nothing, and the service runs as if no
//! policy were installed.
//!
//! **Streams.** Every prefetch belongs to a stream (MAIO: one per loader
//! worker). A newer answer for a stream supersedes the queued remainder of
//! that stream's older answers: this is what makes prefetch interruptible
//! when the reader jumps ahead.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use crate::error::WarmError;

/// Where prefetched pages should be placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Target {
    /// Wherever the kernel puts them.
    #[default]
    Any,
    /// The NUMA node closest to this accelerator (GPU/NPU index).
    Accelerator(u32),
    /// This NUMA node.
    NumaNode(u32),
}

/// A byte range of a file: `{path, offset, len, target}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileRange {
    pub path: PathBuf,
    pub offset: u64,
    pub len: u64,
    pub target: Target,
}

impl FileRange {
    pub fn new(path: impl Into<PathBuf>, offset: u64, len: u64) -> FileRange {
        FileRange {
            path: path.into(),
            offset,
            len,
            target: Target::Any,
        }
    }

    pub fn with_target(mut self, target: Target) -> FileRange {
        self.target = target;
        self
    }

    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.len)
    }
}

/// A range to prefetch, in a stream whose newer answers supersede older.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prefetch {
    pub stream: u32,
    pub range: FileRange,
}

/// How an access was observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessKind {
    /// The file was opened (fanotify `FAN_OPEN`); offset and len are 0.
    Open,
    /// A read()/pread() of exactly this range (`FAN_PRE_ACCESS`).
    Read,
    /// The range was mapped (one `FAN_PRE_ACCESS` at mmap() time).
    Mmap,
    /// A sampler saw the reader reach `offset` (fdinfo `pos`, pagemap).
    Progress,
    /// Asked for by the CLI or the API.
    Explicit,
}

/// One observed access.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessEvent {
    /// The reading process.
    pub pid: i32,
    /// The loader worker the runtime mapped `pid` to, when it knows.
    pub worker: Option<u32>,
    pub path: PathBuf,
    pub offset: u64,
    pub len: u64,
    pub kind: AccessKind,
}

/// What a policy knows when it starts.
#[derive(Clone, Debug, Default)]
pub struct PolicyContext {
    /// The watched model directory.
    pub model_dir: PathBuf,
    /// Every model file under it, with its size, in name order.
    pub files: Vec<(PathBuf, u64)>,
    /// Whether a memory limit applies (cgroup or watermark); policies may
    /// evict only then.
    pub memory_limited: bool,
}

impl PolicyContext {
    /// Total bytes of the model files.
    pub fn model_bytes(&self) -> u64 {
        self.files.iter().map(|(_, size)| size).sum()
    }

    /// `path` relative to the model directory, when it lies inside it.
    pub fn relative<'a>(&self, path: &'a Path) -> Option<&'a Path> {
        path.strip_prefix(&self.model_dir).ok()
    }
}

/// A page-cache policy. Every method has a do-nothing default except
/// [`WarmPolicy::name`], so a policy implements only what it uses.
pub trait WarmPolicy: Send {
    /// The name it is chosen by and logged as.
    fn name(&self) -> &str;

    /// Called once before any event. Returns prefetches to start right away
    /// (`precache` returns the whole model). An error disables the policy.
    fn init(&mut self, ctx: &PolicyContext) -> Result<Vec<Prefetch>, WarmError> {
        let _ = ctx;
        Ok(Vec::new())
    }

    /// Whether the policy needs exact read ranges (fanotify pre-content
    /// events, which make every read wait for an answer). Policies that act
    /// on opens alone say no, and the runtime then watches opens only, at
    /// no cost to the reader.
    fn needs_read_ranges(&self) -> bool {
        true
    }

    /// Whether the service must wait until `init`'s prefetches are done
    /// before it starts (`precache`).
    fn wait_for_init(&self) -> bool {
        false
    }

    /// Called for each access, after the reader was let through. Returns
    /// prefetches; for each stream named, they replace what that stream
    /// still had queued.
    fn on_access(&mut self, event: &AccessEvent) -> Result<Vec<Prefetch>, WarmError> {
        let _ = event;
        Ok(Vec::new())
    }

    /// Called when memory is over the watermark: after an access (with it)
    /// and periodically (with `None`). Returns ranges to drop from the page
    /// cache. Returning nothing leaves eviction to the kernel.
    fn evict(&mut self, event: Option<&AccessEvent>) -> Result<Vec<FileRange>, WarmError> {
        let _ = event;
        Ok(Vec::new())
    }

    /// Called once when the runtime stops (the service exited or the daemon
    /// is told to stop); `template` writes its recording here.
    fn exit(&mut self) -> Result<(), WarmError> {
        Ok(())
    }

    /// The run failed (the service exited with an error), before
    /// [`WarmPolicy::exit`]: what the policy would keep from it (a
    /// recording, possibly partial) is not to be kept. The default keeps
    /// nothing anyway.
    fn discard(&mut self) -> Result<(), WarmError> {
        Ok(())
    }
}

/// A policy behind a fail-open guard: the first error or panic disables it
/// for good and is kept for `sluice warm status`.
pub struct Guarded {
    inner: Box<dyn WarmPolicy>,
    fault: Option<String>,
}

impl Guarded {
    pub fn new(inner: Box<dyn WarmPolicy>) -> Guarded {
        Guarded { inner, fault: None }
    }

    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Why the policy was disabled, if it was.
    pub fn fault(&self) -> Option<&str> {
        self.fault.as_deref()
    }

    pub fn init(&mut self, ctx: &PolicyContext) -> Vec<Prefetch> {
        let plan = self.call("init", |p| p.init(ctx)).unwrap_or_default();
        tracing::debug!(policy = self.inner.name(), reply = ?plan, "init answered");
        plan
    }

    pub fn wait_for_init(&self) -> bool {
        self.fault.is_none() && self.inner.wait_for_init()
    }

    pub fn needs_read_ranges(&self) -> bool {
        self.inner.needs_read_ranges()
    }

    /// The policy's answer to `event`; at debug level (`-vv`) both are logged.
    pub fn on_access(&mut self, event: &AccessEvent) -> Vec<Prefetch> {
        let plan = self
            .call("on_access", |p| p.on_access(event))
            .unwrap_or_default();
        tracing::debug!(policy = self.inner.name(), ?event, reply = ?plan, "access answered");
        plan
    }

    pub fn evict(&mut self, event: Option<&AccessEvent>) -> Vec<FileRange> {
        let ranges = self.call("evict", |p| p.evict(event)).unwrap_or_default();
        if event.is_some() || !ranges.is_empty() {
            tracing::debug!(policy = self.inner.name(), ?event, reply = ?ranges, "evict answered");
        }
        ranges
    }

    pub fn exit(&mut self) {
        let _ = self.call("exit", |p| p.exit());
    }

    pub fn discard(&mut self) {
        let _ = self.call("discard", |p| p.discard());
    }

    fn call<T>(
        &mut self,
        method: &str,
        f: impl FnOnce(&mut dyn WarmPolicy) -> Result<T, WarmError>,
    ) -> Option<T> {
        if self.fault.is_some() {
            return None;
        }
        let inner = &mut *self.inner;
        let outcome = catch_unwind(AssertUnwindSafe(|| f(inner)));
        let message = match outcome {
            Ok(Ok(value)) => return Some(value),
            Ok(Err(err)) => err.to_string(),
            Err(panic) => panic_message(panic.as_ref()),
        };
        let fault = format!("{method} failed: {message}");
        tracing::error!(
            policy = self.inner.name(),
            "{fault}; policy disabled, the service continues without it"
        );
        self.fault = Some(fault);
        None
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        format!("panicked: {s}")
    } else if let Some(s) = panic.downcast_ref::<String>() {
        format!("panicked: {s}")
    } else {
        "panicked".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Faulty {
        calls: u32,
        panic: bool,
    }

    impl WarmPolicy for Faulty {
        fn name(&self) -> &str {
            "faulty"
        }

        fn on_access(&mut self, event: &AccessEvent) -> Result<Vec<Prefetch>, WarmError> {
            self.calls += 1;
            if self.calls == 2 {
                if self.panic {
                    panic!("boom at {}", event.offset);
                }
                return Err(WarmError::Policy {
                    name: "faulty".into(),
                    message: "bad state".into(),
                });
            }
            Ok(vec![Prefetch {
                stream: 0,
                range: FileRange::new(&event.path, event.offset, 1),
            }])
        }
    }

    fn event(offset: u64) -> AccessEvent {
        AccessEvent {
            pid: 1,
            worker: None,
            path: "/m/a".into(),
            offset,
            len: 1,
            kind: AccessKind::Read,
        }
    }

    #[test]
    fn an_error_or_a_panic_disables_the_policy_and_later_calls_return_nothing() {
        for panic in [false, true] {
            let mut g = Guarded::new(Box::new(Faulty { calls: 0, panic }));
            assert_eq!(g.on_access(&event(1)).len(), 1);
            assert!(g.fault().is_none());
            assert!(g.on_access(&event(2)).is_empty());
            let fault = g.fault().expect("disabled").to_string();
            let needle = if panic { "boom at 2" } else { "bad state" };
            assert!(
                fault.contains(needle) && fault.contains("on_access"),
                "{fault}"
            );
            // Disabled for good: the third call would succeed but is not made.
            assert!(g.on_access(&event(3)).is_empty());
            assert!(g.evict(None).is_empty());
            assert!(!g.wait_for_init());
        }
    }

    #[test]
    fn defaults_do_nothing() {
        struct Idle;
        impl WarmPolicy for Idle {
            fn name(&self) -> &str {
                "idle"
            }
        }
        let mut g = Guarded::new(Box::new(Idle));
        assert!(g.init(&PolicyContext::default()).is_empty());
        assert!(g.on_access(&event(0)).is_empty());
        assert!(g.evict(Some(&event(0))).is_empty());
        g.exit();
        assert!(g.fault().is_none());
    }
}
