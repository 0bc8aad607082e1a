//! fanotify event source: who opens, reads and maps model files, and where.
//!
//! Two levels, chosen by what the kernel and file system allow:
//!
//! - **Pre-content** (Linux ≥ 6.14 on ext4, xfs, btrfs; CAP_SYS_ADMIN): a
//!   `FAN_CLASS_PRE_CONTENT` group with `FAN_PRE_ACCESS` gives the exact,
//!   page-aligned range of every read()/pread() and one event covering the
//!   mapping at mmap() time (page faults give none). These are permission
//!   events: the reader blocks until we answer.
//! - **Notification**: a `FAN_CLASS_NOTIF` group with `FAN_OPEN` says which
//!   process opened which file, nothing more; progress then comes from the
//!   samplers.
//!
//! Where neither works (no privilege, tmpfs, old kernel) [`Watch::open`]
//! returns `Unsupported` and the caller falls back to explicit mode.
//!
//! **Every permission event is answered, first.** The reader thread answers
//! ALLOW before it does anything else with an event, and hands events to
//! the policy side through a bounded queue it never blocks on (a full queue
//! drops the event and counts it). Events caused by this process are
//! answered and ignored, so the runtime's own reads can never wait on
//! themselves.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::error::WarmError;
use crate::policy::{AccessEvent, AccessKind};
use event_buffer::{answer, for_each_event, parse_range};
use process_tree::ProcessTree;

mod event_buffer;
mod process_tree;
#[cfg(test)]
mod tests;

/// `FAN_PRE_ACCESS` (Linux 6.14; not yet in the libc crate).
const FAN_PRE_ACCESS: u64 = 0x0010_0000;
/// Info record carrying the accessed range of a pre-content event.
const FAN_EVENT_INFO_TYPE_RANGE: u8 = 6;
const METADATA_LEN: usize = std::mem::size_of::<libc::fanotify_event_metadata>();

/// What a [`Watch`] can see.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// Exact read ranges and mmap events (`FAN_PRE_ACCESS`).
    PreContent,
    /// Opens only (`FAN_OPEN`).
    Open,
}

/// Counters of a running watch.
#[derive(Debug, Default)]
pub struct WatchStats {
    pub events: AtomicU64,
    /// Permission events answered (all of them).
    pub answered: AtomicU64,
    /// Events dropped because the consumer was behind.
    pub dropped: AtomicU64,
    /// Events from this process, answered and ignored.
    pub own: AtomicU64,
    /// Events from processes outside the service's tree (see
    /// [`Watch::only_tree_of`]), answered and ignored.
    pub foreign: AtomicU64,
    /// Permission events whose answer the kernel did not take (logged).
    pub unanswered: AtomicU64,
    /// Events whose lengths did not add up (logged; answered where their
    /// descriptor could be found).
    pub malformed: AtomicU64,
}

/// A fanotify watch over files, delivering [`AccessEvent`]s.
pub struct Watch {
    pub level: Level,
    pub stats: Arc<WatchStats>,
    /// The service's root process, once known (0: every process counts).
    root: Arc<AtomicI32>,
    events: Receiver<AccessEvent>,
    stop: Arc<AtomicBool>,
    wake: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

impl Watch {
    /// Watches `files` (their inodes: only files opened after this call
    /// produce pre-content events), at the best level available unless
    /// `level` asks for one. `queue` bounds the events waiting for the
    /// consumer.
    pub fn open(files: &[PathBuf], level: Option<Level>, queue: usize) -> Result<Watch, WarmError> {
        let levels: &[Level] = match level {
            Some(Level::PreContent) => &[Level::PreContent],
            Some(Level::Open) => &[Level::Open],
            None => &[Level::PreContent, Level::Open],
        };
        let mut reasons = Vec::new();
        for &level in levels {
            match Group::new(level, files) {
                Ok(group) => return Ok(Watch::start(group, level, queue)),
                Err(reason) => {
                    tracing::info!("fanotify {level:?} unavailable: {reason}");
                    reasons.push(format!("{level:?}: {reason}"));
                }
            }
        }
        Err(WarmError::Unsupported {
            feature: "fanotify",
            reason: reasons.join("; "),
        })
    }

