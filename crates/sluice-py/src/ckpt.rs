//! `sluice.ckpt` natives: conversions between Python and `sluice-ckpt`, nothing more.
//!
//! `sluice/ckpt/` flattens state and resolves tensors to (address, length) of host memory
//! it keeps alive for each call, and runs the group's collectives; everything else (path
//! checks, hashing and packing, the write plan, the save job and its commit, the read
//! plan, the store) is `sluice-ckpt`'s. The GIL is released for all hashing, I/O and
//! waiting.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use sluice_ckpt::{
    decode_needs, encode_needs, ChunkRef, CkptPath, CkptStore, Digest, EntryHead, Fetch, ReadPlan,
    Replica, SaveJob, SaveOptions, SavePlan, Saver, Share, ShareTable, Source,
};

use crate::convert::to_py;
use crate::errors::{ckpt_to_py, config_error};

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

fn tables(raw: &[Vec<u8>]) -> PyResult<Vec<ShareTable>> {
    raw.iter()
        .enumerate()
        .map(|(r, b)| ShareTable::decode(b, r).map_err(ckpt_to_py))
        .collect()
}

/// `STORE/NAME` checked: (store, name), the store a path or an object URL (a str: a
/// `pathlib.Path` would fold `s3://` into `s3:/`). Refuses other URLs, `..`, paths that
/// name no checkpoint and names the store uses itself.
#[pyfunction]
pub fn ckpt_path(path: &str) -> PyResult<(String, String)> {
    let p = CkptPath::parse(path).map_err(ckpt_to_py)?;
    Ok((p.root.to_string_lossy().into_owned(), p.name))
}

/// Checks a store path (a directory without `..`, or an `s3://`, `gs://`, `az://` URL).
#[pyfunction]
pub fn ckpt_check_store(path: PathBuf) -> PyResult<()> {
    sluice_ckpt::check_store_path(&path).map_err(ckpt_to_py)
}

/// `value` (an int, or a string such as "4MiB") as bytes; `name` for the error.
#[pyfunction]
pub fn ckpt_size(name: &str, value: &Bound<'_, PyAny>) -> PyResult<u64> {
    crate::config::byte_size(name, value)
}

/// Entries below this many bytes share packs (for chunks of `chunk_bytes`).
#[pyfunction]
pub fn ckpt_pack_below(chunk_bytes: u64) -> u64 {
    sluice_ckpt::pack_below(chunk_bytes)
}

/// This process's write bandwidth for the next plan (bytes/s).
#[pyfunction]
pub fn ckpt_bandwidth() -> f64 {
    Saver::process().bandwidth()
}

/// A rank's state, hashed: the entries (a JSON list of heads) and where each one's bytes
/// are (an address of host memory, or -1 for bytes streamed through windows later).
#[pyclass(name = "CkptShare", module = "sluice._sluice")]
pub struct PyShare {
    share: Option<Share>,
    /// Once a save holds the share (it owns the packs' bytes until staged).
    shared: Option<Arc<Share>>,
}

#[pymethods]
impl PyShare {
    #[new]
    fn new(py: Python<'_>, heads: &str, sources: Vec<i64>, chunk_bytes: u64) -> PyResult<Self> {
        let heads: Vec<EntryHead> = serde_json::from_str(heads)
            .map_err(|e| config_error(format!("sluice.ckpt: entries: {e}")))?;
        let sources: Vec<Source> = sources
            .iter()
            .map(|&a| match a {
                a if a < 0 => Source::Streamed,
                a => Source::Host(a as usize),
            })
            .collect();
        // SAFETY: sluice/ckpt passes addresses of contiguous host memory it keeps alive
        // and unchanged until the save is staged (the `keep` handed to the save job).
        let share = py
            .detach(|| unsafe { Share::hash(heads, sources, chunk_bytes, threads()) })
            .map_err(ckpt_to_py)?;
        Ok(PyShare {
            share: Some(share),
            shared: None,
        })
    }

    /// Hashes `len` bytes at `addr`: streamed entry `entry`'s bytes from `offset`.
    fn hash_window(
        &mut self,
        py: Python<'_>,
        entry: usize,
        offset: u64,
        addr: usize,
        len: usize,
    ) -> PyResult<()> {
        let share = self
            .share
            .as_mut()
            .ok_or_else(|| config_error("sluice.ckpt: share in use"))?;
        // SAFETY: sluice/ckpt passes a window of `len` bytes it holds for this call.
        let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
        py.detach(|| share.hash_window(entry, offset, bytes, threads()))
            .map_err(ckpt_to_py)
    }

