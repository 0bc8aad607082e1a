//! `sluice sim`: replay traces through cache policies (`run`) and generate
//! KV-cache workloads (`gen-kv`).
//!
//! `run` hands the flags to [`study::run`], which checks them, reads every
//! trace and replays the (trace × policy × fraction) grid on all cores, as
//! it does for Python's `sluice.sim.run`. This front writes `results.json`
//! and `results.csv` into `--out`, prints a hit-ratio table and draws two
//! plots by running `python3 -m sluice.sim plot DIR` (matplotlib lives on
//! the Python side). Without Python or matplotlib the plots are skipped with
//! a warning and the results stand.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::Command;

use indicatif::{ProgressBar, ProgressStyle};
use sluice_policy::registry::split_specs;
use sluice_sim::kv_model::KvModel;
use sluice_sim::report::write_results;
use sluice_sim::source::TraceOptions;
use sluice_sim::study::{self, StudyConfig};
use sluice_sim::{GridRow, SimError};

use crate::{SimModelsArgs, SimRunArgs, SimTraceArgs};

/// `sluice sim models`: each preset's KV bytes per token, with the formula.
pub fn models(args: &SimModelsArgs) -> Result<(), SimError> {
    if args.block_tokens == 0 {
        return Err(SimError::config("--block-tokens", "must be at least 1"));
    }
    let mut models = KvModel::presets();
    if let Some(spec) = &args.model {
        models.push(KvModel::parse(spec)?);
    }
    outln!(
        "{:<16}{:>12}{:>20}  derivation",
        "model",
        "B/token",
        format!("MiB/{}-tok block", args.block_tokens)
    );
    for m in models {
        let block_mib = m.block_bytes(args.block_tokens) as f64 / (1u64 << 20) as f64;
        outln!(
            "{:<16}{:>12}{:>20.2}  {}",
            m.name,
            m.bytes_per_token(),
            block_mib,
            m.derivation()
        );
    }
    Ok(())
}

/// `sluice sim run`: the study the flags describe ([`study::run`], which
/// Python's `sluice.sim.run` calls too), its results written and shown.
pub fn run(args: &SimRunArgs) -> Result<(), SimError> {
    let config = study_config(args)?;
    if let Some(model) = config.check()?.kv_model() {
        errln!(
            "KV blocks of {} tokens sized by {}: {}",
            config.trace_options.block_tokens,
            model.name,
            model.derivation()
        );
    }
    let bar = progress_bar(args.no_progress || args.json);
    let study = study::run(&config, &|done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        true
    })?;
    bar.finish_and_clear();
    let (json_path, csv_path) = write_results(&args.out, &study.meta, &study.rows)?;
    if args.json {
        let rows = serde_json::to_string(&study.rows).expect("rows always serialize");
        outln!("{rows}");
    } else {
        print_table(&study.rows);
        outln!("wrote {} and {}", json_path.display(), csv_path.display());
    }
    if !args.no_plots {
        draw_plots(&args.out);
    }
    Ok(())
}

/// The study the flags describe; what they hold is checked by the study.
pub fn study_config(args: &SimRunArgs) -> Result<StudyConfig, SimError> {
    let defaults = StudyConfig::default();
    Ok(StudyConfig {
        traces: args.traces.clone(),
        trace_options: trace_options(&args.trace_args)?,
        policies: split_specs(&args.policies),
        fractions: parse_fractions(&args.fractions)?,
        count_mode: args.count_mode,
        threads: args.threads.unwrap_or(defaults.threads),
    })
}

/// Parses `--fractions`, e.g. `0.01,0.1,0.5`; the study checks the range.
pub fn parse_fractions(list: &str) -> Result<Vec<f64>, SimError> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<f64>()
                .map_err(|_| SimError::config(format!("cache fraction {s:?}"), "is not a number"))
        })
        .collect()
}

pub fn trace_options(args: &SimTraceArgs) -> Result<TraceOptions, SimError> {
    Ok(TraceOptions {
        format: args.format.parse()?,
        csv_columns: args.csv_columns.clone(),
        model: args.model.clone(),
        block_tokens: args.block_tokens,
    })
}

fn progress_bar(hidden: bool) -> ProgressBar {
    if hidden || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(0);
    let style = ProgressStyle::with_template("{bar:40} {pos}/{len} replays, eta {eta}")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}

/// Hit ratio and amplification per policy (rows) and fraction (columns),
/// per trace.
fn print_table(rows: &[GridRow]) {
    for trace in unique(rows.iter().map(|r| r.trace.as_str())) {
        let mine: Vec<&GridRow> = rows.iter().filter(|r| r.trace == trace).collect();
        let fractions = unique(mine.iter().map(|r| r.fraction.to_string()));
        let policies = unique(mine.iter().map(|r| r.policy.as_str()));
        let tables: [(&str, Metric); 2] = [
            ("hit ratio", |r| r.hit_ratio),
            ("amplification (admitted bytes / hit bytes)", |r| {
                r.amplification
            }),
        ];
        for (title, metric) in tables {
            outln!("{trace}: {title} by cache fraction of the working set");
            let head: Vec<String> = fractions.iter().map(|f| format!("{f:>9}")).collect();
            outln!("  {:<28}{}", "policy", head.join(""));
            for policy in &policies {
                let cells: Vec<String> = fractions
                    .iter()
                    .map(|f| {
                        mine.iter()
                            .find(|r| r.policy == *policy && r.fraction.to_string() == *f)
                            .map_or(format!("{:>9}", "-"), |r| format!("{:>9.4}", metric(r)))
                    })
                    .collect();
                outln!("  {policy:<28}{}", cells.join(""));
            }
        }
    }
}

/// A column of the printed tables.
type Metric = fn(&GridRow) -> f64;

/// Distinct items in first-seen order.
fn unique<T: PartialEq>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut out = Vec::new();
    for item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

/// Runs `python -m sluice.sim plot DIR`; a missing interpreter or matplotlib only warns.
fn draw_plots(dir: &Path) {
    draw_plots_with(dir, "sluice.sim");
}

/// Runs the Python plotter `python -m MODULE plot DIR`; a missing interpreter or
/// matplotlib only warns, with how to draw them later.
pub(crate) fn draw_plots_with(dir: &Path, module: &str) {
    let mut failures = Vec::new();
    for python in python_candidates() {
        let outcome = Command::new(&python)
            .args(["-m", module, "plot"])
            .arg(dir)
            .output();
        match outcome {
            Ok(out) if out.status.success() => {
                out!("{}", String::from_utf8_lossy(&out.stdout));
                return;
            }
            Ok(out) => failures.push(format!(
                "`{} -m {module} plot` failed: {}",
                python.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )),
            Err(err) => failures.push(format!("cannot run {}: {err}", python.display())),
        }
    }
    tracing::warn!(
        "plots skipped: {}. Set SLUICE_PYTHON to a Python with the sluice package and \
         matplotlib (make develop builds .venv/bin/python), or draw them later with \
         `python -m {module} plot {}`",
        failures.join("; "),
        dir.display()
    );
}

/// `$SLUICE_PYTHON` alone when set; else `python3`, then the checkout's
/// `.venv/bin/python` (the same search as Python policies).
fn python_candidates() -> Vec<PathBuf> {
    match std::env::var_os("SLUICE_PYTHON") {
        Some(python) => vec![PathBuf::from(python)],
        None => sluice_warm::python::default_interpreters(),
    }
}
