//! Checkpoint metadata for `safe_open` and `sluice inspect`-style listings.

use std::collections::BTreeMap;

use pyo3::prelude::*;
use sluice_formats::Checkpoint as RustCheckpoint;

use crate::errors::err;

#[pyclass(name = "Checkpoint", module = "sluice._sluice", frozen)]
pub struct PyCheckpoint {
    inner: RustCheckpoint,
}

/// Reads and validates every header of the checkpoint at `path` (GIL released).
#[pyfunction]
pub fn open_checkpoint(py: Python<'_>, path: std::path::PathBuf) -> PyResult<PyCheckpoint> {
    let inner = py
        .detach(|| sluice_load::read_checkpoint(&path))
        .map_err(err(py))?;
    Ok(PyCheckpoint { inner })
}

impl PyCheckpoint {
    /// A copy of the validated checkpoint, for a load that skips re-parsing.
    pub fn validated(&self) -> RustCheckpoint {
        self.inner.clone()
    }
}

#[pymethods]
impl PyCheckpoint {
    /// Tensor names in file order, shard by shard.
    fn keys(&self) -> Vec<String> {
        self.inner.tensors().map(|(_, t)| t.name.clone()).collect()
    }

    /// `__metadata__` of every shard merged (later shards win on conflicts).
    fn metadata(&self) -> Option<BTreeMap<String, String>> {
        let mut merged: Option<BTreeMap<String, String>> = None;
        for shard in &self.inner.shards {
            if let Some(m) = &shard.header.metadata {
                merged.get_or_insert_with(BTreeMap::new).extend(m.clone());
            }
        }
        merged
    }

    /// `(dtype, shape, shard_path, nbytes)` of `name`, or `None`.
    fn info(&self, name: &str) -> Option<(String, Vec<u64>, String, u64)> {
        let (shard, t) = self.inner.find(name)?;
        let path = self.inner.shards[shard].path.display().to_string();
        Some((
            t.dtype.as_str().to_string(),
            t.shape.clone(),
            path,
            t.byte_len(),
        ))
    }

    /// `(path, tensor_count, tensor_bytes, file_len)` per shard.
    fn shards(&self) -> Vec<(String, usize, u64, u64)> {
        self.inner
            .shards
            .iter()
            .map(|s| {
                (
                    s.path.display().to_string(),
                    s.header.tensors.len(),
                    s.header.total_tensor_bytes(),
                    s.file_len,
                )
            })
            .collect()
    }

    fn __len__(&self) -> usize {
        self.inner.tensor_count()
    }

    fn __contains__(&self, name: &str) -> bool {
        self.inner.find(name).is_some()
    }
}
