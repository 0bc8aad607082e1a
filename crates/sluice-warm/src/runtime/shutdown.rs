//! Ending a service: what happens when the run is stopped (SIGINT, SIGTERM
//! or SIGHUP to the runtime) or when the service's root process exits.
//!
//! 1. A stop signal is forwarded to the service's root process, unless it
//!    reached it already: a terminal's Ctrl-C goes to the whole foreground
//!    process group, which the service shares with the runtime. Once the
//!    root has exited (on its own, or stopped), the processes it left
//!    behind get SIGTERM.
//! 2. The service then has the grace period to end: its root exited and
//!    none of its processes left.
//! 3. Whatever is left when the grace period runs out, or at once when a
//!    second stop request comes (a second Ctrl-C), gets SIGKILL.
//! 4. The runtime waits, bounded, for the root to be reaped and the
//!    processes to be gone, so that the cgroup can be removed after.
//!
//! Which processes are the service's is [`ServiceProcesses`]: with a
//! cgroup, every process in it ([`CgroupProcesses`]; the runtime has left
//! it by then); without, the root and its descendants ([`ProcessTree`]).
//! A tree remembers every process it has seen while it ends (by pid and
//! start time, so a reused pid is not taken for it), so a child whose
//! parent exited first is still killed. A process whose parent exited long
//! before (`sh -c 'worker & exit'`, a daemon's double fork) would have left
//! the tree for init; the `sluice warm` command's runtime is therefore a
//! child subreaper while a service runs ([`Adoption`]; `RunConfig::adopt_orphans`),
//! so such orphans become its own children and the tree counts them too.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use sluice_engine::cgroup::Cgroup;

use super::{Service, ServiceExit, StopRequest};
use crate::error::WarmError;

/// How often the service is looked at while it ends. 10 ms: short next to
/// any grace period, and 100 looks a second cost nothing.
const POLL: Duration = Duration::from_millis(10);

/// How long killed processes get to be gone. 5 s: a SIGKILLed process dies
/// within milliseconds unless it sleeps uninterruptibly (a hung network
/// file system), and then it may never; the runtime reports it and exits
/// rather than hang with it.
const REAP_TIMEOUT: Duration = Duration::from_secs(5);

/// The processes that make up a service.
pub trait ServiceProcesses {
    /// The service's processes still running (its root too, until it
    /// exits); never the runtime.
    fn pids(&mut self) -> Vec<i32>;

    /// Sends `signal` to every process in [`ServiceProcesses::pids`].
    fn signal_all(&mut self, signal: i32) {
        for pid in self.pids() {
            // SAFETY: kill(2) has no memory effects; a process gone
            // meanwhile gives ESRCH.
            unsafe { libc::kill(pid, signal) };
        }
    }

    /// Sends SIGKILL to every one.
    fn kill_all(&mut self) {
        self.signal_all(libc::SIGKILL);
    }
}

/// Every process in the service's cgroup. The runtime must have left it.
pub struct CgroupProcesses<'a>(pub &'a Cgroup);

impl ServiceProcesses for CgroupProcesses<'_> {
    fn pids(&mut self) -> Vec<i32> {
        let me = std::process::id() as i32;
        match self.0.pids() {
            Ok(pids) => pids.into_iter().filter(|&p| p != me).collect(),
            Err(err) => {
                tracing::warn!("{err}");
                Vec::new()
            }
        }
    }

    fn kill_all(&mut self) {
        if let Err(err) = self.0.kill_all() {
            tracing::warn!("{err}");
        }
    }
}

/// The runtime as a child subreaper (`PR_SET_CHILD_SUBREAPER`): orphans of
/// the service are re-parented to it rather than to init. Its children from
/// before the launch (a Python policy's host) are not the service's; every
/// later child but the root is an orphan of the service.
pub struct Adoption {
    runtime: i32,
    before: HashSet<i32>,
}

impl Adoption {
    /// Makes this process a subreaper and notes its children; `None`
    /// (logged) when the kernel refuses.
    pub fn before_launch() -> Option<Adoption> {
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
            let err = std::io::Error::last_os_error();
            tracing::info!(
                "PR_SET_CHILD_SUBREAPER: {err}: processes the service detaches are not followed"
            );
            return None;
        }
        let runtime = std::process::id() as i32;
        Some(Adoption {
            runtime,
            before: crate::idle_gate::children(runtime).into_iter().collect(),
        })
    }

    /// The service's orphans this process adopted (zombies included).
    fn orphans(&self, root: i32) -> Vec<i32> {
        crate::idle_gate::children(self.runtime)
            .into_iter()
            .filter(|pid| *pid != root && !self.before.contains(pid))
            .collect()
    }

    /// Reaps the adopted orphans that have exited, never the root (its
    /// `Child` does) nor a child from before the launch; returns those still
    /// running.
    pub fn reap(&self, root: i32) -> Vec<i32> {
        let mut running = self.orphans(root);
        running.retain(|&pid| {
            let alive = running_since(pid).is_some();
            if !alive {
                let mut status = 0;
                // SAFETY: waitpid on one pid of our own children, WNOHANG.
                unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            }
            alive
        });
        running
    }
}

impl Drop for Adoption {
    fn drop(&mut self) {
        // SAFETY: as in `before_launch`.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) };
    }
}

/// The service's root and its descendants, through
/// `/proc/PID/task/TID/children`, with the orphans the runtime adopted and
/// theirs, and every one seen before that is still running; zombies are
/// gone already.
pub struct ProcessTree<'a> {
    root: i32,
    adoption: Option<&'a Adoption>,
    /// Processes seen in the tree, by pid, with their start times.
    seen: HashMap<i32, u64>,
}

