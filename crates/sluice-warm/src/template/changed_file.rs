//! Whether the model a template describes is still the one on disk.
//!
//! A template records each model file's size and mtime (ns) as they were when it was
//! recorded. Replaying a template against a changed model would prefetch the wrong bytes,
//! so callers compare: [`file_from_disk`] takes the stamp when recording, and
//! [`changed_files`] lists the files whose stamp differs now.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::{IoOperation, Template, TemplateError, TemplateFile};

/// How a model file differs from what a template recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileChange {
    /// The file cannot be stat'ed now (missing, or no permission); the error, as text.
    Unavailable(String),
    /// The size differs.
    Size { recorded: u64, now: u64 },
    /// Same size, different modification time.
    Mtime { recorded: i64, now: i64 },
}

/// A model file that changed since its template was recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangedFile {
    /// Index into [`Template::files`].
    pub file: u32,
    /// The file's template path.
    pub path: String,
    /// What changed.
    pub change: FileChange,
}

/// Stats `model_dir/path` for a new template entry.
pub fn file_from_disk(model_dir: &Path, path: &str) -> Result<TemplateFile, TemplateError> {
    let (size, mtime_ns) = stamp(&model_dir.join(path))?;
    Ok(TemplateFile {
        path: path.to_string(),
        size,
        mtime_ns,
    })
}

/// The model files of `template` that changed (size, mtime, or gone) since recording,
/// `model_dir` being the directory its paths are relative to. Empty when the template
/// still describes the model.
pub fn changed_files(template: &Template, model_dir: &Path) -> Vec<ChangedFile> {
    let mut changed = Vec::new();
    for (index, file) in template.files.iter().enumerate() {
        let change = match stamp(&model_dir.join(&file.path)) {
            Err(e) => FileChange::Unavailable(e.to_string()),
            Ok((size, _)) if size != file.size => FileChange::Size {
                recorded: file.size,
                now: size,
            },
            Ok((_, mtime)) if mtime != file.mtime_ns => FileChange::Mtime {
                recorded: file.mtime_ns,
                now: mtime,
            },
            Ok(_) => continue,
        };
        changed.push(ChangedFile {
            file: u32::try_from(index).unwrap_or(u32::MAX),
            path: file.path.clone(),
            change,
        });
    }
    changed
}

/// Size and mtime (ns) of `path`, as a template records them.
fn stamp(path: &Path) -> Result<(u64, i64), TemplateError> {
    let meta = std::fs::metadata(path).map_err(TemplateError::io(path, IoOperation::Stat))?;
    let mtime_ns = meta
        .mtime()
        .saturating_mul(1_000_000_000)
        .saturating_add(meta.mtime_nsec());
    Ok((meta.size(), mtime_ns))
}

#[cfg(test)]
mod tests {
    use std::fs::File;

    use super::super::{Recorder, ServiceId};
    use super::*;

    #[test]
    fn changed_files_reports_size_mtime_and_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["same", "grown", "touched", "gone"] {
            std::fs::write(dir.path().join(name), b"0123").unwrap();
        }
        let mut rec = Recorder::new(ServiceId::from_spec("m"), "m".into());
        for name in ["same", "grown", "touched", "gone"] {
            let f = file_from_disk(dir.path(), name).unwrap();
            rec.file(f.path, f.size, f.mtime_ns);
        }
        let t = rec.finish();
        assert!(changed_files(&t, dir.path()).is_empty());
        std::fs::write(dir.path().join("grown"), b"012345").unwrap();
        let touched = File::options()
            .write(true)
            .open(dir.path().join("touched"))
            .unwrap();
        let earlier = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        touched.set_modified(earlier).unwrap();
        std::fs::remove_file(dir.path().join("gone")).unwrap();
        let changed = changed_files(&t, dir.path());
        let kinds: Vec<(&str, &FileChange)> = changed
            .iter()
            .map(|c| (c.path.as_str(), &c.change))
            .collect();
        assert_eq!(kinds.len(), 3, "{changed:?}");
        assert_eq!(
            kinds[0].1,
            &FileChange::Size {
                recorded: 4,
                now: 6
            }
        );
        assert!(
            matches!(kinds[1].1, FileChange::Mtime { now, .. } if *now == 1_000_000_000_000_000)
        );
        assert!(
            matches!(kinds[2].1, FileChange::Unavailable(_)),
            "{changed:?}"
        );
    }

    #[test]
    fn file_from_disk_of_a_missing_file_names_it_and_the_stat() {
        let dir = tempfile::tempdir().unwrap();
        let err = file_from_disk(dir.path(), "absent.safetensors").unwrap_err();
        assert!(
            matches!(
                &err,
                TemplateError::Io {
                    operation: IoOperation::Stat,
                    source,
                    ..
                } if source.kind() == std::io::ErrorKind::NotFound
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("absent.safetensors"), "{err}");
    }
}
