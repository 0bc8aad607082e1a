//! Python keyword arguments into a `LoadConfig`.

use pyo3::exceptions::PyOverflowError;
use pyo3::prelude::*;
use pyo3::types::PyBool;
use sluice_load::{parse_bytes, LoadConfig, DEFAULT_STREAM_MEMORY_LIMIT};

use crate::errors::config_error;

/// Builds a config from the keyword values the Python layer passes; `None`
/// keeps the default (after `SLUICE_*` environment overrides).
#[allow(clippy::too_many_arguments)]
pub fn build(
    direct: Option<&str>,
    engine: Option<&str>,
    concurrency: Option<Bound<'_, PyAny>>,
    chunk_bytes: Option<Bound<'_, PyAny>>,
    memory_limit: Option<Bound<'_, PyAny>>,
    drop_cache: Option<bool>,
    allow_partial: Option<bool>,
) -> PyResult<LoadConfig> {
    let mut cfg = LoadConfig::default()
        .with_env_overrides()
        .map_err(|e| config_error(e.to_string()))?;
    apply(
        &mut cfg,
        direct,
        engine,
        concurrency.as_ref(),
        chunk_bytes.as_ref(),
        memory_limit.as_ref(),
    )?;
    if let Some(d) = drop_cache {
        cfg.drop_cache = d;
    }
    if let Some(p) = allow_partial {
        cfg.allow_partial = p;
    }
    cfg.validate().map_err(crate::errors::err)?;
    Ok(cfg)
}

/// The memory limit a stream would run under: `memory_limit` when given, else
/// `SLUICE_MEMORY_LIMIT`, else the stream default (what a grouped load sizes its rounds by).
#[pyfunction]
#[pyo3(signature = (memory_limit=None))]
pub fn stream_memory_limit(memory_limit: Option<Bound<'_, PyAny>>) -> PyResult<u64> {
    let cfg = build(None, None, None, None, memory_limit, None, None)?;
    Ok(cfg.memory_limit.unwrap_or(DEFAULT_STREAM_MEMORY_LIMIT))
}

/// Checks the option values a load would be given, without reading the
/// environment or any file: the front ends call it first, so a bad option is a
/// `ConfigError` before anything is read. `start_stream` checks them again.
#[pyfunction]
#[pyo3(signature = (*, direct=None, engine=None, concurrency=None, chunk_bytes=None,
                    memory_limit=None))]
pub fn check_options(
    direct: Option<&str>,
    engine: Option<&str>,
    concurrency: Option<Bound<'_, PyAny>>,
    chunk_bytes: Option<Bound<'_, PyAny>>,
    memory_limit: Option<Bound<'_, PyAny>>,
) -> PyResult<()> {
    let mut cfg = LoadConfig::default();
    apply(
        &mut cfg,
        direct,
        engine,
        concurrency.as_ref(),
        chunk_bytes.as_ref(),
        memory_limit.as_ref(),
    )?;
    cfg.validate().map_err(crate::errors::err)
}

/// Sets the options the caller gave (`None`: left as they are).
fn apply(
    cfg: &mut LoadConfig,
    direct: Option<&str>,
    engine: Option<&str>,
    concurrency: Option<&Bound<'_, PyAny>>,
    chunk_bytes: Option<&Bound<'_, PyAny>>,
    memory_limit: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    if let Some(d) = direct {
        cfg.direct = d.parse().map_err(config_error)?;
    }
    if let Some(e) = engine {
        cfg.engine = e.parse().map_err(config_error)?;
    }
    if let Some(c) = concurrency {
        cfg.concurrency = count("concurrency", c)?;
    }
    if let Some(c) = chunk_bytes {
        let bytes = byte_size("chunk_bytes", c)?;
        cfg.chunk_bytes = usize::try_from(bytes)
            .map_err(|_| config_error(format!("chunk_bytes is out of range: {bytes}")))?;
    }
    if let Some(m) = memory_limit {
        cfg.memory_limit = Some(byte_size("memory_limit", m)?);
    }
    Ok(())
}

/// The integer an option holds, or `None` when it holds none. A bool is not one: Python
/// counts `True` as the int 1, but it never means a count or a size. An int too large
/// for any option is a `ConfigError` naming it (not Python's `OverflowError`).
pub(crate) fn integer(name: &str, value: &Bound<'_, PyAny>) -> PyResult<Option<i128>> {
    if value.is_instance_of::<PyBool>() {
        return Ok(None);
    }
    match value.extract::<i128>() {
        Ok(n) => Ok(Some(n)),
        Err(e) if e.is_instance_of::<PyOverflowError>(value.py()) => {
            Err(config_error(format!("{name} is out of range: {value}")))
        }
        Err(_) => Ok(None),
    }
}

/// A count such as `concurrency`: a positive int.
fn count(name: &str, value: &Bound<'_, PyAny>) -> PyResult<usize> {
    let Some(n) = integer(name, value)? else {
        return Err(config_error(format!(
            "{name} must be a positive integer, not {}",
            repr(value)
        )));
    };
    if n < 1 {
        return Err(config_error(format!(
            "{name} must be a positive integer, not {n}"
        )));
    }
    usize::try_from(n).map_err(|_| config_error(format!("{name} is out of range: {n}")))
}

/// The bytes of an option `name` given as an int or a size string ("512MiB"), by the
/// rules every load option follows; `ConfigError` naming it otherwise.
#[pyfunction]
pub fn parse_byte_size(name: &str, value: Bound<'_, PyAny>) -> PyResult<u64> {
    byte_size(name, &value)
}

/// Accepts an int of bytes or a string like "512MiB".
pub(crate) fn byte_size(name: &str, value: &Bound<'_, PyAny>) -> PyResult<u64> {
    if let Some(n) = integer(name, value)? {
        if n < 0 {
            return Err(config_error(format!(
                "{name} must be a non-negative byte count, not {n}"
            )));
        }
        return u64::try_from(n).map_err(|_| config_error(format!("{name} is out of range: {n}")));
    }
    if let Ok(s) = value.extract::<String>() {
        return parse_bytes(&s).map_err(|e| config_error(format!("{name}: {e}")));
    }
    Err(config_error(format!(
        "{name} must be an int or a size string like '512MiB', not {}",
        repr(value)
    )))
}

/// `repr(value)`, for messages.
pub(crate) fn repr(value: &Bound<'_, PyAny>) -> String {
    value
        .repr()
        .map_or_else(|_| "<unprintable>".into(), |r| r.to_string())
}
