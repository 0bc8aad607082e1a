//! `sluice._sluice`: the private native module behind the `sluice` package.
//!
//! This layer only converts: Python arguments into a `LoadConfig`, Rust
//! windows into objects numpy can view without copying, and `LoadError`s
//! into Python exceptions (in `errors.rs`, the one place that happens). All
//! waiting on I/O happens with the GIL released.

mod checkpoint;
mod config;
mod errors;
mod sim;
mod stream;
mod window;

use pyo3::prelude::*;

/// Routes `tracing` logs to stderr, filtered by `SLUICE_LOG` (default: warn).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

#[pymodule]
fn _sluice(m: &Bound<'_, PyModule>) -> PyResult<()> {
    init_logging();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<checkpoint::Checkpoint>()?;
    m.add_class::<stream::Stream>()?;
    m.add_class::<window::Window>()?;
    m.add_function(wrap_pyfunction!(checkpoint::open_checkpoint, m)?)?;
    m.add_function(wrap_pyfunction!(stream::start_stream, m)?)?;
    m.add_function(wrap_pyfunction!(sim::sim_run, m)?)?;
    m.add_function(wrap_pyfunction!(sim::sim_defaults, m)?)?;
    Ok(())
}
