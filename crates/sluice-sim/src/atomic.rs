//! Output files appear whole or not at all: each writer fills a temporary
//! sibling (`.NAME.tmp-PID`), syncs it and renames it over the destination,
//! so an interrupted run never leaves a truncated trace or result behind.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use crate::error::SimError;

/// Writes `path` through `fill`, atomically (temporary file + rename).
pub fn write_file(
    path: &Path,
    fill: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<(), SimError> {
    let io_error = |source| SimError::Io {
        path: path.to_path_buf(),
        source,
    };
    let tmp = temporary_sibling(path);
    let outcome = (|| {
        let mut out = BufWriter::new(File::create(&tmp)?);
        fill(&mut out)?;
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if outcome.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    outcome.map_err(io_error)
}

fn temporary_sibling(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

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
