//! A running load, iterated from Python one window at a time.

use std::collections::HashMap;
use std::sync::Arc;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use sluice_engine::{LentMemory, WritableRanges};
use sluice_load::{LoadError, LoadStats, Loader, Polled, TensorStream};

/// How long a wait for the next window runs with the GIL released before checking for
/// signals (Ctrl-C).
const SIGNAL_POLL: std::time::Duration = std::time::Duration::from_millis(200);

use crate::checkpoint::PyCheckpoint;
use crate::config;
use crate::errors::err;
use crate::window::Window;

#[pyclass(module = "sluice._sluice")]
pub struct Stream {
    /// Declared before `lent`: dropping it joins the reads, which must end
    /// before the memory they write is let go.
    inner: Option<TensorStream>,
    stats: LoadStats,
    /// The Python objects owning the memory an `into` load writes.
    lent: Option<Py<PyAny>>,
}

/// The caller's destinations for an `into` load: `(name, address, bytes)`.
type IntoTargets = Vec<(String, usize, usize)>;

/// Lends each destination to the reads. Memory this process may not write
/// (a tensor over a read-only mapping) is a `ConfigError` naming the tensor,
/// before any read; one name twice is a `ValueError`.
fn lend(targets: IntoTargets) -> PyResult<HashMap<String, Arc<LentMemory>>> {
    let mut out = HashMap::with_capacity(targets.len());
    let writable = WritableRanges::of_this_process()
        .map_err(|e| PyOSError::new_err(format!("reading /proc/self/maps: {e}")))?;
    for (name, address, len) in targets {
        if !writable.covers(address, len) {
            return Err(err(LoadError::config(
                format!("tensor {name:?}"),
                format!(
                    "its destination ({len} bytes at {address:#x}) is not writable memory \
                     (a tensor over a read-only mapping?)"
                ),
            )));
        }
        // SAFETY: `sluice.load_into` passes each destination tensor's data
        // pointer and byte size, and hands the tensors to the stream (`lent`),
        // which keeps them alive until its reads have ended.
        let memory = unsafe { LentMemory::new(address as *mut u8, len) };
        if out.insert(name.clone(), Arc::new(memory)).is_some() {
            return Err(PyValueError::new_err(format!(
                "tensor {name:?} has two destinations"
            )));
        }
    }
    Ok(out)
}

/// Starts a load. `bounded=True` streams under `memory_limit` with buffer
/// reuse; `bounded=False` keeps every window alive as long as it is held.
#[pyfunction]
#[pyo3(signature = (path, names=None, *, bounded, direct=None, engine=None, concurrency=None,
                    chunk_bytes=None, memory_limit=None, drop_cache=None, allow_partial=None,
                    checkpoint=None, into=None, lent=None, pin=false))]
#[allow(clippy::too_many_arguments)]
pub fn start_stream(
    py: Python<'_>,
    path: std::path::PathBuf,
    names: Option<Vec<String>>,
    bounded: bool,
    direct: Option<&str>,
    engine: Option<&str>,
    concurrency: Option<Bound<'_, PyAny>>,
    chunk_bytes: Option<Bound<'_, PyAny>>,
    memory_limit: Option<Bound<'_, PyAny>>,
    drop_cache: Option<bool>,
    allow_partial: Option<bool>,
    checkpoint: Option<PyRef<'_, PyCheckpoint>>,
    into: Option<IntoTargets>,
    lent: Option<Py<PyAny>>,
    pin: bool,
) -> PyResult<Stream> {
    let mut cfg = config::build(
        direct,
        engine,
        concurrency,
        chunk_bytes,
        memory_limit,
        drop_cache,
        allow_partial,
    )?;
    if pin {
        // Buffers registered for DMA once each (the pool recycles them), so copies to a
        // device run asynchronously; without a CUDA runtime the load is the same, unpinned.
        cfg.pin = crate::gpu::runtime();
    }
    let into = match into {
        Some(targets) if lent.is_some() => Some(lend(targets)?),
        Some(_) => {
            return Err(PyValueError::new_err(
                "an `into` load needs `lent`: the objects owning its memory",
            ))
        }
        None => None,
    };
    let held = checkpoint.as_deref();
    let started = py.detach(|| {
        let loader = match held {
            Some(ckpt) => ckpt.loader(cfg)?,
            None => Loader::open(&path, cfg)?,
        };
        if let Some(into) = into {
            loader.stream_into(into)
        } else if bounded {
            loader.stream(names.as_deref())
        } else {
            loader.stream_unbounded(names.as_deref())
        }
    });
    let (inner, stats) = started.map_err(err)?;
    Ok(Stream {
        inner: Some(inner),
        stats,
        lent,
    })
}