    /// The table the other ranks see, as bytes.
    fn table<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let share = self.get()?;
        let t = share.table().map_err(ckpt_to_py)?;
        Ok(PyBytes::new(py, &t.encode()))
    }
}

impl PyShare {
    fn get(&self) -> PyResult<&Share> {
        match (&self.share, &self.shared) {
            (Some(s), _) => Ok(s),
            (None, Some(s)) => Ok(s),
            _ => Err(config_error("sluice.ckpt: the share was closed")),
        }
    }

    /// The share, from now on shared with a save job.
    fn arc(&mut self) -> PyResult<Arc<Share>> {
        if let Some(s) = self.share.take() {
            self.shared = Some(Arc::new(s));
        }
        self.shared
            .clone()
            .ok_or_else(|| config_error("sluice.ckpt: the share was closed"))
    }
}

/// Keeps only the entries named in `keep` of an encoded table (DCP publishes the items it
/// planned, not everything a rank staged).
#[pyfunction]
pub fn ckpt_table_keep<'py>(
    py: Python<'py>,
    table: Vec<u8>,
    rank: usize,
    keep: std::collections::HashSet<String>,
) -> PyResult<Bound<'py, PyBytes>> {
    let t = ShareTable::decode(&table, rank).map_err(ckpt_to_py)?;
    Ok(PyBytes::new(py, &t.retain(|k| keep.contains(k)).encode()))
}

/// (entries, logical bytes, content-unique bytes) of every rank's table.
#[pyfunction]
pub fn ckpt_totals(tables_raw: Vec<Vec<u8>>) -> PyResult<(usize, u64, u64)> {
    Ok(sluice_ckpt::totals(&tables(&tables_raw)?))
}

/// Rank 0's plan for a save: who writes what, and the save's token (as bytes, to
/// broadcast).
#[pyfunction]
pub fn ckpt_plan<'py>(
    py: Python<'py>,
    store: &PyCkptStore,
    tables_raw: Vec<Vec<u8>>,
    bandwidth: Vec<f64>,
) -> PyResult<Bound<'py, PyBytes>> {
    let store = store.get()?;
    let tables = tables(&tables_raw)?;
    let plan = py
        .detach(|| Saver::process().plan(&store, &tables, &bandwidth))
        .map_err(ckpt_to_py)?;
    Ok(PyBytes::new(py, &plan.encode()))
}

/// A streamed chunk as Python sees it: (digest, length, entry, offset).
type StreamedRow = (Vec<u8>, u64, usize, u64);

/// A rank's save in flight.
#[pyclass(name = "CkptSave", module = "sluice._sluice")]
pub struct PySave {
    job: Option<Arc<SaveJob>>,
}

impl PySave {
    fn job(&self) -> PyResult<Arc<SaveJob>> {
        self.job
            .clone()
            .ok_or_else(|| config_error("sluice.ckpt: the save was closed"))
    }
}

/// A wait's bound: None (or one too long to represent) waits without one.
fn timeout(t: Option<f64>) -> Option<Duration> {
    t.and_then(|s| Duration::try_from_secs_f64(s.max(0.0)).ok())
}

/// The longest `timeout` a save takes (about 116 days): deadlines past it would overflow.
const MAX_TIMEOUT_S: f64 = 1e7;

#[pymethods]
impl PySave {
    /// The chunks of streamed entries this rank writes: (digest, length, entry, offset).
    fn streamed(&self) -> PyResult<Vec<StreamedRow>> {
        Ok(self
            .job()?
            .streamed()
            .iter()
            .map(|t| (t.chunk.digest.0.to_vec(), t.chunk.len, t.entry, t.offset))
            .collect())
    }

    /// Stages chunks (digest, length, address) streamed through a window; returns once
    /// the window may be reused.
    fn push(&self, py: Python<'_>, chunks: Vec<(Vec<u8>, u64, usize)>) -> PyResult<()> {
        let job = self.job()?;
        let chunks = chunks
            .iter()
            .map(|(d, n, a)| {
                Ok((
                    ChunkRef {
                        digest: digest(d)?,
                        len: *n,
                    },
                    *a,
                ))
            })
            .collect::<PyResult<Vec<_>>>()?;
        // SAFETY: sluice/ckpt passes a window holding these chunks for this call.
        py.detach(|| unsafe { job.push(&chunks) })
            .map_err(ckpt_to_py)
    }

