//! [`PythonError`]: why a Python policy could not be started. Each names
//! the policy (`module:Class`) and, where one was run, the interpreter, and
//! ends with what to try next.
//!
//! Faults of a policy that did start (an exception in a call, a missed
//! deadline, a bad reply) are not here: they are
//! [`crate::WarmError::Policy`], which the guard turns into "disabled and
//! logged".

use std::fmt;
use std::path::PathBuf;

use serde_json::Value;

use super::HostError;

/// A Python policy that could not be started, or a setting that keeps any
/// from starting.
#[derive(Debug, thiserror::Error)]
pub enum PythonError {
    /// Not of the form `package.module:Class`.
    #[error("policy {spec:?} is not a Python policy of the form package.module:Class")]
    BadSpec { spec: String },
    /// No interpreter was configured, and none of the candidates can import
    /// `sluice.warm_host`.
    #[error(
        "Python policy {spec}: no interpreter can import sluice.warm_host ({}); \
         set SLUICE_PYTHON to a Python with the sluice package",
        join(tried)
    )]
    NoInterpreter {
        spec: String,
        tried: Vec<InterpreterProbe>,
    },
    /// The interpreter could not be run, or its pipes not set up.
    #[error("Python policy {spec}: cannot run {}: {source} (set SLUICE_PYTHON)", python.display())]
    Start {
        spec: String,
        python: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The host ran but failed before `hello`: it exited, or wrote
    /// something that is not a reply.
    #[error(
        "Python policy {spec}: {} -m sluice.warm_host {source} before saying hello \
         (is the sluice package installed for it? set SLUICE_PYTHON)",
        python.display()
    )]
    HostFailed {
        spec: String,
        python: PathBuf,
        #[source]
        source: HostError,
    },
    /// Importing the module or instantiating the class raised: the Python
    /// error, `"Type: message\n<traceback>"`.
    #[error("Python policy {spec}: {message}")]
    Raised { spec: String, message: String },
    /// No `hello` within the start-up deadline.
    #[error(
        "Python policy {spec}: the host did not say hello within {timeout_ms} ms and was \
         killed: is importing it this slow?"
    )]
    HelloTimedOut { spec: String, timeout_ms: u64 },
    /// `hello` was answered with something other than the class name.
    #[error("Python policy {spec}: hello answered {reply}, not the class name")]
    BadHello { spec: String, reply: Value },
    /// An environment variable that does not parse.
    #[error("{name}={value:?} is not {expected}")]
    BadEnv {
        name: &'static str,
        value: String,
        expected: &'static str,
    },
}

/// A candidate interpreter that could not import `sluice.warm_host`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterpreterProbe {
    pub python: PathBuf,
    /// The last line of its stderr (the `ImportError`), or why it could not
    /// be run.
    pub failure: String,
}

impl fmt::Display for InterpreterProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.python.display(), self.failure)
    }
}

fn join(tried: &[InterpreterProbe]) -> String {
    let tried: Vec<String> = tried.iter().map(ToString::to_string).collect();
    tried.join("; ")
}
