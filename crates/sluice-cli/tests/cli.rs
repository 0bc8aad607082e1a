//! `sluice` end to end: output, JSON, exit codes and error lines.

use std::path::Path;
use std::process::{Command, Output};

use sluice_testkit::mkfifo;

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .expect("sluice runs")
}

/// A valid single-file checkpoint with two small tensors.
fn write_checkpoint(path: &Path) {
    let header = r#"{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"U8","shape":[3],"data_offsets":[16,19]}}"#;
    let mut padded = header.to_string();
    while padded.len() % 8 != 0 {
        padded.push(' ');
    }
    let mut bytes = (padded.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(padded.as_bytes());
    bytes.extend((0u8..19).collect::<Vec<_>>());
    std::fs::write(path, bytes).unwrap();
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn load_prints_tensors_bytes_and_engine() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    write_checkpoint(&path);
    let out = sluice(&["load", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("loaded 2 tensors") && text.contains("GB/s") && text.contains("engine"),
        "{text}"
    );
}

#[test]
fn load_json_has_the_documented_fields() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    write_checkpoint(&path);
    let out = sluice(&[
        "load",
        path.to_str().unwrap(),
        "--json",
        "--engine",
        "threads",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["tensors"], 2);
    assert_eq!(v["bytes"], 19);
    assert_eq!(v["engine"], "threads");
    assert!(v["seconds"].as_f64().unwrap() >= 0.0);
    assert!(v["gb_per_s"].is_number() && v["io_mode"].is_string());
}

#[test]
fn inspect_lists_tensors_and_validates() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    write_checkpoint(&path);
    let out = sluice(&["inspect", path.to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("F32") && text.contains("[2, 2]") && text.contains("valid: 2 tensors"),
        "{text}"
    );
    let out = sluice(&["inspect", path.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["shards"][0]["tensors"][1]["name"], "b");
    assert_eq!(v["tensor_bytes"], 19);
}

#[test]
fn missing_path_exits_4_naming_it() {
    let out = sluice(&["load", "/nonexistent/model.safetensors"]);
    assert_eq!(out.status.code(), Some(4));
    let err = stderr(&out);
    assert!(
        err.starts_with("sluice: error:") && err.contains("/nonexistent/model.safetensors"),
        "{err}"
    );
}

#[test]
fn corrupt_header_exits_3_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.safetensors");
    let mut bytes = 1000u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{not json");
    std::fs::write(&path, bytes).unwrap();
    for cmd in ["load", "inspect"] {
        let out = sluice(&[cmd, path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(3), "{cmd}: {}", stderr(&out));
        assert!(stderr(&out).contains("bad.safetensors"));
    }
}

#[test]
fn unknown_tensor_name_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    write_checkpoint(&path);
    let out = sluice(&["load", path.to_str().unwrap(), "--names", "a,zzz"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("zzz"));
}

#[test]
fn bad_option_value_exits_2() {
    let out = sluice(&["load", "x.safetensors", "--direct", "sideways"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("sideways"));
    assert_eq!(sluice(&[]).status.code(), Some(2));
}

/// Runs sluice with `args`, killed (and the test failed) if it has not
/// ended within 20 s: a FIFO must be refused, never waited on.
fn sluice_bounded(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("sluice runs");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("sluice {args:?} hung on a FIFO");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn fifos_are_refused_as_invalid_input_naming_them_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("m.safetensors");
    mkfifo(&fifo);
    let trace = dir.path().join("t.oracleGeneral");
    mkfifo(&trace);
    let jsonl = dir.path().join("t.jsonl");
    mkfifo(&jsonl);
    let f = fifo.to_str().unwrap();
    let out_dir = dir.path().join("study");
    let o = out_dir.to_str().unwrap();
    for args in [
        vec!["load", f],
        vec!["inspect", f],
        vec!["load", dir.path().to_str().unwrap()],
        vec![
            "sim",
            "run",
            "--trace",
            trace.to_str().unwrap(),
            "--policies",
            "lru",
            "--out",
            o,
        ],
        vec![
            "sim",
            "run",
            "--trace",
            jsonl.to_str().unwrap(),
            "--policies",
            "lru",
            "--out",
            o,
        ],
    ] {
        let out = sluice_bounded(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {err}");
        assert!(
            err.contains("FIFO") && err.contains(dir.path().to_str().unwrap()),
            "{err}"
        );
    }
}

#[test]
fn a_memory_limit_below_the_largest_tensor_is_a_bad_option_and_a_template_dir_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    write_checkpoint(&path);
    // Tensor "a" is 16 bytes: a 1-byte limit cannot hold it (was exit 1, an I/O failure).
    let out = sluice(&["load", path.to_str().unwrap(), "--memory-limit", "1"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    // A directory where the service's template belongs: bad input, which `warm run` reports
    // as its own failure, 125 (was exit 1), never a status the service could give.
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    std::fs::copy(&path, model.join("m.safetensors")).unwrap();
    let templates = dir.path().join("templates");
    let id = sluice_warm::config::service_id("svc").to_hex();
    std::fs::create_dir_all(templates.join(format!("{id}.sluicetpl"))).unwrap();
    let out = sluice(&[
        "warm",
        "run",
        "--model",
        model.to_str().unwrap(),
        "--service",
        "svc",
        "--template-dir",
        templates.to_str().unwrap(),
        "--events",
        "explicit",
        "--",
        "true",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("directory") && err.contains(&id), "{err}");
}

/// Runs `sluice` with standard output, or standard error, on `/dev/full`.
fn sluice_to_full(args: &[&str], stdout_full: bool) -> Output {
    let full = || {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap()
    };
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.args(args);
    match stdout_full {
        true => cmd.stdout(full()),
        false => cmd.stderr(full()),
    };
    cmd.output().expect("sluice runs")
}

#[test]
fn output_that_cannot_be_written_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    write_checkpoint(&path);
    let p = path.to_str().unwrap();
    for args in [
        &["inspect", p][..],
        &["load", "--json", p],
        &["warm", "status", "--json"],
    ] {
        let out = sluice_to_full(args, true);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(
            err.contains("cannot write to standard output") && err.contains("No space left"),
            "{args:?}: {err}"
        );
    }
    // A full standard error loses the message but keeps the command's own status.
    let out = sluice_to_full(&["inspect", "/nonexistent/model.safetensors"], false);
    assert_eq!(out.status.code(), Some(4));
}

#[test]
fn inspect_escapes_control_characters_in_tensor_names() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let header = r#"{"a\nvalid: forged":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#;
    let mut padded = header.to_string();
    while padded.len() % 8 != 0 {
        padded.push(' ');
    }
    let mut bytes = (padded.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(padded.as_bytes());
    bytes.push(7);
    std::fs::write(&path, bytes).unwrap();
    let out = sluice(&["inspect", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(r#""a\nvalid: forged""#), "{text}");
    assert!(
        !text.lines().any(|l| l.starts_with("valid: forged")),
        "{text}"
    );
}

#[test]
fn load_says_when_bytes_were_mapped_rather_than_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    write_checkpoint(&path);
    let p = path.to_str().unwrap();
    let json = sluice(&["load", "--json", "--direct", "off", p]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let mapped = v["bytes_read"].as_u64().unwrap() < v["bytes"].as_u64().unwrap();
    let out = sluice(&["load", "--direct", "off", p]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.contains("mapped from the page cache"),
        mapped,
        "{v} / {text}"
    );
}

#[test]
fn a_malformed_sluice_log_is_said_not_silently_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    write_checkpoint(&path);
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["inspect", path.to_str().unwrap()])
        .env("SLUICE_LOG", "garbage[[")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("SLUICE_LOG=\"garbage[[\" is not a log filter"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_partial_load_of_a_long_series_lists_a_few_missing_shards_and_counts_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(&dir.path().join("model-00001-of-00500.safetensors"));
    let d = dir.path().to_str().unwrap();
    for args in [
        &["load", "--allow-partial", d][..],
        &["inspect", "--allow-partial", d],
    ] {
        let out = sluice(args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text.matches("MISSING").count(), 9, "{args:?}: {text}");
        assert!(text.contains("and 491 more MISSING"), "{args:?}: {text}");
        assert!(
            stderr(&out).lines().count() < 20,
            "{args:?}: {}",
            stderr(&out)
        );
    }
}