    fn end_pushes(&self) -> PyResult<()> {
        self.job()?.end_pushes();
        Ok(())
    }

    /// Seconds staging took once staged; None if `timeout` passed first.
    #[pyo3(signature = (timeout=None))]
    fn wait_staged(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<f64>> {
        let job = self.job()?;
        match py.detach(|| job.wait_staged(self::timeout(timeout))) {
            None => Ok(None),
            Some(r) => r.map(Some).map_err(ckpt_to_py),
        }
    }

    /// (address, length) of each chunk of this rank's share: what it sends to the next
    /// rank when replicated.
    fn replica_sends(&self) -> PyResult<Vec<(usize, u64)>> {
        Ok(self.job()?.replica_sends())
    }

    /// Lengths of the previous rank's chunks, in the order they are received.
    fn replica_lengths(&self) -> PyResult<Vec<u64>> {
        let chunks = self.job()?.replica_chunks().map_err(ckpt_to_py)?;
        Ok(chunks.iter().map(|c| c.len).collect())
    }

    /// Waits until durable and commits; the save's summary. `replica`: (address, length)
    /// of the previous rank's share held here (replicated saves).
    #[pyo3(signature = (replica=None))]
    fn finish<'py>(
        &self,
        py: Python<'py>,
        replica: Option<(usize, u64)>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let job = self.job()?;
        let replica = replica.map(|(addr, len)| Replica { addr, len });
        let summary = py
            .detach(|| job.finish(Saver::process(), replica))
            .map_err(ckpt_to_py)?;
        to_py(py, &summary)
    }

    /// The save's token (its commit directory under `.pending/`).
    fn token(&self) -> PyResult<String> {
        Ok(self.job()?.token().to_string())
    }

    /// Stops the save (its waits then raise); returns at once.
    fn cancel(&self, why: &str) -> PyResult<()> {
        self.job()?.cancel(why);
        Ok(())
    }

    /// Cancels if unfinished and waits for the job's threads (the GIL released).
    fn close(&mut self, py: Python<'_>) {
        if let Some(job) = self.job.take() {
            py.detach(move || drop(job));
        }
    }
}

impl Drop for PySave {
    fn drop(&mut self) {
        if let Some(job) = self.job.take() {
            // Dropping joins the job's threads, which never take the GIL: release it
            // meanwhile where this thread holds it.
            Python::attach(|py| py.detach(move || drop(job)));
        }
    }
}

/// A load's reads on one rank.
#[pyclass(name = "CkptFetch", module = "sluice._sluice")]
pub struct PyFetch {
    fetch: Mutex<Fetch>,
    /// The store, its lock held shared until [`PyFetch::close`] (or the object goes).
    store: Mutex<Option<Arc<CkptStore>>>,
    plan: Mutex<Option<(ReadPlan, Vec<Vec<ChunkRef>>)>>,
}

impl PyFetch {
    fn store(&self) -> PyResult<Arc<CkptStore>> {
        self.store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| config_error("sluice.ckpt: the load's reads were closed"))
    }
}

