//! A study: every trace through every policy at every cache fraction.
//!
//! [`run`] is the one entry point of `sluice sim run` and of Python's
//! `sluice.sim.run`: the fronts only turn their arguments into a
//! [`StudyConfig`] and show the [`Study`] that comes back, so both accept and
//! reject the same studies, with the same errors. It goes in three steps,
//! each finished before the next starts:
//!
//! 1. **Check** every option without reading a file
//!    ([`StudyConfig::check`]): at least one trace, policy specs that parse,
//!    cache fractions in (0, 1], and the trace options that are given (CSV
//!    column spec, KV model, block size), whatever the traces' formats. A
//!    bad option fails the study before a possibly large trace is read.
//! 2. **Read** the traces in order. The first that is missing, malformed or
//!    empty fails the study, naming the file: a trace without requests has
//!    no working set, and its rows would be zeros that look like results.
//! 3. **Replay** the grid on all cores ([`run_grid`]).
//!
//! Errors reach the caller as a [`SimError`], whose variant the fronts map
//! to an exit status and a Python exception: a [`StudyError`] becomes the
//! variant of its class (`EmptyTrace` a `BadTrace` naming the file, exit
//! status 3 and `TraceError`; `NoTraces` a `Config` error, status 2 and
//! `ConfigError`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use sluice_policy::{PolicyConfig, PolicyError};

use crate::error::SimError;
use crate::grid::{run_grid, GridConfig, GridRow};
use crate::kv_model::KvModel;
use crate::report::StudyMeta;
use crate::source::{TraceOptions, TraceReader};
use crate::trace::Trace;

/// The policies a study replays unless told otherwise: LRU as the baseline,
/// the scan-resistant recency/frequency mixes (ARC, 2Q), the FIFO-based
/// designs of recent work (S3-FIFO, SIEVE), an admission door (TinyLFU) and
/// the Belady oracle as the upper reference. The other policies are
/// variants of these, asked for by name.
pub const DEFAULT_POLICIES: [&str; 7] =
    ["lru", "arc", "2q", "s3fifo", "sieve", "tinylfu", "belady"];

/// Seed 003's fractions: from a cache far too small to one holding half of
/// the working set.
pub const DEFAULT_FRACTIONS: [f64; 6] = [0.01, 0.02, 0.05, 0.1, 0.2, 0.5];

/// What went wrong with a study as a whole (its parts report their own
/// errors: policies, trace readers, the grid).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum StudyError {
    /// The config names no trace file.
    #[error("no trace given")]
    NoTraces,
    /// The trace at `path` was read but holds no request.
    #[error("{}: {EMPTY_TRACE}", path.display())]
    EmptyTrace { path: PathBuf },
}

/// Why an empty trace is refused, as the message says it.
const EMPTY_TRACE: &str = "the trace holds no requests (requests of size 0 are skipped)";

impl From<StudyError> for SimError {
    /// The [`SimError`] of the same class, which the fronts know how to
    /// report (see the module header).
    fn from(err: StudyError) -> SimError {
        match err {
            StudyError::EmptyTrace { path } => SimError::BadTrace {
                path,
                message: EMPTY_TRACE.into(),
            },
            StudyError::NoTraces => SimError::config("trace", "none given (name a trace file)"),
        }
    }
}

/// Everything a study takes. [`Default`] is what the CLI's flags and
/// Python's keyword arguments default to (both read it from here).
#[derive(Clone, Debug)]
pub struct StudyConfig {
    /// Trace files, replayed in this order (rows come back in it too). No
    /// default: a study needs at least one.
    pub traces: Vec<PathBuf>,
    /// How the trace files are read. Default: [`TraceOptions::default`].
    pub trace_options: TraceOptions,
    /// Policy specs such as `lru` or `s3fifo(small_ratio=0.2)`, one each;
    /// [`sluice_policy::registry::split_specs`] splits a comma-separated list.
    /// Default: [`DEFAULT_POLICIES`].
    pub policies: Vec<String>,
    /// Cache sizes as fractions of each trace's working set, each in (0, 1].
    /// Default: [`DEFAULT_FRACTIONS`].
    pub fractions: Vec<f64>,
    /// Size every object 1 for the policies (capacities count objects).
    /// Default false: byte capacities are what a cache is provisioned in.
    pub count_mode: bool,
    /// Worker threads; 0 means one per available core. Default 0: replays
    /// are independent, so a study scales with the cores it is given.
    pub threads: usize,
}

