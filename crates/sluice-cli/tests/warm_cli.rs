//! `sluice warm` end to end on a small synthetic model: record, replay,
//! fallbacks, cgroups, status, and the exit status of each bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sluice_testkit::require_root;

/// `sluice warm run --policy eager --events explicit --model M [extra] -- command`.
fn eager_run(m: &Path, templates: &Path, extra: &[&str], command: &[&str]) -> Output {
    let mut args = vec!["warm", "run", "--policy", "eager", "--events", "explicit"];
    args.extend_from_slice(&["--model", m.to_str().unwrap()]);
    args.extend_from_slice(extra);
    args.push("--");
    args.extend_from_slice(command);
    sluice(&args, templates)
}

fn sluice(args: &[&str], templates: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .env("SLUICE_TEMPLATE_DIR", templates)
        .env("SLUICE_RUN_DIR", templates.join("run"))
        .output()
        .expect("sluice runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A model directory on a disk file system (pre-content events need one).
fn model() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let m = dir.path().join("model");
    std::fs::create_dir(&m).unwrap();
    std::fs::write(m.join("model-00001.safetensors"), vec![3u8; 6 << 20]).unwrap();
    std::fs::write(m.join("model-00002.safetensors"), vec![4u8; 2 << 20]).unwrap();
    let templates = dir.path().join("templates");
    (dir, m, templates)
}

fn json(out: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text} / {}", stderr(out)))
}

