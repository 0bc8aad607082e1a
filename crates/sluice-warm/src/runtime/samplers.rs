//! Progress samplers: where readers are that fanotify does not report read
//! by read.
//!
//! - mmap loaders: the furthest page a reader has faulted in, from
//!   `/proc/PID/pagemap` (one page sampled per 2 MiB of the mapping).
//! - read() loaders: the file position of the descriptor they opened the
//!   model file with, from `/proc/PID/fdinfo/FD`.
//! - pread() loaders: the offset of the pread-family call a thread is
//!   blocked in, from `/proc/PID/task/TID/syscall`.
//!
//! A position past the last one reported becomes a `Progress` event. The
//! samplers start following a reader when the runtime shows them its open
//! or mmap event ([`EventSource::observe`]), and sample at most every
//! `interval`.
//!
//! The loader worker a process belongs to comes from its environment
//! ([`worker_from_environ`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::kernel::mapped_addresses;
use crate::page_size;
use crate::policy::{AccessEvent, AccessKind};
use crate::runtime::EventSource;

/// The loader worker a process is bound to, from its environment:
/// `SLUICE_WORKER`, else `LOCAL_RANK` (torchrun, vLLM and SGLang set it per
/// accelerator). `None` leaves the policy to number workers by spawn order.
pub fn worker_from_environ(pid: i32) -> Option<u32> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    worker_in_environ(&environ)
}

fn worker_in_environ(environ: &[u8]) -> Option<u32> {
    let vars: Vec<&[u8]> = environ.split(|&b| b == 0).collect();
    ["SLUICE_WORKER=", "LOCAL_RANK="].iter().find_map(|key| {
        vars.iter()
            .find_map(|v| v.strip_prefix(key.as_bytes()))
            .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse().ok())
    })
}

/// Progress samplers: pagemap for mmap readers, fdinfo and blocked calls
/// for read() and pread() readers.
pub struct Samplers {
    /// State: the file's length.
    mmap: Follower<u64>,
    /// State: the descriptor the reader opened the file with, once found.
    reads: Follower<Option<u32>>,
    /// Sample at most this often.
    interval: Duration,
    last: Option<Instant>,
}

impl Samplers {
    /// Samplers that follow nobody yet and sample at most every `interval`.
    pub fn new(interval: Duration) -> Samplers {
        Samplers {
            mmap: Follower::default(),
            reads: Follower::default(),
            interval,
            last: None,
        }
    }

    fn sample(&mut self) -> Vec<AccessEvent> {
        let mut events = self
            .mmap
            .sample(|pid, path, len, from| furthest_present(pid, path, *len, from));
        // pread() loaders leave the file position alone: where one of their
        // threads is blocked in a pread-family call, its offset is the
        // position (sampled once per process for all its files).
        let mut preads: HashMap<i32, Vec<(PathBuf, u64)>> = HashMap::new();
        for (pid, ..) in &self.reads.readers {
            preads.entry(*pid).or_insert_with(|| blocked_preads(*pid));
        }
        events.extend(self.reads.sample(|pid, path, fd, _| {
            let pread = preads
                .get(&pid)
                .into_iter()
                .flatten()
                .filter(|(p, _)| p == path)
                .map(|&(_, at)| at)
                .max();
            read_position(pid, path, fd).max(pread)
        }));
        events
    }
}

/// Readers followed through one progress signal: for each (pid, file), a
/// sampler state and the furthest offset reported as a `Progress` event.
struct Follower<S> {
    readers: Vec<(i32, PathBuf, S, u64)>,
}

impl<S> Default for Follower<S> {
    fn default() -> Follower<S> {
        Follower {
            readers: Vec::new(),
        }
    }
}

impl<S> Follower<S> {
    fn watch(&mut self, pid: i32, path: &Path, state: S) {
        if !self.readers.iter().any(|r| r.0 == pid && r.1 == path) {
            self.readers.push((pid, path.to_path_buf(), state, 0));
        }
    }

    /// Asks `position(pid, path, state, reported)` where each live reader
    /// is; a position past the last one reported becomes an event.
    fn sample(
        &mut self,
        mut position: impl FnMut(i32, &Path, &mut S, u64) -> Option<u64>,
    ) -> Vec<AccessEvent> {
        self.readers
            .retain(|r| Path::new(&format!("/proc/{}", r.0)).exists());
        let mut events = Vec::new();
        for (pid, path, state, reported) in &mut self.readers {
            match position(*pid, path, state, *reported) {
                Some(at) if at > *reported => {
                    *reported = at;
                    events.push(AccessEvent {
                        pid: *pid,
                        worker: None,
                        path: path.clone(),
                        offset: at,
                        len: 0,
                        kind: AccessKind::Progress,
                    });
                }
                _ => {}
            }
        }
        events
    }
}

