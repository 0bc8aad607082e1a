//! `sluice._sluice`: the private native module behind the `sluice` package.
//!
//! This layer only converts: Python arguments into a `LoadConfig`, Rust
//! windows into objects numpy can view without copying, and `LoadError`s
//! into Python exceptions (in `errors.rs`, the one place that happens). All
//! waiting on I/O happens with the GIL released.

mod checkpoint;
mod ckpt;
mod cli;
mod config;
mod convert;
mod errors;
mod gpu;
mod kv;
mod kv_options;
mod sim;
mod stream;
mod warm;
mod window;

use pyo3::prelude::*;

#[pymodule]
fn _sluice(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // Logs to stderr, filtered by `SLUICE_LOG` (default: warn), as the CLI does.
    sluice_cli::init_logging(0);
    errors::init(m.py())?;
    m.add_function(wrap_pyfunction!(cli::cli_main, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<checkpoint::PyCheckpoint>()?;
    m.add_class::<checkpoint::TensorBuffer>()?;
    m.add_class::<stream::Stream>()?;
    m.add_class::<window::Window>()?;
    m.add_function(wrap_pyfunction!(checkpoint::open_checkpoint, m)?)?;
    m.add_function(wrap_pyfunction!(stream::start_stream, m)?)?;
    m.add_function(wrap_pyfunction!(gpu::gpu_runtime, m)?)?;
    m.add_class::<gpu::PyPinnedPool>()?;
    m.add_class::<gpu::PySlot>()?;
    m.add_function(wrap_pyfunction!(config::check_options, m)?)?;
    m.add_function(wrap_pyfunction!(config::parse_byte_size, m)?)?;
    m.add_function(wrap_pyfunction!(config::stream_memory_limit, m)?)?;
    m.add_function(wrap_pyfunction!(sim::sim_run, m)?)?;
    m.add_function(wrap_pyfunction!(warm::warm_run_dir, m)?)?;
    m.add_function(wrap_pyfunction!(warm::warm_status, m)?)?;
    m.add_function(wrap_pyfunction!(warm::warm_trigger, m)?)?;
    m.add_function(wrap_pyfunction!(sim::sim_defaults, m)?)?;
    m.add_class::<ckpt::PyCkptStore>()?;
    m.add_class::<ckpt::PyShare>()?;
    m.add_class::<ckpt::PySave>()?;
    m.add_class::<ckpt::PyFetch>()?;
    m.add_function(wrap_pyfunction!(ckpt::ckpt_open, m)?)?;
    m.add_function(wrap_pyfunction!(ckpt::ckpt_path, m)?)?;
    m.add_function(wrap_pyfunction!(ckpt::ckpt_check_store, m)?)?;
    m.add_function(wrap_pyfunction!(ckpt::ckpt_size, m)?)?;
    m.add_function(wrap_pyfunction!(ckpt::ckpt_bandwidth, m)?)?;
    m.add_function(wrap_pyfunction!(ckpt::ckpt_pack_below, m)?)?;
    m.add_function(wrap_pyfunction!(ckpt::ckpt_plan, m)?)?;
    m.add_function(wrap_pyfunction!(ckpt::ckpt_totals, m)?)?;
    m.add_function(wrap_pyfunction!(ckpt::ckpt_table_keep, m)?)?;
    m.add_function(wrap_pyfunction!(ckpt::ckpt_gc, m)?)?;
    m.add_function(wrap_pyfunction!(ckpt::ckpt_collect_failed, m)?)?;
    m.add_class::<kv::PyKvStore>()?;
    m.add_class::<kv::PyKvJob>()?;
    m.add_function(wrap_pyfunction!(kv::kv_open, m)?)?;
    m.add_function(wrap_pyfunction!(kv::kv_connect, m)?)?;
    m.add_function(wrap_pyfunction!(kv::kv_fsck, m)?)?;
    m.add_function(wrap_pyfunction!(kv_options::kv_defaults, m)?)?;
    m.add_class::<kv_options::KvStatsReport>()?;
    m.add_class::<kv_options::KvFsckReport>()?;
    Ok(())
}