impl<'a> ProcessTree<'a> {
    /// A bound on the processes followed: a fork bomb must not stall the
    /// runtime.
    const MAX_PROCESSES: usize = 4096;

    pub fn new(root: i32, adoption: Option<&'a Adoption>) -> ProcessTree<'a> {
        ProcessTree {
            root,
            adoption,
            seen: HashMap::new(),
        }
    }
}

impl ServiceProcesses for ProcessTree<'_> {
    fn pids(&mut self) -> Vec<i32> {
        let mut stack = vec![self.root];
        if let Some(adoption) = self.adoption {
            stack.extend(adoption.reap(self.root));
        }
        while let Some(pid) = stack.pop() {
            if self.seen.len() >= Self::MAX_PROCESSES {
                break;
            }
            if let Some(started) = running_since(pid) {
                self.seen.insert(pid, started);
            }
            stack.extend(crate::idle_gate::children(pid));
        }
        self.seen
            .retain(|&pid, &mut started| running_since(pid) == Some(started));
        let mut pids: Vec<i32> = self.seen.keys().copied().collect();
        pids.sort_unstable();
        pids
    }
}

/// When `pid` started (clock ticks after boot), if it exists and is not a
/// zombie.
fn running_since(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's closing parenthesis: state (field 3) first,
    // start time is field 22.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?;
    let started = fields.nth(18)?.parse().ok()?;
    (!matches!(state, "Z" | "X")).then_some(started)
}

/// How a service ended, and what the runtime did to end it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ending {
    pub exit: ServiceExit,
    /// The signal that stopped the run, when one did (and the service had
    /// not exited first).
    pub stopped_by: Option<i32>,
    /// That signal was sent on to the service (it had not reached it).
    pub forwarded: bool,
    /// The grace period the service had.
    pub grace: Duration,
    /// Processes the root left running when it exited, sent SIGTERM.
    pub leftovers: usize,
    /// Processes still running when the grace period ran out (or a second
    /// stop request came), sent SIGKILL.
    pub killed: usize,
    /// Processes still there when the runtime stopped waiting for them.
    pub survivors: usize,
}

impl Ending {
    /// The plain end of a service that was never stopped: `exit`.
    pub fn exited(exit: ServiceExit) -> Ending {
        Ending {
            exit,
            stopped_by: None,
            forwarded: false,
            grace: Duration::ZERO,
            leftovers: 0,
            killed: 0,
            survivors: 0,
        }
    }
}

/// Ends `service`, whose processes are `processes`, as the module notes
/// say: forwards the stop request's signal (or SIGTERMs what the exited
/// root left), waits up to `grace`, kills what is left, and waits (bounded)
/// for it to be gone.
pub fn end_service(
    service: &mut dyn Service,
    processes: &mut dyn ServiceProcesses,
    stop: &StopRequest,
    grace: Duration,
) -> Result<Ending, WarmError> {
    // Seen before anything is signalled, so a tree knows the children of
    // a root that exits as soon as it is told to.
    processes.pids();
    let mut exit = service.try_exit()?;
    let mut ending = Ending::exited(exit.unwrap_or(ServiceExit::Code(0)));
    ending.grace = grace;
    if exit.is_none() {
        // Stopped (or the loop failed, which stops the service too).
        let signal = stop.signal().unwrap_or(libc::SIGTERM);
        ending.stopped_by = Some(signal);
        ending.forwarded = stop.forward() || stop.signal().is_none();
        if ending.forwarded {
            service.signal(signal);
        }
    }
    let deadline = Instant::now() + grace;
    let mut leftovers_told = false;
    loop {
        if exit.is_none() {
            exit = service.try_exit()?;
        }
        let mut left = processes.pids().len();
        if exit.is_some() && left > 0 && !leftovers_told {
            ending.leftovers = left;
            processes.signal_all(libc::SIGTERM);
            leftovers_told = true;
            left = processes.pids().len();
        }
        if exit.is_some() && left == 0 {
            break;
        }
        if Instant::now() >= deadline || stop.requests() >= 2 {
            ending.killed = left;
            processes.kill_all();
            service.signal(libc::SIGKILL);
            break;
        }
        std::thread::sleep(POLL);
    }
    let (exit, survivors) = reap(service, processes, exit)?;
    ending.exit = exit;
    ending.survivors = survivors;
    Ok(ending)
}

/// Waits up to [`REAP_TIMEOUT`] for the root's exit and the processes to be
/// gone, killing again what a v1 cgroup let fork meanwhile. An unreaped
/// root counts as killed.
fn reap(
    service: &mut dyn Service,
    processes: &mut dyn ServiceProcesses,
    mut exit: Option<ServiceExit>,
) -> Result<(ServiceExit, usize), WarmError> {
    let deadline = Instant::now() + REAP_TIMEOUT;
    loop {
        if exit.is_none() {
            exit = service.try_exit()?;
        }
        let left = processes.pids().len();
        if (exit.is_some() && left == 0) || Instant::now() >= deadline {
            if left > 0 || exit.is_none() {
                tracing::warn!(
                    "{left} processes of the service (root pid {}) still there after SIGKILL",
                    service.pid()
                );
            }
            return Ok((exit.unwrap_or(ServiceExit::Signal(libc::SIGKILL)), left));
        }
        processes.kill_all();
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests;
