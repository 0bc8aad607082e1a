//! Prefetch in the gaps of the service's own start-up I/O.
//!
//! Before a service first touches its model it starts up: the interpreter,
//! the framework's libraries (torch alone reads about 1 GiB), CUDA. Those
//! reads are small, synchronous and on the service's critical path, so a
//! prefetch that keeps the disk busy meanwhile delays every one of them:
//! a template replayed from launch without restraint cached the whole model
//! before the load but made the benchmark's loaders end 1.0-1.4 s later
//! (docs/design/warm.md). Yet the disk is idle for much of a start-up,
//! while the service computes.
//!
//! [`IdleGate`] lets prefetch run only while the service is not reading
//! from storage itself: it samples the bytes the service's processes have
//! caused to be read from storage (`read_bytes` in `/proc/PID/io`, which
//! counts the block reads a task submits, for read() and page faults alike,
//! and none of the runtime's own prefetch), and opens once they have stood
//! still for its quiet time. Any growth closes it again at the next sample.
//! The runtime drops the gate at the service's first model access: from
//! then on the service's reads are the model, which prefetch is there to
//! serve.
//!
//! The service is a process tree (vLLM and SGLang start workers), followed
//! through `/proc/PID/task/TID/children`; where the kernel lacks that file
//! only the root process counts.

use std::time::{Duration, Instant};

/// Where the service's storage reads are counted.
pub trait ServiceIo {
    /// Bytes the service has caused to be read from storage so far; `None`
    /// when they cannot be read (the service is gone).
    fn read_bytes(&mut self) -> Option<u64>;
}

impl<S: ServiceIo + ?Sized> ServiceIo for Box<S> {
    fn read_bytes(&mut self) -> Option<u64> {
        (**self).read_bytes()
    }
}

/// A process and its descendants, through /proc.
pub struct ProcessTreeIo {
    root: i32,
}

impl ProcessTreeIo {
    pub fn new(root: i32) -> ProcessTreeIo {
        ProcessTreeIo { root }
    }
}

impl ServiceIo for ProcessTreeIo {
    fn read_bytes(&mut self) -> Option<u64> {
        let mut total = process_read_bytes(self.root)?;
        let mut stack = children(self.root);
        // A bound on the walk: a fork bomb must not stall the runtime.
        let mut left = 4096;
        while let (Some(pid), true) = (stack.pop(), left > 0) {
            left -= 1;
            // A child that exited meanwhile counts in its parent once reaped.
            total += process_read_bytes(pid).unwrap_or(0);
            stack.extend(children(pid));
        }
        Some(total)
    }
}

/// `read_bytes` of one process (all its threads, and its reaped children).
fn process_read_bytes(pid: i32) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    parse_read_bytes(&io)
}

fn parse_read_bytes(io: &str) -> Option<u64> {
    io.lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The children of every thread of `pid`.
pub(crate) fn children(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for task in tasks.flatten() {
        if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
            out.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
    }
    out
}

/// Whether prefetch may run now, before the service's first model access.
pub struct IdleGate<S: ServiceIo> {
    io: S,
    quiet: Duration,
    /// The service's read bytes at the last sample.
    last: Option<u64>,
    /// When they last grew (or the gate started).
    busy_at: Instant,
}

impl<S: ServiceIo> IdleGate<S> {
    /// How long the service's storage reads must stand still before
    /// prefetch runs. 150 ms: the benchmark's torch-importing loader, sampled
    /// every 10 ms from a cold cache, paused its reads for at most 110 ms
    /// before its first model access; and short next to the seconds a
    /// framework computes before it touches the model.
    pub const DEFAULT_QUIET: Duration = Duration::from_millis(150);

    /// A closed gate, as of `now`.
    pub fn new(io: S, quiet: Duration, now: Instant) -> IdleGate<S> {
        IdleGate {
            io,
            quiet,
            last: None,
            busy_at: now,
        }
    }

    /// Samples the service's reads and says whether prefetch may run. A
    /// service whose reads cannot be read (gone) holds nothing back.
    pub fn is_open(&mut self, now: Instant) -> bool {
        let Some(read) = self.io.read_bytes() else {
            return true;
        };
        if self.last.is_some_and(|last| read != last) {
            self.busy_at = now;
        }
        self.last = Some(read);
        now.saturating_duration_since(self.busy_at) >= self.quiet
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// Scripted read counters; `None` once the script runs out.
    struct Script(VecDeque<Option<u64>>);

    impl ServiceIo for Script {
        fn read_bytes(&mut self) -> Option<u64> {
            self.0.pop_front().flatten()
        }
    }

    fn gate(values: &[Option<u64>], quiet_ms: u64) -> (IdleGate<Script>, Instant) {
        let t0 = Instant::now();
        let script = Script(values.iter().copied().collect());
        (
            IdleGate::new(script, Duration::from_millis(quiet_ms), t0),
            t0,
        )
    }

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn opens_only_after_the_service_reads_nothing_for_the_quiet_time() {
        let (mut g, t0) = gate(
            &[Some(0), Some(10), Some(10), Some(10), Some(10), Some(20)],
            100,
        );
        assert!(!g.is_open(at(t0, 0)), "closed at start");
        assert!(!g.is_open(at(t0, 50)), "reading");
        assert!(!g.is_open(at(t0, 100)), "quiet for 50 ms only");
        assert!(g.is_open(at(t0, 150)), "quiet for 100 ms");
        assert!(g.is_open(at(t0, 400)));
        assert!(!g.is_open(at(t0, 410)), "reading again: closed at once");
    }

    #[test]
    fn a_service_that_cannot_be_read_holds_nothing_back() {
        let (mut g, t0) = gate(&[None], 100);
        assert!(g.is_open(at(t0, 0)));
    }

    #[test]
    fn read_bytes_parse_from_proc_io_and_garbage_does_not() {
        let io = "rchar: 10\nwchar: 0\nsyscr: 1\nsyscw: 0\nread_bytes: 4096\nwrite_bytes: 0\n";
        assert_eq!(parse_read_bytes(io), Some(4096));
        assert_eq!(parse_read_bytes("read_bytes: x\n"), None);
        assert_eq!(parse_read_bytes(""), None);
    }

    #[test]
    fn a_process_tree_counts_its_childrens_reads() {
        if process_read_bytes(std::process::id() as i32).is_none() {
            eprintln!("skipped: no /proc/PID/io (a kernel without task I/O accounting)");
            return;
        }
        let Some(dir) = sluice_testkit::disk_tempdir() else {
            return;
        };
        let (file, path) = sluice_testkit::synced_file(&dir, 4 << 20);
        sluice_engine::page_cache::dontneed(&file, &path, 0, u64::MAX).unwrap();
        // A shell whose child reads a cold file: the root's own counter
        // moves only once the child is reaped (after a minute here), the
        // tree's at once. Counted from zero: a first sample taken after the
        // child began reading (a loaded machine) would raise the bar past
        // what the tree can ever show.
        let script = format!("cat {} > /dev/null & sleep 60; wait", path.display());
        let mut sh = std::process::Command::new("sh")
            .args(["-c", &script])
            .spawn()
            .unwrap();
        let mut tree = ProcessTreeIo::new(sh.id() as i32);
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = 0;
        while seen < 4 << 20 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            seen = tree.read_bytes().unwrap_or(seen);
        }
        let _ = sh.kill();
        sh.wait().unwrap();
        assert!(seen >= 4 << 20, "saw {seen} bytes read by the tree");
        assert_eq!(ProcessTreeIo::new(i32::MAX).read_bytes(), None);
    }
}
