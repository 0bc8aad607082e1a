//! [`atomic_write`]: replace a file so that readers, and a crash at any
//! moment, see either the old contents or the new, never a torn file.
//!
//! The steps, each of which may fail:
//! 1. create a temporary file next to the target (same directory, so the
//!    rename stays on one file system), named `.<name>.tmp.<pid>.<n>`;
//! 2. write every byte to it;
//! 3. `fsync` it, so its data is on disk before its name is;
//! 4. `rename` it over the target (atomic on POSIX file systems);
//! 5. `fsync` the directory, so the rename itself survives a crash.
//!
//! A failure at steps 1-4 removes the temporary file and leaves the target
//! as it was; a failure at step 5 is reported although the new contents are
//! in place (they may not survive a power cut), except where the file
//! system has no directory fsync at all (`EINVAL`, `EOPNOTSUPP`: NFS, some
//! FUSE file systems), which is logged and taken as done. Every step goes through
//! [`AtomicSteps`], so tests inject a failure at each one. The contents are
//! streamed by a fill function ([`atomic_write_with`]), so a large file is
//! never held in memory twice.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::os_error::OsError;

/// The file-system operations of an atomic write; [`RealSteps`] performs
/// them, tests fail them one at a time.
pub trait AtomicSteps {
    /// Creates `path`, which must not exist.
    fn create(&mut self, path: &Path) -> std::io::Result<File>;
    /// Writes the new contents to `file` through `fill`.
    fn write(&mut self, file: &mut File, fill: &mut Fill<'_>) -> std::io::Result<()>;
    /// Flushes `file`'s data and size to disk.
    fn sync_file(&mut self, file: &File) -> std::io::Result<()>;
    /// Renames `from` over `to`.
    fn rename(&mut self, from: &Path, to: &Path) -> std::io::Result<()>;
    /// Flushes directory `dir`'s entries to disk.
    fn sync_dir(&mut self, dir: &Path) -> std::io::Result<()>;
}

/// What writes the new contents: called once, with a buffered writer.
pub type Fill<'a> = dyn FnMut(&mut dyn Write) -> std::io::Result<()> + 'a;

/// The steps as the operating system performs them.
pub struct RealSteps;

impl AtomicSteps for RealSteps {
    fn create(&mut self, path: &Path) -> std::io::Result<File> {
        File::options().write(true).create_new(true).open(path)
    }

    fn write(&mut self, file: &mut File, fill: &mut Fill<'_>) -> std::io::Result<()> {
        let mut out = BufWriter::new(file);
        fill(&mut out)?;
        out.flush()
    }

    fn sync_file(&mut self, file: &File) -> std::io::Result<()> {
        file.sync_all()
    }

    fn rename(&mut self, from: &Path, to: &Path) -> std::io::Result<()> {
        std::fs::rename(from, to)
    }

