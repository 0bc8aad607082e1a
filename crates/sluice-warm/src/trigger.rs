//! Explicit triggers: a running runtime listens on a named pipe for
//! accesses announced by the CLI (`sluice warm trigger`) or the API
//! (`sluice.warm.trigger`), one JSON object per line:
//!
//! ```json
//! {"path": "model-00001-of-00004.safetensors", "offset": 0, "len": 1048576}
//! ```
//!
//! `path` is absolute or relative to the model directory; `offset` and `len`
//! default to 0 and the whole file. Each line becomes an `Explicit` access
//! event for the policy, as if a loader had read that range. Malformed
//! lines are logged and skipped; the pipe never blocks the runtime (it is
//! read non-blocking, and the runtime holds a writer end itself so a
//! departed writer does not make it spin on end-of-file).

use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::error::WarmError;
use crate::policy::{AccessEvent, AccessKind};
use crate::status::RuntimeStatus;

/// The listening end of a trigger pipe; removes the pipe when dropped.
pub struct TriggerPipe {
    path: PathBuf,
    reader: File,
    _keepalive: File,
    pending: Vec<u8>,
}

impl TriggerPipe {
    /// Creates the named pipe at `path` (replacing a stale one) and opens it.
    pub fn create(path: &Path) -> Result<TriggerPipe, WarmError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(WarmError::io(dir))?;
        }
        let _ = std::fs::remove_file(path);
        let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| WarmError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in path"),
        })?;
        // SAFETY: mkfifo with a valid NUL-terminated path.
        if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
            return Err(WarmError::io(path)(std::io::Error::last_os_error()));
        }
        let reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(WarmError::io(path))?;
        let keepalive = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(WarmError::io(path))?;
        Ok(TriggerPipe {
            path: path.to_path_buf(),
            reader,
            _keepalive: keepalive,
            pending: Vec::new(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every complete line written so far, as events for files under
    /// `model_dir`.
    pub fn poll(&mut self, model_dir: &Path) -> Vec<AccessEvent> {
        let mut buf = [0u8; 4096];
        loop {
            match self.reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => self.pending.extend_from_slice(&buf[..n]),
                Err(_) => break, // EAGAIN: nothing more now
            }
            if self.pending.len() > 1 << 20 {
                tracing::warn!("trigger pipe: over 1 MiB without a newline; dropped");
                self.pending.clear();
            }
        }
        let mut events = Vec::new();
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            match parse_line(&line[..end], model_dir) {
                Ok(Some(e)) => events.push(e),
                Ok(None) => {}
                Err(message) => tracing::warn!("trigger pipe: {message}"),
            }
        }
        events
    }
}

impl Drop for TriggerPipe {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One trigger line as an event; `Ok(None)` for a blank line.
pub fn parse_line(line: &[u8], model_dir: &Path) -> Result<Option<AccessEvent>, String> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let value: serde_json::Value =
        serde_json::from_slice(line).map_err(|e| format!("not JSON ({e})"))?;
    let path = value
        .get("path")
        .and_then(|p| p.as_str())
        .ok_or("no \"path\" string")?;
    let field = |name: &str| -> Result<Option<u64>, String> {
        match value.get(name) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or(format!("{name} {v} is not an unsigned integer")),
        }
    };
    // Named inside the model directory, without climbing out of it; the
    // entry itself may be a symlink (a Hugging Face snapshot's files are).
    let outside = || format!("{path}: not in the model directory");
    let mut relative = Path::new(path);
    if relative.is_absolute() {
        relative = relative.strip_prefix(model_dir).map_err(|_| outside())?;
    }
    let lexical = |c: std::path::Component| {
        matches!(
            c,
            std::path::Component::Normal(_) | std::path::Component::CurDir
        )
    };
    if !relative.components().all(lexical) {
        return Err(outside());
    }
    let path = model_dir.join(
        relative
            .components()
            .filter(|c| matches!(c, std::path::Component::Normal(_)))
            .collect::<PathBuf>(),
    );
    let size = match std::fs::metadata(&path) {
        Ok(meta) if meta.is_file() => meta.len(),
        _ => return Err(format!("{}: no such file", path.display())),
    };
    let offset = field("offset")?.unwrap_or(0);
    if offset > size {
        return Err(format!(
            "offset {offset} is past the end of {} ({size} bytes)",
            path.display()
        ));
    }
    // A length past the end is cut to it: the access cannot reach further.
    let len = field("len")?.map_or(size - offset, |len| len.min(size - offset));
    Ok(Some(AccessEvent {
        pid: 0,
        worker: value
            .get("worker")
            .and_then(|w| w.as_u64())
            .and_then(|w| u32::try_from(w).ok()),
        path,
        offset,
        len,
        kind: AccessKind::Explicit,
    }))
}

