//! `sluice.ckpt` natives: hash state into chunks, plan a grouped write, stage and write a
//! rank's share in the background, publish a manifest, load, list, verify and collect
//! garbage. `sluice/ckpt.py` resolves tensors to (address, length) of contiguous host
//! memory and keeps it alive for each call (for a write job, the job holds it until
//! staged); the GIL is released for all hashing and I/O.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use pyo3::prelude::*;

use pyo3::types::PyBytes;
use sluice_ckpt::{
    chunk, ChunkRef, CkptError, CkptStore, Digest, Entry, EntryKind, Manifest, PlanInput,
    StagingPool, WriteJob, WritePlanner, WriteTask,
};

use crate::errors::{ckpt_to_py, config_error};

/// One process's planner: its cache spans the saves of a training run.
static PLANNER: LazyLock<Mutex<WritePlanner>> = LazyLock::new(|| Mutex::new(WritePlanner::new()));

fn threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

fn digest(d: &[u8]) -> PyResult<Digest> {
    let bytes: [u8; 32] = d.try_into().map_err(|_| {
        config_error(format!(
            "sluice.ckpt: a {}-byte digest (32 expected)",
            d.len()
        ))
    })?;
    Ok(Digest(bytes))
}

/// The bytes at `addr..addr + len` (an empty slice for `len == 0`, whatever `addr`: an
/// empty tensor's data pointer may be null).
///
/// # Safety
/// For `len > 0`, the range must be readable host memory that outlives the slice.
unsafe fn region<'a>(addr: usize, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }
}

/// [`region`], writable.
///
/// # Safety
/// For `len > 0`, the range must be writable host memory no one else touches meanwhile.
unsafe fn region_mut<'a>(addr: usize, len: usize) -> &'a mut [u8] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) }
}

fn to_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("reports always serialize")
}

/// `value` (an int, or a string such as "4MiB") as bytes; `name` for the error.
#[pyfunction]
pub fn ckpt_size(name: &str, value: &Bound<'_, PyAny>) -> PyResult<u64> {
    crate::config::byte_size(name, value)
}

/// Chunks and hashes each (address, length) region. Returns the chunks in a compact
/// table: their digests (32 bytes each), their lengths (u64 little-endian each), and how
/// many chunks each region has.
#[pyfunction]
pub fn ckpt_hash<'py>(
    py: Python<'py>,
    regions: Vec<(usize, usize)>,
    chunk_bytes: usize,
) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>, Vec<usize>)> {
    if chunk_bytes == 0 {
        return Err(config_error("sluice.ckpt: chunk_bytes must be at least 1"));
    }
    let (digests, lens, counts) = py.detach(|| {
        let mut digests = Vec::new();
        let mut lens = Vec::new();
        let mut counts = Vec::with_capacity(regions.len());
        for &(addr, len) in &regions {
            // SAFETY: sluice/ckpt.py passes contiguous host memory it keeps alive and
            // unchanged for this call.
            let bytes = unsafe { region(addr, len) };
            let chunks = chunk(bytes, chunk_bytes, threads());
            counts.push(chunks.len());
            for c in chunks {
                digests.extend_from_slice(&c.digest.0);
                lens.extend_from_slice(&c.len.to_le_bytes());
            }
        }
        (digests, lens, counts)
    });
    Ok((PyBytes::new(py, &digests), PyBytes::new(py, &lens), counts))
}

/// A chunk table (digests, lengths) as chunk references.
fn table(digests: &[u8], lens: &[u8]) -> PyResult<Vec<ChunkRef>> {
    if digests.len() % 32 != 0 || lens.len() % 8 != 0 || digests.len() / 32 != lens.len() / 8 {
        return Err(config_error(format!(
            "sluice.ckpt: a chunk table of {} digest bytes and {} length bytes",
            digests.len(),
            lens.len()
        )));
    }
    Ok(digests
        .chunks_exact(32)
        .zip(lens.chunks_exact(8))
        .map(|(d, n)| ChunkRef {
            digest: Digest(d.try_into().expect("32 bytes")),
            len: u64::from_le_bytes(n.try_into().expect("8 bytes")),
        })
        .collect())
}

