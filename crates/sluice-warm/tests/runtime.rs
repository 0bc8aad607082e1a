//! `sluice warm run` end to end: real services, the real page cache and
//! fanotify. Most need root (fanotify, cgroups) and a disk file system, and
//! skip with a message otherwise; the loop itself is tested without either
//! in `runtime/event_loop/tests.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sluice_engine::page_cache;
use sluice_testkit::{disk_tempdir, hf_layout, model_dir as model, require_root, synced_file};
use sluice_warm::builtin::BuiltinConfig;
use sluice_warm::fanotify::Level;
use sluice_warm::idle_gate::{IdleGate, ProcessTreeIo};
use sluice_warm::kernel::Mechanism;
use sluice_warm::policy::{AccessEvent, PolicyContext, Prefetch, WarmPolicy};
use sluice_warm::runtime::{self, model_files, RunConfig, RuntimeConfig, ServiceExit, StopRequest};
use sluice_warm::template::{ServiceId, TemplateStore};
use sluice_warm::WarmError;

/// A run under a memory limit moves this whole test process into the run's
/// cgroup (the runtime joins its service's cgroup, and in production it is
/// one process per run). Services the other tests start meanwhile would land
/// in that cgroup and be stopped with it, so limited runs take this lock
/// exclusively and every other run shares it.
static CGROUP_RUNS: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn run(
    c: &RunConfig,
    stop: &StopRequest,
    on_status: &mut dyn FnMut(&runtime::Status),
) -> Result<runtime::RunReport, WarmError> {
    let _shared = CGROUP_RUNS.read().unwrap_or_else(|e| e.into_inner());
    runtime::run(c, stop, on_status)
}

fn run_with(
    c: &RunConfig,
    policy: Box<dyn WarmPolicy>,
    stop: &StopRequest,
    on_status: &mut dyn FnMut(&runtime::Status),
) -> Result<runtime::RunReport, WarmError> {
    let _shared = CGROUP_RUNS.read().unwrap_or_else(|e| e.into_inner());
    runtime::run_with(c, policy, stop, on_status)
}

/// A model on a disk file system (fanotify needs root: the callers are `#[ignore]`d
/// and run as root; `None` where no disk file system is at hand).
fn root_model() -> Option<(tempfile::TempDir, PathBuf)> {
    require_root();
    let dir = disk_tempdir()?;
    let m = model(dir.path());
    Some((dir, m))
}

fn config(model_dir: &Path, command: &[&str]) -> RunConfig {
    RunConfig {
        model_dir: model_dir.to_path_buf(),
        policy: "native".into(),
        builtin: BuiltinConfig::default(),
        memory_limit: None,
        watermark: 0.8,
        mechanism: Mechanism::WillNeed,
        in_flight_bytes: 64 << 20,
        level: None,
        explicit: false,
        command: command.iter().map(Into::into).collect(),
        trigger_pipe: None,
        launch_quiet: IdleGate::<ProcessTreeIo>::DEFAULT_QUIET,
        runtime: RuntimeConfig::default(),
        numa_map: None,
        keep_failed: false,
        grace: Duration::from_secs(10),
        // Several runtimes run at once in this test process.
        adopt_orphans: false,
    }
}

/// Sleeps on every event, and panics on the fifth.
struct Stuck {
    calls: u32,
}

impl WarmPolicy for Stuck {
    fn name(&self) -> &str {
        "stuck"
    }

    fn on_access(&mut self, _: &AccessEvent) -> Result<Vec<Prefetch>, WarmError> {
        self.calls += 1;
        std::thread::sleep(Duration::from_millis(20));
        assert!(self.calls < 5, "policy bug");
        Ok(Vec::new())
    }
}

/// Asks for the whole model at init, as a replay from launch does.
struct AtInit;

impl WarmPolicy for AtInit {
    fn name(&self) -> &str {
        "at-init"
    }

    fn needs_read_ranges(&self) -> bool {
        false
    }

