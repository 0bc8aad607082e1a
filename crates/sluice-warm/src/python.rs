//! Policies written in Python (`--policy mypkg.mymod:MyPolicy`), run in a
//! child process so that nothing they do can reach the service.
//!
//! **Isolation.** The class runs inside `python -m sluice.warm_host
//! module:Class`, not in this process: an exception, a hang, a crash, a
//! stray `print` or garbage on the pipe stays there. Each call has a
//! deadline (500 ms, `SLUICE_PY_POLICY_TIMEOUT_MS`); a Python exception,
//! a missed deadline, an exited host, a reply that is not JSON or has a bad
//! field, or a range on a file that is not a model file, all become
//! [`WarmError::Policy`](crate::WarmError::Policy), which
//! [`crate::policy::Guarded`] turns into "disabled and logged". The host is killed (its whole process group) on
//! the first fault, and when the policy is dropped. Since the runtime
//! answers every permission event before it asks the policy, a stuck
//! policy costs prefetching at most one deadline, never a reader.
//!
//! **Protocol.** JSON lines, one request on the host's stdin, one reply on
//! its stdout, in turn (the Python docstring of `sluice.warm_host` is the
//! other copy of this table):
//!
//! | request | reply `ok` |
//! |---|---|
//! | `{"call": "hello"}` | the class name |
//! | `{"call": "init", "ctx": {"model_dir": str, "files": [[path, size], ...], "memory_limited": bool}}` | prefetches |
//! | `{"call": "wait_for_init"}` | bool |
//! | `{"call": "on_access", "event": {"pid": int, "worker": int\|null, "path": str, "offset": int, "len": int, "kind": "open"\|"read"\|"mmap"\|"progress"\|"explicit"}}` | prefetches |
//! | `{"call": "evict", "event": {...}\|null}` | evictions |
//! | `{"call": "exit"}` | `null` |
//!
//! A reply is `{"ok": value}`, or `{"error": "Type: message\n<traceback>"}`
//! when the policy raised. A prefetch is `{"stream": int, "path": str,
//! "offset": int, "len": int, "target": {"accelerator": n}|{"numa": n}|null}`
//! (`stream` and `target` optional); an eviction is `{"path", "offset",
//! "len"}`. Paths are absolute and must be model files from `ctx.files`: a
//! policy must not make the runtime touch other files.
//!
//! **Start-up.** [`spawn`] starts the host and waits for `hello`, so a
//! missing module or class fails `sluice warm run` before the service is
//! launched: a [`PythonError`] (carrying the Python error when there is
//! one), which the runtime sees as [`WarmError::Python`](crate::WarmError::Python)
//! and the CLI as a bad option. The import gets 30 s, not the call
//! deadline: importing torch alone takes seconds.
//!
//! **Parts.**
//! - [`PythonConfig`] (`python/config.rs`): the interpreter, the deadlines,
//!   and their environment overrides;
//! - `Host` (`python/host.rs`): the child process, a call with a deadline
//!   (`poll(2)` on the non-blocking pipe plus a line buffer: no thread per
//!   policy), killing its process group;
//! - `protocol` (`python/protocol.rs`): events as JSON, replies decoded and
//!   checked field by field;
//! - [`PythonPolicy`] (`python/python_policy.rs`): the
//!   [`WarmPolicy`](crate::policy::WarmPolicy) over a host;
//! - [`PythonError`] (`python_error.rs`): why a policy did not start.

mod config;
mod host;
mod protocol;
mod python_policy;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

pub use crate::python_error::{HostError, InterpreterProbe, PythonError};
pub use config::{PythonConfig, DEFAULT_CALL_TIMEOUT, DEFAULT_STARTUP_TIMEOUT};
pub use python_policy::PythonPolicy;

use host::Host;

/// Starts the Python policy `spec` (`package.module:Class`) with the
/// environment's settings ([`PythonConfig::from_env`]); `python` overrides
/// the interpreter.
pub fn spawn(spec: &str, python: Option<PathBuf>) -> Result<PythonPolicy, PythonError> {
    let mut config = PythonConfig::from_env()?;
    if python.is_some() {
        config.python = python;
    }
    spawn_with(spec, &config)
}