/// A write plan for a grouped save. `ranks[r]` is rank r's chunk table (digests,
/// lengths), `bandwidth[r]` its write bytes/s, `stored` the digests (32 bytes each) the
/// store already holds. Returns per rank the indices (u32 little-endian) into its own
/// table of the chunks it writes, the planned finish time, and whether the quotas came
/// from the plan cache.
#[pyfunction]
pub fn ckpt_plan<'py>(
    py: Python<'py>,
    ranks: Vec<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)>,
    bandwidth: Vec<f64>,
    stored: Bound<'py, PyBytes>,
) -> PyResult<(Vec<Bound<'py, PyBytes>>, f64, bool)> {
    let held: Vec<Vec<ChunkRef>> = ranks
        .iter()
        .map(|(d, n)| table(d.as_bytes(), n.as_bytes()))
        .collect::<PyResult<_>>()?;
    let stored = stored.as_bytes();
    if stored.len() % 32 != 0 {
        return Err(config_error(
            "sluice.ckpt: stored digests are 32 bytes each",
        ));
    }
    let stored: HashSet<Digest> = stored
        .chunks_exact(32)
        .map(|d| Digest(d.try_into().expect("32 bytes")))
        .collect();
    let (indices, makespan, cached) = py
        .detach(|| -> Result<_, CkptError> {
            let plan = PLANNER
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .plan(&PlanInput {
                    ranks: &held,
                    bandwidth: &bandwidth,
                    stored: &stored,
                })?;
            // Each assigned chunk as its first index in the rank's own table.
            let indices: Vec<Vec<u8>> = plan
                .assignments
                .iter()
                .zip(&held)
                .map(|(mine, table)| {
                    let mut want: HashSet<Digest> = mine.iter().map(|c| c.digest).collect();
                    let mut out = Vec::with_capacity(4 * mine.len());
                    for (i, c) in table.iter().enumerate() {
                        if want.remove(&c.digest) {
                            out.extend_from_slice(&(i as u32).to_le_bytes());
                        }
                    }
                    out
                })
                .collect();
            Ok((indices, plan.makespan_s, plan.cached))
        })
        .map_err(ckpt_to_py)?;
    let out = indices.iter().map(|v| PyBytes::new(py, v)).collect();
    Ok((out, makespan, cached))
}

/// A rank's entries (JSON), chunk digests, chunk lengths and chunks per entry.
type RankTable<'py> = (String, Bound<'py, PyBytes>, Bound<'py, PyBytes>, Vec<usize>);

/// An entry as sluice/ckpt.py describes it, without its chunks.
#[derive(serde::Deserialize)]
struct EntryHead {
    key: String,
    kind: EntryKind,
    #[serde(default)]
    dtype: Option<String>,
    #[serde(default)]
    shape: Option<Vec<u64>>,
    nbytes: u64,
    #[serde(default)]
    meta: serde_json::Value,
}

/// A rank's share of a save, staging and writing in the background.
#[pyclass(name = "CkptJob", module = "sluice._sluice")]
pub struct PyCkptJob {
    job: Option<WriteJob>,
    /// The store's shared lock, held while the job writes.
    store: Option<Arc<CkptStore>>,
}

impl PyCkptJob {
    fn job(&self) -> PyResult<&WriteJob> {
        self.job
            .as_ref()
            .ok_or_else(|| config_error("sluice.ckpt: the save job was closed"))
    }
}

fn timeout(t: Option<f64>) -> Option<Duration> {
    t.map(|s| Duration::from_secs_f64(s.max(0.0)))
}

