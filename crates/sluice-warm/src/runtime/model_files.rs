//! The files of a model directory, and their two names.
//!
//! A model directory may hold its files directly or, like a Hugging Face
//! snapshot, as symlinks into a blob store. Policies, templates and
//! triggers name a file by its place in the model directory; the kernel
//! (fanotify's descriptor, `/proc/PID/fd`, `/proc/PID/maps`) names the file
//! the link points to. [`ModelNames`] translates between the two.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::WarmError;

/// Every regular file under `dir`, sorted, with its size; hidden entries
/// are skipped. Symlinks to files count (a Hugging Face snapshot links each
/// file to a blob elsewhere in the cache) and keep their name in `dir`;
/// symlinked directories are not followed (no loops).
pub fn model_files(dir: &Path) -> Result<Vec<(PathBuf, u64)>, WarmError> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).map_err(WarmError::io(&d))?;
        for entry in entries {
            let entry = entry.map_err(WarmError::io(&d))?;
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let path = entry.path();
            let kind = entry.file_type().map_err(WarmError::io(&path))?;
            if kind.is_dir() {
                stack.push(path);
                continue;
            }
            // Follows a symlink; a dangling one is skipped, as a vanished file.
            match std::fs::metadata(&path) {
                Ok(meta) if meta.is_file() => out.push((path, meta.len())),
                Ok(_) => {}
                Err(err) if kind.is_symlink() => {
                    tracing::warn!("{}: dangling link skipped: {err}", path.display());
                }
                Err(err) => return Err(WarmError::io(&path)(err)),
            }
        }
    }
    out.sort();
    if out.is_empty() {
        return Err(WarmError::NoModelFiles {
            dir: dir.to_path_buf(),
        });
    }
    Ok(out)
}

/// A model file's two names: where it sits in the model directory (what
/// policies, templates and triggers use) and the file the kernel reports,
/// which differ when the entry is a symlink.
#[derive(Clone, Debug, Default)]
pub struct ModelNames {
    to_model: HashMap<PathBuf, PathBuf>,
    to_real: HashMap<PathBuf, PathBuf>,
}

impl ModelNames {
    /// The names of `files` (as [`model_files`] lists them).
    pub fn new(files: &[(PathBuf, u64)]) -> ModelNames {
        let mut names = ModelNames::default();
        for (path, _) in files {
            match path.canonicalize() {
                Ok(real) if &real != path => {
                    names.to_model.insert(real.clone(), path.clone());
                    names.to_real.insert(path.clone(), real);
                }
                _ => {}
            }
        }
        names
    }

    /// The model-directory name of a file the kernel reported.
    pub fn model(&self, real: PathBuf) -> PathBuf {
        match self.to_model.get(&real) {
            Some(model) => model.clone(),
            None => real,
        }
    }

    /// The name the kernel reports for a model file.
    pub fn real<'a>(&'a self, model: &'a Path) -> &'a Path {
        self.to_real.get(model).map_or(model, PathBuf::as_path)
    }

    /// Model name → kernel name, for the files whose names differ.
    pub fn real_names(&self) -> &HashMap<PathBuf, PathBuf> {
        &self.to_real
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_testkit::{hf_layout, model_dir as model};

    #[test]
    fn model_files_are_sorted_sized_and_skip_hidden_entries() {
        let dir = tempfile::tempdir().unwrap();
        let m = model(dir.path());
        let files = model_files(&m).unwrap();
        let names: Vec<_> = files
            .iter()
            .map(|(p, s)| (p.file_name().unwrap().to_owned(), *s))
            .collect();
        assert_eq!(
            names,
            [
                ("a.safetensors".into(), 8 << 20),
                ("b.safetensors".into(), 4 << 20)
            ]
        );
        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        let err = model_files(&empty).unwrap_err();
        assert!(
            matches!(&err, WarmError::NoModelFiles { dir } if dir == &empty),
            "{err}"
        );
        assert!(err.to_string().contains("no model files"), "{err}");
        let err = model_files(&dir.path().join("missing")).unwrap_err();
        assert!(matches!(err, WarmError::Io { .. }), "{err}");
    }

    #[test]
    fn symlinked_model_files_count_under_their_names_and_dangling_links_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let snap = hf_layout(dir.path());
        std::os::unix::fs::symlink("../../blobs/gone", snap.join("c.safetensors")).unwrap();
        std::os::unix::fs::symlink("../../blobs", snap.join("linked-dir")).unwrap();
        let files = model_files(&snap).unwrap();
        assert_eq!(
            files,
            [
                (snap.join("a.safetensors"), 8 << 20),
                (snap.join("b.safetensors"), 4 << 20)
            ]
        );
        let names = ModelNames::new(&files);
        let real = dir
            .path()
            .canonicalize()
            .unwrap()
            .join("blobs/a.safetensors");
        assert_eq!(names.model(real.clone()), snap.join("a.safetensors"));
        assert_eq!(names.real(&snap.join("a.safetensors")), real);
        let other = PathBuf::from("/elsewhere");
        assert_eq!(names.model(other.clone()), other);
    }
}
