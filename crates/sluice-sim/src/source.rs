//! Opening a trace file of any supported format, chosen by flag or by name.
//!
//! `auto` picks by extension: `.jsonl` is a Mooncake-style KV trace, `.csv`
//! (or `.txt`) is CSV, anything else is read as oracleGeneral, whose reader
//! checks the record layout and says so if the guess was wrong.
//!
//! [`TraceOptions::reader`] parses the options once (the CSV column spec,
//! the KV model, the block size), whatever format the files turn out to
//! have, so a bad option is reported before any file is read and whichever
//! traces it is given with; the [`TraceReader`] it returns opens the files.

use std::path::Path;

use crate::error::SimError;
use crate::kv_model::KvModel;
use crate::trace::csv::CsvConfig;
use crate::trace::mooncake::{MooncakeConfig, DEFAULT_BLOCK_TOKENS};
use crate::trace::{csv, mooncake, oracle_general, Trace};

/// Trace file formats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TraceFormat {
    /// By extension (see the module header): the default, so that naming
    /// files as usual is all a user has to do.
    #[default]
    Auto,
    /// libCacheSim's binary records (`oracle`).
    OracleGeneral,
    /// CSV with chosen columns (`csv`).
    Csv,
    /// Mooncake-style KV-cache JSONL (`mooncake`).
    Mooncake,
}

impl std::str::FromStr for TraceFormat {
    type Err = SimError;

    fn from_str(s: &str) -> Result<TraceFormat, SimError> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(TraceFormat::Auto),
            "oracle" | "oraclegeneral" | "oracle-general" | "bin" => Ok(TraceFormat::OracleGeneral),
            "csv" => Ok(TraceFormat::Csv),
            "mooncake" | "jsonl" | "kv" => Ok(TraceFormat::Mooncake),
            other => Err(SimError::config(
                format!("trace format {other:?}"),
                "unknown: use auto, oracle, csv or mooncake",
            )),
        }
    }
}

impl std::fmt::Display for TraceFormat {
    /// The name [`FromStr`](std::str::FromStr) reads back.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TraceFormat::Auto => "auto",
            TraceFormat::OracleGeneral => "oracle",
            TraceFormat::Csv => "csv",
            TraceFormat::Mooncake => "mooncake",
        })
    }
}

/// How to read a trace.
#[derive(Clone, Debug)]
pub struct TraceOptions {
    /// The files' format. Default [`TraceFormat::Auto`].
    pub format: TraceFormat,
    /// CSV column spec, e.g. `id-col=2,size-col=3,has-header=true`.
    pub csv_columns: Option<String>,
    /// KV traces: a model preset or spec giving bytes per token; `None`
    /// gives every block size 1 (count the blocks).
    pub model: Option<String>,
    /// KV traces: tokens per block. Default [`DEFAULT_BLOCK_TOKENS`].
    pub block_tokens: u64,
}

impl Default for TraceOptions {
    fn default() -> TraceOptions {
        TraceOptions {
            format: TraceFormat::default(),
            csv_columns: None,
            model: None,
            block_tokens: DEFAULT_BLOCK_TOKENS,
        }
    }
}

/// Trace options with their specs parsed: what opens the trace files.
#[derive(Clone, Debug)]
pub struct TraceReader {
    format: TraceFormat,
    csv: CsvConfig,
    mooncake: MooncakeConfig,
}

impl TraceOptions {
    /// The KV model blocks are sized by, if one is given.
    fn kv_model(&self) -> Result<Option<KvModel>, SimError> {
        self.model.as_deref().map(KvModel::parse).transpose()
    }

    /// Parses and checks every option given, for any format.
    pub fn reader(&self) -> Result<TraceReader, SimError> {
        let csv = match &self.csv_columns {
            Some(spec) => CsvConfig::parse(spec)?,
            None => CsvConfig::default(),
        };
        let mooncake = MooncakeConfig {
            block_tokens: self.block_tokens,
            model: self.kv_model()?,
        };
        mooncake.check()?;
        Ok(TraceReader {
            format: self.format,
            csv,
            mooncake,
        })
    }
}

impl TraceReader {
    /// The KV model blocks are sized by, if any.
    pub fn kv_model(&self) -> Option<&KvModel> {
        self.mooncake.model.as_ref()
    }

    /// Reads the trace at `path`.
    pub fn open(&self, path: &Path) -> Result<Trace, SimError> {
        let format = match self.format {
            TraceFormat::Auto => detect_format(path),
            f => f,
        };
        tracing::info!(path = %path.display(), ?format, "reading trace");
        match format {
            TraceFormat::OracleGeneral => oracle_general::read(path),
            TraceFormat::Csv => csv::read(path, &self.csv),
            TraceFormat::Mooncake => mooncake::read(path, &self.mooncake),
            TraceFormat::Auto => unreachable!("resolved above"),
        }
    }
}

/// The format `auto` resolves to for `path`.
pub fn detect_format(path: &Path) -> TraceFormat {
    match path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
    {
        Some(e) if e == "jsonl" || e == "json" => TraceFormat::Mooncake,
        Some(e) if e == "csv" || e == "txt" => TraceFormat::Csv,
        _ => TraceFormat::OracleGeneral,
    }
}

/// Reads the trace at `path` (see [`TraceOptions::reader`]).
pub fn open_trace(path: &Path, options: &TraceOptions) -> Result<Trace, SimError> {
    options.reader()?.open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_format_reads_back_from_its_name() {
        for format in [
            TraceFormat::Auto,
            TraceFormat::OracleGeneral,
            TraceFormat::Csv,
            TraceFormat::Mooncake,
        ] {
            assert_eq!(format.to_string().parse::<TraceFormat>().unwrap(), format);
        }
    }

    #[test]
    fn given_options_are_checked_whatever_the_format() {
        let bad_columns = TraceOptions {
            format: TraceFormat::OracleGeneral,
            csv_columns: Some("id-col=0".into()),
            ..TraceOptions::default()
        };
        let err = bad_columns.reader().unwrap_err();
        assert!(err.to_string().contains("id-col"), "{err}");
        let zero_blocks = TraceOptions {
            block_tokens: 0,
            ..TraceOptions::default()
        };
        assert!(matches!(zero_blocks.reader(), Err(SimError::Config(_))));
    }
}
