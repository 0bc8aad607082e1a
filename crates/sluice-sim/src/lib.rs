//! The simulator plane: replay traces through Sluice's cache policies.
//!
//! - [`trace`]: the in-memory [`Trace`] and its readers and writers (CSV,
//!   libCacheSim's oracleGeneral, Mooncake-style KV JSONL).
//! - [`kv_model`]: per-token KV-cache bytes of model presets.
//! - [`generator`]: the seeded KV workload generator behind `sluice sim gen-kv`.
//! - [`simulator`]: one (trace, policy, capacity) replay and its metrics.
//! - [`grid`]: every (trace, policy, cache fraction) in parallel.
//! - [`source`]: opening a trace file of any supported format.
//! - [`study`]: a whole study (check, read, replay), the one entry point of
//!   the CLI's `sluice sim run` and of Python's `sluice.sim.run`.
//! - [`report`]: `results.json` and `results.csv`.
//! - [`tiered`]: a KV trace through a stack of tiers, as `sluice kv bench` checks.

pub mod atomic;
pub mod error;
pub mod generator;
pub mod grid;
pub mod kv_model;
pub mod report;
pub mod simulator;
pub mod source;
pub mod study;
pub mod tiered;
pub mod trace;

pub use error::SimError;
pub use grid::{run_grid, GridConfig, GridRow};
pub use simulator::{simulate, SimConfig, SimStats};
pub use study::{Study, StudyConfig, StudyError};
pub use trace::{Record, Trace};
