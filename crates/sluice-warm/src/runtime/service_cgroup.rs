//! Memory cgroups around a service: the one `run --memory-limit` creates for
//! the service and the runtime, and the reader's cgroup a daemon joins.
//!
//! Page cache is charged to the cgroup of the process that first brings a
//! page in, so prefetch must run inside the cgroup whose limit it is meant
//! to respect: the runtime moves itself into the cgroup it creates before
//! it launches the service (which inherits it), and a daemon moves into
//! the cgroup of the first reader it sees.
//!
//! Inside the service's limit the runtime is exposed to the kernel's OOM
//! killer, which must take the service, never the runtime (that would leave
//! no report and the cgroup behind): the runtime sets its own
//! `oom_score_adj` to -1000 (never chosen) and the service is launched with
//! the score the runtime had. Lowering a score needs CAP_SYS_RESOURCE,
//! which containers usually drop (Docker's default set does); then the
//! service is launched with +1000 instead, which makes it the OOM killer's
//! first choice inside the cgroup, and, the cost, outside it too. When the
//! service ends, the runtime leaves the cgroup first ([`leave_cgroup`]), so
//! that everything left in it is the service's and can be killed, then
//! removes it ([`remove_cgroup`]).

use std::time::{Duration, Instant};

use crate::error::WarmError;
use sluice_engine::cgroup::{self, Cgroup};

/// `oom_score_adj` that exempts a process from the OOM killer.
const OOM_SCORE_ADJ_MIN: i32 = -1000;

/// `oom_score_adj` that makes a process the OOM killer's first choice.
const OOM_SCORE_ADJ_MAX: i32 = 1000;

/// How long a cgroup whose processes were all killed may stay busy: the
/// kernel unlinks a dead task from its cgroup a little after it exits. 1 s
/// is far above the milliseconds that takes.
const REMOVE_TIMEOUT: Duration = Duration::from_secs(1);

/// The cgroup a run created, and the runtime's OOM score before it joined.
pub struct ServiceCgroup {
    pub cgroup: Cgroup,
    pub limit: u64,
    /// The runtime's own `oom_score_adj` before it lowered it to -1000;
    /// `None` when it could not (then the service gets +1000 instead).
    pub runtime_score_before: Option<i32>,
}

impl ServiceCgroup {
    /// The `oom_score_adj` the service is launched with: the runtime's own
    /// from before it protected itself, or +1000 when it could not.
    pub fn service_oom_score(&self) -> i32 {
        self.runtime_score_before.unwrap_or(OOM_SCORE_ADJ_MAX)
    }
}

/// The name of the cgroup runtime `pid` creates.
fn cgroup_name(pid: u32) -> String {
    format!("{CGROUP_PREFIX}{pid}")
}

const CGROUP_PREFIX: &str = "sluice-warm-";

/// Removes the cgroups of runtimes that died without removing theirs (a
/// SIGKILL): each one whose runtime's pid is gone and which holds no
/// process. One whose service still runs is left to it, logged, and
/// removed by a later run once empty. Returns the cgroups removed.
pub fn sweep_dead_cgroups() -> Vec<std::path::PathBuf> {
    let Ok((_, parent)) = cgroup::memory_hierarchy() else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(&parent) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(CGROUP_PREFIX))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let path = entry.path();
        match std::fs::remove_dir(&path) {
            Ok(()) => {
                tracing::info!(cgroup = %path.display(), "removed the cgroup of a dead runtime");
                removed.push(path);
            }
            Err(err) => tracing::warn!(
                cgroup = %path.display(),
                "the cgroup of a dead runtime (pid {pid}) stays: {err} (its service still runs?)"
            ),
        }
    }
    removed
}

/// Creates a cgroup with `limit`, takes this process out of the OOM killer's
/// reach and moves it into the cgroup; the service, spawned later, inherits
/// the cgroup. The score is lowered first: a cgroup that runs out of memory
/// in between (another thread of this process allocating) must not pick it.
pub fn enter_cgroup(limit: u64) -> Result<ServiceCgroup, WarmError> {
    let name = cgroup_name(std::process::id());
    let cgroup = cgroup::create_cgroup(&name, Some(limit))?;
    let runtime_score_before = protect_from_oom();
    if let Err(err) = cgroup.add_pid(std::process::id() as i32) {
        restore_oom_score(runtime_score_before);
        let _ = cgroup.clone().remove();
        return Err(err.into());
    }
    tracing::info!(cgroup = %cgroup.path.display(), limit, "service cgroup created");
    Ok(ServiceCgroup {
        cgroup,
        limit,
        runtime_score_before,
    })
}

fn restore_oom_score(before: Option<i32>) {
    if let Some(score) = before {
        let _ = std::fs::write("/proc/self/oom_score_adj", score.to_string());
    }
}

/// Sets this process's `oom_score_adj` to -1000; returns the value it had,
/// or `None` (logged) when it cannot be changed (no CAP_SYS_RESOURCE).
fn protect_from_oom() -> Option<i32> {
    let file = "/proc/self/oom_score_adj";
    let before = std::fs::read_to_string(file).ok()?.trim().parse().ok()?;
    match std::fs::write(file, OOM_SCORE_ADJ_MIN.to_string()) {
        Ok(()) => Some(before),
        Err(err) => {
            tracing::info!(
                "{file}: {err} (no CAP_SYS_RESOURCE): the service gets oom_score_adj \
                 {OOM_SCORE_ADJ_MAX} instead, so the OOM killer takes it before the runtime"
            );
            None
        }
    }
}

/// Moves this process back to the cgroup's parent and restores its OOM
/// score; the service's processes stay.
pub fn leave_cgroup(cgroup: &ServiceCgroup) {
    let path = &cgroup.cgroup.path;
    if let Some(parent) = path.parent() {
        let procs = parent.join("cgroup.procs");
        if let Err(e) = std::fs::write(&procs, std::process::id().to_string()) {
            tracing::warn!("leaving {}: {e}", path.display());
        }
    }
    restore_oom_score(cgroup.runtime_score_before);
}

/// Removes the cgroup once the service's processes are gone, waiting up to
/// [`REMOVE_TIMEOUT`] for the kernel to let go of them; `false` (logged)
/// when it stays.
pub fn remove_cgroup(cgroup: ServiceCgroup) -> bool {
    let deadline = Instant::now() + REMOVE_TIMEOUT;
    loop {
        match cgroup.cgroup.clone().remove() {
            Ok(()) => return true,
            Err(e) if Instant::now() >= deadline => {
                tracing::warn!("cgroup left behind: {e}");
                return false;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
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
