//! Which processes belong to the service: the root it launched and its
//! descendants, followed through the parent pid in `/proc/PID/stat`, with
//! verdicts cached per pid.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

/// The root while the service is being launched: its pid is coming.
pub(crate) const AWAITING: i32 = i32::MIN;

/// The root before a service is launched: no process is the service's.
pub(crate) const NOBODY: i32 = i32::MIN + 1;

/// How long a verdict waits for the launched service's pid.
const AWAIT_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether a process belongs to the service: the root or a descendant.
pub(super) struct ProcessTree {
    root: Arc<AtomicI32>,
    /// Verdicts per pid, for the current root.
    known: HashMap<i32, bool>,
    known_root: i32,
}

impl ProcessTree {
    /// Pids remembered at most; a long run with many short processes
    /// starts over rather than grow.
    const MAX_KNOWN: usize = 4096;

    pub(super) fn new(root: Arc<AtomicI32>) -> ProcessTree {
        ProcessTree {
            root,
            known: HashMap::new(),
            known_root: 0,
        }
    }

    /// `pid` is the root or descends from it; `true` for every process
    /// while no root is set, and for a process already gone (it cannot be
    /// placed; counting it is the old behaviour, the safe side for a
    /// recording of a service's short-lived helpers). While the service is
    /// being launched ([`AWAITING`]) the verdict waits for its pid, up to
    /// [`AWAIT_LIMIT`]: the service's first reads can come before its
    /// launcher learns the pid, and nothing else is the service's then,
    /// not even the launcher's other children.
    pub(super) fn contains(&mut self, pid: i32) -> bool {
        let mut root = self.root.load(Ordering::SeqCst);
        if root == NOBODY {
            return false;
        }
        if root == AWAITING {
            let since = std::time::Instant::now();
            while root == AWAITING && since.elapsed() < AWAIT_LIMIT {
                std::thread::sleep(std::time::Duration::from_micros(200));
                root = self.root.load(Ordering::SeqCst);
            }
            if root == AWAITING {
                return false; // the launch failed or hangs: nothing is the service's
            }
        }
        if root <= 0 || pid == root {
            return true;
        }
        if root != self.known_root || self.known.len() >= Self::MAX_KNOWN {
            self.known.clear();
            self.known_root = root;
        }
        if let Some(&known) = self.known.get(&pid) {
            return known;
        }
        let verdict = descends_from(pid, root, |p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|stat| parent_in_stat(&stat))
        });
        if let Some(verdict) = verdict {
            self.known.insert(pid, verdict);
        }
        verdict.unwrap_or(true)
    }
}

/// Whether `pid`'s chain of parents reaches `root`; `None` when a process
/// on the way is gone. An orphan re-parented to init (or to a subreaper
/// outside the tree) is not in the tree.
pub(super) fn descends_from(
    pid: i32,
    root: i32,
    parent_of: impl Fn(i32) -> Option<i32>,
) -> Option<bool> {
    let mut at = pid;
    for _ in 0..128 {
        let parent = parent_of(at)?;
        if parent == root {
            return Some(true);
        }
        if parent <= 1 {
            return Some(false);
        }
        at = parent;
    }
    Some(false)
}

/// The parent pid in a `/proc/PID/stat` line: the second field after the
/// command name, which is in parentheses and may itself hold spaces and
/// parentheses.
pub(super) fn parent_in_stat(stat: &str) -> Option<i32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn before_a_launch_nothing_counts_and_during_one_verdicts_wait_for_the_pid() {
        let me = std::process::id() as i32;
        let root = Arc::new(AtomicI32::new(NOBODY));
        let mut tree = ProcessTree::new(root.clone());
        // Our own child would have counted when the root was this process.
        assert!(!tree.contains(me));
        root.store(AWAITING, Ordering::SeqCst);
        let setter = {
            let root = root.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                root.store(me, Ordering::SeqCst);
            })
        };
        let started = std::time::Instant::now();
        assert!(tree.contains(me), "the launched root counts once known");
        assert!(started.elapsed() >= std::time::Duration::from_millis(40));
        setter.join().unwrap();
        // Not a descendant of the root (our parent is not our child).
        let parent = std::os::unix::process::parent_id() as i32;
        assert!(!tree.contains(parent));
    }

    #[test]
    fn a_launch_that_never_reports_its_pid_counts_nobody() {
        let root = Arc::new(AtomicI32::new(AWAITING));
        let mut tree = ProcessTree::new(root);
        let started = std::time::Instant::now();
        assert!(!tree.contains(std::process::id() as i32));
        assert!(started.elapsed() >= AWAIT_LIMIT);
    }
}
