//! Memory cgroups around a service: the one `run --memory-limit` creates for
//! the service and the runtime, and the reader's cgroup a daemon joins.
//!
//! Page cache is charged to the cgroup of the process that first brings a
//! page in, so prefetch must run inside the cgroup whose limit it is meant
//! to respect: the runtime moves itself into the cgroup it creates before
//! it launches the service (which inherits it), and a daemon moves into
//! the cgroup of the first reader it sees.

use crate::error::WarmError;
use sluice_engine::cgroup::{self, Cgroup};

/// Creates a cgroup with `limit` and moves this process into it; the
/// service, spawned later, inherits it.
pub fn enter_cgroup(limit: u64) -> Result<Cgroup, WarmError> {
    let name = format!("sluice-warm-{}", std::process::id());
    let cgroup = cgroup::create_cgroup(&name, Some(limit))?;
    if let Err(err) = cgroup.add_pid(std::process::id() as i32) {
        let _ = cgroup.clone().remove();
        return Err(err.into());
    }
    tracing::info!(cgroup = %cgroup.path.display(), limit, "service cgroup created");
    Ok(cgroup)
}

/// Moves this process back to the parent cgroup and removes ours.
pub fn leave_cgroup(cgroup: Cgroup) {
    if let Some(parent) = cgroup.path.parent() {
        let procs = parent.join("cgroup.procs");
        if let Err(e) = std::fs::write(&procs, std::process::id().to_string()) {
            tracing::warn!("leaving {}: {e}", cgroup.path.display());
        }
    }
    let path = cgroup.path.clone();
    if let Err(e) = cgroup.remove() {
        tracing::warn!("cgroup {} left behind: {e}", path.display());
    }
}

/// A daemon prefetches for services it did not start: it joins the memory
/// cgroup of the first reader it sees, so the page cache it fills is
/// charged where that service's limit applies (and its watermark is the
/// service's). Returns whether it moved, or `None` when the reader's
/// cgroup could not be read (it already exited: a short-lived `cat` of a
/// config file), so the next reader is tried.
pub fn join_reader_cgroup(pid: i32) -> Option<bool> {
    let theirs = cgroup::memory_cgroup_of(pid)?;
    if cgroup::memory_cgroup_of(std::process::id() as i32).as_ref() == Some(&theirs) {
        return Some(false);
    }
    match theirs.add_pid(std::process::id() as i32) {
        Ok(()) => {
            tracing::info!(cgroup = %theirs.path.display(), pid, "prefetch now charged to the reader's cgroup");
            Some(true)
        }
        Err(err) => {
            tracing::warn!(
                "cannot join the reader's cgroup {}: {err}",
                theirs.path.display()
            );
            Some(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_gone_before_its_cgroup_is_read_leaves_the_join_to_the_next() {
        assert_eq!(join_reader_cgroup(i32::MAX), None);
        // Our own cgroup: decided, nothing to move.
        let me = std::process::id() as i32;
        if cgroup::memory_cgroup_of(me).is_some() {
            assert_eq!(join_reader_cgroup(me), Some(false));
        }
    }
}
