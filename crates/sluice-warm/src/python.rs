//! Policies written in Python (`--policy mypkg.mymod:MyPolicy`), run in a
//! child process so that nothing they do can reach the service.
//!
//! **Isolation.** The class runs inside `python -m sluice.warm_host
//! module:Class`, not in this process: an exception, a hang, a crash, a
//! stray `print` or garbage on the pipe stays there. Each call has a
//! deadline (500 ms, `SLUICE_PY_POLICY_TIMEOUT_MS`); a Python exception,
//! a missed deadline, an exited host, a reply that is not JSON or has a bad
//! field, or a range on a file that is not a model file, all become
//! [`WarmError::Policy`], which [`crate::policy::Guarded`] turns into
//! "disabled and logged". The host is killed (its whole process group) on
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
//! launched (a [`WarmError::Config`] carrying the Python error). The import
//! gets 30 s, not the call deadline: importing torch alone takes seconds.
//! `wait_for_init` is asked once, right after `init`, because the trait's
//! [`WarmPolicy::wait_for_init`] cannot fail.
//!
//! Reading with a deadline is `poll(2)` on the non-blocking pipe plus a
//! line buffer: no thread per policy.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use crate::error::WarmError;
use crate::policy::{
    AccessEvent, AccessKind, FileRange, PolicyContext, Prefetch, Target, WarmPolicy,
};

/// 500 ms: far above a policy's honest cost per call (a dict lookup and a
/// few objects, tens of µs plus a pipe round trip), short enough that a
/// stuck policy is noticed while the model is still loading.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_millis(500);

/// 30 s for start-up and `hello`: the import of the policy's module, which
/// may pull in torch or numpy.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// A reply longer than this is garbage, not a plan (a million prefetches
/// are about 100 MiB of JSON; no policy needs that many per event).
const MAX_REPLY_BYTES: usize = 64 << 20;

/// How Python policies are started.
#[derive(Clone, Debug)]
pub struct PythonConfig {
    /// The interpreter. `None`: `python3`, then the checkout's
    /// `.venv/bin/python` next to this binary, whichever can import
    /// `sluice.warm_host`.
    pub python: Option<PathBuf>,
    /// The deadline of each call after start-up.
    pub call_timeout: Duration,
    /// The deadline of start-up and `hello` (the module's import).
    pub startup_timeout: Duration,
    /// Directories put before `$PYTHONPATH` for the host.
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
    pub fn from_env() -> Result<PythonConfig, WarmError> {
        PythonConfig::from_vars(|name| std::env::var_os(name))
    }

    /// [`PythonConfig::from_env`] over any variable lookup.
    fn from_vars(var: impl Fn(&str) -> Option<OsString>) -> Result<PythonConfig, WarmError> {
        let mut config = PythonConfig::default();
        if let Some(python) = var("SLUICE_PYTHON") {
            tracing::info!(python = %Path::new(&python).display(), "SLUICE_PYTHON");
            config.python = Some(PathBuf::from(python));
        }
        if let Some(raw) = var("SLUICE_PY_POLICY_TIMEOUT_MS") {
            let text = raw.to_string_lossy();
            let ms = text.trim().parse::<u64>().ok().filter(|ms| *ms > 0);
            let Some(ms) = ms else {
                return Err(WarmError::Config(format!(
                    "SLUICE_PY_POLICY_TIMEOUT_MS={text:?} is not a positive number of milliseconds"
                )));
            };
            tracing::info!(ms, "SLUICE_PY_POLICY_TIMEOUT_MS");
            config.call_timeout = Duration::from_millis(ms);
        }
        Ok(config)
    }
}

/// Starts the Python policy `spec` (`package.module:Class`) with the
/// environment's settings ([`PythonConfig::from_env`]); `python` overrides
/// the interpreter.
pub fn spawn(spec: &str, python: Option<PathBuf>) -> Result<PythonPolicy, WarmError> {
    let mut config = PythonConfig::from_env()?;
    if python.is_some() {
        config.python = python;
    }
    spawn_with(spec, &config)
}

