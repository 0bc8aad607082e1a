//! The one place a Rust error becomes a Python exception.
//!
//! Every plane's error type knows its class (`sluice_engine::Classify`), and each class
//! names its exception in `sluice/errors.py` (`ErrorClass::python_name`), the same table
//! the CLI's exit statuses come from. The exception classes are looked up once, when the
//! native module is imported: a class missing from `sluice/errors.py` fails the import, it
//! never turns a raise into a bare `RuntimeError`. An I/O failure's errno (ENOSPC for a
//! full disk) is set on the exception (`SluiceIOError` is an `OSError`).

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use sluice_engine::{Classify, ErrorClass};

static CLASSES: PyOnceLock<Vec<(ErrorClass, Py<PyType>)>> = PyOnceLock::new();

/// Resolves every class's exception in `sluice.errors`; called when `sluice._sluice` is
/// imported.
pub fn init(py: Python<'_>) -> PyResult<()> {
    CLASSES.get_or_try_init(py, || -> PyResult<_> {
        let module = py.import("sluice.errors")?;
        ErrorClass::ALL
            .into_iter()
            .map(|c| {
                let cls = module.getattr(c.python_name())?.cast_into::<PyType>()?;
                Ok((c, cls.unbind()))
            })
            .collect()
    })?;
    Ok(())
}

/// The exception for `err`: its class's, with its message and errno.
pub fn to_py<E: Classify + ?Sized>(err: &E) -> PyErr {
    let message = err.to_string();
    let errno = err.errno();
    let class = err.class();
    Python::attach(|py| raise(py, class, message, errno))
}

/// Helper for `map_err` chains.
pub fn err<E: Classify>(e: E) -> PyErr {
    to_py(&e)
}

pub fn ckpt_to_py(e: sluice_ckpt::CkptError) -> PyErr {
    to_py(&e)
}

/// A `sluice.errors.ConfigError` (a `ValueError`) with `message`: an option value the
/// call cannot take.
pub fn config_error(message: impl Into<String>) -> PyErr {
    let message = message.into();
    Python::attach(|py| raise(py, ErrorClass::Config, message, None))
}

fn raise(py: Python<'_>, class: ErrorClass, message: String, errno: Option<i32>) -> PyErr {
    let classes = CLASSES
        .get(py)
        .expect("sluice._sluice resolved its exception classes when it was imported");
    let (_, cls) = classes
        .iter()
        .find(|(c, _)| *c == class)
        .expect("every class was resolved");
    // `errno` alone: with `strerror` set too, an OSError's str() would become
    // "[Errno N] strerror" and lose the message that names the file.
    let made = cls.bind(py).call1((message,)).and_then(|e| {
        if let Some(code) = errno {
            e.setattr("errno", code)?;
        }
        Ok(e)
    });
    match made {
        Ok(instance) => PyErr::from_value(instance),
        Err(e) => e,
    }
}
