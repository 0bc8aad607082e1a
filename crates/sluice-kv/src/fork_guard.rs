//! [`ForkGuard`]: which process a handle belongs to.
//!
//! `fork` copies an open store, or a sidecar connection, into the child. The copy is
//! not a second handle: its memory holds the parent's index and slot reservations, but
//! the segment files, the directory lock, the sockets and the shared regions it points
//! at are the parent's, and none of the parent's threads (job threads, the reclaimer)
//! exist in the child. A child that used it would append into slots its parent also
//! reserves, and a client would interleave frames with its parent on one socket and read
//! its parent's blocks out of one shared region. So every call checks that it runs in
//! the process that opened the handle, and a forked child gets
//! [`KvError::Forked`](crate::KvError::Forked); letting go of the copy in the child
//! touches none of the parent's files, locks or threads.

use std::path::Path;

use crate::error::KvError;

/// The process that opened a handle.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ForkGuard {
    opened_by: u32,
}

impl ForkGuard {
    /// Records the calling process as the handle's.
    pub(crate) fn this_process() -> ForkGuard {
        ForkGuard {
            opened_by: std::process::id(),
        }
    }

    /// Whether this process is a fork of the one that opened the handle.
    pub(crate) fn is_forked(self) -> bool {
        std::process::id() != self.opened_by
    }

    /// `Err` naming both processes when this one is a fork of the handle's; `path` is the
    /// store or the socket.
    pub(crate) fn check(self, path: &Path) -> Result<(), KvError> {
        match self.is_forked() {
            false => Ok(()),
            true => Err(KvError::Forked {
                path: path.to_path_buf(),
                opened_by: self.opened_by,
                this: std::process::id(),
            }),
        }
    }
}