/// An explicit access to announce to a running runtime.
#[derive(Clone, Debug, Default)]
pub struct TriggerRequest {
    /// The file, absolute or relative to the runtime's model directory.
    pub path: String,
    /// First byte (default 0).
    pub offset: Option<u64>,
    /// Bytes (default: to the end of the file).
    pub len: Option<u64>,
    /// The loader worker this access belongs to.
    pub worker: Option<u32>,
    /// The runtime's pid; needed when several run.
    pub pid: Option<i32>,
}

/// Sends `request` to its runtime (see [`target_runtime`]) through that
/// runtime's pipe in `env`'s run directory: what `sluice warm trigger` and
/// `sluice.warm.trigger` do.
///
/// The line is checked here against the runtime's model directory (from
/// its status file) before it is sent, so a path outside the model, a file
/// that is not there or an offset past its end is an error for the caller,
/// not a line the runtime logs and drops.
pub fn trigger(env: &crate::env::WarmEnv, request: &TriggerRequest) -> Result<(), WarmError> {
    let status = crate::status::list(&env.run_dir())?;
    let pid = target_runtime(&status, request.pid)?;
    let line = serde_json::json!({
        "path": request.path,
        "offset": request.offset,
        "len": request.len,
        "worker": request.worker,
    })
    .to_string();
    // A status without a model directory (an older runtime's) cannot be
    // checked against; the runtime still checks what it receives.
    let model_dir = status
        .iter()
        .find(|s| s.pid == pid && !s.model_dir.is_empty())
        .map(|s| Path::new(&s.model_dir));
    if let Some(model_dir) = model_dir {
        if let Err(message) = parse_line(line.as_bytes(), model_dir) {
            return Err(WarmError::BadTrigger { pid, message });
        }
    }
    let pipe = env.trigger_pipe(pid);
    match send(&pipe, &line) {
        // No reader on the pipe (ENXIO) or no pipe: no runtime of that pid.
        Err(WarmError::Io { source, .. })
            if matches!(source.raw_os_error(), Some(libc::ENXIO | libc::ENOENT)) =>
        {
            Err(WarmError::RuntimeGone { pid, pipe })
        }
        outcome => outcome,
    }
}

/// The pid of the runtime a trigger goes to: `pid` when given, else the one
/// runtime among `running` (the live statuses); none, or several, is an
/// error that says so.
pub fn target_runtime(running: &[RuntimeStatus], pid: Option<i32>) -> Result<i32, WarmError> {
    if let Some(pid) = pid {
        return Ok(pid);
    }
    match running {
        [one] => Ok(one.pid),
        [] => Err(WarmError::NoRuntime),
        many => Err(WarmError::SeveralRuntimes {
            pids: many.iter().map(|s| s.pid).collect(),
        }),
    }
}