/// A read() loader's file position (`/proc/PID/fdinfo/FD`, `pos:`) on the
/// descriptor it opened the model file with. pread() does not move it:
/// [`blocked_preads`] covers those loaders.
fn read_position(pid: i32, path: &Path, fd: &mut Option<u32>) -> Option<u64> {
    // The descriptor found before may be closed by now, or its number
    // reused for another file (a shell's `exec 3< f` may open at one number
    // and move it to 3; a loader closes a shard after its header and opens
    // it again): look again unless it still names the model file.
    let names_path = |n: u32| {
        std::fs::read_link(format!("/proc/{pid}/fd/{n}"))
            .ok()
            .as_deref()
            == Some(path)
    };
    if !fd.is_some_and(names_path) {
        *fd = find_fd(pid, path);
    }
    let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", (*fd)?)).ok()?;
    fdinfo_pos(&info)
}

/// The files and offsets of the pread-family calls (`pread64`, `preadv`,
/// `preadv2`) that `pid`'s threads are blocked in now, from
/// `/proc/PID/task/TID/syscall`. The kernel shows a thread's call only
/// while it sleeps (a cold read waiting for the disk, which is when the
/// position matters: the reader caught up with prefetch); a running thread
/// reads `running`. io_uring reads are not system calls of the reader and
/// stay invisible.
fn blocked_preads(pid: i32) -> Vec<(PathBuf, u64)> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for task in tasks.flatten() {
        let Ok(line) = std::fs::read_to_string(task.path().join("syscall")) else {
            continue;
        };
        let Some((fd, at)) = pread_in_syscall(&line) else {
            continue;
        };
        if let Ok(path) = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")) {
            found.push((path, at));
        }
    }
    found
}

/// `(fd, offset)` of a `/proc/PID/task/TID/syscall` line when the call is
/// in the pread family: `NR fd buf count pos ...` for pread64, `NR fd iov
/// iovcnt pos_l ...` for preadv and preadv2 (the low word is the whole
/// offset on 64-bit kernels).
fn pread_in_syscall(line: &str) -> Option<(u32, u64)> {
    let mut fields = line.split_whitespace();
    let nr: i64 = fields.next()?.parse().ok()?;
    if ![libc::SYS_pread64, libc::SYS_preadv, libc::SYS_preadv2].contains(&nr) {
        return None;
    }
    let args: Vec<u64> = fields
        .take(4)
        .map(|a| u64::from_str_radix(a.strip_prefix("0x")?, 16).ok())
        .collect::<Option<_>>()?;
    let [fd, _, _, at] = args[..] else {
        return None;
    };
    Some((u32::try_from(fd).ok()?, at))
}

/// The descriptor through which `pid` has `path` open, if any.
fn find_fd(pid: i32, path: &Path) -> Option<u32> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    for entry in dir.flatten() {
        if std::fs::read_link(entry.path()).ok().as_deref() == Some(path) {
            return entry.file_name().to_str()?.parse().ok();
        }
    }
    None
}