#[test]
#[ignore = "needs root for fanotify: make test runs it as root (--include-ignored)"]
fn record_then_replay_a_template() {
    require_root();
    let (_dir, m, templates) = model();
    let read = format!("cat {}/*.safetensors > /dev/null", m.display());
    let m_str = m.to_str().unwrap();
    let out = sluice(
        &[
            "warm",
            "record",
            "--service",
            "llama-tp1",
            "--model",
            m_str,
            "--json",
            "--",
            "sh",
            "-c",
            &read,
        ],
        &templates,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let rec = json(&out);
    if rec["events_from"] != "PreContent" {
        eprintln!("skipped: no pre-content events ({rec})");
        return;
    }
    let template = rec["template"].as_str().expect("template path").to_string();
    let size = std::fs::metadata(&template).unwrap().len();
    assert!(
        size < 1024,
        "a template of 8 MiB read sequentially is tiny: {size} B"
    );
    // Replay from a cold cache: the loader opens its first shard, initializes
    // for a moment (as frameworks do), then reads everything.
    // SAFETY: sync has no preconditions; it makes the pages clean so they drop.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "1").unwrap();
    let slow = format!(
        "head -c 4096 {}/model-00001.safetensors > /dev/null; sleep 0.3; {read}",
        m.display()
    );
    let out = sluice(
        &[
            "warm",
            "run",
            "--service",
            "llama-tp1",
            "--model",
            m_str,
            "--json",
            "--",
            "sh",
            "-c",
            &slow,
        ],
        &templates,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let run = json(&out);
    assert_eq!(run["policy"], "template");
    assert!(run["prefetched_bytes"].as_u64().unwrap() > 0, "{run}");
    assert!(run["policy_fault"].is_null(), "{run}");
    // The same replay on a (pretend) two-node machine: worker 0's
    // accelerator sits on node 1, so a loader thread for node 1 prefetches.
    // Node 1 does not exist here: its memory policy and CPU pinning are
    // refused (logged) and prefetch goes on.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "1").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["warm", "run", "--service", "llama-tp1", "--model", m_str])
        .args(["--json", "--", "sh", "-c", &slow])
        .env("SLUICE_TEMPLATE_DIR", &templates)
        .env("SLUICE_RUN_DIR", templates.join("run"))
        .env("SLUICE_NUMA_MAP", "0:1")
        .env("SLUICE_LOG", "sluice_warm=debug")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let numa = json(&out);
    assert!(numa["prefetched_bytes"].as_u64().unwrap() > 0, "{numa}");
    assert_eq!(numa["prefetch_errors"], 0, "{numa}");
    assert!(
        stderr(&out).contains("prefetch lane 1"),
        "the node-1 loader thread ran: {}",
        stderr(&out)
    );
    // A corrupt template is refused with status 125 (warm's own failure,
    // not the service's), naming it.
    std::fs::write(&template, b"SLTPL\0garbage").unwrap();
    let out = sluice(
        &[
            "warm",
            "run",
            "--service",
            "llama-tp1",
            "--model",
            m_str,
            "--",
            "true",
        ],
        &templates,
    );
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    assert!(stderr(&out).contains(".sluicetpl"), "{}", stderr(&out));
}

#[test]
fn the_service_exit_status_passes_through_in_every_event_mode() {
    let (_dir, m, templates) = model();
    let m_str = m.to_str().unwrap();
    for events in ["explicit", "auto"] {
        let out = sluice(
            &[
                "warm", "run", "--policy", "eager", "--events", events, "--model", m_str, "--json",
                "--", "sh", "-c", "exit 5",
            ],
            &templates,
        );
        assert_eq!(out.status.code(), Some(5), "{events}: {}", stderr(&out));
        assert_eq!(json(&out)["exit_code"], 5);
    }
}

#[test]
#[ignore = "needs root for fanotify: make test runs it as root (--include-ignored)"]
fn tmpfs_models_fall_back_from_pre_content_to_open_events() {
    require_root();
    if !Path::new("/dev/shm").is_dir() {
        eprintln!("skipped: no /dev/shm");
        return;
    }
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let m = dir.path().join("model");
    std::fs::create_dir(&m).unwrap();
    std::fs::write(m.join("w.safetensors"), vec![1u8; 1 << 20]).unwrap();
    let read = format!("cat {}/w.safetensors > /dev/null", m.display());
    let out = sluice(
        &[
            "warm",
            "run",
            "--policy",
            "native",
            "--model",
            m.to_str().unwrap(),
            "--json",
            "--",
            "sh",
            "-c",
            &read,
        ],
        &dir.path().join("t"),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["events_from"], "Open");
    let out = sluice(
        &[
            "warm",
            "run",
            "--policy",
            "native",
            "--events",
            "pre-content",
            "--model",
            m.to_str().unwrap(),
            "--",
            "true",
        ],
        &dir.path().join("t"),
    );
    assert_eq!(
        out.status.code(),
        Some(125),
        "insisting on pre-content fails: {}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("unavailable"), "{}", stderr(&out));
}

#[test]
#[ignore = "needs root for cgroups: make test runs it as root (--include-ignored)"]
fn a_memory_limit_runs_the_service_in_a_cgroup_that_is_removed_after() {
    require_root();
    let (_dir, m, templates) = model();
    let probe = "cat /proc/self/cgroup | grep -q sluice-warm";
    let out = sluice(
        &[
            "warm",
            "run",
            "--policy",
            "native",
            "--memory-limit",
            "256MiB",
            "--model",
            m.to_str().unwrap(),
            "--json",
            "--",
            "sh",
            "-c",
            probe,
        ],
        &templates,
    );
    if stderr(&out).contains("memory cgroup unavailable") {
        eprintln!("skipped: {}", stderr(&out));
        return;
    }
    assert!(
        out.status.success(),
        "the service ran inside the cgroup: {}",
        stderr(&out)
    );
    let cgroup = json(&out)["cgroup"]
        .as_str()
        .expect("cgroup path")
        .to_string();
    assert!(
        !Path::new(&cgroup).exists(),
        "{cgroup} removed after the run"
    );
}

#[test]
fn warms_own_failures_exit_125_126_or_127_never_a_code_the_service_could_give() {
    let (dir, m, templates) = model();
    let m_str = m.to_str().unwrap();
    let missing = dir.path().join("nope");
    let not_executable = dir.path().join("serve.sh");
    std::fs::write(&not_executable, "#!/bin/sh\nexit 0\n").unwrap();
    let run = |extra: &[&str], command: &[&str]| -> Vec<String> {
        let mut args = vec!["warm", "run"];
        if !extra.contains(&"--policy") {
            args.extend_from_slice(&["--policy", "eager"]);
        }
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--model", m_str, "--"]);
        args.extend_from_slice(command);
        args.into_iter().map(String::from).collect()
    };
    let cases: Vec<(Vec<String>, i32, &str)> = vec![
        (run(&["--policy", "lru"], &["true"]), 125, "lru"),
        (
            vec!["warm", "run", "--model", m_str, "--", "true"]
                .into_iter()
                .map(String::from)
                .collect(),
            125,
            "--service",
        ),
        (run(&["--events", "magic"], &["true"]), 125, "magic"),
        (run(&["--watermark", "1.5"], &["true"]), 125, "1.5"),
        (run(&["--mechanism", "mmap"], &["true"]), 125, "mmap"),
        (run(&["--memory-limit", "lots"], &["true"]), 125, "lots"),
        // Below what anything starts in: refused before a cgroup is made.
        (
            run(&["--memory-limit", "2MiB"], &["true"]),
            125,
            "at least 32MiB",
        ),
        (
            run(&["--memory-limit", "0"], &["true"]),
            125,
            "at least 32MiB",
        ),
        (run(&["--grace-period", "soon"], &["true"]), 125, "soon"),
        // A usage error clap finds.
        (run(&["--bogus"], &["true"]), 125, "--bogus"),
        (
            vec!["warm", "run", "--policy", "eager", "--model"]
                .into_iter()
                .map(String::from)
                .chain([missing.display().to_string(), "--".into(), "true".into()])
                .collect(),
            125,
            "nope",
        ),
        (run(&[], &["/nonexistent/serve"]), 127, "/nonexistent/serve"),
        (
            run(&[], &[not_executable.to_str().unwrap()]),
            126,
            "serve.sh",
        ),
    ];
    for (args, code, needle) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = sluice(&args, &templates);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(needle), "{args:?}: {}", stderr(&out));
    }
    // The commands that launch nothing keep the usual statuses.
    let out = sluice(&["warm", "status", "--bogus"], &templates);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    // --help says all this.
    let out = sluice(&["warm", "run", "--help"], &templates);
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in ["125", "126", "127", "128 + the signal", "--grace-period"] {
        assert!(help.contains(needle), "{needle}: {help}");
    }
}

#[test]
fn a_service_killed_by_a_signal_exits_128_plus_it_and_the_report_names_it() {
    let (_dir, m, templates) = model();
    let out = eager_run(&m, &templates, &["--json"], &["sh", "-c", "kill -TERM $$"]);
    assert_eq!(
        out.status.code(),
        Some(128 + libc::SIGTERM),
        "{}",
        stderr(&out)
    );
    let report = json(&out);
    assert_eq!(
        report["service_exit"],
        serde_json::json!({"signal": libc::SIGTERM, "signal_name": "SIGTERM"})
    );
    assert_eq!(
        (
            report["stopped_by"].is_null(),
            report["oom_killed"].as_bool()
        ),
        (true, Some(false))
    );
}

/// `sluice warm run` of a shell `script` that prints `ready` once its traps
/// are set, with stdout piped: the test reads up to that line (an early
/// failure closes stdout, so the read cannot hang).
fn start_service(m: &Path, templates: &Path, grace: &str, script: &str) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
    // The stop signals at their defaults, whatever this test inherited: under
    // nohup SIGHUP is ignored, and a background job of a non-interactive
    // shell ignores SIGINT, and `warm run` rightly keeps inherited ignores.
    // SAFETY: signal(2) is async-signal-safe, as pre_exec requires.
    unsafe {
        command.pre_exec(|| {
            for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGTERM] {
                libc::signal(sig, libc::SIG_DFL);
            }
            Ok(())
        });
    }
    let mut child = command
        .args(["warm", "run", "--policy", "eager", "--events", "explicit"])
        .args(["--grace-period", grace, "--json", "--model"])
        .arg(m)
        .args(["--", "sh", "-c", script])
        .env("SLUICE_TEMPLATE_DIR", templates)
        .env("SLUICE_RUN_DIR", templates.join("run"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert_eq!(line, "ready\n", "the service did not start");
    child.stdout = Some(stdout.into_inner());
    child
}

/// Waits for `child` with a guard against a hang (not a timing assertion). Its stdout
/// and stderr are drained while it runs: a child blocked writing into a full pipe would
/// otherwise never exit, and the guard would blame it.
fn finish(mut child: std::process::Child) -> Output {
    fn drain(mut r: impl std::io::Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut out = Vec::new();
            let _ = r.read_to_end(&mut out);
            out
        })
    }
    let stdout = drain(child.stdout.take().unwrap());
    let stderr = drain(child.stderr.take().unwrap());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            let _ = child.wait();
            let err = String::from_utf8_lossy(&stderr.join().unwrap()).into_owned();
            panic!("sluice warm run did not end; its stderr:\n{err}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

fn signal(child: &std::process::Child, signal: i32) {
    // SAFETY: kill(2) on our own child, which we have not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
}

#[test]
fn sigterm_reaches_the_service_which_exits_in_its_grace_period_with_its_own_status() {
    let (_dir, m, templates) = model();
    let script = "trap 'exit 3' TERM; sleep 1000 & echo ready; wait";
    let child = start_service(&m, &templates, "60s", script);
    signal(&child, libc::SIGTERM);
    let out = finish(child);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let report = json(&out);
    assert_eq!(report["service_exit"], serde_json::json!({"code": 3}));
    assert_eq!(report["stopped_by"], "SIGTERM");
    assert_eq!(report["signal_forwarded"], true);
    assert_eq!(report["killed_processes"], 0, "{report}");
    // The shell's sleep went with it.
    assert_eq!(report["leftover_processes"], 1, "{report}");
    assert_eq!(report["surviving_processes"], 0, "{report}");
}

#[test]
fn a_second_signal_kills_a_deaf_service_at_once() {
    let (_dir, m, templates) = model();
    // Deaf to SIGTERM (it says so and waits on), an hour of grace.
    let script = "trap 'echo term' TERM; sleep 1000 & echo ready; while :; do wait; done";
    let mut child = start_service(&m, &templates, "3600s", script);
    // The second signal only once the service has answered the first: sent
    // back to back, both could be pending at once and the runtime could take
    // either for the first (it forwarded SIGHUP once, and the service died
    // of it). Two different signals, as two of the same may merge.
    signal(&child, libc::SIGTERM);
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert_eq!(
        line, "term\n",
        "the service never got the forwarded SIGTERM"
    );
    child.stdout = Some(stdout.into_inner());
    signal(&child, libc::SIGHUP);
    let out = finish(child);
    assert_eq!(
        out.status.code(),
        Some(128 + libc::SIGKILL),
        "{}",
        stderr(&out)
    );
    let report = json(&out);
    assert_eq!(
        report["killed_processes"], 2,
        "the shell and its sleep: {report}"
    );
    assert_eq!(report["surviving_processes"], 0, "{report}");
}

#[test]
fn stale_status_files_and_trigger_pipes_of_dead_runtimes_are_removed() {
    let (_dir, m, templates) = model();
    let run_dir = templates.join("run");
    std::fs::create_dir_all(&run_dir).unwrap();
    // A pid that cannot exist (above any pid_max): a runtime killed before
    // it could clean up.
    let stale = [
        run_dir.join("2147483646.json"),
        run_dir.join("2147483646.trigger"),
    ];
    std::fs::write(&stale[0], b"{}").unwrap();
    sluice_testkit::mkfifo(&stale[1]);
    let out = eager_run(&m, &templates, &[], &["true"]);
    assert!(out.status.success(), "{}", stderr(&out));
    for path in &stale {
        assert!(!path.exists(), "{} left behind", path.display());
    }
    let left: Vec<_> = std::fs::read_dir(&run_dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "the run cleaned up after itself: {left:?}");
}

#[test]
fn status_lists_nothing_when_nothing_runs() {
    let (_dir, _m, templates) = model();
    let out = sluice(&["warm", "status"], &templates);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("no warm runtime"));
    let out = sluice(&["warm", "status", "--json"], &templates);
    assert_eq!(json(&out), serde_json::json!([]));
    let out = sluice(&["warm", "trigger", "--path", "a.safetensors"], &templates);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("no warm runtime"), "{}", stderr(&out));
    let out = sluice(
        &["warm", "trigger", "--path", "a.safetensors", "--pid", "1"],
        &templates,
    );
    assert_eq!(
        out.status.code(),
        Some(4),
        "no pipe for pid 1: {}",
        stderr(&out)
    );
}

