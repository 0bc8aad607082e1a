//! `sluice.warm`'s native calls: the run directory, the running runtimes'
//! status, and explicit triggers, all from `sluice_warm` (the CLI's
//! `sluice warm status` and `trigger` run the same code).

use pyo3::prelude::*;
use sluice_warm::config::WarmEnv;
use sluice_warm::trigger::TriggerRequest;

use crate::errors::to_py;

/// Where running runtimes publish their status and trigger pipes.
#[pyfunction]
pub fn warm_run_dir() -> String {
    WarmEnv::from_env().run_dir().display().to_string()
}

/// The live runtimes' status, a list of dicts (dead ones' files removed).
#[pyfunction]
pub fn warm_status(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    let run_dir = WarmEnv::from_env().run_dir();
    let all = py
        .detach(|| sluice_warm::status::list(&run_dir))
        .map_err(|e| to_py(&e))?;
    crate::convert::to_py(py, &all)
}

/// Sends an explicit access to a running runtime.
#[pyfunction]
#[pyo3(signature = (path, offset=None, length=None, worker=None, pid=None))]
pub fn warm_trigger(
    py: Python<'_>,
    path: String,
    offset: Option<u64>,
    length: Option<u64>,
    worker: Option<u32>,
    pid: Option<i32>,
) -> PyResult<()> {
    let request = TriggerRequest {
        path,
        offset,
        len: length,
        worker,
        pid,
    };
    let env = WarmEnv::from_env();
    py.detach(|| sluice_warm::trigger::trigger(&env, &request))
        .map_err(|e| to_py(&e))
}
