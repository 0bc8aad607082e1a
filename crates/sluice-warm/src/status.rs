//! `sluice warm status`: every running runtime keeps a small JSON file
//! describing itself in the run directory, rewritten atomically about every
//! 200 ms; `status` lists the files whose process is still alive and
//! removes the others, with the trigger pipes of dead runtimes (a runtime
//! removes both when it exits, but not when it is killed). `warm run`,
//! `record`, `daemon` and `trigger` list too, so stale files go whichever
//! command comes next.
//!
//! The directory is [`crate::config::WarmEnv::run_dir`]: `$SLUICE_RUN_DIR`,
//! else `/run/sluice/warm` for root, else `$XDG_RUNTIME_DIR/sluice/warm`,
//! else `/tmp/sluice-warm-UID`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::WarmError;

/// What a runtime reports about itself. Fields a file lacks (an older
/// runtime's) read as their defaults; the pid is the file's name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RuntimeStatus {
    pub pid: i32,
    /// `run`, `record` or `daemon`.
    pub mode: String,
    pub policy: String,
    pub model_dir: String,
    pub service: Option<String>,
    /// fanotify level (`PreContent`, `Open`) or `explicit`.
    pub events_from: String,
    pub elapsed_s: f64,
    pub events: u64,
    pub prefetched_bytes: u64,
    pub evicted_bytes: u64,
    pub superseded_bytes: u64,
    pub pending_bytes: u64,
    /// The latest reader position: file and offset.
    pub reader: Option<(String, u64)>,
    /// Why the policy was disabled, if it was.
    pub policy_fault: Option<String>,
}

/// Writes `status` as `DIR/PID.json`, atomically.
pub fn publish(dir: &Path, status: &RuntimeStatus) -> Result<(), WarmError> {
    std::fs::create_dir_all(dir).map_err(WarmError::io(dir))?;
    let path = dir.join(format!("{}.json", status.pid));
    let text = serde_json::to_vec(status).expect("a status serializes: plain fields only");
    Ok(sluice_engine::atomic_write(&path, &text)?)
}

/// Removes this process's status file.
pub fn retract(dir: &Path, pid: i32) {
    let _ = std::fs::remove_file(dir.join(format!("{pid}.json")));
}

/// The status of every live runtime, by pid; status files and trigger
/// pipes of dead processes are removed, unreadable ones skipped with a
/// warning.
pub fn list(dir: &Path) -> Result<Vec<RuntimeStatus>, WarmError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(WarmError::io(dir)(e)),
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let Some((pid, kind)) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.rsplit_once('.'))
            .and_then(|(pid, kind)| Some((pid.parse::<i32>().ok()?, kind)))
        else {
            continue;
        };
        if !matches!(kind, "json" | "trigger") {
            continue;
        }
        if !alive(pid) {
            let _ = std::fs::remove_file(&path);
            continue;
        }
        if kind == "trigger" {
            continue;
        }
        match std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<RuntimeStatus>(&b).map_err(|e| e.to_string()))
        {
            Ok(s) => out.push(RuntimeStatus { pid, ..s }),
            Err(e) => tracing::warn!("{}: {e}", path.display()),
        }
    }
    out.sort_by_key(|s| s.pid);
    Ok(out)
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    pid > 0
        && (unsafe { libc::kill(pid, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_statuses_are_listed_and_dead_ones_removed() {
        let dir = tempfile::tempdir().unwrap();
        let me = RuntimeStatus {
            pid: std::process::id() as i32,
            mode: "run".into(),
            policy: "template".into(),
            prefetched_bytes: 42,
            reader: Some(("a.safetensors".into(), 7)),
            ..RuntimeStatus::default()
        };
        publish(dir.path(), &me).unwrap();
        // A pid that cannot exist.
        let dead = RuntimeStatus {
            pid: i32::MAX - 1,
            ..me.clone()
        };
        publish(dir.path(), &dead).unwrap();
        // A killed runtime's pipe, and one with no status file at all.
        sluice_testkit::mkfifo(&dir.path().join(format!("{}.trigger", dead.pid)));
        std::fs::write(dir.path().join(format!("{}.trigger", i32::MAX - 2)), b"").unwrap();
        let mine = dir.path().join(format!("{}.trigger", me.pid));
        std::fs::write(&mine, b"").unwrap();
        std::fs::write(dir.path().join("garbage.json"), b"{").unwrap();
        let listed = list(dir.path()).unwrap();
        assert_eq!(listed, std::slice::from_ref(&me));
        assert!(!dir.path().join(format!("{}.json", i32::MAX - 1)).exists());
        for gone in [i32::MAX - 1, i32::MAX - 2] {
            let stale = dir.path().join(format!("{gone}.trigger"));
            assert!(!stale.exists(), "{} removed", stale.display());
        }
        assert!(mine.exists(), "a live runtime's pipe stays");
        retract(dir.path(), me.pid);
        assert!(list(dir.path()).unwrap().is_empty());
        assert!(list(&dir.path().join("missing")).unwrap().is_empty());
    }
}
