//! Errors of the warm plane. Each names the file, template, feature or
//! value at fault.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum WarmError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A template file that is not one, is truncated, corrupt or of another
    /// version.
    #[error("template {path}: {message}")]
    BadTemplate { path: PathBuf, message: String },
    /// Reading, decoding or writing a template failed (see
    /// [`crate::template::TemplateError`]).
    #[error(transparent)]
    Template(#[from] crate::template::TemplateError),
    /// The kernel, file system or privileges lack a feature; callers fall
    /// back and log.
    #[error("{feature} unavailable: {reason}")]
    Unsupported {
        feature: &'static str,
        reason: String,
    },
    #[error("{0}")]
    Config(String),
    /// A policy failed; it is disabled and the application is unaffected.
    #[error("policy {name}: {message}")]
    Policy { name: String, message: String },
}

impl WarmError {
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> WarmError {
        let path = path.into();
        move |source| WarmError::Io { path, source }
    }
}
