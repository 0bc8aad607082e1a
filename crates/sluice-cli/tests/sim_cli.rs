//! `sluice sim` end to end: gen-kv output, run results on every trace format,
//! and the exit status and message of each kind of bad input.

use std::path::Path;
use std::process::{Command, Output};

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        // No plots: the Python side is tested on its own.
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

fn rows(dir: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(dir.join("results.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["rows"].as_array().unwrap().clone()
}

#[test]
fn gen_kv_is_reproducible_and_seed_dependent() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.jsonl");
    let b = dir.path().join("b.jsonl");
    let c = dir.path().join("c.jsonl");
    for (path, seed) in [(&a, "3"), (&b, "3"), (&c, "4")] {
        let out = sluice(&[
            "sim",
            "gen-kv",
            "--out",
            p(path),
            "--requests",
            "500",
            "--seed",
            seed,
            "--json",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(summary["requests"], 500);
    }
    let (a, b, c) = (
        std::fs::read(&a).unwrap(),
        std::fs::read(&b).unwrap(),
        std::fs::read(&c).unwrap(),
    );
    assert_eq!(a, b, "same seed, same bytes");
    assert_ne!(a, c, "another seed, another workload");
    let lines: Vec<&[u8]> = a.split(|&x| x == b'\n').filter(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), 500);
    let first: serde_json::Value = serde_json::from_slice(lines[0]).unwrap();
    for key in ["timestamp", "input_length", "output_length", "hash_ids"] {
        assert!(first.get(key).is_some(), "missing {key} in {first}");
    }
}

#[test]
fn gen_kv_rejects_bad_knobs_with_status_2_and_names_them() {
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("x.jsonl");
    for (flag, value, needle) in [
        ("--sessions", "0", "sessions"),
        ("--agentic-fraction", "1.5", "agentic_fraction"),
        ("--user-tokens", "gamma:k=2", "gamma"),
        ("--arrival-rate", "0", "arrival_rate"),
    ] {
        let out = sluice(&["sim", "gen-kv", "--out", p(&out_path), flag, value]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{flag} {value}: {}",
            stderr(&out)
        );
        assert!(stderr(&out).contains(needle), "{flag}: {}", stderr(&out));
        assert!(!out_path.exists(), "nothing written on a bad knob");
    }
    let missing_dir = dir.path().join("no/such/dir/x.jsonl");
    let out = sluice(&["sim", "gen-kv", "--out", p(&missing_dir), "--requests", "5"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(stderr(&out).contains("no/such/dir"), "{}", stderr(&out));
}

#[test]
fn run_on_a_generated_kv_trace_writes_every_row_and_metric() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("kv.jsonl");
    let out = sluice(&["sim", "gen-kv", "--out", p(&trace), "--requests", "2000"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let res = dir.path().join("res");
    let out = sluice(&[
        "sim",
        "run",
        "--trace",
        p(&trace),
        "--model",
        "llama3-8b",
        "--policies",
        "lru,arc,tinylfu,belady",
        "--fractions",
        "0.05,0.2",
        "--out",
        p(&res),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("hit ratio") && text.contains("belady"),
        "{text}"
    );
    let rows = rows(&res);
    assert_eq!(rows.len(), 8);
    for row in &rows {
        for key in [
            "hit_ratio",
            "byte_hit_ratio",
            "amplification",
            "wasted_ratio",
            "evictions",
            "prefix_hit_ratio",
            "capacity",
        ] {
            assert!(row.get(key).is_some(), "missing {key} in {row}");
        }
        let hit = row["hit_ratio"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&hit));
    }
    // Block sizes come from the model: llama3-8b keeps 131072 B per token
    // (a prompt's last block holds only its remaining tokens).
    let ws = rows[0]["working_set_bytes"].as_u64().unwrap();
    assert_eq!(ws % 131_072, 0, "working set {ws} is whole tokens");
    assert!(ws > 131_072 * 512 * 100, "working set {ws} is in KV bytes");
    // Belady is an upper reference for LRU at the same size.
    let hit = |policy: &str, f: f64| {
        rows.iter()
            .find(|r| r["policy"] == policy && r["fraction"].as_f64() == Some(f))
            .unwrap()["hit_ratio"]
            .as_f64()
            .unwrap()
    };
    assert!(hit("belady", 0.05) >= hit("lru", 0.05));
    let csv = std::fs::read_to_string(res.join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 9, "{csv}");
    // The printed amplification is the JSON's: admitted bytes over hit bytes (issue 12:
    // it was labelled "miss bytes / hit bytes", another metric).
    assert!(
        text.contains("amplification (admitted bytes / hit bytes)"),
        "{text}"
    );
    let lru = rows
        .iter()
        .find(|r| r["policy"] == "lru" && r["fraction"].as_f64() == Some(0.05))
        .unwrap();
    let printed = format!("{:.4}", lru["amplification"].as_f64().unwrap());
    let table = text.split("amplification (").nth(1).unwrap();
    let line = table
        .lines()
        .find(|l| l.trim_start().starts_with("lru "))
        .unwrap();
    assert!(line.contains(&printed), "{line} vs {printed}");
}

#[test]
fn run_reads_csv_with_custom_columns_and_oracle_general() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("t.csv");
    let mut body = String::from("size;key;ts\n");
    for i in 0..400u64 {
        body.push_str(&format!("{};obj{};{}\n", 100 + i % 7, (i * 7) % 37, i));
    }
    std::fs::write(&csv, body).unwrap();
    let res = dir.path().join("csv-res");
    let out = sluice(&[
        "sim",
        "run",
        "--trace",
        p(&csv),
        "--csv-columns",
        "time-col=3,id-col=2,size-col=1,has-header=true,delimiter=;,id-is-num=false",
        "--policies",
        "lru,fifo",
        "--fractions",
        "0.5",
        "--out",
        p(&res),
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 2);
    assert_eq!(rows[0]["stats"]["requests"], 400);
    assert_eq!(rows[0]["working_set_objects"], 37);

    // oracleGeneral: 24-byte records u32 time, u64 id, u32 size, i64 next.
    let bin = dir.path().join("t.oracleGeneral");
    let mut bytes = Vec::new();
    for i in 0..300u32 {
        bytes.extend_from_slice(&i.to_le_bytes());
        bytes.extend_from_slice(&u64::from(i % 10).to_le_bytes());
        bytes.extend_from_slice(&64u32.to_le_bytes());
        bytes.extend_from_slice(&(-1i64).to_le_bytes());
    }
    std::fs::write(&bin, &bytes).unwrap();
    let res = dir.path().join("bin-res");
    let out = sluice(&[
        "sim",
        "run",
        "--trace",
        p(&bin),
        "--policies",
        "lru",
        "--fractions",
        "1",
        "--out",
        p(&res),
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Ten objects in a cache that holds them all: only the ten first touches miss.
    assert_eq!(rows[0]["stats"]["hits"], 290, "{rows}");
}

#[test]
fn bad_traces_fail_with_status_3_naming_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let res = dir.path().join("res");
    let cases: [(&str, &[u8], &str); 4] = [
        (
            "bad.jsonl",
            b"{\"timestamp\":0,\"input_length\":10,\"output_length\":1,\"hash_ids\":[1]}\n{\"timestamp\":1,\"input_length\":10,\"output_length\":1,\"hash_ids\":\"x\"}\n",
            ":2:",
        ),
        ("broken.jsonl", b"{\"timestamp\":0,\n", ":1:"),
        ("short.oracleGeneral", &[0u8; 30], "24"),
        ("bad.csv", b"1,2,3\n4,five,6\n", ":2:"),
    ];
    for (name, body, needle) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, body).unwrap();
        let out = sluice(&["sim", "run", "--trace", p(&path), "--out", p(&res)]);
        assert_eq!(out.status.code(), Some(3), "{name}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(name) && err.contains(needle), "{name}: {err}");
    }
    assert!(
        !res.join("results.json").exists(),
        "no results from a bad trace"
    );
}

#[test]
fn bad_flags_and_missing_files_have_distinct_statuses() {
    let dir = tempfile::tempdir().unwrap();
    let res = dir.path().join("res");
    let trace = dir.path().join("kv.jsonl");
    assert!(
        sluice(&["sim", "gen-kv", "--out", p(&trace), "--requests", "50"])
            .status
            .success()
    );
    let run = |extra: &[&str]| {
        let mut args = vec!["sim", "run", "--trace", p(&trace), "--out", p(&res)];
        args.extend_from_slice(extra);
        sluice(&args)
    };
    for (extra, needle) in [
        (&["--policies", "lru,nosuch"][..], "nosuch"),
        (&["--policies", "s3fifo(small_ratio=oops)"][..], "oops"),
        (&["--fractions", "0.1,2"][..], "2"),
        (&["--fractions", "abc"][..], "abc"),
        (&["--model", "llama-9000"][..], "llama-9000"),
        (&["--format", "parquet"][..], "parquet"),
    ] {
        let out = run(extra);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(needle), "{extra:?}: {}", stderr(&out));
    }
    let missing = dir.path().join("missing.jsonl");
    let out = sluice(&["sim", "run", "--trace", p(&missing), "--out", p(&res)]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(stderr(&out).contains("missing.jsonl"), "{}", stderr(&out));
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, b"").unwrap();
    let out = sluice(&["sim", "run", "--trace", p(&empty), "--out", p(&res)]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("no requests"), "{}", stderr(&out));
    // An --out that is a file says so.
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let ok_trace = dir.path().join("ok.csv");
    std::fs::write(&ok_trace, b"time,id,size\n1,7,3\n2,8,3\n").unwrap();
    let out = sluice(&["sim", "run", "--trace", p(&ok_trace), "--out", p(&file)]);
    assert_ne!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("not a directory"), "{}", stderr(&out));
    // Rows of size 0 are skipped: a trace of nothing else says why it is empty.
    let zeros = dir.path().join("zeros.csv");
    std::fs::write(&zeros, b"time,id,size\n1,7,0\n2,8,0\n").unwrap();
    let out = sluice(&["sim", "run", "--trace", p(&zeros), "--out", p(&res)]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("size 0 are skipped"),
        "{}",
        stderr(&out)
    );
}

/// A small valid trace of each format, for tests that vary only the flags.
fn small_traces(dir: &Path) -> [std::path::PathBuf; 3] {
    let kv = dir.join("good.jsonl");
    let line = "{\"timestamp\":0,\"input_length\":600,\"output_length\":1,\"hash_ids\":[1,2]}\n";
    std::fs::write(&kv, line.repeat(3)).unwrap();
    let csv = dir.join("good.csv");
    std::fs::write(&csv, "time,id,size\n0,1,10\n1,2,10\n2,1,10\n").unwrap();
    let bin = dir.join("good.oracleGeneral");
    let mut bytes = Vec::new();
    for (i, id) in [1u64, 2, 1].into_iter().enumerate() {
        bytes.extend_from_slice(&(i as u32).to_le_bytes());
        bytes.extend_from_slice(&id.to_le_bytes());
        bytes.extend_from_slice(&10u32.to_le_bytes());
        bytes.extend_from_slice(&(-1i64).to_le_bytes());
    }
    std::fs::write(&bin, bytes).unwrap();
    [kv, csv, bin]
}

#[test]
fn given_trace_options_are_checked_whatever_the_trace_format() {
    let dir = tempfile::tempdir().unwrap();
    let res = dir.path().join("res");
    for trace in small_traces(dir.path()) {
        for (flag, value, needle) in [
            ("--csv-columns", "bogus=1", "bogus"),
            ("--model", "llama-9000", "llama-9000"),
            ("--block-tokens", "0", "block_tokens"),
        ] {
            let out = sluice(&[
                "sim",
                "run",
                "--trace",
                p(&trace),
                "--out",
                p(&res),
                flag,
                value,
            ]);
            let what = format!("{} {flag} {value}", trace.display());
            assert_eq!(out.status.code(), Some(2), "{what}: {}", stderr(&out));
            assert!(stderr(&out).contains(needle), "{what}: {}", stderr(&out));
        }
    }
    assert!(!res.join("results.json").exists());
}

#[test]
fn options_are_checked_before_any_trace_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let res = dir.path().join("res");
    let missing = dir.path().join("missing.jsonl");
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, b"{\"timestamp\":0,\n").unwrap();
    for (trace, flag, value) in [
        (&missing, "--fractions", "0"),
        (&missing, "--policies", "nosuch"),
        (&bad, "--fractions", "1.5"),
        (&bad, "--csv-columns", "id-col=0"),
    ] {
        let out = sluice(&[
            "sim",
            "run",
            "--trace",
            p(trace),
            "--out",
            p(&res),
            flag,
            value,
        ]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{flag} {value}: {}",
            stderr(&out)
        );
        assert!(stderr(&out).contains(value), "{flag}: {}", stderr(&out));
    }
}

#[test]
fn empty_traces_of_every_format_fail_with_status_3_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let res = dir.path().join("res");
    for (name, body) in [
        ("empty.jsonl", &b""[..]),
        ("empty.oracleGeneral", b""),
        ("empty.csv", b"time,id,size\n"),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, body).unwrap();
        let out = sluice(&["sim", "run", "--trace", p(&path), "--out", p(&res)]);
        assert_eq!(out.status.code(), Some(3), "{name}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(name) && err.contains("no requests"), "{err}");
    }
}