/// Starts the Python policy `spec` and waits for its `hello`. Errors
/// ([`WarmError::Config`]): a malformed spec, no interpreter that can run
/// `sluice.warm_host`, or the Python error of importing or instantiating
/// the class.
pub fn spawn_with(spec: &str, config: &PythonConfig) -> Result<PythonPolicy, WarmError> {
    validate_spec(spec)?;
    let python = interpreter(spec, config)?;
    let mut host = Host::start(&python, spec, config)
        .map_err(|e| WarmError::Config(format!("Python policy {spec}: {e}")))?;
    let class = match host.call(&json!({"call": "hello"}), config.startup_timeout) {
        Ok(Value::String(class)) => class,
        Ok(other) => {
            return Err(WarmError::Config(format!(
                "Python policy {spec}: hello answered {other}, not the class name"
            )))
        }
        Err(HostError::Raised(message)) => {
            return Err(WarmError::Config(format!(
                "Python policy {spec}: {message}"
            )))
        }
        Err(HostError::TimedOut(message)) => {
            return Err(WarmError::Config(format!(
                "Python policy {spec}: the host {message}: is importing it this slow?"
            )))
        }
        Err(HostError::Broken(message)) => {
            return Err(WarmError::Config(format!(
                "Python policy {spec}: {} -m sluice.warm_host {message} before saying hello \
                 (is the sluice package installed for it? set SLUICE_PYTHON)",
                python.display()
            )))
        }
    };
    tracing::info!(policy = spec, python = %python.display(), "Python policy started");
    Ok(PythonPolicy {
        spec: spec.to_string(),
        class,
        host: Some(host),
        fault: None,
        call_timeout: config.call_timeout,
        files: HashMap::new(),
        wait_for_init: false,
    })
}