/// The `pos:` field of an fdinfo file.
fn fdinfo_pos(info: &str) -> Option<u64> {
    info.lines()
        .find_map(|l| l.strip_prefix("pos:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Mmap readers are followed through their mappings: the furthest page a
/// reader has faulted in (pagemap present bit), sampled one page per 2 MiB.
const SAMPLE_STRIDE: u64 = 2 << 20;

/// The end of the furthest sampled block of `path` that `pid` has present
/// in its mapping, scanning from `from`.
fn furthest_present(pid: i32, path: &Path, len: u64, from: u64) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let maps = mapped_addresses(pid, path, 0, len);
    let (addr, mapped_len) = *maps.first()?;
    let pagemap = std::fs::File::open(format!("/proc/{pid}/pagemap")).ok()?;
    let page = page_size();
    let mut furthest = None;
    let mut off = from / SAMPLE_STRIDE * SAMPLE_STRIDE;
    let mut entry = [0u8; 8];
    while off < mapped_len {
        let vpage = (addr + off) / page;
        if pagemap.read_exact_at(&mut entry, vpage * 8).is_err() {
            break;
        }
        if u64::from_le_bytes(entry) >> 63 == 1 {
            furthest = Some((off + SAMPLE_STRIDE).min(mapped_len));
        }
        off += SAMPLE_STRIDE;
    }
    furthest
}

impl EventSource for Samplers {
    fn poll(&mut self, _wait: Duration) -> Vec<AccessEvent> {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|last| now.duration_since(last) < self.interval)
        {
            return Vec::new();
        }
        self.last = Some(now);
        self.sample()
    }

    fn observe(&mut self, event: &AccessEvent, real: &Path) {
        match event.kind {
            AccessKind::Mmap => self.mmap.watch(event.pid, real, event.len),
            // Without read ranges, the file position of read() loaders and
            // the pagemap of mmap loaders are the progress signals.
            AccessKind::Open => {
                self.reads.watch(event.pid, real, None);
                let len = std::fs::metadata(real).map_or(0, |m| m.len());
                self.mmap.watch(event.pid, real, len);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_come_from_the_loader_environment() {
        assert_eq!(worker_in_environ(b"PATH=/bin\0LOCAL_RANK=3\0"), Some(3));
        assert_eq!(
            worker_in_environ(b"LOCAL_RANK=3\0SLUICE_WORKER=1\0"),
            Some(1)
        );
        assert_eq!(worker_in_environ(b"LOCAL_RANK=x\0"), None);
        assert_eq!(worker_in_environ(b""), None);
        assert_eq!(worker_from_environ(i32::MAX), None);
    }

    #[test]
    fn a_descriptor_number_reused_for_another_file_is_looked_up_again() {
        use std::io::{Seek, SeekFrom};
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, vec![0u8; 8192]).unwrap();
        std::fs::write(&b, vec![0u8; 8192]).unwrap();
        let me = std::process::id() as i32;
        let mut fa = std::fs::File::open(&a).unwrap();
        fa.seek(SeekFrom::Start(100)).unwrap();
        let mut fd = None;
        assert_eq!(read_position(me, &a, &mut fd), Some(100));
        let first = fd.unwrap();
        // a's number now holds b, at another position; a lives on elsewhere.
        let moved = std::fs::File::open(&a).unwrap();
        let mut fb = std::fs::File::open(&b).unwrap();
        fb.seek(SeekFrom::Start(7000)).unwrap();
        // SAFETY: both descriptors are open and owned here; dup2 replaces
        // `first` (fa's) with a copy of fb's.
        assert!(unsafe { libc::dup2(fb.as_raw_fd(), first as i32) } >= 0);
        let mut moved_at = moved;
        moved_at.seek(SeekFrom::Start(300)).unwrap();
        assert_eq!(read_position(me, &a, &mut fd), Some(300), "not b's 7000");
        assert_ne!(fd, Some(first));
        drop(fa); // closes `first`, which holds b now
    }

    #[test]
    fn fdinfo_positions_parse_and_garbage_does_not() {
        assert_eq!(fdinfo_pos("pos:\t4096\nflags:\t02100000\n"), Some(4096));
        assert_eq!(fdinfo_pos("flags: 0\n"), None);
        assert_eq!(fdinfo_pos("pos: lots\n"), None);
        assert_eq!(find_fd(i32::MAX, Path::new("/x")), None);
    }

    #[test]
    fn pread_calls_parse_from_the_syscall_file_and_others_do_not() {
        let pread = format!(
            "{} 0x7 0x7f00 0x100000 0x500000 0x0 0x0 0x7ffd 0x7f01",
            libc::SYS_pread64
        );
        assert_eq!(pread_in_syscall(&pread), Some((7, 5 << 20)));
        let preadv2 = format!(
            "{} 0x3 0x7f00 0x2 0x1000 0x0 0x8 0x7ffd 0x7f01",
            libc::SYS_preadv2
        );
        assert_eq!(pread_in_syscall(&preadv2), Some((3, 4096)));
        let read = format!(
            "{} 0x3 0x7f00 0x1000 0x0 0x0 0x0 0x7ffd 0x7f01",
            libc::SYS_read
        );
        for line in [
            read.as_str(),
            "running",
            "-1 0x7ffd 0x7f01",
            "",
            "17 0x3 zz 0x1 0x2",
        ] {
            assert_eq!(pread_in_syscall(line), None, "{line:?}");
        }
        assert!(blocked_preads(i32::MAX).is_empty());
    }
}