impl Default for StudyConfig {
    fn default() -> StudyConfig {
        StudyConfig {
            traces: Vec::new(),
            trace_options: TraceOptions::default(),
            policies: DEFAULT_POLICIES.map(String::from).to_vec(),
            fractions: DEFAULT_FRACTIONS.to_vec(),
            count_mode: false,
            threads: 0,
        }
    }
}

/// A study's options, parsed and checked: step 1 of [`run`].
#[derive(Clone, Debug)]
pub struct CheckedStudy {
    grid: GridConfig,
    reader: TraceReader,
}

impl CheckedStudy {
    /// The KV model the traces' blocks are sized by, if one was given.
    pub fn kv_model(&self) -> Option<&KvModel> {
        self.reader.kv_model()
    }
}

impl StudyConfig {
    /// Parses and checks every option, reading no file (step 1 of [`run`]).
    pub fn check(&self) -> Result<CheckedStudy, SimError> {
        if self.traces.is_empty() {
            return Err(StudyError::NoTraces.into());
        }
        let policies = self
            .policies
            .iter()
            .map(|spec| Ok((spec.clone(), PolicyConfig::parse(spec)?)))
            .collect::<Result<Vec<_>, PolicyError>>()?;
        let grid = GridConfig {
            policies,
            fractions: self.fractions.clone(),
            count_mode: self.count_mode,
            threads: self.threads,
        };
        grid.validate()?;
        let reader = self.trace_options.reader()?;
        Ok(CheckedStudy { grid, reader })
    }
}

/// A finished study.
#[derive(Clone, Debug)]
pub struct Study {
    /// One row per (trace, policy, fraction), in that order.
    pub rows: Vec<GridRow>,
    /// What ran, for `results.json`.
    pub meta: StudyMeta,
}

/// Checks the options, reads the traces and replays the grid (see the
/// module header). `progress(done, total)` is called after each replay and
/// returns whether to go on; `false` ends the study with
/// [`SimError::Cancelled`].
pub fn run(
    config: &StudyConfig,
    progress: &(dyn Fn(usize, usize) -> bool + Sync),
) -> Result<Study, SimError> {
    let checked = config.check()?;
    let mut traces = config
        .traces
        .iter()
        .map(|path| read_trace(&checked.reader, path))
        .collect::<Result<Vec<_>, _>>()?;
    let started = Instant::now();
    let rows = run_grid(&mut traces, &checked.grid, progress)?;
    let meta = StudyMeta {
        sluice_version: env!("CARGO_PKG_VERSION"),
        traces: traces.iter().map(|t| t.name.clone()).collect(),
        policies: config.policies.clone(),
        fractions: config.fractions.clone(),
        count_mode: config.count_mode,
        threads: config.threads,
        wall_seconds: started.elapsed().as_secs_f64(),
    };
    Ok(Study { rows, meta })
}

