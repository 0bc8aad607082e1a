//! [`Host`]: the `python -m sluice.warm_host module:Class` child process and
//! the one request/reply exchange over its pipes.
//!
//! The host runs in a process group of its own, so that a terminal's Ctrl-C
//! reaches the runtime (which stops the policy in order) and a kill takes
//! the policy's own children with it. Our ends of its pipes are
//! non-blocking: a call writes one JSON line and reads one back, waiting in
//! `poll(2)` until the call's deadline, with a line buffer for what arrives
//! past the newline. No thread per policy.
//!
//! Every way a call can fail is a [`HostError`](crate::python_error::HostError). The host's whole group is
//! killed when the [`Host`] is dropped, also when the host itself exited on
//! its own: a child the policy forked stays in the group, and left alive
//! it would hold the runtime's stderr open (a `$(sluice warm run …
//! 2>&1)` would wait for it). The host is reaped only after that, so its
//! pid, the group's id, cannot be reused meanwhile. [`Host::finish`] first
//! closes its input and gives it a grace period to exit.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::PythonConfig;
use crate::python_error::HostError;

/// A reply longer than this is garbage, not a plan (a million prefetches
/// are about 100 MiB of JSON; no policy needs that many per event).
const MAX_REPLY_BYTES: usize = 64 << 20;

/// 100 ms: how long a host whose pipe closed gets to be reaped, so that the
/// fault says "exited (status N)" rather than just "exited"; a process
/// that closed its stdout is normally gone within a few ms.
const EXIT_STATUS_WAIT: Duration = Duration::from_millis(100);

/// 2 ms between `try_wait`s while waiting for an exit: short next to the
/// waits themselves, long enough not to spin.
const REAP_POLL: Duration = Duration::from_millis(2);

/// The `sluice.warm_host` child and its pipes (non-blocking on our side).
pub(super) struct Host {
    pub(super) child: Child,
    /// `None` once closed (`finish`), so the host sees end of input.
    stdin: Option<ChildStdin>,
    stdout: ChildStdout,
    /// Bytes read past the last complete line.
    buffer: Vec<u8>,
}

impl Host {
    /// Runs `python -m sluice.warm_host spec`; its stderr is ours, so its
    /// tracebacks and prints reach the log.
    pub(super) fn start(python: &Path, spec: &str, config: &PythonConfig) -> std::io::Result<Host> {
        let mut child = Command::new(python)
            .args(["-m", "sluice.warm_host", spec])
            .env("PYTHONPATH", config.host_python_path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // Its own group: see the module header.
            .process_group(0)
            .spawn()?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other("its pipes were not set up"));
        };
        for fd in [stdin.as_raw_fd(), stdout.as_raw_fd()] {
            if let Err(e) = set_nonblocking(fd) {
                let _ = child.kill();
                let _ = child.wait();
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("making its pipe non-blocking: {e}"),
                ));
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
    pub(super) fn call(&mut self, request: &Value, timeout: Duration) -> Result<Value, HostError> {
        let deadline = Instant::now() + timeout;
        let mut line = request.to_string().into_bytes();
        line.push(b'\n');
        self.write_all(&line, deadline, timeout)?;
        let reply = self.read_line(deadline, timeout)?;
        let reply: Value = serde_json::from_slice(&reply).map_err(|source| {
            let text = String::from_utf8_lossy(&reply);
            let head = text.trim_end().chars().take(200).collect();
            HostError::NotJson { head, source }
        })?;
        match reply {
            Value::Object(mut map) if map.len() == 1 => {
                if let Some(value) = map.remove("ok") {
                    return Ok(value);
                }
                match map.remove("error") {
                    Some(Value::String(message)) => Err(HostError::Raised { message }),
                    Some(other) => Err(HostError::NotAReply {
                        reply: serde_json::json!({ "error": other }),
                    }),
                    None => Err(HostError::NotAReply {
                        reply: Value::Object(map),
                    }),
                }
            }
            reply => Err(HostError::NotAReply { reply }),
        }
    }

    fn write_all(
        &mut self,
        mut bytes: &[u8],
        deadline: Instant,
        timeout: Duration,
    ) -> Result<(), HostError> {
        let Some(stdin) = self.stdin.as_mut() else {
            return Err(HostError::NoInput);
        };
        while !bytes.is_empty() {
            match stdin.write(bytes) {
                Ok(0) => return Err(self.gone(HostError::StoppedReading { source: None })),
                Ok(n) => bytes = &bytes[n..],
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if !wait_for(stdin.as_raw_fd(), libc::POLLOUT, deadline) {
                        return Err(timed_out(timeout, "take the request"));
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.gone(HostError::StoppedReading { source: Some(e) })),
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
                return Err(HostError::ReplyTooLong {
                    limit_bytes: MAX_REPLY_BYTES,
                });
            }
            match self.stdout.read(&mut chunk) {
                Ok(0) => return Err(self.gone(HostError::Exited { status: None })),
                Ok(n) => self.buffer.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if !wait_for(self.stdout.as_raw_fd(), libc::POLLIN, deadline) {
                        return Err(timed_out(timeout, "reply"));
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(source) => return Err(HostError::Unreadable { source }),
            }
        }
    }

    /// [`HostError::Exited`] with its status when it has exited within
    /// [`EXIT_STATUS_WAIT`] (its group is killed and it is reaped then);
    /// `otherwise` if not.
    fn gone(&mut self, otherwise: HostError) -> HostError {
        let deadline = Instant::now() + EXIT_STATUS_WAIT;
        while Instant::now() < deadline {
            if self.unreaped() != Some(false) {
                return HostError::Exited {
                    status: self.kill_and_reap(),
                };
            }
            std::thread::sleep(REAP_POLL);
        }
        otherwise
    }

    /// Closes the host's input and gives it `grace` to exit; then its
    /// group is killed (on drop).
    pub(super) fn finish(mut self, grace: Duration) {
        self.stdin = None;
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline && self.unreaped() == Some(false) {
            std::thread::sleep(REAP_POLL);
        }
    }

    /// Whether the host is unreaped: `Some(false)` while it runs,
    /// `Some(true)` once it exited (a zombie, its pid still its group's
    /// id), `None` once reaped.
    fn unreaped(&self) -> Option<bool> {
        // SAFETY: a zeroed siginfo is valid for waitid to fill.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid on our own child with WNOWAIT leaves it waitable;
        // `info` outlives the call.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                self.child.id(),
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        // SAFETY: waitid filled `info`, or left it zeroed (no exit yet).
        (rc == 0).then(|| unsafe { info.si_pid() } != 0)
    }

    /// Kills the host's process group (the host and whatever the policy
    /// forked) and reaps the host; its status, when it was not reaped yet.
    fn kill_and_reap(&mut self) -> Option<ExitStatus> {
        if self.unreaped().is_some() {
            // SAFETY: kill(2) has no memory effects; a negative pid names the
            // process group the host leads (`process_group(0)`), whose id
            // cannot be reused while the host is unreaped.
            unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        }
        self.child.wait().ok()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.kill_and_reap();
    }
}

fn timed_out(timeout: Duration, waiting_for: &'static str) -> HostError {
    HostError::TimedOut {
        waiting_for,
        timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
    }
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