#[pymethods]
impl PyCkptJob {
    /// Seconds staging took once staged; None if `timeout` passed first.
    #[pyo3(signature = (timeout=None))]
    fn wait_staged(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<f64>> {
        let job = self.job()?;
        match py.detach(|| job.wait_staged(self::timeout(timeout))) {
            None => Ok(None),
            Some(r) => r.map(Some).map_err(ckpt_to_py),
        }
    }

    /// The job's report (JSON) once durable; None if `timeout` passed first.
    #[pyo3(signature = (timeout=None))]
    fn wait_durable(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<String>> {
        let job = self.job()?;
        match py.detach(|| job.wait_durable(self::timeout(timeout))) {
            None => Ok(None),
            Some(r) => r.map(|rep| Some(to_json(&rep))).map_err(ckpt_to_py),
        }
    }

    /// Stops the job (its waits then raise); returns at once.
    fn cancel(&self, why: &str) -> PyResult<()> {
        self.job()?.cancel(why);
        Ok(())
    }

    /// Cancels if unfinished and waits for the job's threads (the GIL released); lets go
    /// of the store.
    fn close(&mut self, py: Python<'_>) {
        if let Some(job) = self.job.take() {
            py.detach(move || drop(job));
        }
        self.store = None;
    }
}

impl Drop for PyCkptJob {
    fn drop(&mut self) {
        if let Some(job) = self.job.take() {
            // Dropping joins the job's thread, which may be writing: do it without the GIL
            // where this thread holds it (a job's threads never take the GIL, so holding it
            // cannot deadlock them; releasing it lets the rest of Python run meanwhile).
            Python::attach(|py| py.detach(move || drop(job)));
        }
    }
}

/// An open checkpoint store, its lock held shared for as long as the object lives: a
/// save holds it from its first look at the store until its manifest is published, so a
/// `gc` (which takes the lock exclusive) never removes a chunk the save counts on.
#[pyclass(name = "CkptStore", module = "sluice._sluice", frozen)]
pub struct PyCkptStore {
    store: Mutex<Option<Arc<CkptStore>>>,
}

impl PyCkptStore {
    fn get(&self) -> PyResult<Arc<CkptStore>> {
        self.store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| config_error("sluice.ckpt: the store was closed"))
    }
}

/// Opens the checkpoint store at `root`; `create`: make it if absent (a save), else a
/// path that is no store is an error and nothing is created (loads, listings).
#[pyfunction]
#[pyo3(signature = (root, create=false))]
pub fn ckpt_open(py: Python<'_>, root: PathBuf, create: bool) -> PyResult<PyCkptStore> {
    let store = py
        .detach(|| match create {
            true => CkptStore::open(&root),
            false => CkptStore::open_existing(&root),
        })
        .map_err(ckpt_to_py)?;
    Ok(PyCkptStore {
        store: Mutex::new(Some(Arc::new(store))),
    })
}

#[pymethods]
impl PyCkptStore {
    #[getter]
    fn root(&self) -> PyResult<PathBuf> {
        Ok(self.get()?.root().to_path_buf())
    }

    /// The digests (32 bytes each) of the chunks the newest checkpoint references: chunks
    /// the store holds for sure (published, and kept from gc while this object lives).
    fn known<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let store = self.get()?;
        let out = py
            .detach(|| -> Result<Vec<u8>, CkptError> {
                let mut out = Vec::new();
                if let Some((_, m)) = store.newest()? {
                    for d in m.unique_chunks().keys() {
                        out.extend_from_slice(&d.0);
                    }
                }
                Ok(out)
            })
            .map_err(ckpt_to_py)?;
        Ok(PyBytes::new(py, &out))
    }

    /// Starts writing `tasks` (digest: 32 bytes, length, source address), staged through a
    /// pool of `staging_bytes`. `keep` keeps the sources alive; the job drops it once
    /// staged.
    fn write(
        &self,
        py: Python<'_>,
        tasks: Vec<(Vec<u8>, u64, usize)>,
        chunk_bytes: u64,
        staging_bytes: u64,
        keep: Py<PyAny>,
    ) -> PyResult<PyCkptJob> {
        let store = self.get()?;
        let tasks: Vec<WriteTask> = tasks
            .iter()
            .map(|(h, n, src)| {
                Ok(WriteTask {
                    chunk: ChunkRef {
                        digest: digest(h)?,
                        len: *n,
                    },
                    src: *src,
                })
            })
            .collect::<PyResult<_>>()?;
        let job = py
            .detach(|| -> Result<WriteJob, CkptError> {
                let pool = StagingPool::new(staging_bytes, chunk_bytes)?;
                // SAFETY: sluice/ckpt.py passes addresses inside host memory that `keep`
                // references; the job holds `keep` until it has copied every source, and
                // the caller leaves the state unchanged until staged (the API's contract).
                unsafe { WriteJob::start(store.chunks().clone(), tasks, pool, 2, Box::new(keep)) }
            })
            .map_err(ckpt_to_py)?;
        Ok(PyCkptJob {
            job: Some(job),
            store: Some(store),
        })
    }

