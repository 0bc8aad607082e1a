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
    /// A bad option, named with its value and what it must be.
    #[error(transparent)]
    BadOption(#[from] WarmConfigError),
    /// `sluice warm trigger` with no runtime to send to.
    #[error("no warm runtime is running (see sluice warm status)")]
    NoRuntime,
    /// `sluice warm trigger` without `--pid` while several runtimes run.
    #[error("{} runtimes are running (pids {}): choose one by its pid (--pid, pid=)", pids.len(), join(pids))]
    SeveralRuntimes { pids: Vec<i32> },
    /// A trigger the runtime would refuse (a path outside its model, a file
    /// not there, an offset past the end).
    #[error("trigger for the runtime of pid {pid}: {message}")]
    BadTrigger { pid: i32, message: String },
    /// No runtime listens on the trigger pipe of `pid`.
    #[error("no warm runtime of pid {pid} listens on {pipe} (see sluice warm status)")]
    RuntimeGone { pid: i32, pipe: PathBuf },
    /// A model directory with no files to serve.
    #[error("{dir}: no model files in it")]
    NoModelFiles { dir: PathBuf },
    /// A value the OS layer cannot take (a NUMA map, a cgroup name, a
    /// watermark), named with what it must be.
    #[error(transparent)]
    InvalidArgument(sluice_engine::OsError),
    /// The service command could not be started: not found, not
    /// executable, not a program.
    #[error("{program}: cannot start the service: {source}")]
    Launch {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `run` or `record` without a command to launch.
    #[error("no service command given (put it after --)")]
    NoCommand,
    /// A policy failed; it is disabled and the application is unaffected.
    #[error("policy {name}: {message}")]
    Policy { name: String, message: String },
    /// A Python policy could not be started (see
    /// [`crate::python_error::PythonError`]).
    #[error(transparent)]
    Python(#[from] crate::python_error::PythonError),
}

/// The OS layer's errors keep their meaning here: a failed call on a file
/// is [`WarmError::Io`], a missing feature [`WarmError::Unsupported`], and
/// an argument the kernel interface cannot take a bad option.
/// A bad option: which one, the value given and what it must be.
#[derive(Debug, thiserror::Error)]
pub enum WarmConfigError {
    #[error("--{option} {value}: {expected}")]
    Invalid {
        option: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("the {policy} policy needs --{option}: {why}")]
    Missing {
        policy: &'static str,
        option: &'static str,
        why: &'static str,
    },
    #[error("unknown policy {name:?}: use one of {known}, or module:Class for a Python policy")]
    UnknownPolicy { name: String, known: String },
    #[error("${name}={value:?}: {expected}")]
    Env {
        name: &'static str,
        value: String,
        expected: &'static str,
    },
}

impl From<sluice_engine::OsError> for WarmError {
    fn from(err: sluice_engine::OsError) -> WarmError {
        use sluice_engine::OsError;
        match err {
            OsError::Io { path, source } => WarmError::Io { path, source },
            OsError::Unsupported { feature, reason } => WarmError::Unsupported { feature, reason },
            invalid @ OsError::InvalidArgument { .. } => WarmError::InvalidArgument(invalid),
        }
    }
}

impl WarmError {
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> WarmError {
        let path = path.into();
        move |source| WarmError::Io { path, source }
    }
}

/// Pids as a comma-separated list, for messages.
fn join(pids: &[i32]) -> String {
    let pids: Vec<String> = pids.iter().map(i32::to_string).collect();
    pids.join(", ")
}

impl sluice_engine::Classify for WarmError {
    fn class(&self) -> sluice_engine::ErrorClass {
        use sluice_engine::ErrorClass;
        match self {
            WarmError::Io { source, .. } => ErrorClass::of_io(source),
            WarmError::Template(e) => e.class(),
            WarmError::NoModelFiles { .. } => ErrorClass::BadHeader,
            WarmError::BadOption(_)
            | WarmError::InvalidArgument(_)
            | WarmError::BadTrigger { .. }
            | WarmError::NoCommand
            | WarmError::Python(_) => ErrorClass::Config,
            WarmError::NoRuntime | WarmError::SeveralRuntimes { .. } => ErrorClass::NoRuntime,
            WarmError::RuntimeGone { .. } => ErrorClass::RuntimeGone,
            WarmError::Unsupported { .. } | WarmError::Policy { .. } | WarmError::Launch { .. } => {
                ErrorClass::Failed
            }
        }
    }

    fn errno(&self) -> Option<i32> {
        match self {
            WarmError::Io { source, .. } | WarmError::Launch { source, .. } => {
                source.raw_os_error()
            }
            WarmError::Template(e) => e.errno(),
            _ => None,
        }
    }
}

impl sluice_engine::Classify for crate::template::TemplateError {
    fn class(&self) -> sluice_engine::ErrorClass {
        use crate::template::TemplateError;
        use sluice_engine::ErrorClass;
        match self {
            TemplateError::Io { source, .. } => ErrorClass::of_io(source),
            TemplateError::ModelPath(_) => ErrorClass::BadPath,
            // A template that no longer matches its model (a file gone or resized, another
            // service's) or does not decode: record the service again.
            _ => ErrorClass::BadStore,
        }
    }

    fn errno(&self) -> Option<i32> {
        match self {
            crate::template::TemplateError::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use sluice_formats::template::RelativePathError;

    use super::*;
    use crate::template::TemplateError;

    #[test]
    fn relative_path_errors_become_warm_errors_naming_the_file() {
        let err =
            crate::template::relative_path(Path::new("/models/llama"), Path::new("/etc/passwd"))
                .map_err(WarmError::from)
                .unwrap_err();
        assert!(
            matches!(
                &err,
                WarmError::Template(TemplateError::ModelPath(
                    RelativePathError::OutsideModelDir { .. }
                ))
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("/etc/passwd"), "{err}");
    }
}