    fn init(&mut self, ctx: &PolicyContext) -> Result<Vec<Prefetch>, WarmError> {
        let whole = |(path, len): &(PathBuf, u64)| Prefetch {
            stream: 0,
            range: sluice_warm::policy::FileRange::new(path, 0, *len),
        };
        Ok(ctx.files.iter().map(whole).collect())
    }
}

/// A model, and a cold 128 MiB file outside it that a service can spend
/// its start-up reading; `None` (skip) without a disk file system or
/// without /proc/PID/io.
fn model_and_startup_file() -> Option<(tempfile::TempDir, PathBuf, PathBuf)> {
    if !Path::new("/proc/self/io").exists() {
        eprintln!("skipped: no /proc/PID/io (a kernel without task I/O accounting)");
        return None;
    }
    let dir = disk_tempdir()?;
    let m = model(dir.path());
    let (f, libs) = synced_file(&dir, 128 << 20);
    page_cache::dontneed(&f, &libs, 0, u64::MAX).unwrap();
    Some((dir, m, libs))
}

#[test]
fn prefetch_queued_before_the_first_access_waits_while_the_service_reads() {
    let Some((_dir, m, libs)) = model_and_startup_file() else {
        return;
    };
    // The service only starts up (reads its "libraries") and exits
    // without touching the model: a gate that needs 2 s of quiet holds
    // the launch prefetch back the whole time.
    let startup = format!("cat {} > /dev/null", libs.display());
    let mut c = config(&m, &["sh", "-c", &startup]);
    c.launch_quiet = Duration::from_secs(2);
    let stop = StopRequest::new();
    let held = run_with(&c, Box::new(AtInit), &stop, &mut |_| {}).unwrap();
    assert_eq!(held.exit_code(), 0);
    assert_eq!(held.stats.prefetched_bytes, 0, "{held:?}");
    // Without the gate the same prefetch runs alongside the start-up.
    let f = std::fs::File::open(&libs).unwrap();
    page_cache::dontneed(&f, &libs, 0, u64::MAX).unwrap();
    c.launch_quiet = Duration::ZERO;
    let free = run_with(&c, Box::new(AtInit), &stop, &mut |_| {}).unwrap();
    assert!(free.stats.prefetched_bytes > 0, "{free:?}");
}

#[test]
#[ignore = "needs root for fanotify: make test runs it as root (--include-ignored)"]
fn the_first_model_access_lets_launch_prefetch_run() {
    require_root();
    let Some((_dir, m, libs)) = model_and_startup_file() else {
        return;
    };
    let a = m.join("a.safetensors");
    let service = format!(
        "cat {} > /dev/null; head -c 4096 {} > /dev/null; sleep 0.5",
        libs.display(),
        a.display()
    );
    let mut c = config(&m, &["sh", "-c", &service]);
    c.launch_quiet = Duration::from_secs(60);
    let stop = StopRequest::new();
    let report = run_with(&c, Box::new(AtInit), &stop, &mut |_| {}).unwrap();
    if report.level.is_none() {
        eprintln!("skipped: no fanotify here");
        return;
    }
    assert_eq!(report.exit_code(), 0);
    assert!(report.stats.prefetched_bytes > 0, "{report:?}");
}

#[test]
fn a_vanished_model_file_is_counted_and_the_rest_is_prefetched() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let fifo = dir.path().join("run/v.trigger");
    // The service deletes b, then asks for the model: eager fetches a and
    // fails on b without stopping.
    let cmd = format!(
        "rm {}; echo '{{\"path\": \"a.safetensors\"}}' > {}; sleep 0.5",
        m.join("b.safetensors").display(),
        fifo.display()
    );
    let mut c = config(&m, &["sh", "-c", &cmd]);
    c.policy = "eager".into();
    c.explicit = true;
    c.trigger_pipe = Some(fifo);
    let stop = StopRequest::new();
    let report = run(&c, &stop, &mut |_| {}).unwrap();
    assert_eq!(report.exit_code(), 0);
    assert!(report.stats.prefetch_errors >= 1, "{report:?}");
    // a is 8 MiB; it may already be cached (the test wrote it), so at most.
    assert!(report.stats.prefetched_bytes <= 8 << 20, "{report:?}");
}