/// Starts the Python policy `spec` and waits for its `hello`. Errors: a
/// malformed spec, no interpreter that can run `sluice.warm_host`, or the
/// Python error of importing or instantiating the class.
pub fn spawn_with(spec: &str, config: &PythonConfig) -> Result<PythonPolicy, PythonError> {
    validate_spec(spec)?;
    let python = interpreter(spec, config)?;
    let mut host = Host::start(&python, spec, config).map_err(|source| PythonError::Start {
        spec: spec.to_string(),
        python: python.clone(),
        source,
    })?;
    let class = match host.call(&json!({"call": "hello"}), config.startup_timeout) {
        Ok(Value::String(class)) => class,
        Ok(reply) => {
            let spec = spec.to_string();
            return Err(PythonError::BadHello { spec, reply });
        }
        Err(err) => return Err(hello_failed(spec, python, err)),
    };
    tracing::info!(policy = spec, python = %python.display(), "Python policy started");
    Ok(PythonPolicy::new(spec, class, host, config.call_timeout))
}

/// Why the host did not say hello: the Python error, the start-up
/// deadline, or a host that exited or wrote garbage.
fn hello_failed(spec: &str, python: PathBuf, err: HostError) -> PythonError {
    let spec = spec.to_string();
    match err {
        HostError::Raised { message } => PythonError::Raised { spec, message },
        HostError::TimedOut { timeout_ms, .. } => PythonError::HelloTimedOut { spec, timeout_ms },
        source => PythonError::HostFailed {
            spec,
            python,
            source,
        },
    }
}

/// Checks the `a.b:C` form: a dotted module path of identifiers, a colon,
/// and a (possibly dotted) class name.
pub fn validate_spec(spec: &str) -> Result<(), PythonError> {
    let dotted = |s: &str| {
        s.split('.').all(|part| {
            let mut chars = part.chars();
            chars.next().is_some_and(|c| c == '_' || c.is_alphabetic())
                && chars.all(|c| c == '_' || c.is_alphanumeric())
        })
    };
    match spec.split_once(':') {
        Some((module, class)) if dotted(module) && dotted(class) => Ok(()),
        _ => Err(PythonError::BadSpec {
            spec: spec.to_string(),
        }),
    }
}

/// Interpreters to try when none is configured: `python3`, then the
/// checkout's `.venv/bin/python` when this binary was built in
/// `target/{debug,release}`.
pub fn default_interpreters() -> Vec<PathBuf> {
    let mut candidates = vec![PathBuf::from("python3")];
    let venv = std::env::current_exe().ok().and_then(|exe| {
        let checkout = exe.parent()?.parent()?.parent()?;
        Some(checkout.join(".venv/bin/python"))
    });
    candidates.extend(venv.filter(|p| p.is_file()));
    candidates
}

/// The configured interpreter; else the first candidate that can import
/// `sluice.warm_host` (probed, so a `python3` without the package does not
/// print its ImportError when the checkout's venv has it).
fn interpreter(spec: &str, config: &PythonConfig) -> Result<PathBuf, PythonError> {
    if let Some(python) = &config.python {
        return Ok(python.clone());
    }
    let mut tried = Vec::new();
    for python in default_interpreters() {
        match probe(&python, config) {
            Ok(()) => return Ok(python),
            Err(failure) => tried.push(InterpreterProbe { python, failure }),
        }
    }
    Err(PythonError::NoInterpreter {
        spec: spec.to_string(),
        tried,
    })
}

/// Whether `python` can import `sluice.warm_host`; if not, the last line of
/// its stderr (the ImportError) or why it did not run.
fn probe(python: &Path, config: &PythonConfig) -> Result<(), String> {
    let out = Command::new(python)
        .args(["-c", "import sluice.warm_host"])
        .env("PYTHONPATH", config.host_python_path())
        .stdin(Stdio::null())
        .output()
        .map_err(|err| err.to_string())?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    Err(stderr.lines().last().unwrap_or("failed").trim().to_string())
}
