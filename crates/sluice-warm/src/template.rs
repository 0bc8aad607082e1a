//! MAIO I/O templates on disk: recording them, storing them, and telling whether the
//! model they describe has changed.
//!
//! Two inference services with the same model and the same runtime parameters (tensor
//! parallelism, prefill/decode split, ...) load the same bytes in the same order. So the
//! first load of a service is recorded, and every later one replays the record: on a
//! page-cache miss the `template` policy finds the missed byte in the worker's sequence,
//! prefetches from there to the end of the sequence, and evicts what lies well behind it
//! (seed 000, §4.1, "I/O Template Generation").
//!
//! The template itself ([`Template`], named by a [`ServiceId`]) and its `.sluicetpl` codec
//! are a file format, so they live in `sluice_formats::template` and are re-exported here.
//! This module adds what needs the file system or a running load:
//!
//! - [`Recorder`] (`template/recorder.rs`): takes accesses as they happen and merges each
//!   into its worker's last range when it continues it;
//! - [`TemplateStore`] (`template/store.rs`): a directory of `<hex service id>.sluicetpl`
//!   files, local or on shared storage, with [`read_template`] and [`write_template`] for
//!   single files;
//! - [`changed_files`] (`template/changed_file.rs`): which model files differ in size or
//!   mtime from what the template recorded.
//!
//! Every failure is a [`TemplateError`] naming the template (or model file) and, for
//! decoding failures, carrying the [`TemplateFormatError`] that says which field at which
//! byte was wrong.

mod changed_file;
mod recorder;
mod store;

use std::fmt;
use std::path::{Path, PathBuf};

pub use changed_file::{changed_files, file_from_disk, ChangedFile, FileChange};
pub use recorder::{Recorder, MERGE_GAP_BYTES};
pub use sluice_formats::template::{
    check_relative_path, InvalidTemplate, RelativePathError, ServiceId, ServiceIdError, Template,
    TemplateFile, TemplateFormatError, TemplateRange, UnsafePathReason, WorkerSequence, EXTENSION,
    MAGIC, VERSION,
};
pub use store::{read_template, write_template, TemplateStore, MAX_TEMPLATE_BYTES};

/// What was being done to a file when an I/O error struck.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOperation {
    Open,
    Stat,
    Read,
    CreateDir,
    Create,
    Replace,
}

impl fmt::Display for IoOperation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IoOperation::Open => "open",
            IoOperation::Stat => "stat",
            IoOperation::Read => "read",
            IoOperation::CreateDir => "create the directory",
            IoOperation::Create => "create a file in the template directory:",
            IoOperation::Replace => "atomically replace",
        })
    }
}

/// Errors of templates on disk. Each names the file.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// Reading or writing a template, or stat'ing a model file, failed.
    #[error("cannot {operation} {path}: {source}")]
    Io {
        path: PathBuf,
        operation: IoOperation,
        #[source]
        source: std::io::Error,
    },
    /// The file is not a template, or is truncated, corrupt, hostile or of another version.
    #[error("template {path}: {source}")]
    Format {
        path: PathBuf,
        #[source]
        source: TemplateFormatError,
    },
    /// The file is larger than any template: refused before it is read.
    #[error("template {path}: {len} bytes, more than the {max_bytes}-byte limit")]
    TooLarge {
        path: PathBuf,
        len: u64,
        max_bytes: u64,
    },
    /// A store's file holds another service's template.
    #[error("template {path}: holds the template of service {found}, not {expected} (renamed or copied?)")]
    WrongService {
        path: PathBuf,
        expected: ServiceId,
        found: ServiceId,
    },
    /// A template that readers would reject was not written.
    #[error("template {path}: not written, readers would reject it: {source}")]
    Invalid {
        path: PathBuf,
        #[source]
        source: InvalidTemplate,
    },
    /// A model file that a template cannot name.
    #[error(transparent)]
    ModelPath(#[from] RelativePathError),
    /// A model file changed size since its template was recorded: replaying
    /// would prefetch the wrong bytes.
    #[error("{path}: {now_bytes} bytes now, {recorded_bytes} when the template was recorded; record the service again")]
    ModelFileResized {
        path: PathBuf,
        recorded_bytes: u64,
        now_bytes: u64,
    },
    /// A file the template names is not in the model directory.
    #[error("{path}: in the template but not in the model directory; record the service again")]
    ModelFileMissing { path: PathBuf },
}

impl TemplateError {
    pub(crate) fn io(
        path: &Path,
        operation: IoOperation,
    ) -> impl FnOnce(std::io::Error) -> TemplateError {
        let path = path.to_path_buf();
        move |source| TemplateError::Io {
            path,
            operation,
            source,
        }
    }
}

/// `file` as a template path: relative to `model_dir`, `/`-separated (see
/// [`sluice_formats::template::relative_path`]). Fails when `file` lies outside
/// `model_dir` or is not UTF-8.
pub fn relative_path(model_dir: &Path, file: &Path) -> Result<String, TemplateError> {
    Ok(sluice_formats::template::relative_path(model_dir, file)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_name_the_operation_and_the_file() {
        let source = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let err = TemplateError::io(Path::new("/t/x.sluicetpl"), IoOperation::Open)(source);
        let text = err.to_string();
        assert!(text.starts_with("cannot open /t/x.sluicetpl: "), "{text}");
    }
}
