//! `sluice.kv` natives: an open [`KvStore`] as a Python class.
//!
//! The abi3 build cannot take Python's buffer protocol, so `sluice/kv.py` resolves each
//! numpy array, torch CPU tensor or writable buffer to (address, length) after checking
//! that it is contiguous (and writable, for gets), and keeps the objects alive for the
//! call. Here the pairs become slices and the GIL is released for the whole batch.

use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyDict;
use std::sync::Arc;
use std::time::Duration;

use sluice_kv::{BlockStore, JobBuffer, KvClient, KvError, KvJob, KvStore};

use crate::errors::config_error;
use crate::kv_options::{client_config, store_config, KvFsckReport, KvStatsReport, Options};

/// An open store (`sluice.kv.open`), or a connection to a `sluice kv serve` sidecar
/// (`sluice.kv.connect`): the Python wrapper is the same for both.
#[pyclass(name = "KvStore", module = "sluice._sluice")]
pub struct PyKvStore {
    store: Arc<dyn BlockStore>,
}

fn kv_to_py(err: KvError) -> PyErr {
    crate::errors::err(err)
}

/// Opens (or creates) a store; `options` holds `sluice.kv.open`'s keyword arguments
/// (parsed in `kv_options`, sizes as ints or strings like "8GiB").
#[pyfunction]
pub fn kv_open(
    py: Python<'_>,
    path: std::path::PathBuf,
    options: Bound<'_, PyDict>,
) -> PyResult<PyKvStore> {
    let config = store_config(Options::new(options))?;
    let store = py
        .detach(|| KvStore::open(&path, config))
        .map_err(kv_to_py)?;
    Ok(PyKvStore {
        store: Arc::new(store),
    })
}

/// Connects to a `sluice kv serve` sidecar; `options` holds `sluice.kv.connect`'s
/// keyword arguments.
#[pyfunction]
pub fn kv_connect(
    py: Python<'_>,
    socket: std::path::PathBuf,
    options: Bound<'_, PyDict>,
) -> PyResult<PyKvStore> {
    let config = client_config(Options::new(options))?;
    let client = py
        .detach(|| KvClient::connect(&socket, config))
        .map_err(kv_to_py)?;
    Ok(PyKvStore {
        store: Arc::new(client),
    })
}

/// The keys as slices. Keys arrive as `PyBackedBytes`: a `bytes` key is borrowed where it
/// lies (no copy), so a 1,000-key lookup does not pay for converting its chain.
fn key_refs(keys: &[PyBackedBytes]) -> Vec<&[u8]> {
    keys.iter().map(|k| &**k).collect()
}

/// The index of a buffer whose (address, length) range overlaps another's, if any.
fn first_overlap(buffers: &[(usize, usize)]) -> Option<usize> {
    let mut by_start: Vec<(usize, usize, usize)> = buffers
        .iter()
        .enumerate()
        .map(|(i, (p, n))| (*p, p.saturating_add(*n), i))
        .collect();
    by_start.sort_unstable();
    by_start
        .windows(2)
        .find(|w| w[1].0 < w[0].1 || w[1].0 == w[0].0)
        .map(|w| w[0].2.max(w[1].2))
}

/// A caller's buffer a job reads or fills: its address and length, and the Python object
/// that owns the memory, held until the job has finished with it.
struct PyBuffer {
    addr: usize,
    len: usize,
    _owner: Py<PyAny>,
}

impl JobBuffer for PyBuffer {
    fn bytes(&self) -> &[u8] {
        // SAFETY: sluice/kv.py checked that (addr, len) is the contiguous memory of
        // `_owner`, which this buffer keeps alive.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above; for gets the memory was also checked writable and the buffers
        // of one job checked not to overlap.
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len) }
    }
}

fn job_buffers(
    buffers: Vec<(usize, usize)>,
    owners: Vec<Py<PyAny>>,
) -> PyResult<Vec<Box<dyn JobBuffer>>> {
    if buffers.len() != owners.len() {
        return Err(config_error(format!(
            "batch: {} buffers but {} owners",
            buffers.len(),
            owners.len()
        )));
    }
    Ok(buffers
        .into_iter()
        .zip(owners)
        .map(|((addr, len), owner)| {
            Box::new(PyBuffer {
                addr,
                len,
                _owner: owner,
            }) as Box<dyn JobBuffer>
        })
        .collect())
}

/// A submitted batch (`sluice.kv.KvJob` wraps it).
#[pyclass(name = "KvJob", module = "sluice._sluice")]
pub struct PyKvJob {
    job: KvJob,
}

/// Refuses get buffers that share memory: two blocks would be written into one place.
fn check_no_overlap(buffers: &[(usize, usize)]) -> PyResult<()> {
    match first_overlap(buffers) {
        Some(i) => Err(config_error(format!(
            "buffer {i}: overlaps another buffer (the same memory is passed twice)"
        ))),
        None => Ok(()),
    }
}

#[pymethods]
impl PyKvJob {
    #[getter]
    fn id(&self) -> u64 {
        self.job.id()
    }