#[test]
#[ignore = "needs root for fanotify: make test runs it as root (--include-ignored)"]
fn read_loaders_are_followed_through_their_file_position_with_open_events_only() {
    let Some((_dir, m)) = root_model() else {
        return;
    };
    let a = m.join("a.safetensors");
    // Read 3 MiB through one descriptor, then hold it open a moment.
    let cmd = format!(
        "exec 3< {}; dd bs=1M count=3 <&3 >/dev/null 2>&1; sleep 0.4",
        a.display()
    );
    let mut c = config(&m, &["sh", "-c", &cmd]);
    c.level = Some(Level::Open);
    let stop = StopRequest::new();
    let report = run(&c, &stop, &mut |_| {}).unwrap();
    assert_eq!(report.level, Some(Level::Open));
    let (path, at) = report.stats.last_reader.clone().expect("progress seen");
    assert_eq!(path, a.canonicalize().unwrap());
    assert_eq!(at, 3 << 20, "{report:?}");
}

#[test]
#[ignore = "needs root for fanotify: make test runs it as root (--include-ignored)"]
fn pread_loaders_are_followed_through_their_blocked_calls_with_open_events_only() {
    let Some((_dir, m)) = root_model() else {
        return;
    };
    let Some(python) = ["python3", "python"].into_iter().find(|p| {
        Command::new(p)
            .arg("-c")
            .arg("")
            .status()
            .is_ok_and(|s| s.success())
    }) else {
        eprintln!("skipped: no python3 to run a pread loader");
        return;
    };
    let a = m.join("a.safetensors");
    // A pread() loader that keeps rereading 1 MiB at 5 MiB from a cold
    // cache: its file position never moves, each call waits for the disk.
    let script = format!(
        "import os, time\n\
         fd = os.open({a:?}, os.O_RDONLY)\n\
         end = time.monotonic() + 0.8\n\
         while time.monotonic() < end:\n\
         \x20   os.posix_fadvise(fd, 5 << 20, 1 << 20, os.POSIX_FADV_DONTNEED)\n\
         \x20   os.pread(fd, 1 << 20, 5 << 20)\n"
    );
    let mut c = config(&m, &[python, "-c", &script]);
    c.level = Some(Level::Open);
    let stop = StopRequest::new();
    let report = run(&c, &stop, &mut |_| {}).unwrap();
    assert_eq!(report.exit_code(), 0, "{report:?}");
    let (path, at) = report.stats.last_reader.clone().expect("progress seen");
    assert_eq!(path, a.canonicalize().unwrap());
    assert_eq!(at, 5 << 20, "{report:?}");
}

#[test]
#[ignore = "needs root for fanotify: make test runs it as root (--include-ignored)"]
fn policies_without_read_ranges_watch_opens_only() {
    let Some((_dir, m)) = root_model() else {
        return;
    };
    let cat = format!("cat {} > /dev/null", m.join("a.safetensors").display());
    let stop = StopRequest::new();
    let mut c = config(&m, &["sh", "-c", &cat]);
    let native = run(&c, &stop, &mut |_| {}).unwrap();
    assert_eq!(
        native.level,
        Some(Level::Open),
        "a no-op policy costs readers nothing"
    );
    assert_eq!(native.watch_answered, 0);
    let custom = run_with(&c, Box::new(Stuck { calls: 10 }), &stop, &mut |_| {}).unwrap();
    if custom.level == Some(Level::PreContent) {
        assert!(custom.watch_answered > 0);
    }
    c.level = Some(Level::PreContent);
    match (custom.level, run(&c, &stop, &mut |_| {})) {
        (Some(Level::PreContent), Ok(forced)) => assert_eq!(
            forced.level,
            Some(Level::PreContent),
            "--events pre-content is obeyed"
        ),
        // Asked for and missing (before 6.14, tmpfs): a typed error,
        // not a silent downgrade.
        (_, Err(WarmError::Unsupported { feature, reason })) => {
            assert_eq!(feature, "fanotify", "{reason}");
            assert!(reason.contains("a.safetensors"), "{reason}");
        }
        (level, other) => panic!("auto chose {level:?}, forced gave {other:?}"),
    }
}