    fn sync_dir(&mut self, dir: &Path) -> std::io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

/// Replaces `path` with `bytes` atomically and durably (see the module
/// notes). Errors name the file the failing step acted on.
pub fn atomic_write(path: &Path, bytes: &[u8]) -> Result<(), OsError> {
    atomic_write_with(path, |out| out.write_all(bytes))
}

/// [`atomic_write`] of contents streamed by `fill` (a large trace need not
/// be held in memory first). An error from `fill` aborts the write and
/// leaves the old file.
pub fn atomic_write_with(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<(), OsError> {
    atomic_write_steps(&mut RealSteps, path, fill)
}

/// [`atomic_write_with`] through `steps`.
pub fn atomic_write_steps(
    steps: &mut dyn AtomicSteps,
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<(), OsError> {
    let (dir, tmp) = temporary_path(path)?;
    let mut file = steps.create(&tmp).map_err(OsError::io(&tmp))?;
    let mut once = Some(fill);
    let mut fill = |out: &mut dyn Write| match once.take() {
        Some(fill) => fill(out),
        None => Err(std::io::Error::other("atomic write: contents filled twice")),
    };
    let written = steps
        .write(&mut file, &mut fill)
        .and_then(|()| steps.sync_file(&file));
    drop(file);
    if let Err(err) = written.and_then(|()| steps.rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(OsError::io(&tmp)(err));
    }
    match steps.sync_dir(&dir) {
        // NFS and some FUSE file systems refuse fsync on a directory; the
        // rename is atomic there all the same.
        Err(err) if matches!(err.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {
            tracing::debug!("{}: directory fsync unsupported: {err}", dir.display());
            Ok(())
        }
        outcome => outcome.map_err(OsError::io(&dir)),
    }
}

/// The target's directory and a temporary name in it unique to this
/// process and call.
fn temporary_path(path: &Path) -> Result<(PathBuf, PathBuf), OsError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let Some(name) = path.file_name() else {
        return Err(OsError::InvalidArgument {
            what: "atomic write: path".into(),
            value: path.display().to_string(),
            expected: "must name a file",
        });
    };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let tmp = format!(".{}.tmp.{}.{n}", name.to_string_lossy(), std::process::id());
    Ok((dir.clone(), dir.join(tmp)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real steps, except that step `fail_at` (1-5) fails.
    struct FailAt {
        fail_at: u32,
        step: u32,
    }

    impl FailAt {
        fn next(&mut self) -> std::io::Result<()> {
            self.step += 1;
            match self.step == self.fail_at {
                true => Err(std::io::Error::other(format!(
                    "injected at step {}",
                    self.step
                ))),
                false => Ok(()),
            }
        }
    }

    impl AtomicSteps for FailAt {
        fn create(&mut self, path: &Path) -> std::io::Result<File> {
            self.next()?;
            RealSteps.create(path)
        }

        fn write(&mut self, file: &mut File, fill: &mut Fill<'_>) -> std::io::Result<()> {
            // Half the contents reach the file first, as a torn write would
            // leave them.
            let mut contents = Vec::new();
            fill(&mut contents)?;
            file.write_all(&contents[..contents.len() / 2])?;
            self.next()?;
            file.write_all(&contents[contents.len() / 2..])
        }

        fn sync_file(&mut self, file: &File) -> std::io::Result<()> {
            self.next()?;
            RealSteps.sync_file(file)
        }

        fn rename(&mut self, from: &Path, to: &Path) -> std::io::Result<()> {
            self.next()?;
            RealSteps.rename(from, to)
        }

        fn sync_dir(&mut self, dir: &Path) -> std::io::Result<()> {
            self.next()?;
            RealSteps.sync_dir(dir)
        }
    }

    #[test]
    fn a_failure_at_any_step_leaves_the_old_file_or_the_new_never_a_torn_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let (old, new) = (vec![b'o'; 10_000], vec![b'n'; 20_000]);
        for fail_at in 1..=5 {
            std::fs::write(&path, &old).unwrap();
            let mut steps = FailAt { fail_at, step: 0 };
            let err = atomic_write_steps(&mut steps, &path, |out| out.write_all(&new)).unwrap_err();
            assert!(
                err.to_string().contains("injected"),
                "step {fail_at}: {err}"
            );
            let now = std::fs::read(&path).unwrap();
            // Steps 1-4 leave the old file; a failed directory sync comes
            // after the rename, so the new one is in place.
            let expected = if fail_at == 5 { &new } else { &old };
            assert_eq!(&now, expected, "step {fail_at}");
            let names: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(names, ["state.json"], "no temporary left at step {fail_at}");
        }
    }

    /// Real steps, with a directory fsync that fails with `errno`.
    struct DirSyncFails(i32);

    impl AtomicSteps for DirSyncFails {
        fn create(&mut self, path: &Path) -> std::io::Result<File> {
            RealSteps.create(path)
        }

        fn write(&mut self, file: &mut File, fill: &mut Fill<'_>) -> std::io::Result<()> {
            RealSteps.write(file, fill)
        }

        fn sync_file(&mut self, file: &File) -> std::io::Result<()> {
            RealSteps.sync_file(file)
        }

        fn rename(&mut self, from: &Path, to: &Path) -> std::io::Result<()> {
            RealSteps.rename(from, to)
        }

        fn sync_dir(&mut self, _dir: &Path) -> std::io::Result<()> {
            Err(std::io::Error::from_raw_os_error(self.0))
        }
    }

    #[test]
    fn a_file_system_without_directory_fsync_is_not_an_error_but_eio_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.bin");
        for unsupported in [libc::EINVAL, libc::EOPNOTSUPP] {
            atomic_write_steps(&mut DirSyncFails(unsupported), &path, |o| o.write_all(b"x"))
                .unwrap();
        }
        let err = atomic_write_steps(&mut DirSyncFails(libc::EIO), &path, |o| o.write_all(b"y"))
            .unwrap_err();
        assert!(
            matches!(&err, OsError::Io { path, .. } if path == dir.path()),
            "{err}"
        );
    }

    #[test]
    fn a_new_file_is_created_and_an_existing_one_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.bin");
        atomic_write(&path, b"first").unwrap();
        atomic_write(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
    }

    #[test]
    fn a_failing_fill_leaves_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trace.bin");
        std::fs::write(&path, b"old").unwrap();
        let err = atomic_write_with(&path, |out| {
            out.write_all(b"half of the new")?;
            Err(std::io::Error::other("the trace source failed"))
        })
        .unwrap_err();
        assert!(err.to_string().contains("the trace source failed"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn bad_targets_are_errors_naming_them() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no/such/dir/f");
        let err = atomic_write(&missing, b"x").unwrap_err();
        assert!(err.to_string().contains("no/such/dir"), "{err}");
        assert!(matches!(
            atomic_write(Path::new("/"), b"x"),
            Err(OsError::InvalidArgument { .. })
        ));
        // A directory in the way: the rename fails, the directory stays.
        let blocker = dir.path().join("d");
        std::fs::create_dir(&blocker).unwrap();
        std::fs::write(blocker.join("inside"), b"keep").unwrap();
        assert!(atomic_write(&blocker, b"x").is_err());
        assert_eq!(std::fs::read(blocker.join("inside")).unwrap(), b"keep");
    }
}