    /// Publishes checkpoint `name` from the ranks' tables, once the store holds every
    /// chunk. `ranks[r]` is (entries as a JSON list of {key, kind, dtype, shape, nbytes,
    /// meta}, digests, lengths, chunks per entry); `extra` (JSON) is kept as the
    /// manifest's `extra`.
    fn publish(
        &self,
        py: Python<'_>,
        name: String,
        world_size: u32,
        chunk_bytes: u64,
        ranks: Vec<RankTable<'_>>,
        extra: &str,
    ) -> PyResult<()> {
        let store = self.get()?;
        let mut m = Manifest::new(chunk_bytes, world_size);
        m.extra = serde_json::from_str(extra)
            .map_err(|e| config_error(format!("sluice.ckpt: manifest extra: {e}")))?;
        for (r, (entries, digests, lens, counts)) in ranks.iter().enumerate() {
            let heads: Vec<EntryHead> = serde_json::from_str(entries)
                .map_err(|e| config_error(format!("sluice.ckpt: rank {r}'s entries: {e}")))?;
            let chunks = table(digests.as_bytes(), lens.as_bytes())?;
            if heads.len() != counts.len() || counts.iter().sum::<usize>() != chunks.len() {
                return Err(config_error(format!(
                    "sluice.ckpt: rank {r}: {} entries, {} counts, {} chunks do not match",
                    heads.len(),
                    counts.len(),
                    chunks.len()
                )));
            }
            let mut at = 0;
            for (h, n) in heads.into_iter().zip(counts) {
                let entry = Entry {
                    kind: h.kind,
                    dtype: h.dtype,
                    shape: h.shape,
                    nbytes: h.nbytes,
                    chunks: chunks[at..at + n].to_vec(),
                    meta: h.meta,
                };
                at += n;
                if m.entries.insert(h.key.clone(), entry).is_some() {
                    return Err(config_error(format!(
                        "sluice.ckpt: entry {:?} saved twice",
                        h.key
                    )));
                }
            }
        }
        py.detach(|| store.publish(&name, &m)).map_err(ckpt_to_py)
    }

    /// The manifest of checkpoint `name`, as JSON.
    fn manifest(&self, py: Python<'_>, name: String) -> PyResult<String> {
        let store = self.get()?;
        let m = py
            .detach(|| Manifest::read(&store.checkpoint_dir(&name)?))
            .map_err(ckpt_to_py)?;
        Ok(to_json(&m))
    }

    /// Reads chunks (digest, length, destination address, entry named in errors) into
    /// host memory, each verified against its digest.
    fn read_chunks(
        &self,
        py: Python<'_>,
        items: Vec<(Vec<u8>, u64, usize, String)>,
    ) -> PyResult<()> {
        let store = self.get()?;
        let refs = items
            .iter()
            .map(|(d, n, _, _)| {
                Ok(ChunkRef {
                    digest: digest(d)?,
                    len: *n,
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        py.detach(|| {
            let pieces = refs
                .iter()
                .zip(&items)
                .map(|(c, (_, n, addr, key))| {
                    // SAFETY: sluice/ckpt.py passes writable host memory of `n` bytes it
                    // keeps alive for this call; no two destinations overlap.
                    (*c, key.as_str(), unsafe { region_mut(*addr, *n as usize) })
                })
                .collect();
            store.read_chunks(pieces, threads())
        })
        .map_err(ckpt_to_py)
    }

    /// The store's checkpoints (`ls`), as JSON.
    fn ls(&self, py: Python<'_>) -> PyResult<String> {
        let store = self.get()?;
        let infos = py.detach(|| store.infos()).map_err(ckpt_to_py)?;
        Ok(to_json(&infos))
    }

    /// Re-hashes every chunk of checkpoint `name`; the report as JSON.
    fn verify(&self, py: Python<'_>, name: String) -> PyResult<String> {
        let store = self.get()?;
        let r = py
            .detach(|| store.verify(&name, threads()))
            .map_err(ckpt_to_py)?;
        Ok(to_json(&r))
    }

    /// Releases the store's lock (once the last job using it is closed too).
    fn close(&self) {
        self.store.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

/// Keeps the `keep` newest checkpoints; the report as JSON.
#[pyfunction]
pub fn ckpt_gc(py: Python<'_>, root: PathBuf, keep: usize) -> PyResult<String> {
    let r = py
        .detach(|| CkptStore::open_exclusive(&root)?.gc(keep))
        .map_err(ckpt_to_py)?;
    Ok(to_json(&r))
}