/// Writes one trigger line to the pipe of a running runtime. Fails when no
/// runtime listens there (`ENXIO`) or the pipe is gone.
pub fn send(pipe: &Path, line: &str) -> Result<(), WarmError> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(pipe)
        .map_err(WarmError::io(pipe))?;
    let mut text = line.trim_end().to_string();
    text.push('\n');
    f.write_all(text.as_bytes()).map_err(WarmError::io(pipe))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_become_explicit_events_and_bad_lines_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let m = dir.path().canonicalize().unwrap();
        std::fs::write(m.join("a.bin"), vec![0u8; 100]).unwrap();
        let e = parse_line(br#"{"path": "a.bin", "offset": 10}"#, &m)
            .unwrap()
            .unwrap();
        assert_eq!((e.offset, e.len, e.kind), (10, 90, AccessKind::Explicit));
        assert_eq!(e.path, m.join("a.bin"));
        assert!(parse_line(b"  ", &m).unwrap().is_none());
        // Absolute inside the model directory, and a symlinked entry (kept
        // under its name in the directory, as a Hugging Face snapshot's).
        let abs = format!(r#"{{"path": "{}"}}"#, m.join("a.bin").display());
        let e = parse_line(abs.as_bytes(), &m).unwrap().unwrap();
        assert_eq!(e.path, m.join("a.bin"));
        let blob = tempfile::tempdir().unwrap();
        std::fs::write(blob.path().join("blob"), vec![0u8; 7]).unwrap();
        std::os::unix::fs::symlink(blob.path().join("blob"), m.join("link.bin")).unwrap();
        let e = parse_line(br#"{"path": "./link.bin"}"#, &m)
            .unwrap()
            .unwrap();
        assert_eq!((e.path, e.len), (m.join("link.bin"), 7));
        for (line, needle) in [
            (&br#"{"offset": 1}"#[..], "path"),
            (br#"{"path": "nope.bin"}"#, "no such file"),
            (br#"{"path": "a.bin", "len": -1}"#, "len"),
            (b"garbage", "not JSON"),
            (
                br#"{"path": "/etc/hostname"}"#,
                "not in the model directory",
            ),
            (
                br#"{"path": "../../etc/hostname"}"#,
                "not in the model directory",
            ),
        ] {
            let err = parse_line(line, &m).unwrap_err();
            assert!(err.contains(needle), "{err}");
        }
    }

    #[test]
    fn triggers_are_checked_against_the_runtimes_model_before_they_are_sent() {
        let dir = tempfile::tempdir().unwrap();
        let m = dir.path().canonicalize().unwrap().join("model");
        std::fs::create_dir(&m).unwrap();
        std::fs::write(m.join("a.bin"), vec![0u8; 100]).unwrap();
        let run = dir.path().join("run");
        let env = crate::env::WarmEnv {
            run_dir: Some(run.clone()),
            ..Default::default()
        };
        let me = std::process::id() as i32;
        let status = crate::status::RuntimeStatus {
            pid: me,
            model_dir: m.display().to_string(),
            ..Default::default()
        };
        crate::status::publish(&run, &status).unwrap();
        let request = |path: &str, offset: Option<u64>| TriggerRequest {
            path: path.into(),
            offset,
            ..TriggerRequest::default()
        };
        // No pipe yet: the runtime is named as gone, not "os error 6".
        match trigger(&env, &request("a.bin", None)) {
            Err(WarmError::RuntimeGone { pid, .. }) => assert_eq!(pid, me),
            other => panic!("{other:?}"),
        }
        let mut pipe = TriggerPipe::create(&env.trigger_pipe(me)).unwrap();
        for (path, offset, needle) in [
            ("../../etc/hostname", None, "not in the model directory"),
            ("/etc/hostname", None, "not in the model directory"),
            ("nope.bin", None, "no such file"),
            ("a.bin", Some(1 << 40), "past the end"),
        ] {
            match trigger(&env, &request(path, offset)) {
                Err(e @ WarmError::BadTrigger { .. }) => {
                    assert!(e.to_string().contains(needle), "{path}: {e}")
                }
                other => panic!("{path}: {other:?}"),
            }
        }
        assert!(pipe.poll(&m).is_empty(), "nothing refused was sent");
        trigger(&env, &request("a.bin", Some(90))).unwrap();
        let events = pipe.poll(&m);
        assert_eq!(events.len(), 1);
        assert_eq!((events[0].offset, events[0].len), (90, 10));
    }

    #[test]
    fn a_pipe_carries_lines_and_is_removed_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let m = dir.path().canonicalize().unwrap();
        std::fs::write(m.join("a.bin"), vec![0u8; 100]).unwrap();
        let fifo = m.join("run/1.trigger");
        let mut pipe = TriggerPipe::create(&fifo).unwrap();
        assert!(pipe.poll(&m).is_empty());
        send(&fifo, r#"{"path": "a.bin", "len": 5}"#).unwrap();
        send(&fifo, "not json").unwrap();
        let events = pipe.poll(&m);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].len, 5);
        drop(pipe);
        assert!(!fifo.exists());
        let err = send(&fifo, "{}").unwrap_err();
        assert!(err.to_string().contains("1.trigger"), "{err}");
    }
}
