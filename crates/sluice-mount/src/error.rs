//! Errors of setting up and running a mount; each names the root, mount point or value.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("bad mount option: {0}")]
    Config(String),
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