#[test]
fn explicit_triggers_reach_the_policy() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let fifo = dir.path().join("run/t.trigger");
    let cmd = format!(
        "sleep 0.3; echo '{{\"path\": \"b.safetensors\"}}' > {}; sleep 0.5",
        fifo.display()
    );
    let mut c = config(&m, &["sh", "-c", &cmd]);
    c.policy = "eager".into();
    c.explicit = true;
    c.trigger_pipe = Some(fifo.clone());
    let stop = StopRequest::new();
    let report = run(&c, &stop, &mut |_| {}).unwrap();
    assert_eq!(report.exit_code(), 0);
    assert_eq!(report.stats.events, 1, "{report:?}");
    assert_eq!(
        report.stats.prefetched_bytes,
        12 << 20,
        "eager fetched the model"
    );
    assert!(!fifo.exists(), "the pipe is removed at exit");
}

#[test]
#[ignore = "needs root for fanotify: make test runs it as root (--include-ignored)"]
fn readers_of_a_symlinked_model_are_followed_under_the_model_names() {
    require_root();
    let Some(dir) = disk_tempdir() else {
        return;
    };
    let snap = hf_layout(dir.path());
    let a = snap.join("a.safetensors");
    let cmd = format!(
        "exec 3< {}; dd bs=1M count=3 <&3 >/dev/null 2>&1; sleep 0.4",
        a.display()
    );
    let mut c = config(&snap, &["sh", "-c", &cmd]);
    c.policy = "eager".into();
    let stop = StopRequest::new();
    let report = run(&c, &stop, &mut |_| {}).unwrap();
    assert_eq!(report.level, Some(Level::Open));
    let (path, at) = report.stats.last_reader.clone().expect("progress seen");
    assert_eq!(path, snap.canonicalize().unwrap().join("a.safetensors"));
    assert_eq!(at, 3 << 20, "{report:?}");
    assert!(report.stats.prefetched_bytes > 0, "{report:?}");
    assert_eq!(report.stats.prefetch_errors, 0, "{report:?}");
}

#[test]
#[ignore = "needs root for fanotify: make test runs it as root (--include-ignored)"]
fn a_stuck_and_panicking_policy_never_holds_the_reader_back() {
    let Some((_dir, m)) = root_model() else {
        return;
    };
    let a = m.join("a.safetensors");
    // 64 reads of 128 KiB: far more events than the policy can take at 20 ms each.
    let cmd = format!("dd if={} of=/dev/null bs=128k status=none", a.display());
    let config = config(&m, &["sh", "-c", &cmd]);
    let stop = StopRequest::new();
    let report = run_with(&config, Box::new(Stuck { calls: 0 }), &stop, &mut |_| {}).unwrap();
    assert_eq!(report.exit_code(), 0);
    if report.level != Some(Level::PreContent) {
        // Opens only: too few events to reach the fault, and none of
        // them holds the reader.
        eprintln!("skipped: no pre-content events here ({:?})", report.level);
        return;
    }
    assert!(
        report
            .policy_fault
            .as_deref()
            .unwrap_or("")
            .contains("policy bug"),
        "{report:?}"
    );
    assert!(report.watch_events >= 64, "{report:?}");
    assert_eq!(
        report.watch_answered, report.watch_events,
        "every event answered"
    );
}