#[pymethods]
impl PyFetch {
    /// The chunks this rank needs, as bytes (40 a chunk) for the other ranks.
    fn needs<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let f = self.fetch.lock().unwrap_or_else(|p| p.into_inner());
        PyBytes::new(py, &encode_needs(&f.needs()))
    }

    /// Plans the group's reads from every rank's needs and reads (and verifies) this
    /// rank's part.
    fn read(&self, py: Python<'_>, all_needs: Vec<Vec<u8>>, rank: usize) -> PyResult<()> {
        let needs = all_needs
            .iter()
            .enumerate()
            .map(|(r, b)| decode_needs(b, r))
            .collect::<Result<Vec<_>, _>>()
            .map_err(ckpt_to_py)?;
        let plan = ReadPlan::new(&needs);
        let store = self.store()?;
        py.detach(|| {
            let mut f = self.fetch.lock().unwrap_or_else(|p| p.into_inner());
            f.read(&store, &plan, rank, threads())
        })
        .map_err(ckpt_to_py)?;
        *self.plan.lock().unwrap_or_else(|p| p.into_inner()) = Some((plan, needs));
        Ok(())
    }

    /// This rank's sends and receives: (send, peer, address, length), in one order all
    /// ranks derive alike.
    fn transfers(&self, rank: usize) -> PyResult<Vec<(bool, usize, usize, u64)>> {
        let plan = self.plan.lock().unwrap_or_else(|p| p.into_inner());
        let (plan, needs) = plan
            .as_ref()
            .ok_or_else(|| config_error("sluice.ckpt: transfers() before read()"))?;
        let mut f = self.fetch.lock().unwrap_or_else(|p| p.into_inner());
        Ok(f.transfers(plan, needs, rank)
            .into_iter()
            .map(|t| (t.send, t.peer, t.addr, t.len))
            .collect())
    }

    /// Lets go of the store (a `gc` may then take it); the reads are done or abandoned.
    fn close(&self) {
        self.store.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// Copies every chunk to its other places; what this rank read and received.
    fn finish<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let report = py.detach(|| {
            self.fetch
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .finish()
        });
        to_py(py, &report)
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
/// path that is no store is an error, nothing is created and only read access is needed.
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
    fn root(&self) -> PyResult<String> {
        Ok(self.get()?.root().to_string_lossy().into_owned())
    }

    /// Whether the store is under an object-store prefix (no lock, create-only publish).
    #[getter]
    fn is_object(&self) -> PyResult<bool> {
        Ok(self.get()?.object().is_some())
    }

    /// Starts this rank's share of a save: `share` hashed here, every rank's `tables`,
    /// rank 0's `plan`. `keep` keeps the share's sources alive until staged.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (share, tables, plan, name, rank, world, chunk_bytes, staging_bytes,
                        timeout_s, replicate, extra, keep, publish=true))]
    fn start_save(
        &self,
        py: Python<'_>,
        share: &mut PyShare,
        tables: Vec<Vec<u8>>,
        plan: Vec<u8>,
        name: String,
        rank: usize,
        world: usize,
        chunk_bytes: u64,
        staging_bytes: u64,
        timeout_s: f64,
        replicate: bool,
        extra: &str,
        keep: Py<PyAny>,
        publish: bool,
    ) -> PyResult<PySave> {
        let store = self.get()?;
        let tables = self::tables(&tables)?;
        let plan = SavePlan::decode(&plan).map_err(ckpt_to_py)?;
        let extra = serde_json::from_str(extra)
            .map_err(|e| config_error(format!("sluice.ckpt: manifest extra: {e}")))?;
        if !(timeout_s > 0.0 && timeout_s <= MAX_TIMEOUT_S) {
            return Err(config_error(format!(
                "timeout: must be a positive number of seconds up to {MAX_TIMEOUT_S}, \
                 got {timeout_s}"
            )));
        }
        let opts = SaveOptions {
            name,
            rank,
            world,
            chunk_bytes,
            staging_bytes,
            timeout: Duration::from_secs_f64(timeout_s),
            replicate,
            extra,
            publish,
        };
        let share = share.arc()?;
        // SAFETY: sluice/ckpt keeps the sources alive in `keep`, which the job holds until
        // staged, and leaves the state unchanged until then (the API's contract).
        let job = py
            .detach(|| unsafe { SaveJob::start(store, share, tables, plan, opts, Box::new(keep)) })
            .map_err(ckpt_to_py)?;
        Ok(PySave {
            job: Some(Arc::new(job)),
        })
    }

    /// Publishes checkpoint `name` from the ranks' tables (its chunks durable already):
    /// DCP's coordinator, once every rank's writes are done.
    fn publish(
        &self,
        py: Python<'_>,
        name: String,
        tables: Vec<Vec<u8>>,
        world: u32,
        chunk_bytes: u64,
        extra: &str,
    ) -> PyResult<()> {
        let store = self.get()?;
        let tables = self::tables(&tables)?;
        let extra: serde_json::Value = serde_json::from_str(extra)
            .map_err(|e| config_error(format!("sluice.ckpt: manifest extra: {e}")))?;
        py.detach(|| {
            let mut m = sluice_ckpt::manifest_of(&tables, world, chunk_bytes)?;
            m.extra = extra;
            store.publish(&name, &m)
        })
        .map_err(ckpt_to_py)
    }

    /// Writes every chunk of `share` (host entries only) the store lacks, durably: an
    /// entry one process adds to a save (DCP's metadata).
    fn write_share(&self, py: Python<'_>, share: &PyShare, staging_bytes: u64) -> PyResult<()> {
        let store = self.get()?;
        let share = share.get()?;
        // SAFETY: sluice/ckpt keeps the share's sources alive for this call.
        py.detach(|| unsafe { sluice_ckpt::write_share(&store, share, staging_bytes) })
            .map(|_| ())
            .map_err(ckpt_to_py)
    }

    /// Checks that checkpoint `name` may be saved here (no foreign files where it goes).
    fn prepare(&self, py: Python<'_>, name: String) -> PyResult<()> {
        let store = self.get()?;
        py.detach(|| store.prepare(&name).map(|_| ()))
            .map_err(ckpt_to_py)
    }

    /// The manifest of checkpoint `name`.
    fn manifest<'py>(&self, py: Python<'py>, name: String) -> PyResult<Bound<'py, PyAny>> {
        let store = self.get()?;
        let m = py.detach(|| store.manifest(&name)).map_err(ckpt_to_py)?;
        to_py(py, &m)
    }

    /// A load's reads of checkpoint `name` into `dests`: (entry, address, bytes).
    fn fetch(
        &self,
        py: Python<'_>,
        name: String,
        dests: Vec<(String, usize, u64)>,
    ) -> PyResult<PyFetch> {
        let store = self.get()?;
        let where_ = format!("{}/{name}", store.root().display());
        let fetch = py
            .detach(|| {
                let m = store.manifest(&name)?;
                // SAFETY: sluice/ckpt passes writable host buffers of these sizes, distinct,
                // that it keeps alive and untouched until the fetch is finished.
                unsafe { Fetch::new(&m, &dests, &where_) }
            })
            .map_err(ckpt_to_py)?;
        Ok(PyFetch {
            fetch: Mutex::new(fetch),
            store: Mutex::new(Some(store)),
            plan: Mutex::new(None),
        })
    }

    /// The store's checkpoints (`ls`).
    fn ls<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let store = self.get()?;
        let infos = py.detach(|| store.infos()).map_err(ckpt_to_py)?;
        to_py(py, &infos)
    }

    /// Re-hashes every chunk of checkpoint `name`.
    fn verify<'py>(&self, py: Python<'py>, name: String) -> PyResult<Bound<'py, PyAny>> {
        let store = self.get()?;
        let r = py
            .detach(|| store.verify(&name, threads()))
            .map_err(ckpt_to_py)?;
        to_py(py, &r)
    }

    /// Releases the store's lock (once the last save using it is closed too).
    fn close(&self) {
        self.store.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

/// After grouped save `token` failed: removes the chunks its ranks created that no
/// checkpoint references, if the store is free now (every rank, and every other save or
/// load, let go of it); None when it is not (the last rank to let go succeeds, and `gc`
/// collects what none could).
#[pyfunction]
pub fn ckpt_collect_failed<'py>(
    py: Python<'py>,
    root: PathBuf,
    token: String,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let r = py.detach(|| CkptStore::open_exclusive(&root).and_then(|s| s.collect_failed(&token)));
    match r {
        Ok(report) => to_py(py, &report).map(Some),
        Err(sluice_ckpt::CkptError::Busy { .. }) => Ok(None),
        Err(e) => Err(ckpt_to_py(e)),
    }
}

/// Keeps the `keep` newest checkpoints; the report. In an object store, unreferenced
/// chunks younger than `grace_s` (default an hour) are left for a later `gc`.
#[pyfunction]
#[pyo3(signature = (root, keep, grace_s=None))]
pub fn ckpt_gc<'py>(
    py: Python<'py>,
    root: PathBuf,
    keep: usize,
    grace_s: Option<f64>,
) -> PyResult<Bound<'py, PyAny>> {
    let grace = match grace_s {
        None => sluice_ckpt::DEFAULT_GRACE,
        Some(s) if s.is_finite() && s >= 0.0 => Duration::from_secs_f64(s),
        Some(s) => {
            return Err(config_error(format!(
                "grace_s: expected seconds >= 0, got {s}"
            )))
        }
    };
    let r = py
        .detach(|| CkptStore::open_exclusive(&root)?.gc_with(keep, grace))
        .map_err(ckpt_to_py)?;
    to_py(py, &r)
}
