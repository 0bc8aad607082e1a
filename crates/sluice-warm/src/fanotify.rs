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

use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::error::WarmError;
use crate::policy::{AccessEvent, AccessKind};

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
        if meta.mask & FAN_PRE_ACCESS != 0 {
            // Answer first, whatever happens next.
            answer(self.fd.as_raw_fd(), meta, stats);
        }
        if meta.pid == own_pid {
            stats.own.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // Checked while the process is most likely alive: a permission
        // event's reader was just let go, an opener has only just opened.
        if !tree.contains(meta.pid) {
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

/// Whether a process belongs to the service: the root or a descendant.
struct ProcessTree {
    root: Arc<AtomicI32>,
    /// Verdicts per pid, for the current root.
    known: HashMap<i32, bool>,
    known_root: i32,
}

impl ProcessTree {
    /// Pids remembered at most; a long run with many short processes
    /// starts over rather than grow.
    const MAX_KNOWN: usize = 4096;

    fn new(root: Arc<AtomicI32>) -> ProcessTree {
        ProcessTree {
            root,
            known: HashMap::new(),
            known_root: 0,
        }
    }

    /// `pid` is the root or descends from it; `true` for every process
    /// while no root is set, and for a process already gone (it cannot be
    /// placed; counting it is the old behaviour, the safe side for a
    /// recording of a service's short-lived helpers).
    fn contains(&mut self, pid: i32) -> bool {
        let root = self.root.load(Ordering::Relaxed);
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
fn descends_from(pid: i32, root: i32, parent_of: impl Fn(i32) -> Option<i32>) -> Option<bool> {
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
fn parent_in_stat(stat: &str) -> Option<i32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Attempts at writing one permission answer: a write interrupted by a
/// signal is retried, and two more tries cost nothing next to a reader
/// blocked for good.
const ANSWER_ATTEMPTS: u32 = 3;

/// Allows the access of permission event `meta` and counts the answer only
/// when the kernel took it. A failed answer is logged and counted in
/// [`WatchStats::unanswered`]: `ENOENT` means the kernel no longer waits
/// for it (the reader died), anything else leaves the reader blocked until
/// the group closes, which the runtime reports.
fn answer(group: RawFd, meta: &libc::fanotify_event_metadata, stats: &WatchStats) {
    let response = libc::fanotify_response {
        fd: meta.fd,
        response: libc::FAN_ALLOW,
    };
    let size = std::mem::size_of::<libc::fanotify_response>();
    let mut last = None;
    for _ in 0..ANSWER_ATTEMPTS {
        // SAFETY: writing a response struct that lives across the call to
        // the group descriptor.
        let rc = unsafe {
            libc::write(
                group,
                (&response as *const libc::fanotify_response).cast(),
                size,
            )
        };
        if rc == size as isize {
            stats.answered.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let err = if rc < 0 {
            std::io::Error::last_os_error()
        } else {
            std::io::Error::new(std::io::ErrorKind::WriteZero, format!("short write: {rc}"))
        };
        let retry = err.kind() == std::io::ErrorKind::Interrupted;
        last = Some(err);
        if !retry {
            break;
        }
    }
    stats.unanswered.fetch_add(1, Ordering::Relaxed);
    if let Some(err) = last {
        tracing::warn!(
            "fanotify: could not answer the access of pid {} (event fd {}): {err}",
            meta.pid,
            meta.fd
        );
    }
}

/// Calls `f` with each well-formed event of a buffer read from a fanotify
/// group, and its info records. The kernel's lengths are checked before
/// anything is sliced: an event whose `metadata_len` is below the struct or
/// past its `event_len` is still handed over, with no info records (its
/// descriptor must be answered and closed); an `event_len` below the struct
/// or past the buffer ends the walk, since neither that event nor anything
/// after it can be located. Returns how many events were damaged.
fn for_each_event(buf: &[u8], mut f: impl FnMut(libc::fanotify_event_metadata, &[u8])) -> u64 {
    let mut damaged = 0;
    let mut at = 0usize;
    while let Some(rest) = buf.get(at..).filter(|rest| !rest.is_empty()) {
        let Some(meta) = read_metadata(rest) else {
            return damaged + 1;
        };
        let len = meta.event_len as usize;
        // The kernel copies whole events only, so a length below the
        // struct or past the buffer means nothing in it can be trusted, not
        // even its descriptor (closing a wrong one would break another part
        // of this process): stop here.
        let Some(event) = rest.get(..len).filter(|_| len >= METADATA_LEN) else {
            return damaged + 1;
        };
        let info = match event.get(meta.metadata_len as usize..) {
            Some(info) if meta.metadata_len as usize >= METADATA_LEN => info,
            _ => {
                damaged += 1;
                &[]
            }
        };
        f(meta, info);
        at += len;
    }
    damaged
}

/// The event metadata at the start of `bytes`, or `None` when fewer bytes
/// than the struct are left.
fn read_metadata(bytes: &[u8]) -> Option<libc::fanotify_event_metadata> {
    let head = bytes.get(..METADATA_LEN)?;
    // SAFETY: `head` holds METADATA_LEN bytes, the struct is plain integers
    // (any bit pattern is valid), and read_unaligned copes with any
    // alignment.
    Some(unsafe { std::ptr::read_unaligned(head.as_ptr().cast()) })
}

/// The range record of a pre-content event: header (type u8, pad u8, len
/// u16), u32 pad, u64 offset, u64 count.
fn parse_range(mut info: &[u8]) -> Option<(u64, u64)> {
    while info.len() >= 4 {
        let kind = info[0];
        let len = u16::from_ne_bytes([info[2], info[3]]) as usize;
        if len < 4 || len > info.len() {
            return None;
        }
        if kind == FAN_EVENT_INFO_TYPE_RANGE && len >= 24 {
            let offset = u64::from_ne_bytes(info[8..16].try_into().ok()?);
            let count = u64::from_ne_bytes(info[16..24].try_into().ok()?);
            return Some((offset, count));
        }
        info = &info[len..];
    }
    None
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

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_testkit::is_root;
    use std::io::{Read, Seek, SeekFrom};
    use std::time::Duration;

    fn model(dir: &Path) -> PathBuf {
        let path = dir.join("w.bin");
        std::fs::write(&path, vec![7u8; 4 << 20]).unwrap();
        path
    }

    /// Reads from a child process (events from our own pid are ignored).
    fn child_reads(path: &Path, offset: u64, len: u64) {
        let status = std::process::Command::new("dd")
            .arg(format!("if={}", path.display()))
            .arg("of=/dev/null")
            .arg("bs=1M")
            .arg(format!("skip={}", offset >> 20))
            .arg(format!("count={}", len >> 20))
            .arg("status=none")
            .status()
            .expect("dd runs");
        assert!(status.success());
    }

    #[test]
    fn pre_content_reports_read_ranges_and_answers_every_event() {
        if !is_root() {
            eprintln!("skipped: needs root for fanotify");
            return;
        }
        let Some(dir) = sluice_testkit::disk_tempdir() else {
            return;
        };
        let path = model(dir.path());
        let watch = match Watch::open(std::slice::from_ref(&path), Some(Level::PreContent), 64) {
            Ok(w) => w,
            Err(e) => {
                eprintln!("skipped: {e}");
                return;
            }
        };
        child_reads(&path, 1 << 20, 2 << 20);
        let mut ranges = Vec::new();
        while let Some(e) = watch.recv_timeout(Duration::from_millis(500)) {
            assert_eq!(e.path, path);
            assert_eq!(e.kind, AccessKind::Read);
            ranges.push((e.offset, e.len));
        }
        assert!(!ranges.is_empty(), "no events");
        let first = ranges.iter().map(|r| r.0).min().unwrap();
        let end = ranges.iter().map(|r| r.0 + r.1).max().unwrap();
        assert!(first <= 1 << 20 && end >= 3 << 20, "{ranges:?}");
        let s = &watch.stats;
        assert_eq!(
            s.answered.load(Ordering::Relaxed),
            s.events.load(Ordering::Relaxed)
        );
        // Our own reads are answered and ignored: no deadlock, no event.
        let mut f = std::fs::File::open(&path).unwrap();
        f.seek(SeekFrom::Start(0)).unwrap();
        let mut buf = vec![0u8; 1 << 20];
        f.read_exact(&mut buf).unwrap();
        assert!(watch.recv_timeout(Duration::from_millis(200)).is_none());
        assert!(s.own.load(Ordering::Relaxed) >= 1);
    }

    #[test]
    fn open_level_reports_opens_and_tmpfs_refuses_pre_content() {
        if !is_root() {
            eprintln!("skipped: needs root for fanotify");
            return;
        }
        let Some(dir) = sluice_testkit::disk_tempdir() else {
            return;
        };
        let path = model(dir.path());
        let watch = Watch::open(std::slice::from_ref(&path), Some(Level::Open), 64).unwrap();
        child_reads(&path, 0, 1 << 20);
        let e = watch
            .recv_timeout(Duration::from_secs(2))
            .expect("an open event");
        assert_eq!((e.kind, e.path.clone()), (AccessKind::Open, path.clone()));
        assert!(e.pid > 0 && e.pid != std::process::id() as i32);
        if Path::new("/dev/shm").is_dir() {
            let shm = tempfile::tempdir_in("/dev/shm").unwrap();
            let f = model(shm.path());
            let err = pre_content_supported(&f).unwrap_err();
            assert!(matches!(err, WarmError::Unsupported { .. }), "{err}");
        }
    }

    #[test]
    fn the_service_tree_is_followed_through_parents() {
        // 10 launched 11, which launched 12; 20 is unrelated; 30 was
        // orphaned to init; 40's parent is gone.
        let parents = HashMap::from([(11, 10), (12, 11), (20, 5), (5, 1), (30, 1), (40, 41)]);
        let parent_of = |p: i32| parents.get(&p).copied();
        assert_eq!(descends_from(12, 10, parent_of), Some(true));
        assert_eq!(descends_from(11, 10, parent_of), Some(true));
        assert_eq!(descends_from(20, 10, parent_of), Some(false));
        assert_eq!(descends_from(30, 10, parent_of), Some(false));
        assert_eq!(descends_from(40, 10, parent_of), None);
        // A cycle (pids reused mid-walk) ends.
        let cycle = |p: i32| Some(if p == 50 { 51 } else { 50 });
        assert_eq!(descends_from(50, 10, cycle), Some(false));

        // Real processes: this one's child is in its tree, this one is not
        // in its child's.
        let root = Arc::new(AtomicI32::new(0));
        let mut tree = ProcessTree::new(root.clone());
        let me = std::process::id() as i32;
        assert!(tree.contains(me), "no root yet: everyone counts");
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let kid = child.id() as i32;
        root.store(me, Ordering::SeqCst);
        assert!(tree.contains(kid));
        root.store(kid, Ordering::SeqCst);
        assert!(
            !tree.contains(me),
            "the verdicts of the old root were forgotten"
        );
        assert!(tree.contains(kid));
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn parent_pids_parse_from_stat_lines_with_odd_names() {
        assert_eq!(parent_in_stat("123 (python3) S 77 123 123 0"), Some(77));
        assert_eq!(parent_in_stat("9 (a b) c) (d) R 42 9 9"), Some(42));
        assert_eq!(parent_in_stat("9 (no closing S 42"), None);
        assert_eq!(parent_in_stat("9 (x) S"), None);
        assert_eq!(parent_in_stat("9 (x) S notanumber"), None);
        assert_eq!(parent_in_stat(""), None);
    }

    /// The bytes of one event: metadata with the given lengths, then `info`.
    fn event_bytes(event_len: u32, metadata_len: u16, info: &[u8]) -> Vec<u8> {
        // SAFETY: the struct is plain integers; all zeroes is valid.
        let mut meta: libc::fanotify_event_metadata = unsafe { std::mem::zeroed() };
        meta.event_len = event_len;
        meta.vers = libc::FANOTIFY_METADATA_VERSION;
        meta.metadata_len = metadata_len;
        meta.fd = -1;
        meta.pid = 42;
        // SAFETY: viewing the plain struct as its bytes.
        let head = unsafe {
            std::slice::from_raw_parts(
                (&meta as *const libc::fanotify_event_metadata).cast::<u8>(),
                METADATA_LEN,
            )
        };
        let mut out = head.to_vec();
        out.extend_from_slice(info);
        out
    }

    fn range_record(offset: u64, count: u64) -> Vec<u8> {
        let mut rec = vec![FAN_EVENT_INFO_TYPE_RANGE, 0, 24, 0, 0, 0, 0, 0];
        rec.extend_from_slice(&offset.to_ne_bytes());
        rec.extend_from_slice(&count.to_ne_bytes());
        rec
    }

    /// Walks `buf`, returning each event's info range (if any) and the
    /// damaged count.
    fn walk(buf: &[u8]) -> (Vec<Option<(u64, u64)>>, u64) {
        let mut seen = Vec::new();
        let damaged = for_each_event(buf, |meta, info| {
            assert_eq!(meta.pid, 42);
            seen.push(parse_range(info));
        });
        (seen, damaged)
    }

    #[test]
    fn event_buffers_with_inconsistent_lengths_are_walked_without_slicing_past_them() {
        let full = (METADATA_LEN + 24) as u32;
        let meta = METADATA_LEN as u16;
        let good = event_bytes(full, meta, &range_record(4096, 8192));
        assert_eq!(walk(&good), (vec![Some((4096, 8192))], 0));
        let two = [good.clone(), good.clone()].concat();
        assert_eq!(walk(&two).0.len(), 2);

        // metadata_len past event_len: handed over (to be answered), with
        // no info records, and the walk goes on to the next event.
        let long_meta = event_bytes(full, meta + 100, &range_record(1, 2));
        assert_eq!(
            walk(&[long_meta, good.clone()].concat()),
            (vec![None, Some((4096, 8192))], 1)
        );
        // metadata_len below the struct: the same.
        let short_meta = event_bytes(full, 4, &range_record(1, 2));
        assert_eq!(walk(&short_meta), (vec![None], 1));

        // event_len past the buffer, below the struct, or zero (which would
        // loop forever): nothing is handed over from there on.
        let past = event_bytes(full + 4096, meta, &range_record(1, 2));
        assert_eq!(
            walk(&[good.clone(), past].concat()),
            (vec![Some((4096, 8192))], 1)
        );
        for bad_len in [0, 8, METADATA_LEN as u32 - 1] {
            let short = event_bytes(bad_len, meta, &range_record(1, 2));
            assert_eq!(walk(&short), (vec![], 1), "event_len {bad_len}");
        }
        // A buffer cut inside the metadata or inside the info.
        assert_eq!(walk(&good[..METADATA_LEN - 1]), (vec![], 1));
        assert_eq!(walk(&good[..METADATA_LEN + 10]), (vec![], 1));
        assert_eq!(walk(&[]), (vec![], 0));
    }

    #[test]
    fn an_answer_counts_only_when_the_kernel_takes_it() {
        let (read_end, write_end) = {
            let mut fds = [0; 2];
            // SAFETY: pipe writes two descriptors into the array.
            assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
            // SAFETY: both are fresh descriptors we own.
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
        };
        // SAFETY: the struct is plain integers; all zeroes is valid.
        let mut meta: libc::fanotify_event_metadata = unsafe { std::mem::zeroed() };
        meta.fd = 7;
        meta.pid = 42;
        let stats = WatchStats::default();
        answer(write_end.as_raw_fd(), &meta, &stats);
        assert_eq!(stats.answered.load(Ordering::Relaxed), 1);
        assert_eq!(stats.unanswered.load(Ordering::Relaxed), 0);
        // The read end refuses writes (EBADF): not answered, and counted.
        answer(read_end.as_raw_fd(), &meta, &stats);
        assert_eq!(stats.answered.load(Ordering::Relaxed), 1);
        assert_eq!(stats.unanswered.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn range_records_parse_and_garbage_does_not() {
        let mut rec = vec![FAN_EVENT_INFO_TYPE_RANGE, 0, 24, 0, 0, 0, 0, 0];
        rec.extend_from_slice(&4096u64.to_ne_bytes());
        rec.extend_from_slice(&8192u64.to_ne_bytes());
        assert_eq!(parse_range(&rec), Some((4096, 8192)));
        assert_eq!(parse_range(&rec[..10]), None);
        assert_eq!(
            parse_range(&[6, 0, 0, 0]),
            None,
            "zero length must not loop"
        );
        assert_eq!(parse_range(&[]), None);
    }
}
