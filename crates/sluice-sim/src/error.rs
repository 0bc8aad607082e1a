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
        problem: crate::trace::csv::HeaderProblem,
    },
    #[error(transparent)]
    Policy(#[from] sluice_policy::PolicyError),
    #[error("{0}")]
    Config(String),
    /// The caller's progress callback asked to stop.
    #[error("cancelled")]
    Cancelled,
}