#[test]
fn explicit_mode_runs_without_fanotify_and_exit_codes_pass_through() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let mut c = config(&m, &["sh", "-c", "exit 7"]);
    c.explicit = true;
    let stop = StopRequest::new();
    let report = run(&c, &stop, &mut |_| {}).unwrap();
    assert_eq!((report.exit_code(), report.level), (7, None));
    c.command = vec!["/nonexistent/loader".into()];
    let err = run(&c, &stop, &mut |_| {}).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/loader"), "{err}");
    c.policy = "lru".into();
    assert!(run(&c, &stop, &mut |_| {}).is_err());
}

#[test]
fn stop_ends_a_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let mut c = config(&m, &[]);
    c.explicit = true;
    let stop = StopRequest::new();
    let mut calls = 0;
    let report = run(&c, &stop, &mut |_| {
        calls += 1;
        stop.request(libc::SIGTERM, false);
    })
    .unwrap();
    assert_eq!((report.exit_code(), report.ending), (0, None));
    assert!(calls >= 1);
}

/// A shell service that has set up its traps once `ready` exists; `body`
/// runs after.
fn trapping_service(ready: &Path, traps: &str, body: &str) -> Vec<String> {
    let script = format!("{traps}; : > {}; {body}", ready.display());
    vec!["sh".into(), "-c".into(), script]
}

/// Runs `c` and asks it to stop with `signal` (from kill(1), not the
/// terminal) once the service has made `ready`.
fn run_stopped_when_ready(
    c: &RunConfig,
    ready: &Path,
    signal: i32,
) -> sluice_warm::runtime::RunReport {
    let stop = StopRequest::new();
    run(c, &stop, &mut |_| {
        if ready.exists() {
            stop.request(signal, false);
        }
    })
    .unwrap()
}

#[test]
fn a_stop_signal_is_forwarded_and_the_service_exits_in_its_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let ready = dir.path().join("ready");
    // The shell ends with 3 on SIGTERM; its sleep would hold it for 1000 s.
    let service = trapping_service(&ready, "trap 'exit 3' TERM", "sleep 1000 & wait");
    let service: Vec<&str> = service.iter().map(String::as_str).collect();
    let mut c = config(&m, &service);
    c.explicit = true;
    let report = run_stopped_when_ready(&c, &ready, libc::SIGTERM);
    let ending = report.ending.clone().expect("a service ran");
    assert_eq!(
        report.exit_code(),
        3,
        "the service's own status: {ending:?}"
    );
    assert_eq!(ending.exit, ServiceExit::Code(3));
    assert_eq!(
        (ending.stopped_by, ending.forwarded, ending.killed),
        (Some(libc::SIGTERM), true, 0)
    );
    // The sleep the shell left behind was told to go, and went.
    assert_eq!((ending.leftovers, ending.survivors), (1, 0), "{ending:?}");
}

/// The sluice cgroups that exist now.
fn sluice_cgroups() -> Vec<PathBuf> {
    [
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/unified",
        "/sys/fs/cgroup",
    ]
    .iter()
    .filter_map(|root| std::fs::read_dir(root).ok())
    .flat_map(|dir| dir.flatten().map(|e| e.path()))
    .filter(|p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("sluice-warm-"))
    })
    .collect()
}

/// A run under a memory limit (root: the callers are `#[ignore]`d and run as root), or
/// `None` (skip) without memory cgroups. It leaves no cgroup behind (checked under the
/// lock: another limited run's cgroup comes and goes outside it).
fn limited_run(
    c: &RunConfig,
    stop_when: Option<(&Path, i32)>,
) -> Option<sluice_warm::runtime::RunReport> {
    require_root();
    let _exclusive = CGROUP_RUNS.write().unwrap_or_else(|e| e.into_inner());
    let before = sluice_cgroups();
    let outcome = match stop_when {
        Some((ready, signal)) => {
            let stop = StopRequest::new();
            runtime::run(c, &stop, &mut |_| {
                if ready.exists() {
                    stop.request(signal, false);
                }
            })
        }
        None => runtime::run(c, &StopRequest::new(), &mut |_| {}),
    };
    match outcome {
        Err(e @ (WarmError::Unsupported { .. } | WarmError::Io { .. })) => {
            eprintln!("skipped: no memory cgroup here: {e}");
            None
        }
        other => {
            let report = other.unwrap();
            assert_eq!(sluice_cgroups(), before, "no cgroup leaked: {report:?}");
            Some(report)
        }
    }
}

