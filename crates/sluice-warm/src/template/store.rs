//! Templates as files: one file read or written whole, and a directory of them.
//!
//! [`read_template`] refuses a file over [`MAX_TEMPLATE_BYTES`] before reading it, then
//! decodes it with [`Template::decode`], which trusts nothing. [`write_template`] refuses
//! a template readers would reject, then writes it atomically: a temporary sibling is
//! filled, synced and renamed over the destination, so readers on shared storage see the
//! old template or the new one, never a part.
//!
//! A [`TemplateStore`] is a directory of `<hex service id>.sluicetpl` files, one per
//! service, local or shared. Loading checks that the file holds the service asked for, so
//! a renamed or copied file is not replayed for the wrong service.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::{IoOperation, ServiceId, Template, TemplateError, EXTENSION};

/// Largest template file [`read_template`] accepts: 256 MiB. At the 1 KiB per GiB the
/// format reaches for sequential loaders this covers any model; a bigger file is a mistake
/// or an attack, not a template.
pub const MAX_TEMPLATE_BYTES: u64 = 256 << 20;

/// Reads and decodes the template at `path`.
pub fn read_template(path: &Path) -> Result<Template, TemplateError> {
    let file =
        sluice_engine::open_regular(path, 0).map_err(TemplateError::io(path, IoOperation::Open))?;
    let too_big = |len: u64| TemplateError::TooLarge {
        path: path.to_path_buf(),
        len,
        max_bytes: MAX_TEMPLATE_BYTES,
    };
    let len = file
        .metadata()
        .map_err(TemplateError::io(path, IoOperation::Stat))?
        .len();
    if len > MAX_TEMPLATE_BYTES {
        return Err(too_big(len));
    }
    // The file may grow between the stat and the read: read one byte past the limit, no
    // more, to notice.
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(MAX_TEMPLATE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(TemplateError::io(path, IoOperation::Read))?;
    if bytes.len() as u64 > MAX_TEMPLATE_BYTES {
        return Err(too_big(bytes.len() as u64));
    }
    Template::decode(&bytes).map_err(|source| TemplateError::Format {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes `template` to `path` atomically (see the module documentation). Refuses a
/// template that [`Template::decode`] would reject.
pub fn write_template(template: &Template, path: &Path) -> Result<(), TemplateError> {
    template
        .validate()
        .map_err(|source| TemplateError::Invalid {
            path: path.to_path_buf(),
            source,
        })?;
    write_atomically(path, &template.encode())
}

/// Replaces `path` with `bytes` through the engine's atomic write (whole
/// or not at all, synced); errors name the template.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), TemplateError> {
    sluice_engine::atomic_write(path, bytes).map_err(|err| TemplateError::Io {
        path: path.to_path_buf(),
        operation: IoOperation::Replace,
        source: match err {
            sluice_engine::OsError::Io { source, .. } => source,
            other => std::io::Error::other(other.to_string()),
        },
    })
}

/// A directory of templates, one file per service named `<hex service id>.sluicetpl`. May
/// be on shared storage: writes are atomic renames, and reads check the id inside the file.
#[derive(Debug, Clone)]
pub struct TemplateStore {
    dir: PathBuf,
}

impl TemplateStore {
    /// A store in `dir` (created on the first save).
    pub fn new(dir: impl Into<PathBuf>) -> TemplateStore {
        TemplateStore { dir: dir.into() }
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the template of `service` lives.
    pub fn path_for(&self, service: &ServiceId) -> PathBuf {
        self.dir.join(format!("{}.{EXTENSION}", service.to_hex()))
    }

    /// The template of `service`; `None` when there is none yet (the caller records one).
    /// A file holding another service's template is an error.
    pub fn load(&self, service: &ServiceId) -> Result<Option<Template>, TemplateError> {
        let path = self.path_for(service);
        let template = match read_template(&path) {
            Ok(template) => template,
            Err(TemplateError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        if template.service != *service {
            return Err(TemplateError::WrongService {
                path,
                expected: *service,
                found: template.service,
            });
        }
        Ok(Some(template))
    }

    /// Whether a template could be saved here: the directory exists (or is created) and a
    /// file can be created in it. A recording checks before the service starts, so that a
    /// path that is a file, or a directory it may not write, fails at once, not after the
    /// whole run.
    pub fn check_writable(&self) -> Result<(), TemplateError> {
        let create = TemplateError::io(&self.dir, IoOperation::CreateDir);
        if std::fs::symlink_metadata(&self.dir).is_ok_and(|m| !m.is_dir())
            && !std::fs::metadata(&self.dir).is_ok_and(|m| m.is_dir())
        {
            let not_dir = std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a directory");
            return Err(create(not_dir));
        }
        std::fs::create_dir_all(&self.dir).map_err(create)?;
        let probe = self.dir.join(format!(".probe-{}", std::process::id()));
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&probe)
            .map_err(TemplateError::io(&probe, IoOperation::Create))?;
        let _ = std::fs::remove_file(&probe);
        Ok(())
    }

    /// Saves `template` under its service id, creating the directory if needed; returns
    /// the file's path.
    pub fn save(&self, template: &Template) -> Result<PathBuf, TemplateError> {
        std::fs::create_dir_all(&self.dir)
            .map_err(TemplateError::io(&self.dir, IoOperation::CreateDir))?;
        let path = self.path_for(&template.service);
        write_template(template, &path)?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{TemplateFile, TemplateFormatError, TemplateRange, WorkerSequence};
    use super::*;

    const NAME: &str = "t.sluicetpl";

    #[test]
    fn a_fifo_in_place_of_a_template_is_refused_at_once_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(NAME);
        sluice_testkit::mkfifo(&path);
        // With no writer, a plain open would block here for good.
        match read_template(&path) {
            Err(TemplateError::Io {
                path: p, source, ..
            }) => {
                assert_eq!(p, path);
                assert!(sluice_engine::is_not_regular(&source), "{source}");
            }
            other => panic!("expected the FIFO refused, got {other:?}"),
        }
    }

    fn sample() -> Template {
        let file = |path: &str, size| TemplateFile {
            path: path.into(),
            size,
            mtime_ns: 1_700_000_000_123_456_789,
        };
        let range = |file, offset, len| TemplateRange { file, offset, len };
        Template {
            service: ServiceId::from_spec("llama-3-8b tp=2"),
            spec: "llama-3-8b tp=2".into(),
            files: vec![
                file("model-00001-of-00002.safetensors", 10 << 30),
                file("sub/model-00002-of-00002.safetensors", 5000),
            ],
            workers: vec![
                WorkerSequence {
                    worker: 0,
                    ranges: vec![range(0, 0, 4096), range(1, 100, 900)],
                },
                WorkerSequence {
                    worker: 3,
                    ranges: vec![range(1, 4000, 1000)],
                },
            ],
        }
    }

    #[test]
    fn write_then_read_returns_the_same_template_and_leaves_no_temporaries() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(NAME);
        let mut t = sample();
        write_template(&t, &path).unwrap();
        assert_eq!(read_template(&path).unwrap(), t);
        t.spec = "replaced".into();
        write_template(&t, &path).unwrap();
        assert_eq!(read_template(&path).unwrap(), t);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn write_refuses_a_template_that_readers_would_reject() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(NAME);
        let mut t = sample();
        t.files[1].path = "/etc/passwd".into();
        let err = write_template(&t, &path).unwrap_err();
        assert!(matches!(err, TemplateError::Invalid { .. }), "{err:?}");
        let err = err.to_string();
        assert!(err.contains("absolute") && err.contains(NAME), "{err}");
        assert!(!path.exists());
    }

    #[test]
    fn read_refuses_files_over_the_size_limit_without_reading_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(NAME);
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(MAX_TEMPLATE_BYTES + 1).unwrap(); // sparse
        let err = read_template(&path).unwrap_err().to_string();
        assert!(err.contains("limit") && err.contains(NAME), "{err}");
    }

    #[test]
    fn read_of_a_missing_file_is_an_io_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(NAME);
        let err = read_template(&path).unwrap_err();
        assert!(
            matches!(
                err,
                TemplateError::Io {
                    operation: IoOperation::Open,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains(NAME));
    }

    #[test]
    fn read_of_a_corrupt_file_names_it_and_keeps_the_format_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(NAME);
        std::fs::write(&path, b"SLTPL\0garbage").unwrap();
        let err = read_template(&path).unwrap_err();
        match &err {
            TemplateError::Format { path: at, source } => {
                assert_eq!(at, &path);
                assert!(matches!(
                    source,
                    TemplateFormatError::UnsupportedVersion { .. }
                ));
            }
            other => panic!("expected a format error, got {other:?}"),
        }
        let text = err.to_string(); // as WarmError shows it too (transparent)
        assert!(
            text.starts_with("template ") && text.contains(NAME),
            "{text}"
        );
    }

    #[test]
    fn store_load_of_a_missing_service_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let id = ServiceId::from_spec("nothing recorded");
        assert!(TemplateStore::new(dir.path()).load(&id).unwrap().is_none());
        let absent_dir = TemplateStore::new(dir.path().join("not-yet"));
        assert!(absent_dir.load(&id).unwrap().is_none());
    }

    #[test]
    fn store_saves_under_the_hex_id_and_loads_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = TemplateStore::new(dir.path().join("templates"));
        let t = sample();
        let path = store.save(&t).unwrap();
        let name = format!("{}.sluicetpl", t.service.to_hex());
        assert_eq!(path, dir.path().join("templates").join(&name));
        assert_eq!(store.path_for(&t.service), path);
        assert_eq!(store.load(&t.service).unwrap(), Some(t));
    }

    #[test]
    fn store_rejects_a_file_holding_another_service() {
        let dir = tempfile::tempdir().unwrap();
        let store = TemplateStore::new(dir.path());
        let t = sample();
        let saved = store.save(&t).unwrap();
        let other = ServiceId::from_spec("other");
        std::fs::rename(saved, store.path_for(&other)).unwrap();
        let err = store.load(&other).unwrap_err().to_string();
        assert!(err.contains("holds the template of service"), "{err}");
        assert!(err.contains(&other.to_hex()), "{err}");
    }
}
