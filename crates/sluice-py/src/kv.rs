//! `sluice.kv` natives: an open [`KvStore`] as a Python class.
//!
//! The abi3 build cannot take Python's buffer protocol, so `sluice/kv.py` resolves each
//! numpy array, torch CPU tensor or writable buffer to (address, length) after checking
//! that it is contiguous (and writable, for gets), and keeps the objects alive for the
//! call. Here the pairs become slices and the GIL is released for the whole batch.

use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use std::sync::Arc;
use std::time::Duration;

use sluice_kv::{
    BlockStore, DirectIo, Durability, JobBuffer, KvClient, KvClientConfig, KvConfig, KvError,
    KvJob, KvStore, Namespace, RecomputeModel, WriteMode,
};
use sluice_policy::PolicyConfig;

use crate::config::byte_size;
use crate::errors::config_error;

/// An open store (`sluice.kv.open`), or a connection to a `sluice kv serve` sidecar
/// (`sluice.kv.connect`): the Python wrapper is the same for both.
#[pyclass(name = "KvStore", module = "sluice._sluice")]
pub struct PyKvStore {
    store: Arc<dyn BlockStore>,
}

fn kv_to_py(err: KvError) -> PyErr {
    crate::errors::kv_to_py(err)
}

fn parse<T: serde::de::DeserializeOwned>(
    field: &str,
    value: &str,
    accepted: &[&str],
) -> PyResult<T> {
    serde_json::from_value(serde_json::Value::String(value.to_string())).map_err(|_| {
        config_error(format!(
            "kv: {field} = {value:?}: use one of {}",
            accepted.join(", ")
        ))
    })
}

fn policy(field: &str, spec: &str) -> PyResult<PolicyConfig> {
    PolicyConfig::parse(spec).map_err(|e| config_error(format!("kv: {field} = {spec:?}: {e}")))
}