/// Checks the `a.b:C` form: a dotted module path of identifiers, a colon,
/// and a (possibly dotted) class name.
pub fn validate_spec(spec: &str) -> Result<(), WarmError> {
    let dotted = |s: &str| {
        s.split('.').all(|part| {
            let mut chars = part.chars();
            chars.next().is_some_and(|c| c == '_' || c.is_alphabetic())
                && chars.all(|c| c == '_' || c.is_alphanumeric())
        })
    };
    match spec.split_once(':') {
        Some((module, class)) if dotted(module) && dotted(class) => Ok(()),
        _ => Err(WarmError::Config(format!(
            "policy {spec:?} is not a Python policy of the form package.module:Class"
        ))),
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
fn interpreter(spec: &str, config: &PythonConfig) -> Result<PathBuf, WarmError> {
    if let Some(python) = &config.python {
        return Ok(python.clone());
    }
    let mut failures = Vec::new();
    for python in default_interpreters() {
        let probe = Command::new(&python)
            .args(["-c", "import sluice.warm_host"])
            .env("PYTHONPATH", python_path(config))
            .stdin(Stdio::null())
            .output();
        match probe {
            Ok(out) if out.status.success() => return Ok(python),
            Ok(out) => {
                let stderr = String::from_utf8_lossy(&out.stderr);
                let last = stderr.lines().last().unwrap_or("failed").trim().to_string();
                failures.push(format!("{}: {last}", python.display()));
            }
            Err(err) => failures.push(format!("{}: {err}", python.display())),
        }
    }
    Err(WarmError::Config(format!(
        "Python policy {spec}: no interpreter can import sluice.warm_host ({}); \
         set SLUICE_PYTHON to a Python with the sluice package",
        failures.join("; ")
    )))
}

/// `config.python_path` before the inherited `$PYTHONPATH`.
fn python_path(config: &PythonConfig) -> OsString {
    let inherited = std::env::var_os("PYTHONPATH");
    let paths = config
        .python_path
        .iter()
        .cloned()
        .chain(inherited.iter().flat_map(std::env::split_paths));
    std::env::join_paths(paths).unwrap_or_default()
}

/// A policy served by a `sluice.warm_host` child process.
pub struct PythonPolicy {
    spec: String,
    class: String,
    /// `None` after a fault or `exit`: the host was killed or has ended.
    host: Option<Host>,
    /// Why the host is gone, when a fault ended it.
    fault: Option<String>,
    call_timeout: Duration,
    /// The model files a range may name: the path as the policy sees it
    /// (lossy UTF-8) → the real path.
    files: HashMap<PathBuf, PathBuf>,
    wait_for_init: bool,
}

impl PythonPolicy {
    /// The Python class's name, as the host reported it.
    pub fn class_name(&self) -> &str {
        &self.class
    }

    /// The deadline of each call.
    pub fn call_timeout(&self) -> Duration {
        self.call_timeout
    }

    /// One round trip; `parse` checks the `ok` value. Any fault kills the
    /// host, and every later call fails at once.
    fn request<T>(
        &mut self,
        request: Value,
        parse: impl FnOnce(Value, &HashMap<PathBuf, PathBuf>) -> Result<T, String>,
    ) -> Result<T, WarmError> {
        let outcome = match self.host.as_mut() {
            None => Err(format!(
                "the policy process is gone ({})",
                self.fault.as_deref().unwrap_or("exited")
            )),
            Some(host) => match host.call(&request, self.call_timeout) {
                Ok(value) => parse(value, &self.files).map_err(|e| format!("bad reply: {e}")),
                Err(HostError::Raised(message)) => Err(message),
                Err(HostError::Broken(message)) => Err(format!("the policy process {message}")),
                Err(HostError::TimedOut(message)) => Err(format!(
                    "the policy process {message} (SLUICE_PY_POLICY_TIMEOUT_MS)"
                )),
            },
        };
        outcome.map_err(|message| {
            if let Some(host) = self.host.take() {
                drop(host);
                self.fault = Some(message.clone());
            }
            WarmError::Policy {
                name: self.spec.clone(),
                message,
            }
        })
    }
}

impl WarmPolicy for PythonPolicy {
    fn name(&self) -> &str {
        &self.spec
    }

    fn init(&mut self, ctx: &PolicyContext) -> Result<Vec<Prefetch>, WarmError> {
        self.files = ctx
            .files
            .iter()
            .map(|(path, _)| (PathBuf::from(lossy(path)), path.clone()))
            .collect();
        let files: Vec<Value> = ctx
            .files
            .iter()
            .map(|(path, size)| json!([lossy(path), size]))
            .collect();
        let request = json!({"call": "init", "ctx": {
            "model_dir": lossy(&ctx.model_dir),
            "files": files,
            "memory_limited": ctx.memory_limited,
        }});
        let prefetches = self.request(request, parse_prefetches)?;
        self.wait_for_init = self.request(json!({"call": "wait_for_init"}), |v, _| match v {
            Value::Bool(b) => Ok(b),
            other => Err(format!("wait_for_init answered {other}, not a bool")),
        })?;
        Ok(prefetches)
    }

    fn wait_for_init(&self) -> bool {
        self.wait_for_init
    }

    fn on_access(&mut self, event: &AccessEvent) -> Result<Vec<Prefetch>, WarmError> {
        let request = json!({"call": "on_access", "event": event_json(event)});
        self.request(request, parse_prefetches)
    }

    fn evict(&mut self, event: Option<&AccessEvent>) -> Result<Vec<FileRange>, WarmError> {
        let request = json!({"call": "evict", "event": event.map(event_json)});
        self.request(request, parse_evictions)
    }

    fn exit(&mut self) -> Result<(), WarmError> {
        let outcome = self.request(json!({"call": "exit"}), |v, _| match v {
            Value::Null => Ok(()),
            other => Err(format!("exit answered {other}, not null")),
        });
        if let Some(host) = self.host.take() {
            host.finish(self.call_timeout);
        }
        outcome
    }
}

fn lossy(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

fn event_json(event: &AccessEvent) -> Value {
    let kind = match event.kind {
        AccessKind::Open => "open",
        AccessKind::Read => "read",
        AccessKind::Mmap => "mmap",
        AccessKind::Progress => "progress",
        AccessKind::Explicit => "explicit",
    };
    json!({
        "pid": event.pid,
        "worker": event.worker,
        "path": lossy(&event.path),
        "offset": event.offset,
        "len": event.len,
        "kind": kind,
    })
}

fn parse_prefetches(
    value: Value,
    files: &HashMap<PathBuf, PathBuf>,
) -> Result<Vec<Prefetch>, String> {
    parse_list(value, "prefetch", |item| {
        let range = parse_range(item, files, &["stream", "target"])?;
        let stream = match item.get("stream") {
            None | Some(Value::Null) => 0,
            Some(_) => uint(item, "stream")?,
        };
        let target = match item.get("target") {
            None | Some(Value::Null) => Target::Any,
            Some(Value::Object(t)) if t.len() == 1 && t.contains_key("accelerator") => {
                Target::Accelerator(uint(t, "accelerator")?)
            }
            Some(Value::Object(t)) if t.len() == 1 && t.contains_key("numa") => {
                Target::NumaNode(uint(t, "numa")?)
            }
            Some(other) => {
                return Err(format!(
                    "target {other} is not {{\"accelerator\": n}}, {{\"numa\": n}} or null"
                ))
            }
        };
        Ok(Prefetch {
            stream,
            range: range.with_target(target),
        })
    })
}

fn parse_evictions(
    value: Value,
    files: &HashMap<PathBuf, PathBuf>,
) -> Result<Vec<FileRange>, String> {
    parse_list(value, "eviction", |item| parse_range(item, files, &[]))
}

fn parse_list<T>(
    value: Value,
    what: &str,
    parse: impl Fn(&Map<String, Value>) -> Result<T, String>,
) -> Result<Vec<T>, String> {
    let Value::Array(items) = value else {
        return Err(format!("expected a list of {what} objects, got {value}"));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::Object(map) => parse(map).map_err(|e| format!("{what} {i}: {e}")),
            other => Err(format!("{what} {i}: {other} is not an object")),
        })
        .collect()
}

/// `{path, offset, len}` plus the `extra` keys the caller reads; any other
/// key is a fault (a misspelt field must not be ignored silently).
fn parse_range(
    item: &Map<String, Value>,
    files: &HashMap<PathBuf, PathBuf>,
    extra: &[&str],
) -> Result<FileRange, String> {
    if let Some(key) = item
        .keys()
        .find(|k| !["path", "offset", "len"].contains(&k.as_str()) && !extra.contains(&k.as_str()))
    {
        return Err(format!("unknown field {key:?}"));
    }
    let Some(Value::String(path)) = item.get("path") else {
        return Err(format!(
            "\"path\" must be a string, got {}",
            item.get("path").unwrap_or(&Value::Null)
        ));
    };
    let given = Path::new(path);
    if !given.is_absolute() {
        return Err(format!("path {path:?} is not absolute"));
    }
    let Some(real) = files.get(given) else {
        return Err(format!("path {path:?} is not one of the model files"));
    };
    Ok(FileRange::new(
        real.clone(),
        uint(item, "offset")?,
        uint(item, "len")?,
    ))
}

/// A non-negative integer field that fits `T`.
fn uint<T: TryFrom<u64>>(map: &Map<String, Value>, key: &str) -> Result<T, String> {
    let value = map.get(key).unwrap_or(&Value::Null);
    value
        .as_u64()
        .and_then(|n| T::try_from(n).ok())
        .ok_or_else(|| format!("{key:?} must be a non-negative integer in range, got {value}"))
}

/// How a call to the host failed.
#[derive(Debug)]
enum HostError {
    /// The policy raised: its `"Type: message\n<traceback>"`.
    Raised(String),
    /// No usable reply: it exited, or wrote something that is not one. The message completes
    /// "the policy process …".
    Broken(String),
    /// The deadline passed; the message completes "the policy process …".
    TimedOut(String),
}

/// The `sluice.warm_host` child and its pipes (non-blocking on our side).
struct Host {
    child: Child,
    /// `None` once closed (`finish`), so the host sees end of input.
    stdin: Option<ChildStdin>,
    stdout: ChildStdout,
    /// Bytes read past the last complete line.
    buffer: Vec<u8>,
}

impl Host {
    fn start(python: &Path, spec: &str, config: &PythonConfig) -> Result<Host, String> {
        let mut child = Command::new(python)
            .args(["-m", "sluice.warm_host", spec])
            .env("PYTHONPATH", python_path(config))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // Its own process group: a terminal's Ctrl-C reaches the runtime,
            // which stops the policy in order, and a kill takes the policy's
            // own children with it.
            .process_group(0)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e} (set SLUICE_PYTHON)", python.display()))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err("the interpreter's pipes were not set up".into());
        };
        for fd in [stdin.as_raw_fd(), stdout.as_raw_fd()] {
            if let Err(e) = set_nonblocking(fd) {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("making its pipe non-blocking: {e}"));
            }
        }
        Ok(Host {
            child,
            stdin: Some(stdin),
            stdout,
            buffer: Vec::new(),
        })
    }

    /// Sends `request` and returns the reply's `ok` value, within `timeout`.
    fn call(&mut self, request: &Value, timeout: Duration) -> Result<Value, HostError> {
        let deadline = Instant::now() + timeout;
        let mut line = request.to_string().into_bytes();
        line.push(b'\n');
        self.write_all(&line, deadline, timeout)?;
        let reply = self.read_line(deadline, timeout)?;
        let reply: Value = serde_json::from_slice(&reply).map_err(|e| {
            let text = String::from_utf8_lossy(&reply);
            let head: String = text.trim_end().chars().take(200).collect();
            HostError::Broken(format!("answered {head:?}, which is not JSON: {e}"))
        })?;
        match reply {
            Value::Object(mut map) if map.len() == 1 => {
                if let Some(value) = map.remove("ok") {
                    return Ok(value);
                }
                match map.remove("error") {
                    Some(Value::String(message)) => Err(HostError::Raised(message)),
                    _ => Err(HostError::Broken(format!(
                        "answered {}, not {{\"ok\": ...}} or {{\"error\": str}}",
                        Value::Object(map)
                    ))),
                }
            }
            other => Err(HostError::Broken(format!(
                "answered {other}, not {{\"ok\": ...}} or {{\"error\": str}}"
            ))),
        }
    }

    fn write_all(
        &mut self,
        mut bytes: &[u8],
        deadline: Instant,
        timeout: Duration,
    ) -> Result<(), HostError> {
        let Some(stdin) = self.stdin.as_mut() else {
            return Err(HostError::Broken("has no input any more".into()));
        };
        while !bytes.is_empty() {
            match stdin.write(bytes) {
                Ok(0) => return Err(self.gone("stopped reading")),
                Ok(n) => bytes = &bytes[n..],
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if !wait_for(stdin.as_raw_fd(), libc::POLLOUT, deadline) {
                        return Err(timed_out(timeout, "take the request"));
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.gone(&format!("stopped reading ({e})"))),
            }
        }
        Ok(())
    }

    fn read_line(&mut self, deadline: Instant, timeout: Duration) -> Result<Vec<u8>, HostError> {
        let mut chunk = [0u8; 16 << 10];
        let mut scanned = 0;
        loop {
            if let Some(at) = self.buffer[scanned..].iter().position(|&b| b == b'\n') {
                return Ok(self.buffer.drain(..=scanned + at).collect());
            }
            scanned = self.buffer.len();
            if self.buffer.len() > MAX_REPLY_BYTES {
                return Err(HostError::Broken(format!(
                    "wrote more than {MAX_REPLY_BYTES} bytes without a newline"
                )));
            }
            match self.stdout.read(&mut chunk) {
                Ok(0) => return Err(self.gone("exited")),
                Ok(n) => self.buffer.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if !wait_for(self.stdout.as_raw_fd(), libc::POLLIN, deadline) {
                        return Err(timed_out(timeout, "reply"));
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(HostError::Broken(format!("cannot be read: {e}"))),
            }
        }
    }

    /// "exited (status N)" when it has, within a moment; `what` otherwise.
    fn gone(&mut self, what: &str) -> HostError {
        let deadline = Instant::now() + Duration::from_millis(100);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return HostError::Broken(format!("exited ({status})"));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        HostError::Broken(what.to_string())
    }

    /// Closes the host's input and gives it `grace` to exit; then kills it.
    fn finish(mut self, grace: Duration) {
        self.stdin = None;
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        // Drop kills it.
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // Only while it is unreaped is its pid surely still our group's id.
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: kill(2) has no memory effects; a negative pid names the
            // process group the host leads (`process_group(0)`).
            unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
            let _ = self.child.wait();
        }
    }
}

