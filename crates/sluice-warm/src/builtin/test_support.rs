//! Contexts and events for the built-in policies' tests.

use std::path::Path;

use crate::policy::{AccessEvent, AccessKind, PolicyContext};

pub const MIB: u64 = 1 << 20;

/// A memory-limited context over `files` (name, size) in `dir`.
pub fn ctx(dir: &Path, files: &[(&str, u64)]) -> PolicyContext {
    PolicyContext {
        model_dir: dir.to_path_buf(),
        files: files.iter().map(|(n, s)| (dir.join(n), *s)).collect(),
        memory_limited: true,
    }
}

pub fn event(
    dir: &Path,
    pid: i32,
    file: &str,
    offset: u64,
    len: u64,
    kind: AccessKind,
) -> AccessEvent {
    AccessEvent {
        pid,
        worker: None,
        path: dir.join(file),
        offset,
        len,
        kind,
    }
}