/// Reads one trace, refusing an empty one.
fn read_trace(reader: &TraceReader, path: &Path) -> Result<Trace, SimError> {
    let trace = reader.open(path)?;
    if trace.is_empty() {
        let path = path.to_path_buf();
        return Err(StudyError::EmptyTrace { path }.into());
    }
    Ok(trace)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::TraceFormat;

    /// A KV trace of three requests over blocks 1..=3.
    fn kv_trace(dir: &std::path::Path) -> PathBuf {
        let path = dir.join("kv.jsonl");
        let line = |ids: &str| {
            format!("{{\"timestamp\":0,\"input_length\":1024,\"output_length\":1,\"hash_ids\":[{ids}]}}\n")
        };
        std::fs::write(&path, line("1,2") + &line("1,3") + &line("1,2")).unwrap();
        path
    }

    fn config(traces: Vec<PathBuf>) -> StudyConfig {
        StudyConfig {
            traces,
            trace_options: TraceOptions::default(),
            policies: vec!["lru".into(), "belady".into()],
            fractions: vec![0.5, 1.0],
            count_mode: false,
            threads: 1,
        }
    }

    #[test]
    fn a_study_replays_every_trace_policy_and_fraction_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let trace = kv_trace(dir.path());
        let study = run(&config(vec![trace.clone(), trace]), &|_, _| true).unwrap();
        let grid: Vec<(&str, f64)> = study
            .rows
            .iter()
            .map(|r| (r.policy.as_str(), r.fraction))
            .collect();
        let one = [("lru", 0.5), ("lru", 1.0), ("belady", 0.5), ("belady", 1.0)];
        assert_eq!(grid, [one, one].concat());
        assert_eq!(study.rows[1].stats.hits, 3, "blocks 1, 1 and 2 hit");
        assert_eq!(study.meta.policies, ["lru", "belady"]);
        assert_eq!(study.meta.traces.len(), 2);
    }

    #[test]
    fn an_empty_trace_is_a_trace_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.oracleGeneral");
        std::fs::write(&empty, b"").unwrap();
        let good = kv_trace(dir.path());
        let err = run(&config(vec![good, empty.clone()]), &|_, _| true).unwrap_err();
        let SimError::BadTrace { path, .. } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(path, &empty);
        assert!(err.to_string().contains("no requests"), "{err}");
    }

    #[test]
    fn options_are_checked_before_any_trace_is_read() {
        let missing = PathBuf::from("/nonexistent/trace.jsonl");
        let mut c = config(vec![missing.clone()]);
        c.fractions = vec![0.0];
        assert!(matches!(run(&c, &|_, _| true), Err(SimError::Config(_))));
        let mut c = config(vec![missing.clone()]);
        c.policies = vec!["lru".into(), "nosuch".into()];
        assert!(matches!(run(&c, &|_, _| true), Err(SimError::Policy(_))));
        for options in [
            TraceOptions {
                csv_columns: Some("bogus=1".into()),
                ..TraceOptions::default()
            },
            TraceOptions {
                model: Some("llama-9000".into()),
                format: TraceFormat::OracleGeneral,
                ..TraceOptions::default()
            },
            TraceOptions {
                block_tokens: 0,
                ..TraceOptions::default()
            },
        ] {
            let mut c = config(vec![missing.clone()]);
            c.trace_options = options;
            let err = run(&c, &|_, _| true).unwrap_err();
            assert!(matches!(err, SimError::Config(_)), "{err:?}");
        }
        let err = run(&config(vec![missing]), &|_, _| true).unwrap_err();
        assert!(matches!(err, SimError::Io { .. }), "{err:?}");
    }

    #[test]
    fn a_study_needs_a_trace_a_policy_and_a_fraction() {
        let mut c = config(vec![]);
        let e = c.check().unwrap_err();
        assert!(matches!(e, SimError::Config(_)), "{e}");
        assert!(e.to_string().contains("trace"), "{e}");
        c.traces = vec![PathBuf::from("t.jsonl")];
        c.policies.clear();
        assert!(c.check().is_err());
        let mut c = config(vec![PathBuf::from("t.jsonl")]);
        c.fractions.clear();
        assert!(c.check().is_err());
    }

    #[test]
    fn the_defaults_are_a_valid_study_of_the_default_policies() {
        let c = StudyConfig {
            traces: vec![PathBuf::from("t.jsonl")],
            ..StudyConfig::default()
        };
        c.check().expect("the defaults pass the checks");
        assert_eq!(c.policies, DEFAULT_POLICIES);
        assert_eq!(c.fractions, DEFAULT_FRACTIONS);
    }

    #[test]
    fn the_checked_study_knows_its_kv_model() {
        let mut c = config(vec![PathBuf::from("t.jsonl")]);
        assert!(c.check().unwrap().kv_model().is_none());
        c.trace_options.model = Some("llama3-8b".into());
        let checked = c.check().unwrap();
        assert_eq!(
            checked.kv_model().map(|m| m.name.as_str()),
            Some("llama3-8b")
        );
    }
}
