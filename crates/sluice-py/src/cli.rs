//! `sluice._sluice.cli_main`: the `sluice` command line run inside Python, for
//! the console script that `pip install` puts on PATH (`sluice/_cli.py`).
//!
//! It calls the same entry as the native binary, `sluice_cli::main_with_args`,
//! so the two cannot drift. What differs is the process around it: Python
//! has changed some signal dispositions at start-up and holds the GIL. For
//! the run the dispositions are put back to what the binary would have
//! (see [`NativeSignals`]) and the GIL is released, so Ctrl-C, SIGTERM and a
//! closed pipe end the command as they end the binary, and `sluice warm`'s
//! own SIGINT/SIGTERM handlers see the signals rather than Python's.

use std::ffi::OsString;
use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::prelude::*;

/// Exit status of a Rust program that panicked (the panic message is
/// already on stderr, printed by the panic hook).
const EXIT_PANIC: i32 = 101;

/// Runs the `sluice` command line with `argv` (the program name first) and
/// returns its exit status, as the native binary would exit with. Output goes
/// straight to file descriptors 1 and 2. Signal dispositions are those of the
/// binary for the run and restored afterwards; logging is back at its import
/// level afterwards.
#[pyfunction]
pub fn cli_main(py: Python<'_>, argv: Vec<OsString>) -> i32 {
    let signals = NativeSignals::install();
    let code = py.detach(|| {
        catch_unwind(AssertUnwindSafe(|| sluice_cli::main_with_args(argv))).unwrap_or(EXIT_PANIC)
    });
    drop(signals);
    sluice_cli::init_logging(0);
    code
}

/// The signal dispositions of a native `sluice` process, installed while the
/// command runs; the previous ones come back on drop.
///
/// At start-up Python ignores SIGPIPE and SIGXFSZ, and installs its own
/// SIGINT handler when SIGINT was at its default. The binary has SIGPIPE at
/// its default (it sets that itself) and inherits the rest. So SIGPIPE and
/// SIGXFSZ go back to their defaults, and SIGINT and SIGTERM do when a
/// handler (Python's) is installed; an inherited "ignore" stays, as it would
/// for the binary (`sluice ... &` in a script ignores SIGINT).
struct NativeSignals {
    saved: Vec<(libc::c_int, libc::sigaction)>,
}

impl NativeSignals {
    fn install() -> NativeSignals {
        let mut saved = Vec::new();
        for (signal, only_if_handled) in [
            (libc::SIGPIPE, false),
            (libc::SIGXFSZ, false),
            (libc::SIGINT, true),
            (libc::SIGTERM, true),
        ] {
            let Some(previous) = current(signal) else {
                continue;
            };
            let handled =
                previous.sa_sigaction != libc::SIG_DFL && previous.sa_sigaction != libc::SIG_IGN;
            if only_if_handled && !handled {
                continue;
            }
            if set(signal, &default_action()) {
                saved.push((signal, previous));
            }
        }
        NativeSignals { saved }
    }
}

impl Drop for NativeSignals {
    fn drop(&mut self) {
        for (signal, previous) in self.saved.drain(..).rev() {
            set(signal, &previous);
        }
    }
}

/// The disposition of `signal`, or `None` if it cannot be read.
fn current(signal: libc::c_int) -> Option<libc::sigaction> {
    // SAFETY: sigaction is plain data; all-zero is a valid (empty) value.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a null new action only reads the current one into `action`.
    let rc = unsafe { libc::sigaction(signal, std::ptr::null(), &mut action) };
    (rc == 0).then_some(action)
}

/// SIG_DFL with an empty mask and no flags.
fn default_action() -> libc::sigaction {
    // SAFETY: sigaction is plain data; all-zero is an empty mask and no flags.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = libc::SIG_DFL;
    action
}

/// Installs `action` for `signal`; false if the kernel refused it.
fn set(signal: libc::c_int, action: &libc::sigaction) -> bool {
    // SAFETY: `action` is a complete sigaction (read back from the kernel or
    // SIG_DFL), and the previous one is not asked for.
    unsafe { libc::sigaction(signal, action, std::ptr::null_mut()) == 0 }
}
