//! The service a runtime serves: a launched command, watched until it ends.
//!
//! The loop only needs to know whether the service has ended, and
//! [`crate::runtime::shutdown`] to signal it; [`Service`] is that contract,
//! and [`ChildService`] keeps it for a child process. A daemon serves no
//! service of its own and runs until it is stopped.
//!
//! The child stays in the runtime's process group, so a terminal's Ctrl-C
//! reaches it directly, as it would without `sluice warm` in between, and it
//! keeps the terminal for its own input. When the runtime protects itself
//! from the OOM killer, the child gets back the score the runtime had.

use std::ffi::{CString, OsString};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};

use crate::error::WarmError;

/// How a service ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceExit {
    /// It exited with this code.
    Code(i32),
    /// This signal ended it.
    Signal(i32),
}

impl ServiceExit {
    /// The status a shell reports: the code, or 128 plus the signal.
    pub fn status(self) -> i32 {
        match self {
            ServiceExit::Code(code) => code,
            ServiceExit::Signal(signal) => 128 + signal,
        }
    }
}

/// A service under the runtime.
pub trait Service {
    /// The service's root process.
    fn pid(&self) -> i32;

    /// How it ended, once it has (it is reaped then); `None` while it
    /// runs. Never blocks.
    fn try_exit(&mut self) -> Result<Option<ServiceExit>, WarmError>;

    /// Sends `signal` to its root process; nothing once it was reaped.
    fn signal(&mut self, signal: i32);
}

/// A command the runtime launched as its child.
pub struct ChildService {
    child: Child,
    /// The program, for error messages.
    program: PathBuf,
    /// Set once the child was reaped: its pid may name another process.
    exit: Option<ServiceExit>,
}

impl ChildService {
    /// Launches `command` (program and arguments), with the child's
    /// `oom_score_adj` set to `oom_score_adj` when given. An empty command is
    /// [`WarmError::NoCommand`], a program that cannot be started
    /// [`WarmError::Launch`] naming it.
    pub fn spawn(
        command: &[OsString],
        oom_score_adj: Option<i32>,
    ) -> Result<ChildService, WarmError> {
        let Some((program, args)) = command.split_first() else {
            return Err(WarmError::NoCommand);
        };
        let program = PathBuf::from(program);
        let mut cmd = Command::new(&program);
        cmd.args(args);
        if let Some(score) = oom_score_adj {
            let path = CString::new("/proc/self/oom_score_adj").expect("no NUL in a literal");
            let value = score.to_string().into_bytes();
            // SAFETY: the closure runs between fork and exec and only makes
            // async-signal-safe calls (open, write, close) on memory
            // allocated before the fork.
            unsafe {
                cmd.pre_exec(move || {
                    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd >= 0 {
                        libc::write(fd, value.as_ptr().cast(), value.len());
                        libc::close(fd);
                    }
                    Ok(())
                });
            }
        }
        let child = cmd.spawn().map_err(|source| WarmError::Launch {
            program: program.clone(),
            source,
        })?;
        Ok(ChildService {
            child,
            program,
            exit: None,
        })
    }
}

impl Service for ChildService {
    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn try_exit(&mut self) -> Result<Option<ServiceExit>, WarmError> {
        if self.exit.is_none() {
            let status = self
                .child
                .try_wait()
                .map_err(WarmError::io(&self.program))?;
            self.exit = status.map(exit_of);
        }
        Ok(self.exit)
    }

    fn signal(&mut self, signal: i32) {
        // Only while it is unreaped is its pid surely still the service's.
        if let Ok(None) = self.try_exit() {
            // SAFETY: kill(2) has no memory effects.
            unsafe { libc::kill(self.pid(), signal) };
        }
    }
}

/// How a process ended, as a [`ServiceExit`].
pub fn exit_of(status: std::process::ExitStatus) -> ServiceExit {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => ServiceExit::Code(code),
        (None, Some(signal)) => ServiceExit::Signal(signal),
        // Neither: stopped or continued, which `wait` does not report here.
        (None, None) => ServiceExit::Code(status.into_raw()),
    }
}

/// A signal's name (`SIGTERM`), or `signal N` for one without a common
/// name here.
pub fn signal_name(signal: i32) -> String {
    let name = match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("signal {signal}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_reports_its_exit_code_or_its_signal() {
        let mut ok =
            ChildService::spawn(&["sh".into(), "-c".into(), "exit 7".into()], None).unwrap();
        let exit = loop {
            if let Some(exit) = ok.try_exit().unwrap() {
                break exit;
            }
            std::thread::yield_now();
        };
        assert_eq!(exit, ServiceExit::Code(7));
        let mut long = ChildService::spawn(&["sleep".into(), "30".into()], None).unwrap();
        assert!(long.pid() > 0);
        assert_eq!(long.try_exit().unwrap(), None);
        long.signal(libc::SIGTERM);
        let exit = long.child.wait().map(exit_of).unwrap();
        assert_eq!(exit, ServiceExit::Signal(libc::SIGTERM));
        assert_eq!(exit.status(), 128 + libc::SIGTERM);
        assert_eq!(signal_name(libc::SIGTERM), "SIGTERM");
        assert_eq!(signal_name(64), "signal 64");
    }

    #[test]
    fn a_missing_program_or_an_empty_command_is_an_error_naming_it() {
        let err = ChildService::spawn(&["/nonexistent/loader".into()], None)
            .err()
            .unwrap();
        assert!(
            matches!(&err, WarmError::Launch { program, .. } if program.ends_with("loader")),
            "{err}"
        );
        assert!(matches!(
            ChildService::spawn(&[], None).err().unwrap(),
            WarmError::NoCommand
        ));
    }
}