    fn start(group: Group, level: Level, queue: usize) -> Watch {
        let (tx, rx) = std::sync::mpsc::sync_channel(queue.max(1));
        let stats = Arc::new(WatchStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        // SAFETY: eventfd returns a new descriptor or -1, checked below.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        let wake = if raw >= 0 {
            // SAFETY: `raw` is a fresh descriptor we own.
            unsafe { OwnedFd::from_raw_fd(raw) }
        } else {
            // Without an eventfd, stop by closing: poll on a dup of the group.
            // SAFETY: dup of a valid descriptor.
            unsafe { OwnedFd::from_raw_fd(libc::dup(group.fd.as_raw_fd())) }
        };
        let wake_raw = wake.as_raw_fd();
        let root = Arc::new(AtomicI32::new(0));
        let thread = {
            let stats = stats.clone();
            let stop = stop.clone();
            let tree = ProcessTree::new(root.clone());
            std::thread::Builder::new()
                .name("sluice-fanotify".into())
                .spawn(move || group.run(tx, &stats, &stop, wake_raw, tree))
                .ok()
        };
        Watch {
            level,
            stats,
            root,
            events: rx,
            stop,
            wake,
            thread,
        }
    }

    /// From now on only `pid` and its descendants count: other processes'
    /// events are answered and dropped, so a monitoring tool or a second
    /// service opening the model files can neither steer a replay nor end
    /// up in a recording.
    pub fn only_tree_of(&self, pid: i32) {
        self.root.store(pid, Ordering::SeqCst);
    }

    /// A service will be launched, but not yet: no process counts.
    pub fn no_service_yet(&self) {
        self.root.store(process_tree::NOBODY, Ordering::SeqCst);
    }

    /// A service is being launched: events wait (briefly) for its pid, then
    /// count only if they come from its tree ([`Watch::only_tree_of`]).
    pub fn awaiting_service(&self) {
        self.root.store(process_tree::AWAITING, Ordering::SeqCst);
    }

    /// The next event, waiting at most `timeout`.
    pub fn recv_timeout(&self, timeout: std::time::Duration) -> Option<AccessEvent> {
        self.events.recv_timeout(timeout).ok()
    }