#[test]
fn wrong_stored_next_accesses_are_warned_about_once_and_not_replayed() {
    // A cyclic trace, written once with its true next accesses and once with
    // every next_access_vtime -1 ("never"), which Belady trusted (issue 12,
    // item 15).
    let ids = [1u64, 2, 3, 1, 2, 3, 1, 2, 3];
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, next: &dyn Fn(usize) -> i64| {
        let mut bytes = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            bytes.extend_from_slice(&(i as u32).to_le_bytes());
            bytes.extend_from_slice(&id.to_le_bytes());
            bytes.extend_from_slice(&1u32.to_le_bytes());
            bytes.extend_from_slice(&next(i).to_le_bytes());
        }
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    };
    // 1-based position of the next request of the same id, three on.
    let right = write("right.oracleGeneral", &|i| {
        if i + 3 < ids.len() {
            i as i64 + 4
        } else {
            -1
        }
    });
    let wrong = write("wrong.oracleGeneral", &|_| -1);
    let run = |trace: &Path| {
        let res = dir.path().join("res");
        let out = sluice(&[
            "sim",
            "run",
            "--trace",
            p(trace),
            "--policies",
            "belady",
            "--fractions",
            "0.67,1",
            "--count-mode",
            "--out",
            p(&res),
            "--no-plots",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        let hits: Vec<f64> = rows(&res)
            .iter()
            .map(|r| r["hit_ratio"].as_f64().unwrap())
            .collect();
        (hits, stderr(&out))
    };
    let (truth, quiet) = run(&right);
    assert!(!quiet.contains("wrong next access"), "{quiet}");
    let (hits, err) = run(&wrong);
    assert_eq!(hits, truth);
    let warning = "6 of 9 records stored a wrong next access (first: record 1 stored its next \
                   request at never, the trace has it at record 4)";
    assert_eq!(err.matches(warning).count(), 1, "{err}");
}