fn timed_out(timeout: Duration, what: &str) -> HostError {
    HostError::TimedOut(format!(
        "did not {what} within {} ms and was killed",
        timeout.as_millis()
    ))
}

fn set_nonblocking(fd: i32) -> std::io::Result<()> {
    // SAFETY: fcntl on a descriptor we own, with integer arguments only.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Waits until `fd` is ready for `events` (or hung up); false when the
/// deadline passed first.
fn wait_for(fd: i32, events: libc::c_short, deadline: Instant) -> bool {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        // Rounded up, so a deadline under 1 ms does not spin.
        let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        let mut pfd = libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        // SAFETY: one pollfd we own, for the duration of the call.
        let ready = unsafe { libc::poll(&mut pfd, 1, ms) };
        if ready > 0 {
            return true;
        }
        // 0: timed out (the loop re-checks the clock); EINTR: retry. Any
        // other error: let the caller's read or write report it.
        if ready < 0 && std::io::Error::last_os_error().kind() != ErrorKind::Interrupted {
            return true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Guarded;

    /// `$SLUICE_PYTHON`, else the checkout's venv; `None` (the test skips)
    /// when it cannot import `sluice.warm_host`.
    fn test_python() -> Option<PathBuf> {
        let python = std::env::var_os("SLUICE_PYTHON")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python")
            });
        let ok = Command::new(&python)
            .args(["-c", "import sluice.warm_host"])
            .output()
            .is_ok_and(|out| out.status.success());
        if !ok {
            eprintln!(
                "skipped: {} cannot import sluice.warm_host (run `make develop`)",
                python.display()
            );
            return None;
        }
        Some(python)
    }

    /// A tempdir with `module.py` holding `source`, a two-file model, and
    /// a config whose PYTHONPATH has the module.
    struct Fixture {
        dir: tempfile::TempDir,
        config: PythonConfig,
        ctx: PolicyContext,
    }

    fn fixture(module: &str, source: &str) -> Option<Fixture> {
        let python = test_python()?;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(format!("{module}.py")), source).unwrap();
        let model = dir.path().join("model");
        std::fs::create_dir(&model).unwrap();
        let files = vec![(model.join("a.bin"), 1000), (model.join("b.bin"), 400)];
        for (path, size) in &files {
            std::fs::write(path, vec![0u8; *size as usize]).unwrap();
        }
        let config = PythonConfig {
            python: Some(python),
            call_timeout: Duration::from_millis(200),
            startup_timeout: Duration::from_secs(10),
            python_path: vec![dir.path().to_path_buf()],
        };
        let ctx = PolicyContext {
            model_dir: model,
            files,
            memory_limited: true,
        };
        Some(Fixture { dir, config, ctx })
    }

    fn read(path: &Path, offset: u64, len: u64) -> AccessEvent {
        AccessEvent {
            pid: 42,
            worker: Some(3),
            path: path.to_path_buf(),
            offset,
            len,
            kind: AccessKind::Read,
        }
    }

    fn host_pid(policy: &PythonPolicy) -> i32 {
        policy.host.as_ref().expect("running").child.id() as i32
    }

    fn is_alive(pid: i32) -> bool {
        // SAFETY: signal 0 only checks that the process exists.
        unsafe { libc::kill(pid, 0) == 0 }
    }

    const REST_OF_FILE: &str = "\
import sys
from sluice.warm import Evict, Policy, Prefetch, Target

