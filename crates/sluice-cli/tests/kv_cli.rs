//! `sluice kv` end to end: bench on a generated trace (with the simulator beside it),
//! stats and fsck of the store it leaves, and the exit status of each kind of bad input.

use std::path::Path;
use std::process::{Command, Output};

/// A model whose blocks are 32 KiB at 512 tokens, so a trace replays in a second.
const TINY: &str = "layers=1,kv_heads=1,head_dim=16,dtype_bytes=2";

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .env("SLUICE_PYTHON", "/nonexistent/python")
        .output()
        .expect("sluice runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn trace(dir: &Path, requests: &str) -> std::path::PathBuf {
    let path = dir.join("trace.jsonl");
    let out = sluice(&["sim", "gen-kv", "--out", p(&path), "--requests", requests]);
    assert!(out.status.success(), "{}", stderr(&out));
    path
}

fn bench(dir: &Path, trace: &Path, extra: &[&str]) -> Output {
    let out_dir = dir.join("out");
    let mut args = vec![
        "kv",
        "bench",
        "--trace",
        p(trace),
        "--model",
        TINY,
        "--out",
        p(&out_dir),
        "--no-plots",
    ];
    args.extend_from_slice(extra);
    sluice(&args)
}

fn report(dir: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("out/bench.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn bench_replays_a_trace_and_matches_the_simulator_on_one_tier_and_on_two() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path(), "300");
    for (tiers, policy) in [
        (&["--ssd", "48MiB"][..], "lru"),
        (&["--ssd", "48MiB"][..], "s3fifo"),
        (&["--dram", "1MiB", "--ssd", "48MiB"][..], "arc"),
    ] {
        let _ = std::fs::remove_dir_all(dir.path().join("out"));
        let mut extra = vec!["--compare-sim", "--policy", policy];
        extra.extend_from_slice(tiers);
        let out = bench(dir.path(), &t, &extra);
        assert!(out.status.success(), "{policy}: {}", stderr(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("hit ratio") && text.contains("sim"), "{text}");
        let r = report(dir.path());
        let (live, sim) = (&r["summary"], &r["sim"]);
        assert_eq!(live["requests"], 300);
        let hit = live["hit_ratio"].as_f64().unwrap();
        assert!(
            hit > 0.2,
            "{policy}: a chat trace reuses its prefixes: {hit}"
        );
        // Same policies, same capacities, same key order: the same answers.
        assert_eq!(live["hit_ratio"], sim["hit_ratio"], "{policy}");
        assert_eq!(
            live["prefix_hit_ratio"], sim["prefix_hit_ratio"],
            "{policy}"
        );
        assert!(live["load_gbps"].as_f64().unwrap() > 0.0);
        assert!(live["load_p99_ms"].as_f64().unwrap() >= live["load_p50_ms"].as_f64().unwrap());
        assert_eq!(live["corrupt_blocks"], 0);
        assert!(!r["windows"].as_array().unwrap().is_empty());
        assert!(
            !dir.path().join("out/store").exists(),
            "removed without --keep-store"
        );
    }
}

#[test]
fn stats_and_fsck_describe_and_verify_the_store_a_bench_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path(), "100");
    let out = bench(dir.path(), &t, &["--keep-store", "--ssd", "64MiB"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let store = dir.path().join("out/store");
    // A file the store never wrote (issue 27 #7) is skipped by stats and fsck, and left.
    let stray = store.join("segments/seg-9.skv");
    std::fs::write(&stray, [7u8; 100]).unwrap();
    let stats = sluice(&["kv", "stats", p(&store), "--json"]);
    assert!(stats.status.success(), "{}", stderr(&stats));
    let s: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    let blocks = s["blocks"].as_u64().unwrap();
    assert!(blocks > 0);
    assert_eq!(s["block_bytes"], 32768);
    assert_eq!(s["namespaces"].as_object().unwrap().len(), 1);
    let fsck = sluice(&["kv", "fsck", p(&store), "--json"]);
    assert!(fsck.status.success(), "{}", stderr(&fsck));
    let f: serde_json::Value = serde_json::from_slice(&fsck.stdout).unwrap();
    assert_eq!(
        f["good_blocks"].as_u64().unwrap(),
        s["records"].as_u64().unwrap()
    );
    assert_eq!(f["bad_blocks"], 0);

    // Flip a byte in the first record's payload: fsck reports it and exits 1; --repair
    // drops it; then the store verifies clean with one block fewer.
    let seg = std::fs::read_dir(store.join("segments"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "skv") && *p != stray)
        .min()
        .unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    let slot = s["slot_bytes"].as_u64().unwrap() as usize;
    bytes[slot + 4096 + 100] ^= 0xff;
    std::fs::write(&seg, &bytes).unwrap();
    let bad = sluice(&["kv", "fsck", p(&store)]);
    assert_eq!(bad.status.code(), Some(1), "{}", stderr(&bad));
    let said = String::from_utf8_lossy(&bad.stdout);
    assert!(said.contains("payload checksum does not match"), "{said}");
    assert!(stderr(&bad).contains("--repair"), "{}", stderr(&bad));
    let fixed = sluice(&["kv", "fsck", p(&store), "--repair"]);
    assert_eq!(fixed.status.code(), Some(1));
    let clean = sluice(&["kv", "fsck", p(&store), "--json"]);
    assert!(clean.status.success(), "{}", stderr(&clean));
    assert!(
        stray.exists(),
        "fsck --repair leaves a file the store never wrote"
    );
    let f2: serde_json::Value = serde_json::from_slice(&clean.stdout).unwrap();
    assert_eq!(
        f2["good_blocks"].as_u64().unwrap() + 1,
        f["good_blocks"].as_u64().unwrap()
    );
}

#[test]
fn bad_input_exits_with_its_status_naming_the_value() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path(), "20");
    // No block size.
    let out = sluice(&[
        "kv",
        "bench",
        "--trace",
        p(&t),
        "--out",
        p(&dir.path().join("o")),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--model"), "{}", stderr(&out));
    // A bad policy, size, rate.
    for (flag, value, needle) in [
        ("--policy", "nope", "nope"),
        ("--ssd", "lots", "lots"),
        ("--prefill-tokens-per-s", "0", "prefill"),
        ("--direct", "maybe", "auto, on, off"),
    ] {
        let out = bench(dir.path(), &t, &[flag, value]);
        assert_eq!(out.status.code(), Some(2), "{flag}: {}", stderr(&out));
        assert!(stderr(&out).contains(needle), "{flag}: {}", stderr(&out));
    }
    // A missing trace; a trace that is not JSONL.
    let out = bench(dir.path(), &dir.path().join("absent.jsonl"), &[]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let junk = dir.path().join("junk.jsonl");
    std::fs::write(&junk, "not json\n").unwrap();
    let out = bench(dir.path(), &junk, &[]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    // A store directory that is not empty is never written into.
    let busy = dir.path().join("busy");
    std::fs::create_dir_all(&busy).unwrap();
    std::fs::write(busy.join("mine.txt"), "keep").unwrap();
    let out = bench(dir.path(), &t, &["--store", p(&busy)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(busy.join("mine.txt")).unwrap(),
        "keep"
    );
    // stats/fsck of a directory that is not a store, or is missing.
    let out = sluice(&["kv", "stats", p(&busy)]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let out = sluice(&["kv", "fsck", p(&dir.path().join("nothing"))]);
    assert!(
        matches!(out.status.code(), Some(3) | Some(4)),
        "{:?}: {}",
        out.status.code(),
        stderr(&out)
    );
}

/// Starts `kv bench` on a trace long enough to be interrupted, and waits until its store
/// has a segment on disk. The caller waits for it.
#[allow(clippy::zombie_processes)] // returned to the caller, which waits for it
fn start_bench(dir: &Path, trace: &Path) -> std::process::Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["kv", "bench", "--trace", p(trace), "--model", TINY])
        .args(["--out", p(&dir.join("out")), "--no-plots", "--ssd", "48MiB"])
        .env("SLUICE_PYTHON", "/nonexistent/python")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("sluice runs");
    let segments = dir.join("out/store/segments");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let any = std::fs::read_dir(&segments)
            .map(|d| {
                d.flatten()
                    .any(|e| e.path().extension().is_some_and(|x| x == "skv"))
            })
            .unwrap_or(false);
        if any {
            return child;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("the bench exits");
            panic!("the bench never wrote a segment: {}", stderr(&out));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn finish(child: std::process::Child) -> Output {
    child.wait_with_output().expect("the bench exits")
}

/// Issue 27 #12: Ctrl-C (SIGINT) or SIGTERM during `kv bench` left its temporary store
/// (300+ MiB) behind, and the same command then refused to run ("not empty"). The bench
/// now removes its store on those signals and exits 128 + the signal; a store a killed
/// bench left (kill -9 cannot be caught) is recognised and replaced, saying so; a foreign
/// directory is still refused.
#[test]
fn an_interrupted_bench_removes_its_store_and_the_next_run_starts_clean() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path(), "3000");
    let store = dir.path().join("out/store");
    for (signal, code) in [(libc::SIGINT, 130), (libc::SIGTERM, 143)] {
        let child = start_bench(dir.path(), &t);
        // SAFETY: kill(2) on the pid of a child we started and have not reaped.
        assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
        let out = finish(child);
        assert_eq!(out.status.code(), Some(code), "{}", stderr(&out));
        assert!(stderr(&out).contains("interrupted"), "{}", stderr(&out));
        assert!(!store.exists(), "signal {signal}: the bench left its store");
    }
    // kill -9: nothing runs at exit, so the next bench finds the store and replaces it.
    let mut child = start_bench(dir.path(), &t);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(store.join("sluice-kv.json").exists());
    let out = bench(dir.path(), &t, &["--requests", "50", "--ssd", "48MiB"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("a previous `sluice kv bench` left"),
        "{}",
        stderr(&out)
    );
    assert!(!store.exists());
}
