//! Catching the stop signals (SIGINT, SIGTERM, SIGHUP) for commands that run until told
//! to stop (`warm run`, `kv serve`), and putting the old handlers back after: the console
//! script runs the CLI inside Python, which goes on after it.

/// A signal handler taking the kernel's `siginfo` (`SA_SIGINFO`).
pub type Handler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

/// The handlers [`install`] replaced, put back by [`SavedHandlers::restore`].
#[must_use = "restore the handlers when the command ends"]
pub struct SavedHandlers(Vec<(libc::c_int, libc::sigaction)>);

/// Catches SIGINT, SIGTERM and SIGHUP with `handler`, except those the process was
/// started with ignored (`nohup`, a script's background job): they stay ignored.
pub fn install(handler: Handler) -> SavedHandlers {
    let handler = handler as libc::sighandler_t;
    let mut saved = Vec::new();
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: zeroed sigactions are valid; sigaction only reads `action` and writes
        // `previous`. Handlers passed here only touch atomics, which is async-signal-safe;
        // SA_RESTART keeps reads and waits from failing with EINTR.
        unsafe {
            let mut previous: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut previous) != 0
                || previous.sa_sigaction == libc::SIG_IGN
            {
                continue;
            }
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = handler;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(signal, &action, std::ptr::null_mut()) == 0 {
                saved.push((signal, previous));
            }
        }
    }
    SavedHandlers(saved)
}

impl SavedHandlers {
    pub fn restore(self) {
        for (signal, previous) in self.0 {
            // SAFETY: `previous` is what sigaction returned for this signal.
            unsafe { libc::sigaction(signal, &previous, std::ptr::null_mut()) };
        }
    }
}