#[test]
#[ignore = "needs root for cgroups: make test runs it as root (--include-ignored)"]
fn a_stopped_service_is_killed_after_its_grace_period_and_its_cgroup_removed() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let ready = dir.path().join("ready");
    // Deaf to SIGTERM, with two children (they inherit the ignored signal).
    let service = trapping_service(
        &ready,
        "trap '' TERM; sleep 1000 & sleep 1000 & true",
        "wait",
    );
    let service: Vec<&str> = service.iter().map(String::as_str).collect();
    let mut c = config(&m, &service);
    c.explicit = true;
    c.memory_limit = Some(64 << 20);
    c.grace = Duration::from_millis(200);
    let Some(report) = limited_run(&c, Some((&ready, libc::SIGTERM))) else {
        return;
    };
    let ending = report.ending.clone().expect("a service ran");
    assert_eq!(report.exit_code(), 128 + libc::SIGKILL, "{ending:?}");
    assert_eq!(ending.exit, ServiceExit::Signal(libc::SIGKILL));
    assert_eq!((ending.killed, ending.survivors), (3, 0), "{ending:?}");
    let cgroup = report.cgroup.clone().expect("a cgroup");
    assert!(report.cgroup_removed && !cgroup.exists(), "{report:?}");
}

#[test]
#[ignore = "needs root for cgroups: make test runs it as root (--include-ignored)"]
fn a_service_over_its_limit_is_oom_killed_never_the_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    // The runtime's OOM score is below the service's (-1000 against its
    // own, or its own against +1000), then `tail` grows without bound.
    let script = "r=$(cat /proc/$PPID/oom_score_adj); s=$(cat /proc/self/oom_score_adj); \
                  [ \"$r\" -lt \"$s\" ] || exit 9; exec tail /dev/zero";
    let mut c = config(&m, &["sh", "-c", script]);
    c.explicit = true;
    c.memory_limit = Some(sluice_warm::config::MIN_MEMORY_LIMIT_BYTES);
    let Some(report) = limited_run(&c, None) else {
        return;
    };
    assert_eq!(report.exit_code(), 128 + libc::SIGKILL, "{report:?}");
    assert!(report.service_oom_killed(), "{report:?}");
    assert!(report.oom_kills.unwrap_or(0) >= 1, "{report:?}");
    assert!(report.cgroup_removed, "{report:?}");
}

