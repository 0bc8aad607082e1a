//! A loaded window, viewable by numpy without a copy.
//!
//! The window owns its buffer. `__array_interface__` hands numpy the
//! buffer's address; numpy keeps this object alive as the array's base, and
//! torch keeps the array alive, so the memory lives exactly as long as any
//! tensor over it. When the last one dies the buffer returns to its pool.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use sluice_load::LoadedWindow;

#[pyclass(module = "sluice._sluice", frozen)]
pub struct Window {
    inner: LoadedWindow,
}

impl Window {
    pub fn new(inner: LoadedWindow) -> Self {
        Window { inner }
    }
}

#[pymethods]
impl Window {
    /// The shard file the window was read from.
    #[getter]
    fn shard(&self) -> String {
        self.inner.shard_path.display().to_string()
    }

    /// Bytes in the window's buffer.
    fn __len__(&self) -> usize {
        self.inner.buf.as_ref().map_or(0, |b| b.len())
    }

    /// `(name, dtype, shape, offset, nbytes)` for each tensor in the window.
    #[getter]
    fn tensors<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        self.inner
            .tensors
            .iter()
            .map(|t| {
                let shape = PyTuple::new(py, &t.shape)?;
                PyTuple::new(
                    py,
                    [
                        t.name.clone().into_pyobject(py)?.into_any(),
                        t.dtype.as_str().into_pyobject(py)?.into_any(),
                        shape.into_any(),
                        t.window_offset.into_pyobject(py)?.into_any(),
                        t.byte_len.into_pyobject(py)?.into_any(),
                    ],
                )
            })
            .collect()
    }

    /// numpy's array interface: a writable 1-D uint8 view of the buffer.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (ptr, len) = match &self.inner.buf {
            Some(b) => (b.as_ptr() as usize, b.len()),
            None => (0usize, 0usize),
        };
        // Mapped windows are private copy-on-write mappings, so writable too.
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", (len,))?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (ptr, false))?;
        Ok(d)
    }
}
