//! Logging to stderr through one process-wide `tracing` subscriber whose
//! filter can be replaced after it is installed.
//!
//! A process has one global subscriber, and it can be set only once. The
//! native `sluice` binary sets it right after parsing `-v`. Inside the Python
//! extension, `sluice._sluice` sets it at import (warn, or `SLUICE_LOG`),
//! before the `sluice` console script has parsed its arguments. So the
//! subscriber carries a reloadable filter whose handle is kept here, and a
//! later [`init_logging`] swaps the filter rather than failing to install a
//! second subscriber. Both the binary and the extension go through this
//! function, so they log the same way.

use std::sync::OnceLock;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, reload, EnvFilter, Registry};

/// The handle of the installed subscriber's filter; unset until the first
/// [`init_logging`] installs it (or forever, if another subscriber was
/// already the global one).
static FILTER: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

/// The filter for `-v` given `verbose` times: warn, info, then debug.
/// `SLUICE_LOG` (an `EnvFilter` directive such as `sluice_warm=debug`)
/// overrides it.
///
/// Below debug, fuser's "Unmount failed" is left out: `sluice mount` unmounts
/// (lazily, when files are open) before fuser's own unmount on drop, which then
/// finds the mount gone or busy and logs an error for a clean stop. The mount's
/// own unmount reports its failures.
pub fn log_filter(verbose: u8) -> EnvFilter {
    let level = match verbose {
        0 => "warn,fuser::mnt::fuse_pure=off",
        1 => "info,fuser::mnt::fuse_pure=off",
        _ => "debug",
    };
    match std::env::var("SLUICE_LOG") {
        Ok(spec) if !spec.trim().is_empty() => EnvFilter::try_new(&spec).unwrap_or_else(|e| {
            // Said once, on stderr: the subscriber that would log it is not installed yet.
            let shown = level.split(',').next().unwrap_or(level);
            errln!("sluice: SLUICE_LOG={spec:?} is not a log filter ({e}); logging at {shown}");
            EnvFilter::new(level)
        }),
        _ => EnvFilter::new(level),
    }
}

/// Logs to stderr at warn, info or debug; `SLUICE_LOG` overrides. The first
/// call installs the global subscriber; later calls replace its filter.
pub fn init_logging(verbose: u8) {
    set_filter(log_filter(verbose));
}

/// Colour only for a person at a terminal: not when stderr is a pipe or a
/// file (logs collected by systemd, a CI runner or `2>log` stay plain), and
/// never with `NO_COLOR` set (no-color.org).
fn colour_wanted() -> bool {
    use std::io::IsTerminal;
    std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()) && std::io::stderr().is_terminal()
}

/// Installs the subscriber with `filter`, or gives the installed one `filter`.
fn set_filter(filter: EnvFilter) {
    if let Some(handle) = FILTER.get() {
        // Fails only when the subscriber has been dropped, which a global
        // one never is.
        let _ = handle.reload(filter);
        return;
    }
    let (filter, handle) = reload::Layer::new(filter);
    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(
            fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(colour_wanted()),
        )
        .try_init();
    if installed.is_ok() {
        let _ = FILTER.set(handle);
    }
}

#[cfg(test)]
mod tests {
    use tracing::Level;

    use super::*;

    #[test]
    fn a_later_call_changes_the_level_of_the_installed_subscriber() {
        // The only test in this crate's unit tests that installs a global subscriber.
        set_filter(EnvFilter::new("warn"));
        assert!(tracing::enabled!(Level::WARN) && !tracing::enabled!(Level::INFO));

        set_filter(EnvFilter::new("info"));
        assert!(tracing::enabled!(Level::INFO) && !tracing::enabled!(Level::DEBUG));

        set_filter(EnvFilter::new("debug"));
        assert!(tracing::enabled!(Level::DEBUG));
    }
}