/// Drops a file's clean pages, so prefetch has work to do.
fn drop_cached(path: &Path) {
    let f = std::fs::File::open(path).unwrap();
    f.sync_all().unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: a valid descriptor; fadvise only advises.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0);
}

/// A v1 memory cgroup the test owns, removed on drop.
struct TestCgroup(PathBuf);

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
#[ignore = "needs root for fanotify and cgroups: make test runs it as root (--include-ignored)"]
fn a_daemon_prefetches_for_a_service_it_did_not_start_charged_to_its_cgroup() {
    require_root();
    let v1 = Path::new("/sys/fs/cgroup/memory");
    if !v1.join("cgroup.procs").exists() {
        eprintln!("skipped: no cgroup v1 memory controller");
        return;
    }
    let (_dir, m, templates) = model();
    for f in ["model-00001.safetensors", "model-00002.safetensors"] {
        drop_cached(&m.join(f));
    }
    let daemon = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["warm", "daemon", "--policy", "eager", "--json", "--watch"])
        .arg(&m)
        .env("SLUICE_TEMPLATE_DIR", &templates)
        .env("SLUICE_RUN_DIR", templates.join("run"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = daemon.id() as i32;
    // `status` lists the daemon once it watches.
    let listed = |min_prefetched: u64| {
        let out = sluice(&["warm", "status", "--json"], &templates);
        json(&out).as_array().unwrap().iter().any(|s| {
            s["pid"] == pid
                && s["mode"] == "daemon"
                && s["prefetched_bytes"].as_u64().unwrap_or(0) >= min_prefetched
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !listed(0) {
        assert!(std::time::Instant::now() < deadline, "daemon never listed");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // The service, in its own cgroup: opens the first shard and stays up a
    // moment.
    let cgroup = TestCgroup(v1.join(format!("sluice-test-daemon-{}", std::process::id())));
    std::fs::create_dir(&cgroup.0).unwrap();
    let reader = format!(
        "echo $$ > {}/cgroup.procs && exec 3< {}/model-00001.safetensors && sleep 1",
        cgroup.0.display(),
        m.display()
    );
    let mut service = Command::new("sh").args(["-c", &reader]).spawn().unwrap();
    // Eager fetches the whole model (8 MiB) for it, from inside its cgroup.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !listed(6 << 20) {
        assert!(
            std::time::Instant::now() < deadline,
            "daemon prefetched too little"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let daemon_cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let name = cgroup.0.file_name().unwrap().to_str().unwrap();
    assert!(
        daemon_cgroups.contains(name),
        "daemon joined the reader's cgroup: {daemon_cgroups}"
    );
    // The peak, not the current usage: another test may drop caches.
    let peak: u64 = std::fs::read_to_string(cgroup.0.join("memory.max_usage_in_bytes"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(peak >= 6 << 20, "prefetch charged to the service: {peak}");
    assert!(service.wait().unwrap().success());
    // SIGTERM: a clean exit with its report, and no status file left.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let out = daemon.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let report = json(&out);
    assert_eq!(report["mode"], "daemon");
    assert!(
        report["prefetched_bytes"].as_u64().unwrap() >= 6 << 20,
        "{report}"
    );
    assert!(!listed(0), "status retracted");
}

/// `sluice warm record` of a service that announces one read through the
/// trigger pipe (no root needed) and exits with `code`.
fn record_exiting(dir: &Path, code: i32, keep_failed: bool) -> (Output, PathBuf) {
    let model = dir.join("model");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::write(model.join("a.bin"), vec![1u8; 1 << 20]).unwrap();
    let templates = dir.join("templates");
    let run = dir.join("run");
    let service = format!(
        "echo '{{\"path\": \"a.bin\"}}' > \"$SLUICE_RUN_DIR/$PPID.trigger\"; sleep 0.5; exit {code}"
    );
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.env("SLUICE_RUN_DIR", &run)
        .args([
            "warm",
            "record",
            "--events",
            "explicit",
            "--service",
            "failing",
        ])
        .arg("--model")
        .arg(&model)
        .arg("--template-dir")
        .arg(&templates);
    if keep_failed {
        cmd.arg("--keep-failed");
    }
    let out = cmd.args(["--", "sh", "-c", &service]).output().unwrap();
    let id = sluice_warm::config::service_id("failing").to_hex();
    (out, templates.join(format!("{id}.sluicetpl")))
}

#[test]
fn a_failed_service_leaves_no_template_unless_asked_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let (out, template) = record_exiting(dir.path(), 7, false);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(7), "the service's status: {err}");
    assert!(
        !template.exists(),
        "a failed run's recording was written: {err}"
    );
    assert!(err.contains("exited 7: no template written"), "{err}");

    let (out, template) = record_exiting(dir.path(), 7, true);
    assert_eq!(out.status.code(), Some(7));
    assert!(template.exists(), "--keep-failed keeps it");
    std::fs::remove_file(&template).unwrap();

    let (out, template) = record_exiting(dir.path(), 0, false);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success() && template.exists(), "{err}");
    assert!(err.contains("template written to"), "{err}");
}

#[test]
fn the_hang_guard_drains_a_child_that_fills_its_pipes() {
    // A child writing more than a pipe holds must still be seen to end: the guard used to
    // poll without reading, so such a child blocked and was reported as a hang.
    let child = Command::new("sh")
        .args([
            "-c",
            "head -c 1000000 /dev/zero >&2; head -c 300000 /dev/zero; exit 4",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = finish(child);
    assert_eq!(out.status.code(), Some(4));
    assert_eq!((out.stdout.len(), out.stderr.len()), (300_000, 1_000_000));
}

#[test]
fn a_process_the_service_detached_gets_sigterm_without_a_cgroup_too() {
    let (dir, m, templates) = model();
    // The shell exits at once; its sleep would be init's orphan.
    let pidfile = dir.path().join("sleeper.pid");
    let script = format!("sleep 300 & echo $! > {}", pidfile.display());
    let out = eager_run(
        &m,
        &templates,
        &["--json", "--grace-period", "10s"],
        &["sh", "-c", &script],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let report = json(&out);
    assert_eq!(report["leftover_processes"], 1, "{report}");
    assert_eq!(report["killed_processes"], 0, "{report}");
    let sleeper: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        !Path::new(&format!("/proc/{sleeper}")).exists(),
        "the sleep ({sleeper}) was ended and reaped"
    );
}

#[test]
#[ignore = "needs root for cgroups: make test runs it as root (--include-ignored)"]
fn the_empty_cgroup_of_a_killed_runtime_is_removed_by_the_next_run() {
    require_root();
    let (_dir, m, templates) = model();
    // A runtime killed with SIGKILL leaves `sluice-warm-PID` behind; this
    // pid is above any pid_max, so no runtime has it.
    let dead = match sluice_engine::cgroup::create_cgroup("sluice-warm-2147483645", None) {
        Ok(cgroup) => cgroup.path,
        Err(err) => {
            eprintln!("skipped: {err}");
            return;
        }
    };
    let out = eager_run(&m, &templates, &[], &["true"]);
    let exists = dead.exists();
    if exists {
        let _ = std::fs::remove_dir(&dead);
    }
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!exists, "{} removed", dead.display());
}

/// `warm record` of a service that reads the model (an explicit trigger), writes `ran` and
/// exits 0, templates in `templates`.
fn record_into(dir: &Path, templates: &Path) -> Output {
    let model = dir.join("model");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::write(model.join("a.bin"), vec![1u8; 1 << 20]).unwrap();
    let service = format!(
        "echo '{{\"path\": \"a.bin\"}}' > \"$SLUICE_RUN_DIR/$PPID.trigger\"; sleep 0.5; \
         touch {}/ran",
        dir.display()
    );
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .env("SLUICE_RUN_DIR", dir.join("run"))
        .args(["warm", "record", "--events", "explicit", "--service", "t"])
        .arg("--model")
        .arg(&model)
        .arg("--template-dir")
        .arg(templates)
        .args(["--", "sh", "-c", &service])
        .output()
        .unwrap()
}

#[test]
fn a_template_dir_that_cannot_hold_templates_fails_before_the_service_starts() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let out = record_into(dir.path(), &file);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains("not-a-dir") && err.contains("not a directory"),
        "{err}"
    );
    assert!(
        !dir.path().join("ran").exists(),
        "the service was not started"
    );
}

#[test]
#[ignore = "needs root to mount a small tmpfs: make test runs it as root (--include-ignored)"]
fn a_template_that_cannot_be_written_is_a_failure_of_warms_own() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("full");
    std::fs::create_dir(&full).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&full)
        .status()
        .unwrap();
    assert!(mounted.success());
    // Fill it: the directory and an empty probe file still fit, a template does not.
    let _ = std::fs::write(full.join("filler"), vec![0u8; 1 << 20]);
    let out = record_into(dir.path(), &full.join("templates"));
    let _ = Command::new("umount").arg(&full).status();
    let err = stderr(&out);
    assert!(dir.path().join("ran").exists(), "the service ran: {err}");
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("no template was written"), "{err}");
    assert!(!err.contains("template written to"), "{err}");
}

#[test]
fn a_report_that_cannot_be_printed_is_a_failure_of_warms_own_not_a_service_status() {
    let (_dir, m, templates) = model();
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "warm", "run", "--policy", "eager", "--events", "explicit", "--json",
        ])
        .arg("--model")
        .arg(&m)
        .args(["--", "true"])
        .env("SLUICE_TEMPLATE_DIR", &templates)
        .env("SLUICE_RUN_DIR", templates.join("run"))
        .stdout(full)
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("cannot write to standard output"), "{err}");
}
