//! Writing a study's results: `results.json` (rows plus what produced them)
//! and `results.csv` (one row per trace, policy and fraction, flat), the
//! files `sluice sim run --out DIR` leaves beside its plots.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::SimError;
use crate::grid::GridRow;

/// The CSV columns, in order.
pub const CSV_COLUMNS: [&str; 17] = [
    "trace",
    "policy",
    "fraction",
    "capacity",
    "count_mode",
    "working_set_objects",
    "working_set_bytes",
    "requests",
    "hit_ratio",
    "byte_hit_ratio",
    "amplification",
    "fetch_amplification",
    "wasted_ratio",
    "prefix_hit_ratio",
    "evictions",
    "seconds",
    "mreq_per_s",
];

/// What ran, recorded next to the rows.
#[derive(Clone, Debug, Serialize)]
pub struct StudyMeta {
    pub sluice_version: &'static str,
    pub traces: Vec<String>,
    pub policies: Vec<String>,
    pub fractions: Vec<f64>,
    pub count_mode: bool,
    pub threads: usize,
    pub wall_seconds: f64,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SimError + '_ {
    move |source| SimError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `results.json` and `results.csv` into `dir` (created if needed);
/// returns their paths.
pub fn write_results(
    dir: &Path,
    meta: &StudyMeta,
    rows: &[GridRow],
) -> Result<(PathBuf, PathBuf), SimError> {
    if std::fs::metadata(dir).is_ok_and(|m| !m.is_dir()) {
        let not_dir = std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a directory");
        return Err(io_err(dir)(not_dir));
    }
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let json_path = dir.join("results.json");
    let body = serde_json::json!({ "meta": meta, "rows": rows });
    let text = serde_json::to_string_pretty(&body).expect("JSON values always serialize");
    crate::atomic::write_file(&json_path, |out| out.write_all(text.as_bytes()))?;
    let csv_path = dir.join("results.csv");
    crate::atomic::write_file(&csv_path, |out| out.write_all(to_csv(rows).as_bytes()))?;
    Ok((json_path, csv_path))
}

/// Rows as CSV text, header first. Trace and policy names are quoted when
/// they hold commas or quotes (policy specs with parameters do).
pub fn to_csv(rows: &[GridRow]) -> String {
    let mut out = Vec::new();
    let _ = writeln!(out, "{}", CSV_COLUMNS.join(","));
    for r in rows {
        let prefix = r.prefix_hit_ratio.map_or(String::new(), |p| p.to_string());
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            quote(&r.trace),
            quote(&r.policy),
            r.fraction,
            r.capacity,
            r.count_mode,
            r.working_set_objects,
            r.working_set_bytes,
            r.stats.requests,
            r.hit_ratio,
            r.byte_hit_ratio,
            r.amplification,
            r.fetch_amplification,
            r.wasted_ratio,
            prefix,
            r.evictions,
            r.stats.seconds,
            r.mreq_per_s,
        );
    }
    String::from_utf8(out).expect("formatted numbers and UTF-8 names")
}

fn quote(field: &str) -> String {
    if field.contains([',', '"', '\n']) {
        format!("\"{}\"", field.replace('"', "\"\""))
    } else {
        field.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_with_commas_are_quoted() {
        assert_eq!(quote("s3fifo(a=1,b=2)"), "\"s3fifo(a=1,b=2)\"");
        assert_eq!(quote("lru"), "lru");
        assert_eq!(quote("a\"b,"), "\"a\"\"b,\"");
    }
}
