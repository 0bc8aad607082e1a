//! The one place a Rust error becomes a Python exception.
//!
//! The exception classes live in `sluice/errors.py`, where they can inherit
//! from both `SluiceError` and the builtin a caller would expect
//! (`FileNotFoundError`, `ValueError`, `KeyError`, `MemoryError`, `OSError`).

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use sluice_load::LoadError;
use sluice_sim::SimError;

/// Converts a load error into the matching `sluice.errors` exception.
pub fn to_py(py: Python<'_>, err: LoadError) -> PyErr {
    raise(py, class_name(&err), err.to_string())
}

/// Converts a simulator error into the matching `sluice.errors` exception.
pub fn sim_to_py(py: Python<'_>, err: SimError) -> PyErr {
    let class = match &err {
        SimError::Io { source, .. } => io_class(source),
        SimError::BadField { .. } | SimError::BadTrace { .. } | SimError::CsvHeader { .. } => {
            "TraceError"
        }
        SimError::Policy(_) | SimError::Config(_) => "ConfigError",
        SimError::Cancelled => "SluiceError",
    };
    raise(py, class, err.to_string())
}

/// Converts a warm-plane error into the matching `sluice.errors` exception.
pub fn warm_to_py(py: Python<'_>, err: sluice_warm::WarmError) -> PyErr {
    use sluice_warm::WarmError;
    let class = match &err {
        WarmError::Io { source, .. } => io_class(source),
        WarmError::NoRuntime
        | WarmError::SeveralRuntimes { .. }
        | WarmError::RuntimeGone { .. } => "NoRuntimeError",
        WarmError::BadTrigger { .. }
        | WarmError::BadOption(_)
        | WarmError::InvalidArgument(_)
        | WarmError::Python(_) => "ConfigError",
        _ => "SluiceError",
    };
    raise(py, class, err.to_string())
}

/// Converts a KV-store error into the matching `sluice.errors` exception.
pub fn kv_to_py(err: sluice_kv::KvError) -> PyErr {
    use sluice_kv::KvError;
    let class = match &err {
        KvError::Config { .. } | KvError::InvalidArgument { .. } => "ConfigError",
        KvError::Incompatible { .. } | KvError::Format { .. } => "StoreFormatError",
        KvError::Locked { .. } => "StoreLockedError",
        KvError::Io { source, .. } => io_class(source),
        KvError::Closed | KvError::UnknownJob(_) => "SluiceError",
    };
    let message = err.to_string();
    Python::attach(|py| raise(py, class, message))
}

pub fn ckpt_to_py(err: sluice_ckpt::CkptError) -> PyErr {
    use sluice_ckpt::CkptError;
    let class = match &err {
        CkptError::InvalidArgument { .. }
        | CkptError::Unplannable(_)
        | CkptError::ObjectUrl { .. }
        | CkptError::ForeignDirectory { .. } => "ConfigError",
        CkptError::Busy { .. } => "StoreLockedError",
        CkptError::Cancelled(_) | CkptError::RankFailed { .. } | CkptError::TimedOut { .. } => {
            "SluiceError"
        }
        CkptError::BadManifest { .. } | CkptError::NewerFormat { .. } => "StoreFormatError",
        CkptError::NoCheckpoint { .. }
        | CkptError::MissingChunk { .. }
        | CkptError::NoStore { .. } => "SluiceFileNotFoundError",
        CkptError::CorruptChunk { .. } => "ChunkCorruptError",
        CkptError::Io { source, .. } => io_class(source),
    };
    let message = err.to_string();
    let errno = err.errno();
    Python::attach(|py| {
        let e = raise(py, class, message);
        if let Some(code) = errno {
            // An OSError's errno (ENOSPC for a full disk) for callers that test it.
            let v = e.value(py);
            let _ = v.setattr("errno", code);
            let _ = v.setattr(
                "strerror",
                std::io::Error::from_raw_os_error(code).to_string(),
            );
        }
        e
    })
}

/// The exception class of a failed file operation.
fn io_class(err: &std::io::Error) -> &'static str {
    match err.kind() {
        std::io::ErrorKind::NotFound => "SluiceFileNotFoundError",
        std::io::ErrorKind::PermissionDenied => "SluicePermissionError",
        _ => "SluiceIOError",
    }
}

/// A `sluice.errors.ConfigError` (a `ValueError`) with `message`: an option
/// value the load cannot take.
pub fn config_error(message: impl Into<String>) -> PyErr {
    let message = message.into();
    Python::attach(|py| raise(py, "ConfigError", message))
}

fn raise(py: Python<'_>, class: &str, message: String) -> PyErr {
    match py.import("sluice.errors").and_then(|m| m.getattr(class)) {
        Ok(cls) => match cls.call1((message.clone(),)) {
            Ok(instance) => PyErr::from_value(instance),
            Err(e) => e,
        },
        Err(_) => PyRuntimeError::new_err(message),
    }
}

fn class_name(err: &LoadError) -> &'static str {
    if err.is_not_found() {
        return "SluiceFileNotFoundError";
    }
    if err.is_permission_denied() {
        return "SluicePermissionError";
    }
    match err {
        LoadError::Format(_) | LoadError::NoShards { .. } => "HeaderError",
        LoadError::UnknownTensor { .. } => "TensorNotFoundError",
        LoadError::TensorExceedsMemoryLimit { .. } | LoadError::MemoryLimitExhausted { .. } => {
            "MemoryLimitError"
        }
        LoadError::Remote(e) if e.is_config() => "ConfigError",
        LoadError::Config(_) => "ConfigError",
        LoadError::Cancelled => "SluiceError",
        _ => "SluiceIOError",
    }
}

/// Helper for `map_err` chains.
pub fn err(py: Python<'_>) -> impl FnOnce(LoadError) -> PyErr + '_ {
    move |e| to_py(py, e)
}
