//! `sluice.sim` natives: a study ([`study::run`], the function the CLI's
//! `sluice sim run` calls too), with the GIL released while it runs. Rows
//! travel as JSON text (`sluice/sim.py` turns them into dicts), so this
//! layer holds no conversion logic beyond arguments.

use std::path::PathBuf;
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use sluice_policy::registry::split_specs;
use sluice_sim::source::TraceOptions;
use sluice_sim::study::{self, StudyConfig};
use sluice_sim::SimError;

use crate::errors::to_py;

/// The defaults of a study (`StudyConfig::default()`, where the CLI's flags
/// take theirs too), for `sluice.sim.run`'s keyword arguments.
#[pyfunction]
pub fn sim_defaults(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let defaults = StudyConfig::default();
    let out = PyDict::new(py);
    out.set_item("policies", defaults.policies)?;
    out.set_item("fractions", defaults.fractions)?;
    out.set_item("format", defaults.trace_options.format.to_string())?;
    out.set_item("block_tokens", defaults.trace_options.block_tokens)?;
    out.set_item("count_mode", defaults.count_mode)?;
    out.set_item("threads", defaults.threads)?;
    Ok(out)
}

/// Runs the study: every trace through every policy at every fraction;
/// returns the rows (dicts). `policies` is a comma-separated list of
/// specs. `progress(done, total)` is called after each replay.
#[pyfunction]
#[pyo3(signature = (traces, policies, fractions, count_mode, threads, format, csv_columns, model, block_tokens, progress=None))]
#[allow(clippy::too_many_arguments)]
pub fn sim_run<'py>(
    py: Python<'py>,
    traces: Vec<PathBuf>,
    policies: &str,
    fractions: Vec<f64>,
    count_mode: bool,
    threads: usize,
    format: &str,
    csv_columns: Option<String>,
    model: Option<String>,
    block_tokens: u64,
    progress: Option<Py<PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let stopped: Mutex<Option<PyErr>> = Mutex::new(None);
    let run = || -> Result<Vec<sluice_sim::GridRow>, SimError> {
        let config = StudyConfig {
            traces,
            trace_options: TraceOptions {
                format: format.parse()?,
                csv_columns,
                model,
                block_tokens,
            },
            policies: split_specs(policies),
            fractions,
            count_mode,
            threads,
        };
        // After each replay: Ctrl-C and a raising callback stop the grid, and
        // the Python exception is what the caller sees.
        let report = |done: usize, total: usize| {
            Python::attach(|py| {
                let outcome = py.check_signals().and_then(|()| match &progress {
                    Some(callback) => callback.call1(py, (done, total)).map(drop),
                    None => Ok(()),
                });
                match outcome {
                    Ok(()) => true,
                    Err(e) => {
                        let mut slot = stopped.lock().unwrap_or_else(|p| p.into_inner());
                        slot.get_or_insert(e);
                        false
                    }
                }
            })
        };
        Ok(study::run(&config, &report)?.rows)
    };
    let rows = py
        .detach(run)
        .map_err(|e| match (e, stopped.into_inner()) {
            (SimError::Cancelled, Ok(Some(py_err))) => py_err,
            (e, _) => to_py(&e),
        })?;
    crate::convert::to_py(py, &rows)
}