#[pymethods]
impl Stream {
    /// The next finished window, or `None` at the end. Blocks with the GIL
    /// released.
    fn next_window(&mut self, py: Python<'_>) -> PyResult<Option<Window>> {
        let next = loop {
            let Some(inner) = self.inner.as_mut() else {
                return Ok(None);
            };
            // Waits in slices, checking for Ctrl-C between them: a window from a slow
            // remote store can take minutes, and a KeyboardInterrupt must not.
            match py.detach(|| inner.poll_window(SIGNAL_POLL)) {
                Polled::Ready(next) => break next,
                Polled::Pending => {
                    if let Err(e) = py.check_signals() {
                        self.close(py);
                        return Err(e);
                    }
                }
            }
        };
        match next {
            Some(Ok(w)) => Ok(Some(Window::new(w))),
            Some(Err(e)) => {
                self.close(py);
                Err(err(e))
            }
            None => {
                if let Some(inner) = &self.inner {
                    self.stats.elapsed = inner.elapsed();
                    self.stats.peak_pool_bytes = inner.pool().stats().peak_mapped_bytes;
                }
                Ok(None)
            }
        }
    }

    /// `(done_bytes, total_bytes)` of tensor data.
    fn progress(&self) -> (u64, u64) {
        match &self.inner {
            Some(s) => {
                let p = s.progress();
                (p.done_bytes, p.total_bytes)
            }
            None => (self.stats.tensor_bytes, self.stats.tensor_bytes),
        }
    }

    /// Stops the load and waits for reads in flight (GIL released).
    fn close(&mut self, py: Python<'_>) {
        if let Some(inner) = self.inner.take() {
            py.detach(move || drop(inner));
        }
        self.lent = None;
    }

    /// What the load did, as `sluice.last_load_stats()` documents it:
    /// `engine`, `io_mode`, `tensors`, `tensor_bytes`, `read_bytes` (read from
    /// the files), `mapped_bytes` (served by mapping cached pages instead),
    /// `windows`, `seconds`, `gb_per_s`, `peak_pool_bytes`,
    /// `files` (a dict per shard: `path`, `direct`, `buffered_reason`) and
    /// `missing_shards` (paths left out by `allow_partial`).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = &self.stats;
        let d = PyDict::new(py);
        d.set_item("engine", s.engine)?;
        d.set_item("io_mode", s.io_mode())?;
        d.set_item("tensors", s.tensors)?;
        d.set_item("tensor_bytes", s.tensor_bytes)?;
        let (read, mapped) = match &self.inner {
            Some(inner) => (inner.bytes_read(), inner.mapped_bytes()),
            None => (s.read_bytes, 0),
        };
        d.set_item("read_bytes", read)?;
        d.set_item("mapped_bytes", mapped)?;
        d.set_item("windows", s.windows)?;
        d.set_item("seconds", s.elapsed.as_secs_f64())?;
        d.set_item("gb_per_s", s.gb_per_s())?;
        d.set_item("peak_pool_bytes", s.peak_pool_bytes)?;
        let files = pyo3::types::PyList::empty(py);
        for f in &s.files {
            let file = PyDict::new(py);
            file.set_item("path", f.path.display().to_string())?;
            file.set_item("direct", f.direct)?;
            file.set_item("buffered_reason", f.reason.clone())?;
            files.append(file)?;
        }
        d.set_item("files", files)?;
        let missing: Vec<String> = s
            .missing_shards
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        d.set_item("missing_shards", missing)?;
        Ok(d)
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __exit__(&mut self, py: Python<'_>, _a: Py<PyAny>, _b: Py<PyAny>, _c: Py<PyAny>) -> bool {
        self.close(py);
        false
    }
}