    /// Every event waiting now.
    pub fn drain(&self) -> Vec<AccessEvent> {
        self.events.try_iter().collect()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a valid u64 to our eventfd.
        unsafe {
            libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An initialized, marked fanotify group.
struct Group {
    fd: OwnedFd,
    level: Level,
}

impl Group {
    fn new(level: Level, files: &[PathBuf]) -> Result<Group, String> {
        let class = match level {
            Level::PreContent => libc::FAN_CLASS_PRE_CONTENT,
            Level::Open => libc::FAN_CLASS_NOTIF,
        };
        let flags = class | libc::FAN_CLOEXEC | libc::FAN_NONBLOCK;
        let event_flags = (libc::O_RDONLY | libc::O_LARGEFILE | libc::O_CLOEXEC) as libc::c_uint;
        // SAFETY: plain syscall with constant arguments.
        let raw = unsafe { libc::fanotify_init(flags, event_flags) };
        if raw < 0 {
            return Err(format!(
                "fanotify_init: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: `raw` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mask = match level {
            Level::PreContent => FAN_PRE_ACCESS,
            Level::Open => libc::FAN_OPEN,
        };
        for path in files {
            let c = CString::new(path.as_os_str().as_bytes())
                .map_err(|_| format!("{}: path holds a NUL byte", path.display()))?;
            // SAFETY: valid descriptor and NUL-terminated path.
            let rc = unsafe {
                libc::fanotify_mark(
                    fd.as_raw_fd(),
                    libc::FAN_MARK_ADD | libc::FAN_MARK_INODE,
                    mask,
                    libc::AT_FDCWD,
                    c.as_ptr(),
                )
            };
            if rc < 0 {
                return Err(format!(
                    "fanotify_mark {}: {}",
                    path.display(),
                    std::io::Error::last_os_error()
                ));
            }
        }
        Ok(Group { fd, level })
    }

    /// The reader loop: answer, translate, hand over; until stopped.
    fn run(
        self,
        tx: SyncSender<AccessEvent>,
        stats: &WatchStats,
        stop: &AtomicBool,
        wake: i32,
        mut tree: ProcessTree,
    ) {
        let own_pid = std::process::id() as i32;
        let mut buf = vec![0u8; 64 * 1024];
        while !stop.load(Ordering::SeqCst) {
            let mut fds = [
                libc::pollfd {
                    fd: self.fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: wake,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: two valid pollfd entries.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, 1000) };
            if n <= 0 || fds[0].revents & libc::POLLIN == 0 {
                continue;
            }
            // SAFETY: reading into our buffer of its length.
            let got =
                unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if got <= 0 {
                continue;
            }
            let events = &buf[..got as usize];
            let damaged = for_each_event(events, |meta, info| {
                self.handle(&meta, info, own_pid, &mut tree, &tx, stats);
            });
            if damaged > 0 {
                stats.malformed.fetch_add(damaged, Ordering::Relaxed);
                tracing::warn!(
                    "fanotify: {damaged} event(s) with inconsistent lengths in a {got}-byte read"
                );
            }
        }
    }

    fn handle(
        &self,
        meta: &libc::fanotify_event_metadata,
        info: &[u8],
        own_pid: i32,
        tree: &mut ProcessTree,
        tx: &SyncSender<AccessEvent>,
        stats: &WatchStats,
    ) {
        stats.events.fetch_add(1, Ordering::Relaxed);
        if meta.fd < 0 {
            return; // queue overflow marker
        }
        // SAFETY: the kernel handed us this descriptor; we own it now.
        let file = unsafe { OwnedFd::from_raw_fd(meta.fd) };
        let own = meta.pid == own_pid;
        // Placed before the answer: a permission event's reader is blocked
        // until we answer, so it cannot have exited and left the tree
        // unknowable (a short-lived outsider let go first could be gone by
        // the /proc lookup, and a gone process counts as the service's). An
        // opener (open-level events) has only just opened.
        let in_tree = own || tree.contains(meta.pid);
        if meta.mask & FAN_PRE_ACCESS != 0 {
            // Answered before anything else can return early.
            answer(self.fd.as_raw_fd(), meta, stats);
        }
        if own {
            stats.own.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if !in_tree {
            if stats.foreign.fetch_add(1, Ordering::Relaxed) == 0 {
                tracing::info!(
                    "ignoring pid {} and any other process outside the service's tree",
                    meta.pid
                );
            }
            return;
        }
        let Ok(path) = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())) else {
            return;
        };
        let (kind, offset, len) = match (self.level, parse_range(info)) {
            (Level::PreContent, Some((offset, count))) => (AccessKind::Read, offset, count),
            (Level::PreContent, None) => (AccessKind::Mmap, 0, file_size(&file)),
            (Level::Open, _) => (AccessKind::Open, 0, 0),
        };
        let event = AccessEvent {
            pid: meta.pid,
            worker: None,
            path,
            offset,
            len,
            kind,
        };
        if let Err(TrySendError::Full(_)) = tx.try_send(event) {
            stats.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn file_size(fd: &OwnedFd) -> u64 {
    // SAFETY: fstat on a valid descriptor into a zeroed struct.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd.as_raw_fd(), &mut st) == 0 {
            st.st_size as u64
        } else {
            0
        }
    }
}

/// Whether `path` is on a file system and kernel where pre-content events
/// work (a probe: init + mark, then drop).
pub fn pre_content_supported(path: &Path) -> Result<(), WarmError> {
    Group::new(Level::PreContent, &[path.to_path_buf()])
        .map(drop)
        .map_err(|reason| WarmError::Unsupported {
            feature: "fanotify pre-content events",
            reason,
        })
}
