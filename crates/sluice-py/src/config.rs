//! Python keyword arguments into a `LoadConfig`.

use pyo3::prelude::*;
use sluice_load::{parse_bytes, LoadConfig};

use crate::errors::config_error;

/// Builds a config from the keyword values the Python layer passes; `None`
/// keeps the default (after `SLUICE_*` environment overrides).
#[allow(clippy::too_many_arguments)]
pub fn build(
    direct: Option<&str>,
    engine: Option<&str>,
    concurrency: Option<usize>,
    chunk_bytes: Option<Bound<'_, PyAny>>,
    memory_limit: Option<Bound<'_, PyAny>>,
    drop_cache: Option<bool>,
    allow_partial: Option<bool>,
) -> PyResult<LoadConfig> {
    let mut cfg = LoadConfig::default()
        .with_env_overrides()
        .map_err(|e| config_error(e.to_string()))?;
    if let Some(d) = direct {
        cfg.direct = d.parse().map_err(config_error)?;
    }
    if let Some(e) = engine {
        cfg.engine = e.parse().map_err(config_error)?;
    }
    if let Some(c) = concurrency {
        cfg.concurrency = c;
    }
    if let Some(c) = chunk_bytes {
        cfg.chunk_bytes = usize::try_from(byte_size("chunk_bytes", &c)?)
            .map_err(|e| config_error(e.to_string()))?;
    }
    if let Some(m) = memory_limit {
        cfg.memory_limit = Some(byte_size("memory_limit", &m)?);
    }
    if let Some(d) = drop_cache {
        cfg.drop_cache = d;
    }
    if let Some(p) = allow_partial {
        cfg.allow_partial = p;
    }
    cfg.validate().map_err(config_error)?;
    Ok(cfg)
}

/// Accepts an int of bytes or a string like "512MiB".
pub(crate) fn byte_size(name: &str, value: &Bound<'_, PyAny>) -> PyResult<u64> {
    if let Ok(n) = value.extract::<i128>() {
        return u64::try_from(n).map_err(|_| {
            config_error(format!("{name} must be a non-negative byte count, not {n}"))
        });
    }
    if let Ok(s) = value.extract::<String>() {
        return parse_bytes(&s).map_err(|e| config_error(format!("{name}: {e}")));
    }
    Err(config_error(format!(
        "{name} must be an int or a size string like '512MiB'"
    )))
}
