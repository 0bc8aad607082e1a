//! Picking a reader for this platform.

use std::sync::Arc;

use crate::io_engine::IoEngine;
use crate::thread_engine::ThreadEngine;
use crate::uring_engine::{probe_io_uring, UringEngine};

/// Which engine a caller wants.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EngineChoice {
    /// io_uring where the probe passes, else threads.
    #[default]
    Auto,
    /// io_uring or an error.
    IoUring,
    /// The thread pool.
    Threads,
}

impl std::str::FromStr for EngineChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(EngineChoice::Auto),
            "io_uring" | "uring" => Ok(EngineChoice::IoUring),
            "threads" | "pread" => Ok(EngineChoice::Threads),
            other => Err(format!(
                "engine must be auto, io_uring or threads, not {other:?}"
            )),
        }
    }
}

/// The platform cannot give the engine asked for.
#[derive(Debug, thiserror::Error)]
#[error("engine io_uring was required but is unavailable: {reason}")]
pub struct EngineError {
    pub reason: String,
}

/// An engine with `concurrency` reads in flight, chosen per `choice`; the
/// choice and any fallback are logged. `uring_denied` carries a reason to
/// treat io_uring as unavailable without probing (an operator's override,
/// or a test standing in for a seccomp-filtered container).
pub fn select_engine(
    choice: EngineChoice,
    concurrency: usize,
    uring_denied: Option<&str>,
) -> Result<Arc<dyn IoEngine>, EngineError> {
    let depth = concurrency.max(1);
    let probe = || match uring_denied {
        Some(reason) => Err(reason.to_string()),
        None => probe_io_uring(),
    };
    let uring = || {
        Arc::new(UringEngine::new(u32::try_from(depth).unwrap_or(u32::MAX))) as Arc<dyn IoEngine>
    };
    match choice {
        EngineChoice::Threads => {
            tracing::info!(threads = depth, "engine: thread pool (requested)");
            Ok(Arc::new(ThreadEngine::new(depth)))
        }
        EngineChoice::IoUring => probe()
            .map(|()| uring())
            .map_err(|reason| EngineError { reason }),
        EngineChoice::Auto => match probe() {
            Ok(()) => {
                tracing::info!(concurrency = depth, "engine: io_uring");
                Ok(uring())
            }
            Err(reason) => {
                tracing::warn!(%reason, threads = depth, "io_uring unavailable; falling back to a thread pool");
                Ok(Arc::new(ThreadEngine::new(depth)))
            }
        },
    }
}
