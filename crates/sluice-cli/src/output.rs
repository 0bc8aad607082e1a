//! The CLI's own output, written without panicking.
//!
//! `println!` panics when standard output cannot be written (a full disk, `/dev/full`, a
//! closed pipe in the Python console script, where SIGPIPE is ignored). These macros write
//! instead and remember the first failure: the command goes on (a `warm run` must not
//! abandon its service because its report cannot be printed), and the exit status says
//! that the output was lost. Standard error is best effort: there is nowhere left to
//! report its failure.

use std::fmt;
use std::io::Write;
use std::sync::OnceLock;

static STDOUT_FAILED: OnceLock<String> = OnceLock::new();

/// Writes to standard output; a failure is remembered for [`finish`].
pub(crate) fn stdout(args: fmt::Arguments<'_>) {
    if let Err(err) = std::io::stdout().lock().write_fmt(args) {
        let _ = STDOUT_FAILED.set(err.to_string());
    }
}

/// Writes to standard error, ignoring failure.
pub(crate) fn stderr(args: fmt::Arguments<'_>) {
    let _ = std::io::stderr().lock().write_fmt(args);
}

/// Flushes standard output, and turns a lost output into an error message and the exit
/// status `failed` (a command that failed already keeps its own status).
pub(crate) fn finish(code: i32, failed: i32) -> i32 {
    if let Err(err) = std::io::stdout().lock().flush() {
        let _ = STDOUT_FAILED.set(err.to_string());
    }
    match STDOUT_FAILED.get() {
        None => code,
        Some(err) => {
            stderr(format_args!(
                "sluice: error: cannot write to standard output: {err}\n"
            ));
            if code == 0 {
                failed
            } else {
                code
            }
        }
    }
}

/// `print!` to standard output without panicking.
macro_rules! out {
    ($($arg:tt)*) => { $crate::output::stdout(format_args!($($arg)*)) };
}

/// `println!` to standard output without panicking.
macro_rules! outln {
    () => { $crate::output::stdout(format_args!("\n")) };
    ($($arg:tt)*) => {
        $crate::output::stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `eprint!` without panicking.
macro_rules! errout {
    ($($arg:tt)*) => { $crate::output::stderr(format_args!($($arg)*)) };
}

/// `eprintln!` without panicking.
macro_rules! errln {
    () => { $crate::output::stderr(format_args!("\n")) };
    ($($arg:tt)*) => {
        $crate::output::stderr(format_args!("{}\n", format_args!($($arg)*)))
    };
}
