//! Fixtures shared by the tests of Sluice's crates; a dev-dependency only,
//! never part of a build users run.
//!
//! Page-cache tests need a file system with a real page cache (tmpfs keeps
//! every page resident, so residency means nothing there) and files whose
//! pages are clean (only clean pages can be dropped); fanotify and cgroup
//! tests need root. These helpers provide both and say why when a test
//! must skip.
//!
//! [`faultproxy`] is the library behind the `sluice-faultproxy` binary: a
//! TCP proxy that adds latency and injects faults for remote-loading tests.

pub mod faultproxy;

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Whether the tests run as root (fanotify, cgroups); root-only tests
/// return early with a message otherwise.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Fails the test unless it runs as root. Tests that need root call it first and carry
/// `#[ignore = "needs root ..."]`: `cargo test` reports them as ignored, with the reason,
/// and `make test` runs them with `--include-ignored` where it is root (CI is). Run
/// without root, they fail instead of passing without testing anything.
pub fn require_root() {
    assert!(
        is_root(),
        "this test needs root; without it, leave it ignored (make test runs it as root)"
    );
}

/// A directory on a real disk file system, or `None` (the caller skips,
/// and this prints why) when `/var/tmp` is missing or is tmpfs, where every
/// page is always resident and page-cache tests would mean nothing.
pub fn disk_tempdir() -> Option<tempfile::TempDir> {
    let dir = match tempfile::tempdir_in("/var/tmp") {
        Ok(dir) => dir,
        Err(err) => {
            eprintln!("skipped: no directory in /var/tmp for page-cache tests: {err}");
            return None;
        }
    };
    let c_path = std::ffi::CString::new(dir.path().as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statfs writes into the zeroed struct we own; the path is a
    // valid NUL-terminated string.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statfs(c_path.as_ptr(), &mut fs) } != 0 {
        eprintln!(
            "skipped: statfs of {}: {}",
            dir.path().display(),
            std::io::Error::last_os_error()
        );
        return None;
    }
    if fs.f_type == libc::TMPFS_MAGIC {
        eprintln!("skipped: /var/tmp is tmpfs, page-cache residency is meaningless there");
        return None;
    }
    Some(dir)
}

/// A file `data.bin` of `len` bytes of a non-zero pattern in `dir`, synced
/// to disk so its pages are clean and can be dropped; returned open for
/// reading, with its path.
pub fn synced_file(dir: &tempfile::TempDir, len: usize) -> (File, PathBuf) {
    let path = dir.path().join("data.bin");
    let mut file = File::create(&path).expect("create");
    let block: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8 + 1).collect();
    let mut left = len;
    while left > 0 {
        let n = left.min(block.len());
        file.write_all(&block[..n]).expect("write");
        left -= n;
    }
    file.sync_all().expect("fsync");
    drop(file);
    (File::open(&path).expect("reopen"), path)
}

/// A two-file model directory `dir/model` (`a.safetensors`: 8 MiB,
/// `b.safetensors`: 4 MiB, plus a hidden file that is not part of it),
/// synced and dropped from the page cache (only clean pages can be
/// dropped), so prefetch has something to do.
pub fn model_dir(dir: &Path) -> PathBuf {
    let m = dir.join("model");
    std::fs::create_dir(&m).expect("create the model directory");
    for (name, len) in [("a.safetensors", 8usize << 20), ("b.safetensors", 4 << 20)] {
        let path = m.join(name);
        let mut f = File::create(&path).expect("create a model file");
        f.write_all(&vec![1u8; len]).expect("write a model file");
        f.sync_all().expect("fsync a model file");
        // SAFETY: fadvise only reads its integer arguments.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
    std::fs::write(m.join(".hidden"), b"x").expect("write the hidden file");
    m
}

/// A Hugging Face cache in `dir`: `snapshots/rev/*.safetensors` are
/// symlinks to `blobs/*` (the files of [`model_dir`]). Returns the snapshot
/// directory.
pub fn hf_layout(dir: &Path) -> PathBuf {
    let m = model_dir(dir);
    let blobs = dir.join("blobs");
    let snap = dir.join("snapshots/rev");
    std::fs::create_dir_all(&snap).expect("create the snapshot directory");
    std::fs::rename(&m, &blobs).expect("move the model to blobs");
    for name in ["a.safetensors", "b.safetensors"] {
        std::os::unix::fs::symlink(format!("../../blobs/{name}"), snap.join(name))
            .expect("link a snapshot file");
    }
    snap
}

/// `$SLUICE_PYTHON`, else the checkout's `.venv/bin/python`, when it can
/// import `sluice.warm_host`; `None` (the caller skips, and this prints
/// why) otherwise.
pub fn python_with_sluice() -> Option<PathBuf> {
    let python = std::env::var_os("SLUICE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python"));
    let ok = Command::new(&python)
        .args(["-c", "import sluice.warm_host"])
        .output()
        .is_ok_and(|out| out.status.success());
    if !ok {
        eprintln!(
            "skipped: {} cannot import sluice.warm_host (run `make develop`)",
            python.display()
        );
        return None;
    }
    Some(python)
}

/// Makes a FIFO at `path` (for tests that a reader refuses one instead of blocking).
pub fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("no NUL in a path");
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o600) },
        0,
        "mkfifo {}",
        path.display()
    );
}

/// A `sluice.warm` policy module whose `Forks` policy forks a child that sleeps for ten
/// minutes and notes its pid in `child.pid` beside the module (tests that the policy
/// host's children die with it).
pub const FORKING_POLICY: &str = "\
import os, time
from sluice.warm import Policy

class Forks(Policy):
    def init(self, ctx):
        pid = os.fork()
        if pid == 0:
            time.sleep(600)
            os._exit(0)
        with open(os.path.join(os.path.dirname(__file__), 'child.pid'), 'w') as f:
            f.write(str(pid))
        return []
";

/// `len` pseudo-random bytes (xorshift64) from `seed`: cheap, reproducible, and any
/// reordered, shifted or zeroed chunk shows.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Returns once a file changed now would get a change time (ctime) later than `path`'s:
/// the file system stamps times from a clock that ticks every few milliseconds, so a write
/// right after another can carry the same time. Tests of change detection wait on this
/// observable condition instead of sleeping a guessed while; it fails after 10 s.
pub fn clock_past_ctime_of(path: &Path) {
    use std::os::unix::fs::MetadataExt;
    let ctime = |m: &std::fs::Metadata| (m.ctime(), m.ctime_nsec());
    let then = ctime(&std::fs::metadata(path).expect("the file exists"));
    let probe = path.with_extension("clock-probe");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        std::fs::write(&probe, b"x").expect("a probe file beside it");
        let now = ctime(&std::fs::metadata(&probe).expect("the probe exists"));
        if now > then {
            let _ = std::fs::remove_file(&probe);
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the clock did not move in 10 s"
        );
        std::thread::yield_now();
    }
}