class RestOfFile(Policy):
    def init(self, ctx):
        self.sizes = dict(ctx.files)
        self.limited = ctx.memory_limited
        first, size = ctx.files[0]
        return [Prefetch(first, 0, 100, Target.numa(1), stream=9)]

    def wait_for_init(self):
        return self.limited

    def on_access(self, event):
        start = event.offset + event.len
        end = self.sizes[event.path]
        return [Prefetch(event.path, start, end - start, Target.accelerator(event.worker),
                         stream=event.worker)]

    def evict(self, event):
        if event is None:
            return [Evict(path, 0, size) for path, size in self.sizes.items()]
        return [Evict(event.path, 0, event.offset)]

    def exit(self):
        print('exit called', file=sys.stderr)
";

    #[test]
    fn a_working_policy_prefetches_evicts_and_exits_cleanly() {
        let Some(f) = fixture("restpol", REST_OF_FILE) else {
            return;
        };
        let mut policy = spawn_with("restpol:RestOfFile", &f.config).unwrap();
        assert_eq!(
            (policy.name(), policy.class_name()),
            ("restpol:RestOfFile", "RestOfFile")
        );
        let (a, b) = (f.ctx.files[0].0.clone(), f.ctx.files[1].0.clone());
        let init = policy.init(&f.ctx).unwrap();
        let expected = FileRange::new(&a, 0, 100).with_target(Target::NumaNode(1));
        assert_eq!(
            init,
            [Prefetch {
                stream: 9,
                range: expected
            }]
        );
        assert!(policy.wait_for_init(), "memory_limited went through");
        let plan = policy.on_access(&read(&a, 200, 50)).unwrap();
        let expected = FileRange::new(&a, 250, 750).with_target(Target::Accelerator(3));
        assert_eq!(
            plan,
            [Prefetch {
                stream: 3,
                range: expected
            }]
        );
        assert_eq!(
            policy.evict(Some(&read(&b, 300, 1))).unwrap(),
            [FileRange::new(&b, 0, 300)]
        );
        assert_eq!(policy.evict(None).unwrap().len(), 2);
        let pid = host_pid(&policy);
        policy.exit().unwrap();
        assert!(!is_alive(pid), "the host ended and was reaped");
        let err = policy.on_access(&read(&a, 0, 1)).unwrap_err();
        assert!(err.to_string().contains("gone"), "{err}");
    }

    #[test]
    fn an_exception_is_a_fault_with_the_traceback_and_the_host_is_killed() {
        let source = "\
from sluice.warm import Policy

class Raises(Policy):
    def on_access(self, event):
        raise ValueError(f'boom at {event.offset}')
";
        let Some(f) = fixture("raisepol", source) else {
            return;
        };
        let mut policy = spawn_with("raisepol:Raises", &f.config).unwrap();
        assert!(policy.init(&f.ctx).unwrap().is_empty());
        assert!(!policy.wait_for_init(), "the base class default");
        let pid = host_pid(&policy);
        let err = policy
            .on_access(&read(&f.ctx.files[0].0, 7, 1))
            .unwrap_err();
        let WarmError::Policy { name, message } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(name, "raisepol:Raises");
        assert!(message.starts_with("ValueError: boom at 7"), "{message}");
        assert!(message.contains("Traceback"), "{message}");
        assert!(!is_alive(pid), "killed on the fault");
        let again = policy.evict(None).unwrap_err().to_string();
        assert!(
            again.contains("gone") && again.contains("boom at 7"),
            "{again}"
        );
    }

    #[test]
    fn a_sleeping_policy_misses_its_deadline_and_is_disabled_promptly() {
        let source = "\
import time
from sluice.warm import Policy

class Sleeps(Policy):
    def on_access(self, event):
        time.sleep(5)
        return []
";
        let Some(f) = fixture("sleeppol", source) else {
            return;
        };
        let policy = spawn_with("sleeppol:Sleeps", &f.config).unwrap();
        let pid = host_pid(&policy);
        let mut guarded = Guarded::new(Box::new(policy));
        assert!(guarded.init(&f.ctx).is_empty());
        let started = Instant::now();
        assert!(guarded.on_access(&read(&f.ctx.files[0].0, 0, 1)).is_empty());
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(200) && took < Duration::from_millis(1200),
            "{took:?}"
        );
        let fault = guarded.fault().expect("disabled");
        assert!(fault.contains("within 200 ms"), "{fault}");
        assert!(!is_alive(pid), "the sleeper was killed");
    }

    #[test]
    fn prints_to_stdout_do_not_corrupt_the_protocol() {
        let source = "\
import os
from sluice.warm import Policy, Prefetch

print('importing')

class Chatty(Policy):
    def init(self, ctx):
        print('init', ctx)
        os.write(1, b'not json, straight to fd 1\\n')
        return []

    def on_access(self, event):
        print('{\"ok\": []}')
        return [Prefetch(event.path, 0, 1)]
";
        let Some(f) = fixture("chattypol", source) else {
            return;
        };
        let mut policy = spawn_with("chattypol:Chatty", &f.config).unwrap();
        assert!(policy.init(&f.ctx).unwrap().is_empty());
        let a = &f.ctx.files[0].0;
        let plan = policy.on_access(&read(a, 5, 1)).unwrap();
        assert_eq!(plan[0].range, FileRange::new(a, 0, 1));
        policy.exit().unwrap();
    }

    #[test]
    fn a_range_outside_the_model_files_is_a_fault() {
        let source = "\
from sluice.warm import Policy, Prefetch

class Escapes(Policy):
    def on_access(self, event):
        return [Prefetch(event.path, 0, 1), Prefetch('/etc/passwd', 0, 4096)]
";
        let Some(f) = fixture("escapepol", source) else {
            return;
        };
        let mut policy = spawn_with("escapepol:Escapes", &f.config).unwrap();
        policy.init(&f.ctx).unwrap();
        let pid = host_pid(&policy);
        let err = policy
            .on_access(&read(&f.ctx.files[1].0, 0, 1))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("prefetch 1") && err.contains("\"/etc/passwd\" is not one of the model"),
            "{err}"
        );
        assert!(!is_alive(pid));
    }

    #[test]
    fn a_module_or_class_that_cannot_be_loaded_fails_spawn_with_the_python_error() {
        let source = "import sluice_no_such_dependency\n";
        let Some(f) = fixture("brokenpol", source) else {
            return;
        };
        std::fs::write(f.dir.path().join("fine.py"), "X = 1\n").unwrap();
        let cases = [
            ("brokenpol:P", "No module named 'sluice_no_such_dependency'"),
            ("sluice_absent_mod:P", "No module named 'sluice_absent_mod'"),
            ("fine:Missing", "AttributeError"),
            ("fine:X", "not a class"),
        ];
        for (spec, needle) in cases {
            let err = spawn_with(spec, &f.config).err().expect("spawn fails");
            let text = err.to_string();
            assert!(matches!(err, WarmError::Config(_)), "{spec}: {err:?}");
            assert!(
                text.contains(spec) && text.contains(needle),
                "{spec}: {text}"
            );
        }
    }

    #[test]
    fn bad_specs_are_refused_before_any_process_starts() {
        for bad in [
            "native", "a.b", ":C", "a:", "a..b:C", "1a:C", "a b:C", "a:C:D", "a-b:C", "",
        ] {
            let config = PythonConfig {
                python: Some("/nonexistent/python".into()),
                ..PythonConfig::default()
            };
            let err = spawn_with(bad, &config).err().expect("refused");
            assert!(
                matches!(&err, WarmError::Config(m) if m.contains("module:Class")),
                "{bad:?}: {err}"
            );
        }
        for good in ["a.b:C", "m:Outer.Inner", "_x:Y", "pkg.mod_2:Policy_1"] {
            assert!(validate_spec(good).is_ok(), "{good}");
        }
        let config = PythonConfig {
            python: Some("/nonexistent/python".into()),
            ..PythonConfig::default()
        };
        let err = spawn_with("a:B", &config).err().expect("no interpreter");
        assert!(err.to_string().contains("/nonexistent/python"), "{err}");
    }

    /// A fake host: a shell script answering `hello`, then `reply`.
    fn fake_host(dir: &Path, reply: &str) -> PythonConfig {
        let script = dir.join("fakepython");
        let body = format!(
            "#!/bin/sh\nread line\necho '{{\"ok\": \"Fake\"}}'\nread line\n{reply}\nsleep 5\n"
        );
        std::fs::write(&script, body).unwrap();
        let mut perms = std::fs::metadata(&script).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&script, perms).unwrap();
        PythonConfig {
            python: Some(script),
            call_timeout: Duration::from_millis(300),
            ..PythonConfig::default()
        }
    }

    #[test]
    fn garbage_replies_and_an_exiting_host_are_faults() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = PolicyContext {
            model_dir: "/m".into(),
            files: vec![("/m/a".into(), 10)],
            memory_limited: false,
        };
        let cases = [
            ("echo 'this is not json'", "not JSON"),
            ("echo '{\"ok\": 3}'", "expected a list of prefetch objects"),
            ("echo '{\"result\": []}'", "not {\"ok\""),
            ("exit 3", "exited (exit status: 3)"),
            ("printf '{\"ok\": []'", "within 300 ms"),
        ];
        for (reply, needle) in cases {
            let config = fake_host(dir.path(), reply);
            let mut policy = spawn_with("fake:Fake", &config).unwrap();
            let started = Instant::now();
            let err = policy.init(&ctx).unwrap_err().to_string();
            assert!(err.contains(needle), "{reply}: {err}");
            assert!(started.elapsed() < Duration::from_secs(2), "{reply}");
        }
        // A host that dies before saying hello.
        let config = fake_host(dir.path(), "");
        std::fs::write(config.python.as_ref().unwrap(), "#!/bin/sh\nexit 1\n").unwrap();
        let err = spawn_with("fake:Fake", &config).err().expect("no hello");
        assert!(err.to_string().contains("before saying hello"), "{err}");
    }

    #[test]
    fn replies_are_checked_field_by_field() {
        let files: HashMap<PathBuf, PathBuf> = [("/m/a".into(), "/m/a".into())].into();
        let ok = parse_prefetches(
            json!([{"path": "/m/./a", "offset": 1, "len": 2},
                   {"path": "/m/a", "offset": 0, "len": 1, "stream": 4, "target": {"numa": 2}}]),
            &files,
        )
        .unwrap();
        assert_eq!(ok[0].range, FileRange::new("/m/a", 1, 2));
        assert_eq!((ok[1].stream, ok[1].range.target), (4, Target::NumaNode(2)));
        let bad = [
            (
                json!([{"path": "m/a", "offset": 0, "len": 1}]),
                "not absolute",
            ),
            (
                json!([{"path": "/m/b", "offset": 0, "len": 1}]),
                "not one of",
            ),
            (
                json!([{"path": "/m/a", "offset": -1, "len": 1}]),
                "\"offset\"",
            ),
            (json!([{"path": "/m/a", "offset": 0}]), "\"len\""),
            (
                json!([{"path": "/m/a", "offset": 0, "len": 1.5}]),
                "\"len\"",
            ),
            (
                json!([{"path": "/m/a", "offset": 0, "length": 1}]),
                "unknown field",
            ),
            (json!([{"path": 3, "offset": 0, "len": 1}]), "\"path\""),
            (
                json!([{"path": "/m/a", "offset": 0, "len": 1, "stream": 1u64 << 40}]),
                "\"stream\"",
            ),
            (
                json!([{"path": "/m/a", "offset": 0, "len": 1, "target": {"gpu": 0}}]),
                "target",
            ),
            (json!([7]), "not an object"),
            (json!({"path": "/m/a"}), "expected a list"),
        ];
        for (value, needle) in bad {
            let err = parse_prefetches(value.clone(), &files).unwrap_err();
            assert!(err.contains(needle), "{value}: {err}");
        }
        let err = parse_evictions(
            json!([{"path": "/m/a", "offset": 0, "len": 1, "stream": 0}]),
            &files,
        )
        .unwrap_err();
        assert!(err.contains("unknown field \"stream\""), "{err}");
    }

    #[test]
    fn the_environment_sets_the_interpreter_and_the_deadline() {
        let vars = |timeout: &'static str| {
            move |name: &str| match name {
                "SLUICE_PYTHON" => Some(OsString::from("/opt/py/bin/python")),
                "SLUICE_PY_POLICY_TIMEOUT_MS" => Some(OsString::from(timeout)),
                _ => None,
            }
        };
        let config = PythonConfig::from_vars(vars("1500")).unwrap();
        assert_eq!(config.python, Some(PathBuf::from("/opt/py/bin/python")));
        assert_eq!(config.call_timeout, Duration::from_millis(1500));
        for bad in ["0", "-5", "soon", ""] {
            let err = PythonConfig::from_vars(vars(bad)).unwrap_err().to_string();
            assert!(err.contains("SLUICE_PY_POLICY_TIMEOUT_MS"), "{bad}: {err}");
        }
        let defaults = PythonConfig::from_vars(|_| None).unwrap();
        assert_eq!(defaults.python, None);
        assert_eq!(defaults.call_timeout, DEFAULT_CALL_TIMEOUT);
    }
}
