//! The process's CUDA runtime (opened once, on first use), for pinning the loader's buffers,
//! and pinned host pools for the planes that stage device tensors (`sluice.kv`, `sluice.ckpt`).

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use sluice_engine::gpu::{CudaRuntime, GpuRuntime, HostRuntime, PinnedPool, PinnedSlot};
use sluice_engine::PinWith;

use crate::errors::{config_error, err};

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

/// The runtime a pinned pool registers with: the process's CUDA runtime, else plain host
/// memory (the pool then says once that it runs unpinned).
fn pool_runtime() -> Arc<dyn GpuRuntime> {
    runtime().map_or_else(|| Arc::new(HostRuntime) as Arc<dyn GpuRuntime>, |p| p.0)
}

/// Host memory registered with CUDA once (`sluice-engine`'s `PinnedPool`): `slots` slots of
/// `slot_bytes` each (rounded up to a page), mapped and registered when made, unregistered
/// when the pool and every slot are gone. Without a CUDA runtime the slots are plain memory
/// and `pinned` is false.
#[pyclass(module = "sluice._sluice", name = "PinnedPool", frozen)]
pub struct PyPinnedPool {
    pool: PinnedPool,
}

#[pymethods]
impl PyPinnedPool {
    #[new]
    fn new(py: Python<'_>, slot_bytes: usize, slots: usize) -> PyResult<Self> {
        let pool = py
            .detach(|| PinnedPool::new(pool_runtime(), slot_bytes, slots))
            .map_err(err)?;
        Ok(PyPinnedPool { pool })
    }

    /// Bytes in one slot (a multiple of the page size).
    #[getter]
    fn slot_bytes(&self) -> usize {
        self.pool.slot_bytes()
    }

    /// Whether the slots are page-locked with CUDA.
    #[getter]
    fn pinned(&self) -> bool {
        self.pool.stats().pinned
    }

    /// A slot; waits for one to be released (at most `timeout` seconds, then `None`;
    /// `timeout=None` waits as long as it takes). The GIL is released while waiting.
    #[pyo3(signature = (timeout=None))]
    fn acquire(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<PySlot>> {
        let wait = match timeout {
            None => None,
            Some(t) if t.is_finite() && t >= 0.0 => Some(Duration::from_secs_f64(t)),
            Some(t) => {
                return Err(config_error(format!(
                    "timeout: expected seconds >= 0 or None, got {t}"
                )))
            }
        };
        let got = py
            .detach(|| match wait {
                None => self.pool.acquire().map(Some),
                Some(w) => self.pool.acquire_timeout(w),
            })
            .map_err(err)?;
        Ok(got.map(|slot| PySlot {
            addr: slot.addr(),
            len: slot.len(),
            slot: Mutex::new(Some(slot)),
            _pool: self.pool.clone(),
        }))
    }

    /// `{slots, slot_bytes, pinned, held, acquires, waits_for_holders, lost}`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.pool.stats();
        let d = PyDict::new(py);
        d.set_item("slots", s.slots)?;
        d.set_item("slot_bytes", s.slot_bytes)?;
        d.set_item("pinned", s.pinned)?;
        d.set_item("held", s.held)?;
        d.set_item("acquires", s.acquires)?;
        d.set_item("waits_for_holders", s.waits_for_holders)?;
        d.set_item("lost", s.lost)?;
        Ok(d)
    }
}

/// One slot of a `PinnedPool`, held until `release()` (or until this object is collected).
/// numpy and torch views over it (`numpy.asarray(slot)`) keep this object, and so the
/// memory, alive; after `release()` the pool may hand the memory out again, so a view must
/// not be used past it.
#[pyclass(module = "sluice._sluice", name = "PinnedSlot", frozen)]
pub struct PySlot {
    addr: usize,
    len: usize,
    slot: Mutex<Option<PinnedSlot>>,
    _pool: PinnedPool,
}

#[pymethods]
impl PySlot {
    #[getter]
    fn address(&self) -> usize {
        self.addr
    }

    fn __len__(&self) -> usize {
        self.len
    }

    /// Whether `release()` has not been called.
    #[getter]
    fn held(&self) -> bool {
        self.slot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Gives the slot back to its pool (at once: the caller has waited for its copies).
    /// A second call does nothing.
    fn release(&self) {
        drop(self.slot.lock().unwrap_or_else(|e| e.into_inner()).take());
    }

    /// numpy's array interface: a writable 1-D uint8 view of the slot.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", (self.len,))?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (self.addr, false))?;
        Ok(d)
    }
}
