//! Why a Python policy failed: [`PythonError`], why one could not be started (each
//! names the policy, `module:Class`, and where one was run, the interpreter, and ends
//! with what to try next), and [`HostError`], how a call to its host process failed.
//! A leaf module, so that [`crate::WarmError`] can carry them.
//!
//! Faults of a policy that did start (an exception in a call, a missed
//! deadline, a bad reply) are not here: they are
//! [`crate::WarmError::Policy`], which the guard turns into "disabled and
//! logged".

use std::fmt;
use std::path::PathBuf;

use serde_json::Value;

use std::process::ExitStatus;

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

/// How a call to the host failed. Each message but [`HostError::Raised`]'s
/// completes "the policy process …".
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The policy raised: its `"Type: message\n<traceback>"`.
    #[error("{message}")]
    Raised { message: String },
    /// It exited (its pipe closed); the status when it was reaped in time.
    #[error("exited{}", status.map(|s| format!(" ({s})")).unwrap_or_default())]
    Exited { status: Option<ExitStatus> },
    /// It closed its input or its input failed, and it has not exited.
    #[error("stopped reading{}", source.as_ref().map(|e| format!(" ({e})")).unwrap_or_default())]
    StoppedReading { source: Option<std::io::Error> },
    /// Its input was closed by us (`Host::finish`).
    #[error("has no input any more")]
    NoInput,
    /// Its output could not be read.
    #[error("cannot be read: {source}")]
    Unreadable { source: std::io::Error },
    /// A reply line longer than `limit_bytes` (64 MiB, the cap on a reply).
    #[error("wrote more than {limit_bytes} bytes without a newline")]
    ReplyTooLong { limit_bytes: usize },
    /// A line that is not JSON; `head` is its first 200 characters.
    #[error("answered {head:?}, which is not JSON: {source}")]
    NotJson {
        head: String,
        source: serde_json::Error,
    },
    /// JSON, but neither `{"ok": ...}` nor `{"error": str}`.
    #[error("answered {reply}, not {{\"ok\": ...}} or {{\"error\": str}}")]
    NotAReply { reply: Value },
    /// The deadline passed while waiting for it to `waiting_for` ("take the
    /// request", "reply").
    #[error("did not {waiting_for} within {timeout_ms} ms and was killed")]
    TimedOut {
        waiting_for: &'static str,
        timeout_ms: u64,
    },
}
