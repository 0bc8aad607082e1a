//! An open checkpoint for `safe_open` and listings: validated headers, the
//! shard files held open, and per-tensor and per-block reads from them.

use std::collections::BTreeMap;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use sluice_load::{LoadConfig, Loader, OpenCheckpoint, ReadOptions, TensorBytes};

use crate::errors::{config_error, err};

#[pyclass(name = "Checkpoint", module = "sluice._sluice", frozen)]
pub struct PyCheckpoint {
    inner: OpenCheckpoint,
}

/// Reads and validates every header of the checkpoint at `path`, keeping its
/// files open (GIL released).
#[pyfunction]
#[pyo3(signature = (path, *, allow_partial=false))]
pub fn open_checkpoint(
    py: Python<'_>,
    path: std::path::PathBuf,
    allow_partial: bool,
) -> PyResult<PyCheckpoint> {
    let options = ReadOptions { allow_partial };
    let inner = py
        .detach(|| OpenCheckpoint::open(&path, options))
        .map_err(err)?;
    Ok(PyCheckpoint { inner })
}

impl PyCheckpoint {
    /// A loader over the held files: the load reads what was validated.
    pub fn loader(&self, config: LoadConfig) -> Result<Loader, sluice_load::LoadError> {
        self.inner.loader(config)
    }
}

/// One tensor's (or block's) bytes, owned here and viewed by numpy without a
/// copy; numpy keeps this object alive as the array's base.
#[pyclass(module = "sluice._sluice", frozen)]
pub struct TensorBuffer {
    bytes: TensorBytes,
}

#[pymethods]
impl TensorBuffer {
    fn __len__(&self) -> usize {
        self.bytes.len()
    }

    /// numpy's array interface: a writable 1-D uint8 view of the bytes.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", (self.bytes.len(),))?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (self.bytes.as_slice().as_ptr() as usize, false))?;
        Ok(d)
    }
}

#[pymethods]
impl PyCheckpoint {
    /// Tensor names in file order, shard by shard.
    fn keys(&self) -> Vec<String> {
        self.inner
            .checkpoint()
            .tensors()
            .map(|(_, t)| t.name.clone())
            .collect()
    }

    /// `__metadata__` of every shard merged (later shards win on conflicts).
    fn metadata(&self) -> Option<BTreeMap<String, String>> {
        let mut merged: Option<BTreeMap<String, String>> = None;
        for shard in &self.inner.checkpoint().shards {
            if let Some(m) = &shard.header.metadata {
                merged.get_or_insert_with(BTreeMap::new).extend(m.clone());
            }
        }
        merged
    }

    /// `(dtype, shape, shard_path, nbytes)` of `name`, or `None`.
    fn info(&self, name: &str) -> Option<(String, Vec<u64>, String, u64)> {
        let (shard, t) = self.inner.find(name)?;
        let path = self.inner.checkpoint().shards[shard]
            .path
            .display()
            .to_string();
        Some((
            t.dtype.as_str().to_string(),
            t.shape.clone(),
            path,
            t.byte_len(),
        ))
    }

    /// `(dtype, shape)` of `name`, or `None`: the cheap lookup `get_tensor` uses.
    fn layout(&self, name: &str) -> Option<(&'static str, Vec<u64>)> {
        let (_, t) = self.inner.find(name)?;
        Some((t.dtype.as_str(), t.shape.clone()))
    }

    /// `(path, tensor_count, tensor_bytes, file_len)` per shard.
    fn shards(&self) -> Vec<(String, usize, u64, u64)> {
        self.inner
            .checkpoint()
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

    /// The bytes of tensor `name`, read from the held file (GIL released).
    fn read_tensor(&self, py: Python<'_>, name: &str) -> PyResult<TensorBuffer> {
        let bytes = py.detach(|| self.inner.read_tensor(name)).map_err(err)?;
        Ok(TensorBuffer { bytes })
    }

    /// Reads bytes `offset..offset + len` of `name` into host memory at `address` (GIL
    /// released). The caller owns `len` writable bytes there until this returns.
    fn read_tensor_into(
        &self,
        py: Python<'_>,
        name: &str,
        offset: u64,
        address: usize,
        len: usize,
    ) -> PyResult<()> {
        if address == 0 && len > 0 {
            return Err(config_error(format!(
                "read_tensor_into {name:?}: a null address for {len} bytes"
            )));
        }
        // SAFETY: the caller hands over `len` writable bytes at `address` for the call.
        let out: &mut [u8] = if len == 0 {
            &mut []
        } else {
            unsafe { std::slice::from_raw_parts_mut(address as *mut u8, len) }
        };
        py.detach(|| self.inner.read_tensor_range(name, offset, out))
            .map_err(err)
    }

    /// The block of `name` spanning `ranges[d] = (lo, hi)` in each dimension,
    /// row-major, reading only its bytes (GIL released).
    fn read_block(
        &self,
        py: Python<'_>,
        name: &str,
        ranges: Vec<(u64, u64)>,
    ) -> PyResult<TensorBuffer> {
        let bytes = py
            .detach(|| self.inner.read_block(name, &ranges))
            .map_err(err)?;
        Ok(TensorBuffer { bytes })
    }

    fn __len__(&self) -> usize {
        self.inner.checkpoint().tensor_count()
    }

    fn __contains__(&self, name: &str) -> bool {
        self.inner.find(name).is_some()
    }
}
