//! The service a runtime serves: a launched command, watched until it ends.
//!
//! The loop only needs to know whether the service has ended and to end it
//! when the run is interrupted; [`Service`] is that contract, and
//! [`ChildService`] keeps it for a child process. A daemon serves no
//! service of its own and runs until it is stopped.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Child, Command};

use crate::error::WarmError;

/// A service under the runtime.
pub trait Service {
    /// The service's root process.
    fn pid(&self) -> i32;

    /// Its exit status once it has ended (`128 + signal` when a signal
    /// ended it), `None` while it runs. Never blocks.
    fn try_exit(&mut self) -> Result<Option<i32>, WarmError>;

    /// Ends it (the run was interrupted) and returns its exit status.
    fn stop(&mut self) -> Result<i32, WarmError>;
}

/// A command the runtime launched as its child.
pub struct ChildService {
    child: Child,
    /// The program, for error messages.
    program: PathBuf,
}

impl ChildService {
    /// Launches `command` (program and arguments). An empty command or a
    /// program that cannot be started is an error naming it.
    pub fn spawn(command: &[OsString]) -> Result<ChildService, WarmError> {
        let Some((program, args)) = command.split_first() else {
            return Err(WarmError::NoCommand);
        };
        let program = PathBuf::from(program);
        let child = Command::new(&program)
            .args(args)
            .spawn()
            .map_err(WarmError::io(&program))?;
        Ok(ChildService { child, program })
    }
}

impl Service for ChildService {
    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn try_exit(&mut self) -> Result<Option<i32>, WarmError> {
        let status = self
            .child
            .try_wait()
            .map_err(WarmError::io(&self.program))?;
        Ok(status.map(exit_code_of))
    }

    fn stop(&mut self) -> Result<i32, WarmError> {
        // Interrupted: the service goes down with us.
        let _ = self.child.kill();
        let status = self.child.wait().map_err(WarmError::io(&self.program))?;
        Ok(exit_code_of(status))
    }
}

/// A process's exit status as a shell reports it: its code, or 128 plus
/// the signal that ended it.
pub fn exit_code_of(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_reports_its_exit_code_or_its_signal() {
        let mut ok = ChildService::spawn(&["sh".into(), "-c".into(), "exit 7".into()]).unwrap();
        let code = loop {
            if let Some(code) = ok.try_exit().unwrap() {
                break code;
            }
            std::thread::yield_now();
        };
        assert_eq!(code, 7);
        let mut long = ChildService::spawn(&["sleep".into(), "30".into()]).unwrap();
        assert!(long.pid() > 0);
        assert_eq!(long.try_exit().unwrap(), None);
        assert_eq!(long.stop().unwrap(), 128 + libc::SIGKILL);
    }

    #[test]
    fn a_missing_program_or_an_empty_command_is_an_error_naming_it() {
        let err = ChildService::spawn(&["/nonexistent/loader".into()])
            .err()
            .unwrap();
        assert!(
            matches!(&err, WarmError::Io { path, .. } if path.ends_with("loader")),
            "{err}"
        );
        assert!(matches!(
            ChildService::spawn(&[]).err().unwrap(),
            WarmError::NoCommand
        ));
    }
}