    #[getter]
    fn kind(&self) -> &'static str {
        self.job.kind().name()
    }

    fn done(&self) -> bool {
        self.job.is_done()
    }

    /// Per-key success, or None while the job runs.
    fn result(&self) -> Option<Vec<bool>> {
        self.job.result()
    }

    /// Waits (GIL released) up to `timeout` seconds (None, inf, or more than a `Duration`
    /// holds: for ever); None on timeout.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Vec<bool>>> {
        let timeout = match timeout {
            None => None,
            Some(t) if t >= 0.0 => Duration::try_from_secs_f64(t).ok(),
            Some(t) => {
                return Err(config_error(format!(
                    "timeout = {t}: must be a number of seconds >= 0, or None"
                )))
            }
        };
        Ok(py.detach(|| self.job.wait(timeout)))
    }

    /// Lets go of the buffers once the job is done (they stay referenced until then).
    fn release_buffers(&self) {
        drop(self.job.take_buffers());
    }
}

#[pymethods]
impl PyKvStore {
    /// Consecutive hits from the first key, from the index alone. With `worth_loading`,
    /// only the prefix that loads sooner than the engine recomputes it.
    #[pyo3(signature = (keys, lease=true, worth_loading=false))]
    fn lookup(
        &self,
        py: Python<'_>,
        keys: Vec<PyBackedBytes>,
        lease: bool,
        worth_loading: bool,
    ) -> PyResult<usize> {
        let refs = key_refs(&keys);
        py.detach(|| match worth_loading {
            true => self.store.lookup_worth_loading(&refs, lease),
            false => self.store.lookup(&refs, lease),
        })
        .map_err(kv_to_py)
    }

    /// Queues a put; the owners keep the buffers' memory alive until the job is done.
    fn submit_put(
        &self,
        keys: Vec<Vec<u8>>,
        buffers: Vec<(usize, usize)>,
        owners: Vec<Py<PyAny>>,
    ) -> PyResult<PyKvJob> {
        let bufs = job_buffers(buffers, owners)?;
        let job = self.store.submit_put(keys, bufs).map_err(kv_to_py)?;
        Ok(PyKvJob { job })
    }

    /// Queues a get into writable buffers (checked not to overlap).
    fn submit_get(
        &self,
        keys: Vec<Vec<u8>>,
        buffers: Vec<(usize, usize)>,
        owners: Vec<Py<PyAny>>,
    ) -> PyResult<PyKvJob> {
        check_no_overlap(&buffers)?;
        let bufs = job_buffers(buffers, owners)?;
        let job = self.store.submit_get(keys, bufs).map_err(kv_to_py)?;
        Ok(PyKvJob { job })
    }

    /// Ids of finished jobs not reported yet (by poll or a wait), each once.
    fn poll(&self) -> Vec<u64> {
        self.store.poll().iter().map(|j| j.id()).collect()
    }

    /// Stores blocks given as (address, length) of live, contiguous buffers.
    fn put_batch(
        &self,
        py: Python<'_>,
        keys: Vec<PyBackedBytes>,
        buffers: Vec<(usize, usize)>,
    ) -> PyResult<Vec<bool>> {
        let refs = key_refs(&keys);
        // SAFETY: sluice/kv.py passes the address and length of buffers it keeps alive for
        // this call, each checked to be contiguous host memory.
        let blocks: Vec<&[u8]> = buffers
            .iter()
            .map(|(p, n)| unsafe { std::slice::from_raw_parts(*p as *const u8, *n) })
            .collect();
        py.detach(|| self.store.put_batch(&refs, &blocks))
            .map_err(kv_to_py)
    }

    /// Loads blocks into (address, length) of live, contiguous, writable buffers.
    fn get_batch_into(
        &self,
        py: Python<'_>,
        keys: Vec<PyBackedBytes>,
        buffers: Vec<(usize, usize)>,
    ) -> PyResult<Vec<bool>> {
        let refs = key_refs(&keys);
        check_no_overlap(&buffers)?;
        // SAFETY: as in put_batch; every buffer was checked writable, and no two overlap.
        let mut bufs: Vec<&mut [u8]> = buffers
            .iter()
            .map(|(p, n)| unsafe { std::slice::from_raw_parts_mut(*p as *mut u8, *n) })
            .collect();
        py.detach(|| self.store.get_batch_into(&refs, &mut bufs))
            .map_err(kv_to_py)
    }

    /// Deletes blocks; returns how many the store held.
    fn delete(&self, py: Python<'_>, keys: Vec<PyBackedBytes>) -> PyResult<usize> {
        let refs = key_refs(&keys);
        py.detach(|| self.store.delete(&refs)).map_err(kv_to_py)
    }

    /// Makes every acknowledged put durable.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.store.sync()).map_err(kv_to_py)
    }

    /// The counters, as a typed report (`to_dict()` for all of it).
    fn stats(&self, py: Python<'_>) -> PyResult<KvStatsReport> {
        let report = py.detach(|| self.store.stats_json()).map_err(kv_to_py)?;
        Ok(KvStatsReport::new(report))
    }

    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.store.close()).map_err(kv_to_py)
    }

    #[getter]
    fn block_bytes(&self) -> u64 {
        self.store.block_bytes()
    }
}

/// Verifies every block of a closed store (`sluice kv fsck`); returns the typed report.
#[pyfunction]
#[pyo3(signature = (path, repair=false))]
pub fn kv_fsck(py: Python<'_>, path: std::path::PathBuf, repair: bool) -> PyResult<KvFsckReport> {
    let report = py
        .detach(|| sluice_kv::fsck(&path, repair))
        .map_err(kv_to_py)?;
    Ok(KvFsckReport::new(report))
}
