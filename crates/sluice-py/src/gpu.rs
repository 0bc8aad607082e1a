//! The process's CUDA runtime, for pinning the loader's buffers: opened once, on first use.

use std::sync::{Arc, OnceLock};

use pyo3::prelude::*;
use sluice_engine::gpu::{CudaRuntime, GpuRuntime};
use sluice_engine::PinWith;

static RUNTIME: OnceLock<Option<Arc<dyn GpuRuntime>>> = OnceLock::new();

/// The CUDA runtime (torch's when torch loaded one), or `None` where there is none: said
/// once in the log, and the loads run on plain host memory.
pub(crate) fn runtime() -> Option<PinWith> {
    RUNTIME
        .get_or_init(|| match CudaRuntime::load() {
            Ok(rt) => {
                tracing::info!("pinning read buffers with {}", rt.describe());
                Some(Arc::new(rt) as Arc<dyn GpuRuntime>)
            }
            Err(e) => {
                tracing::info!("read buffers are not pinned: {e}");
                None
            }
        })
        .clone()
        .map(PinWith)
}

/// What pins the loader's buffers for copies to a GPU: the CUDA runtime's description, or
/// `None` where this process has none (the loads then use plain host memory).
#[pyfunction]
pub fn gpu_runtime() -> Option<String> {
    runtime().map(|p| p.0.describe())
}
