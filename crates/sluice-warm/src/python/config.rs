//! [`PythonConfig`]: how a Python policy's host is started, its deadlines,
//! and the environment's overrides of them (read in
//! [`PythonConfig::from_env`] alone, each one logged).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::python_error::PythonError;

/// 500 ms: far above a policy's honest cost per call (a dict lookup and a
/// few objects, tens of µs plus a pipe round trip), short enough that a
/// stuck policy is noticed while the model is still loading.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_millis(500);

/// 30 s for start-up and `hello`: the import of the policy's module, which
/// may pull in torch or numpy.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// The interpreter, overriding the search of [`super::default_interpreters`].
const PYTHON_VAR: &str = "SLUICE_PYTHON";
/// The call deadline in milliseconds.
const CALL_TIMEOUT_VAR: &str = "SLUICE_PY_POLICY_TIMEOUT_MS";

/// How Python policies are started.
#[derive(Clone, Debug)]
pub struct PythonConfig {
    /// The interpreter. `None` (the default): search for one, `python3`
    /// first, then the checkout's `.venv/bin/python` next to this binary,
    /// and take the first that can import `sluice.warm_host`; the search
    /// lets a plain install and a development checkout work unconfigured.
    pub python: Option<PathBuf>,
    /// The deadline of each call after start-up ([`DEFAULT_CALL_TIMEOUT`]).
    pub call_timeout: Duration,
    /// The deadline of start-up and `hello`, the module's import
    /// ([`DEFAULT_STARTUP_TIMEOUT`]).
    pub startup_timeout: Duration,
    /// Directories put before `$PYTHONPATH` for the host. Empty by
    /// default: the host sees the `$PYTHONPATH` this process was given.
    pub python_path: Vec<PathBuf>,
}

impl Default for PythonConfig {
    fn default() -> PythonConfig {
        PythonConfig {
            python: None,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            python_path: Vec::new(),
        }
    }
}

impl PythonConfig {
    /// The defaults with the environment's overrides, logged:
    /// `$SLUICE_PYTHON` (the interpreter) and `$SLUICE_PY_POLICY_TIMEOUT_MS`
    /// (the call deadline, a positive integer).
    pub fn from_env() -> Result<PythonConfig, PythonError> {
        PythonConfig::from_vars(|name| std::env::var_os(name))
    }

    /// [`PythonConfig::from_env`] over any variable lookup.
    pub(super) fn from_vars(
        var: impl Fn(&str) -> Option<OsString>,
    ) -> Result<PythonConfig, PythonError> {
        let mut config = PythonConfig::default();
        if let Some(python) = var(PYTHON_VAR) {
            tracing::info!(python = %Path::new(&python).display(), "{PYTHON_VAR}");
            config.python = Some(PathBuf::from(python));
        }
        if let Some(raw) = var(CALL_TIMEOUT_VAR) {
            let text = raw.to_string_lossy();
            let ms = text.trim().parse::<u64>().ok().filter(|ms| *ms > 0);
            let Some(ms) = ms else {
                return Err(PythonError::BadEnv {
                    name: CALL_TIMEOUT_VAR,
                    value: text.into_owned(),
                    expected: "a positive number of milliseconds",
                });
            };
            tracing::info!(ms, "{CALL_TIMEOUT_VAR}");
            config.call_timeout = Duration::from_millis(ms);
        }
        Ok(config)
    }

    /// The host's `$PYTHONPATH`: [`PythonConfig::python_path`] before the
    /// inherited one, which the host must still see (it is how a policy
    /// outside site-packages is found), so it is passed on, not overridden.
    pub(super) fn host_python_path(&self) -> OsString {
        let inherited = std::env::var_os("PYTHONPATH");
        let paths = self
            .python_path
            .iter()
            .cloned()
            .chain(inherited.iter().flat_map(std::env::split_paths));
        std::env::join_paths(paths).unwrap_or_default()
    }
}
