//! Errors of setting up and running a mount; each names the root, mount point or value.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("bad mount option: {0}")]
    Config(#[from] sluice_engine::ConfigError),
    #[error("{root}: cannot list: {source}")]
    Backend {
        root: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {why}", path.display())]
    MountPoint { path: PathBuf, why: String },
    #[error("{}: a stale mount is left here (its daemon died); run `umount -l {}` (or `fusermount -u`) first", path.display(), path.display())]
    Stale { path: PathBuf },
    #[error("{}: cannot mount: {source}", path.display())]
    Mount {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start a thread: {0}")]
    Thread(std::io::Error),
    /// The background mount daemon (`--daemon`) failed: its exit status (what the same
    /// command in the foreground exits with) and what it logged.
    #[error("the mount daemon failed (exit status {code}): {said}")]
    Daemon { code: i32, said: String },
    #[error(transparent)]
    Remote(#[from] sluice_remote::RemoteError),
}

impl MountError {
    /// A bad option: `what` names it (with its value), `problem` what is wrong.
    pub fn config(what: impl Into<String>, problem: impl Into<String>) -> MountError {
        MountError::Config(sluice_engine::ConfigError::new(what, problem))
    }
}

/// Bad options are usage errors, a stale or busy mount point a path that is not what it
/// must be, a missing source not found; a daemon's failure is what its foreground run
/// would have been (the status it exited with).
impl sluice_engine::Classify for MountError {
    fn class(&self) -> sluice_engine::ErrorClass {
        use sluice_engine::ErrorClass;
        match self {
            MountError::Config(_) => ErrorClass::Config,
            MountError::Stale { .. } | MountError::MountPoint { .. } => ErrorClass::BadPath,
            MountError::Backend { source, .. } | MountError::Mount { source, .. } => {
                ErrorClass::of_io(source)
            }
            MountError::Remote(e) => e.class(),
            MountError::Thread(_) => ErrorClass::Io,
            MountError::Daemon { .. } => ErrorClass::Failed,
        }
    }

    /// A daemon's status is what the same command in the foreground would have exited
    /// with (1 to 4), passed on.
    fn exit_status(&self) -> Option<i32> {
        match self {
            MountError::Daemon { code, .. } => Some(if (1..=4).contains(code) { *code } else { 1 }),
            _ => None,
        }
    }
}
