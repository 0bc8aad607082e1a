//! How model files are named inside a template.
//!
//! A template names each model file by its path relative to the model directory,
//! `/`-separated, so the same template replays against a copy of the model elsewhere.
//! [`relative_path`] turns a file's path into that name when recording; [`check_relative_path`]
//! decides which names a template may hold at all. A template can come from shared storage,
//! and a replay joins its names onto the model directory, so a name that is absolute, holds
//! a `..` or a NUL could make a replay touch a file outside the model: those are refused.
//! Empty and `.` components are refused too, so every file has exactly one name and a
//! template's file table has no aliases.
//!
//! Both are string checks: nothing here looks at the file system.

use std::fmt;
use std::path::{Component, Path, PathBuf};

/// Why a path from a template cannot be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnsafePathReason {
    /// The path is the empty string.
    Empty,
    /// The path starts with `/`.
    Absolute,
    /// The path contains a NUL byte, which no file system path can hold.
    ContainsNul,
    /// A component is empty (a doubled or trailing `/`).
    EmptyComponent,
    /// A component is `.`.
    CurrentDir,
    /// A component is `..`, which would leave the model directory.
    ParentDir,
}

impl fmt::Display for UnsafePathReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UnsafePathReason::Empty => "empty path",
            UnsafePathReason::Absolute => {
                "absolute path; template paths are relative to the model directory"
            }
            UnsafePathReason::ContainsNul => "contains a NUL byte",
            UnsafePathReason::EmptyComponent => "has an empty component (doubled or trailing '/')",
            UnsafePathReason::CurrentDir => "has a '.' component",
            UnsafePathReason::ParentDir => {
                "has a '..' component, which would leave the model directory"
            }
        })
    }
}

/// Why a file cannot be named in a template.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelativePathError {
    #[error("{}: not a file inside the model directory {}", .file.display(), .model_dir.display())]
    OutsideModelDir { file: PathBuf, model_dir: PathBuf },
    #[error("{}: path is not UTF-8", .file.display())]
    NotUtf8 { file: PathBuf },
}

/// Why `path` could not be trusted as a template path, if it cannot.
pub fn check_relative_path(path: &str) -> Result<(), UnsafePathReason> {
    if path.is_empty() {
        return Err(UnsafePathReason::Empty);
    }
    if path.starts_with('/') {
        return Err(UnsafePathReason::Absolute);
    }
    if path.contains('\0') {
        return Err(UnsafePathReason::ContainsNul);
    }
    for part in path.split('/') {
        match part {
            "" => return Err(UnsafePathReason::EmptyComponent),
            "." => return Err(UnsafePathReason::CurrentDir),
            ".." => return Err(UnsafePathReason::ParentDir),
            _ => {}
        }
    }
    Ok(())
}

/// `file` as a template path: relative to `model_dir`, `/`-separated, with `.` components
/// dropped. Fails when `file` lies outside `model_dir`, is `model_dir` itself, or is not
/// UTF-8. Purely lexical: symbolic links are not followed, so callers pass canonical paths.
pub fn relative_path(model_dir: &Path, file: &Path) -> Result<String, RelativePathError> {
    let outside = || RelativePathError::OutsideModelDir {
        file: file.to_path_buf(),
        model_dir: model_dir.to_path_buf(),
    };
    let rest = file.strip_prefix(model_dir).map_err(|_| outside())?;
    let mut parts = Vec::new();
    for component in rest.components() {
        match component {
            Component::Normal(part) => {
                parts.push(part.to_str().ok_or_else(|| RelativePathError::NotUtf8 {
                    file: file.to_path_buf(),
                })?)
            }
            Component::CurDir => {}
            _ => return Err(outside()),
        }
    }
    if parts.is_empty() {
        return Err(outside());
    }
    Ok(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_path_strips_the_model_directory_and_refuses_outside() {
        let dir = Path::new("/models/llama");
        let inside = Path::new("/models/llama/sub/./m.safetensors");
        assert_eq!(relative_path(dir, inside).unwrap(), "sub/m.safetensors");
        for outside in ["/models/other/m", "/models/llama", "/models/llama/../x"] {
            let err = relative_path(dir, Path::new(outside)).unwrap_err();
            assert!(
                err.to_string().contains("not a file inside"),
                "{outside}: {err}"
            );
        }
    }

    #[cfg(unix)]
    #[test]
    fn relative_path_refuses_names_that_are_not_utf8() {
        use std::ffi::OsStr;
        use std::os::unix::ffi::OsStrExt;

        let dir = Path::new("/models/llama");
        let file = dir.join(OsStr::from_bytes(b"m\xff.safetensors"));
        assert_eq!(
            relative_path(dir, &file),
            Err(RelativePathError::NotUtf8 { file })
        );
    }

    #[test]
    fn check_relative_path_names_each_kind_of_unsafe_path() {
        for (path, reason) in [
            ("", UnsafePathReason::Empty),
            ("/etc/passwd", UnsafePathReason::Absolute),
            ("a\0b", UnsafePathReason::ContainsNul),
            ("a//b", UnsafePathReason::EmptyComponent),
            ("a/", UnsafePathReason::EmptyComponent),
            ("./a", UnsafePathReason::CurrentDir),
            ("../secret", UnsafePathReason::ParentDir),
            ("a/../../b", UnsafePathReason::ParentDir),
        ] {
            assert_eq!(check_relative_path(path), Err(reason), "{path:?}");
        }
        for path in ["a", "sub/model-00001.safetensors", "a..b/.c/d."] {
            assert_eq!(check_relative_path(path), Ok(()), "{path:?}");
        }
    }

    #[test]
    fn every_relative_path_passes_the_template_check() {
        let dir = Path::new("/m");
        for file in ["/m/a", "/m/./b/c", "/m/x/./y/z.bin"] {
            let name = relative_path(dir, Path::new(file)).unwrap();
            assert_eq!(check_relative_path(&name), Ok(()), "{file} -> {name}");
        }
    }
}
