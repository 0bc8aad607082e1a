//! Errors of the simulator plane. Trace errors name the file, the line (or
//! record) and the field.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: field {field}: {message}")]
    BadField {
        path: PathBuf,
        /// 1-based line (text formats) or record number (binary formats).
        line: u64,
        field: String,
        message: String,
    },
    #[error("{path}: {message}")]
    BadTrace { path: PathBuf, message: String },
    /// A CSV trace's first row and the header option disagree, or the option
    /// was left out and the row cannot tell.
    #[error("{path}:{line}: first row {row:?} {problem}")]
    CsvHeader {
        path: PathBuf,
        /// 1-based line of the row.
        line: u64,
        /// The row as read (its first 80 characters).
        row: String,
        problem: HeaderProblem,
    },
    #[error(transparent)]
    Policy(#[from] sluice_policy::PolicyError),
    #[error(transparent)]
    Config(#[from] sluice_engine::ConfigError),
    /// The caller's progress callback asked to stop.
    #[error("cancelled")]
    Cancelled,
}

impl SimError {
    /// A config error: `what` is the option or value, `problem` what is wrong with it.
    pub fn config(what: impl Into<String>, problem: impl Into<String>) -> SimError {
        SimError::Config(sluice_engine::ConfigError::new(what, problem))
    }
}

impl sluice_engine::Classify for SimError {
    fn class(&self) -> sluice_engine::ErrorClass {
        use sluice_engine::ErrorClass;
        match self {
            SimError::Io { source, .. } => ErrorClass::of_io(source),
            SimError::BadField { .. } | SimError::BadTrace { .. } | SimError::CsvHeader { .. } => {
                ErrorClass::BadTrace
            }
            SimError::Policy(_) | SimError::Config(_) => ErrorClass::Config,
            SimError::Cancelled => ErrorClass::Failed,
        }
    }

    fn errno(&self) -> Option<i32> {
        match self {
            SimError::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// Why a CSV trace's first row stopped the read (see [`SimError::CsvHeader`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderProblem {
    /// `has-header=true`, but every numeric column of the row holds a number.
    LooksLikeData,
    /// `has-header` left out, and no numeric column to judge the row by.
    Undecidable,
}

impl std::fmt::Display for HeaderProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HeaderProblem::LooksLikeData => {
                "looks like a request (its columns are numbers), yet has-header=true would \
                 drop it; pass has-header=false for a file without a header, or leave \
                 has-header out to detect it"
            }
            HeaderProblem::Undecidable => {
                "cannot tell whether it is a header: no column read is numeric (time-col, \
                 size-col, or id-col with numeric ids); pass has-header=true or has-header=false"
            }
        })
    }
}