#[test]
#[ignore = "needs root for fanotify: make test runs it as root (--include-ignored)"]
fn a_recording_ignores_processes_outside_the_service() {
    let Some((dir, m)) = root_model() else {
        return;
    };
    let (a, b) = (m.join("a.safetensors"), m.join("b.safetensors"));
    // The service reads a; a process the service did not start (a
    // monitoring tool, say) reads b meanwhile.
    let service = format!("sleep 0.3; cat {} > /dev/null; sleep 0.3", a.display());
    let mut c = config(&m, &["sh", "-c", &service]);
    c.policy = "template".into();
    c.builtin.service = Some(ServiceId::from_spec("outsiders"));
    c.builtin.template_dir = Some(dir.path().join("templates"));
    c.builtin.record = true;
    let stop = StopRequest::new();
    // Reads of b back to back, from before the watch opens until the run
    // ends: some land while the service is being launched, when its pid is
    // not known yet (once, those counted as the service's: a flaky test).
    let running = Arc::new(AtomicBool::new(true));
    let outsider = {
        let running = running.clone();
        std::thread::spawn(move || {
            let mut reads = 0;
            while running.load(Ordering::Relaxed) {
                // Its exit status is not checked: another test of this binary
                // may hold this process in its service cgroup for a while, and
                // kill what it started meanwhile when it ends.
                let _ = std::process::Command::new("cat").arg(&b).output();
                reads += 1;
            }
            reads
        })
    };
    let rec = run(&c, &stop, &mut |_| {}).unwrap();
    running.store(false, Ordering::Relaxed);
    assert!(outsider.join().unwrap() > 10);
    if rec.level != Some(Level::PreContent) {
        // A read() loader this short is recorded from exact ranges only.
        eprintln!("skipped: no pre-content events here ({:?})", rec.level);
        return;
    }
    let store = TemplateStore::new(dir.path().join("templates"));
    let t = store
        .load(c.builtin.service.as_ref().unwrap())
        .unwrap()
        .unwrap_or_else(|| panic!("no template was written: {rec:?}"));
    let read: Vec<&str> = t
        .workers
        .iter()
        .flat_map(|w| &w.ranges)
        .map(|r| t.files[r.file as usize].path.as_str())
        .collect();
    assert_eq!(t.workers.len(), 1, "one worker, the service: {read:?}");
    assert!(
        read.iter().all(|p| *p == "a.safetensors"),
        "only the service's reads: {read:?}"
    );
    assert_eq!(t.total_bytes(), 8 << 20);
}

#[test]
#[ignore = "needs root for fanotify: make test runs it as root (--include-ignored)"]
fn a_template_run_prefetches_the_recorded_sequence() {
    let Some((dir, m)) = root_model() else {
        return;
    };
    let templates = dir.path().join("templates");
    let read_all = format!(
        "cat {} {} > /dev/null",
        m.join("a.safetensors").display(),
        m.join("b.safetensors").display()
    );
    let mut c = config(&m, &["sh", "-c", &read_all]);
    c.policy = "template".into();
    c.builtin.service = Some(ServiceId::from_spec("rt-test"));
    c.builtin.template_dir = Some(templates.clone());
    c.builtin.record = true;
    let stop = StopRequest::new();
    let rec = run(&c, &stop, &mut |_| {}).unwrap();
    if rec.level != Some(Level::PreContent) {
        eprintln!("skipped: no pre-content events here ({:?})", rec.level);
        return;
    }
    let store = TemplateStore::new(templates);
    let t = store
        .load(c.builtin.service.as_ref().unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(t.total_bytes(), 12 << 20);
    // Replay: drop the cache, read the first 128 KiB, then wait a moment.
    for (p, _) in model_files(&m).unwrap() {
        let f = std::fs::File::open(&p).unwrap();
        page_cache::dontneed(&f, &p, 0, u64::MAX).unwrap();
    }
    c.builtin.record = false;
    // The default mechanism: synchronous, so what was handed over is in
    // the cache when `run` returns (WILLNEED's readahead is best effort:
    // under memory pressure its allocations may give up on a few pages).
    c.mechanism = Mechanism::Populate;
    let first = format!(
        "head -c 131072 {} > /dev/null; sleep 0.5",
        m.join("a.safetensors").display()
    );
    c.command = vec!["sh".into(), "-c".into(), first.into()];
    let replay = run(&c, &stop, &mut |_| {}).unwrap();
    assert_eq!(replay.exit_code(), 0);
    assert!(replay.stats.prefetched_bytes >= 11 << 20, "{replay:?}");
    let b = m.join("b.safetensors");
    let f = std::fs::File::open(&b).unwrap();
    let resident = page_cache::resident_bytes(&f, &b, 0, 0).unwrap();
    let missing: Vec<u64> = (0..(4u64 << 20))
        .step_by(4096)
        .filter(|&at| page_cache::resident_bytes(&f, &b, at, 4096).unwrap() == 0)
        .collect();
    assert_eq!(
        resident,
        4 << 20,
        "b was prefetched before anyone read it; pages missing at {missing:?}; {replay:?}"
    );
}
