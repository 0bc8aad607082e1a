//! Output files appear whole or not at all: the engine's
//! [`sluice_engine::atomic_write_with`] fills a temporary sibling, syncs it,
//! renames it over the destination and syncs the directory, so an
//! interrupted run never leaves a truncated trace or result behind.

use std::io::Write;
use std::path::Path;

use sluice_engine::OsError;

use crate::error::SimError;

/// Writes `path` through `fill`, atomically; errors name `path`.
pub fn write_file(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<(), SimError> {
    sluice_engine::atomic_write_with(path, fill).map_err(|err| SimError::Io {
        path: path.to_path_buf(),
        source: match err {
            OsError::Io { source, .. } => source,
            other => std::io::Error::other(other.to_string()),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_fill_leaves_no_file_and_keeps_the_old_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.bin");
        write_file(&path, |w| w.write_all(b"old")).unwrap();
        let err = write_file(&path, |w| {
            w.write_all(b"partial")?;
            Err(std::io::Error::other("disk on fire"))
        })
        .unwrap_err();
        assert!(err.to_string().contains("t.bin"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_missing_directory_is_an_io_error_naming_the_path() {
        let err = write_file(Path::new("/nonexistent-dir/x.jsonl"), |_| Ok(())).unwrap_err();
        assert!(matches!(err, SimError::Io { .. }));
        assert!(
            err.to_string().contains("/nonexistent-dir/x.jsonl"),
            "{err}"
        );
    }
}