/// Opens (or creates) a store. Sizes are bytes; the Python wrapper parses "8GiB".
#[pyfunction]
#[pyo3(signature = (path, block_bytes, dram_bytes, ssd_bytes, namespace, dram_policy, ssd_policy, write_mode, durability, direct, io_threads, lease_timeout_ms, key_bytes, segment_bytes, recompute=None, shared=None, engine="auto"))]
#[allow(clippy::too_many_arguments)]
pub fn kv_open(
    py: Python<'_>,
    path: std::path::PathBuf,
    block_bytes: &Bound<'_, PyAny>,
    dram_bytes: &Bound<'_, PyAny>,
    ssd_bytes: &Bound<'_, PyAny>,
    namespace: (String, String, u32, u32, u32, String, String),
    dram_policy: &str,
    ssd_policy: &str,
    write_mode: &str,
    durability: &str,
    direct: &str,
    io_threads: usize,
    lease_timeout_ms: u64,
    key_bytes: Option<usize>,
    segment_bytes: &Bound<'_, PyAny>,
    recompute: Option<(f64, u64)>,
    shared: Option<(std::path::PathBuf, Bound<'_, PyAny>, String, u64)>,
    engine: &str,
) -> PyResult<PyKvStore> {
    let block_bytes = byte_size("block_bytes", block_bytes)?;
    let dram_bytes = byte_size("dram", dram_bytes)?;
    let ssd_bytes = byte_size("ssd", ssd_bytes)?;
    let segment_bytes = if segment_bytes.is_none() {
        None
    } else {
        Some(byte_size("segment_bytes", segment_bytes)?)
    };
    let mut config = KvConfig::new(block_bytes, namespace_of(namespace));
    config.dram_bytes = dram_bytes;
    config.ssd_bytes = ssd_bytes;
    config.dram_policy = policy("dram_policy", dram_policy)?;
    config.ssd_policy = policy("ssd_policy", ssd_policy)?;
    config.write_mode =
        parse::<WriteMode>("write_mode", write_mode, &["write-through", "write-back"])?;
    config.durability = parse::<Durability>("durability", durability, &["batch", "none"])?;
    config.direct = parse::<DirectIo>("direct", direct, &["auto", "on", "off"])?;
    config.engine = engine
        .parse()
        .map_err(|e| config_error(format!("kv: engine = {engine:?}: {e}")))?;
    config.recompute = recompute.map(recompute_model);
    config.io_threads = io_threads;
    config.lease_timeout_ms = lease_timeout_ms;
    config.key_bytes = key_bytes;
    if let Some(s) = segment_bytes {
        config.segment_bytes = s;
    }
    if let Some((dir, bytes, shared_policy, refresh_ms)) = shared {
        config.shared_dir = Some(dir);
        config.shared_bytes = byte_size("shared", &bytes)?;
        config.shared_policy = policy("shared_policy", &shared_policy)?;
        config.shared_refresh_ms = refresh_ms;
    }
    let store = py
        .detach(|| KvStore::open(&path, config))
        .map_err(kv_to_py)?;
    Ok(PyKvStore {
        store: Arc::new(store),
    })
}

/// The namespace fields as Python passes them.
type NamespaceFields = (String, String, u32, u32, u32, String, String);

fn namespace_of(fields: NamespaceFields) -> Namespace {
    let (model, dtype, tp_rank, tp_size, pp_stage, kv_format, salt) = fields;
    Namespace {
        model,
        dtype,
        tp_rank,
        tp_size,
        pp_stage,
        kv_format,
        salt,
    }
}

fn recompute_model((tokens_per_s, block_tokens): (f64, u64)) -> RecomputeModel {
    RecomputeModel {
        tokens_per_s,
        block_tokens,
    }
}

/// Connects to a `sluice kv serve` sidecar (`sluice.kv.connect` wraps it).
#[pyfunction]
#[pyo3(signature = (socket, namespace, shm_bytes, connections, retry_ms, timeout_ms, recompute=None))]
#[allow(clippy::too_many_arguments)]
pub fn kv_connect(
    py: Python<'_>,
    socket: std::path::PathBuf,
    namespace: NamespaceFields,
    shm_bytes: &Bound<'_, PyAny>,
    connections: usize,
    retry_ms: u64,
    timeout_ms: u64,
    recompute: Option<(f64, u64)>,
) -> PyResult<PyKvStore> {
    let mut config = KvClientConfig::new(namespace_of(namespace));
    config.shm_bytes = byte_size("shm", shm_bytes)?;
    config.connections = connections;
    config.retry_ms = retry_ms;
    config.timeout_ms = timeout_ms;
    config.recompute = recompute.map(recompute_model);
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

    /// Waits (GIL released) up to `timeout` seconds (None: for ever); None on timeout.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Vec<bool>>> {
        let timeout = match timeout {
            None => None,
            Some(t) if t.is_finite() && t >= 0.0 => Some(Duration::from_secs_f64(t)),
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

    /// Makes every acknowledged put durable.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.store.sync()).map_err(kv_to_py)
    }

    /// The counters, as JSON text.
    fn stats_json(&self, py: Python<'_>) -> PyResult<String> {
        let v = py.detach(|| self.store.stats_json()).map_err(kv_to_py)?;
        Ok(v.to_string())
    }

    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.store.close()).map_err(kv_to_py)
    }

    #[getter]
    fn block_bytes(&self) -> u64 {
        self.store.block_bytes()
    }
}

/// Verifies every block of a closed store (`sluice kv fsck`); returns the report as JSON.
#[pyfunction]
#[pyo3(signature = (path, repair=false))]
pub fn kv_fsck(py: Python<'_>, path: std::path::PathBuf, repair: bool) -> PyResult<String> {
    let report = py
        .detach(|| sluice_kv::fsck(&path, repair))
        .map_err(kv_to_py)?;
    Ok(serde_json::to_string(&report).unwrap_or_else(|_| "{}".into()))
}
