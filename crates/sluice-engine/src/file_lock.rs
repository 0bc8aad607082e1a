//! [`FileLock`]: an advisory `flock` on a file, the one way Sluice's stores lock.
//!
//! A store directory (a checkpoint store, a KV store, a mount's disk cache) is locked
//! through a file inside it. `flock` locks belong to the open file description, so two
//! opens in one process exclude each other as two processes do, and the kernel releases
//! a lock when its holder dies however it dies: a lock is never left behind by a crash.
//!
//! Locks are taken without waiting: a store in use is an error the caller reports
//! ([`LockError::Busy`]), with the holder's pid where the holder wrote one
//! ([`FileLock::write_owner`]). A reader may lock a file it can only read (`flock` works
//! on a read-only descriptor), so a store on a read-only mount, or owned by another user,
//! can still be read under its lock. [`FileLock::is_free`] probes whether anyone holds a
//! lock, which tells a process whether a peer that holds one is still alive.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// How a lock is shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    /// Many holders at once (saves and loads of a checkpoint store).
    Shared,
    /// One holder (an open KV store, garbage collection).
    Exclusive,
}

/// How the lock file is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockOpen {
    /// Created if absent, opened for reading and writing.
    Create,
    /// Opened for reading only; it must exist.
    ReadOnly,
}

/// Why a lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Someone else holds it (in this process or another); `owner` is what the holder
    /// wrote into the file (its pid), if anything.
    #[error("{path}: locked by another holder{}", owner_text(.owner))]
    Busy {
        path: PathBuf,
        owner: Option<String>,
    },
    /// The lock file could not be opened or locked.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn owner_text(owner: &Option<String>) -> String {
    owner
        .as_ref()
        .map(|o| format!(" (pid {o})"))
        .unwrap_or_default()
}

impl LockError {
    /// Whether the file system has no `flock` at all (some FUSE and network file systems).
    pub fn is_unsupported(&self) -> bool {
        matches!(self, LockError::Io { source, .. }
            if matches!(source.raw_os_error(), Some(libc::ENOLCK | libc::EOPNOTSUPP | libc::ENOSYS)))
    }
}

/// A held lock; dropping it releases it.
#[derive(Debug)]
pub struct FileLock {
    file: File,
    path: PathBuf,
    mode: LockMode,
}

impl FileLock {
    /// Opens `path` as `open` says and locks it in `mode`, without waiting.
    pub fn acquire(path: &Path, mode: LockMode, open: LockOpen) -> Result<FileLock, LockError> {
        let io = |source| LockError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut opts = OpenOptions::new();
        opts.read(true)
            // A FIFO or device in place of the lock would block the open.
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC);
        if open == LockOpen::Create {
            opts.write(true).create(true).truncate(false);
        }
        let file = opts.open(path).map_err(|e| {
            io(match e.raw_os_error() {
                // What open(2) says of a socket, and of a link that loops: named plainly.
                Some(libc::ENXIO) => {
                    io::Error::new(io::ErrorKind::InvalidInput, "not a regular file (a socket)")
                }
                Some(libc::ELOOP) => io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a symbolic link that loops (too many levels of links)",
                ),
                _ => e,
            })
        })?;
        if !file.metadata().map_err(io)?.is_file() {
            return Err(io(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file",
            )));
        }
        crate::clear_nonblocking(&file);
        let mut lock = FileLock {
            file,
            path: path.to_path_buf(),
            mode,
        };
        if let Err(e) = lock.set(mode) {
            return Err(match e.kind() {
                io::ErrorKind::WouldBlock => LockError::Busy {
                    path: path.to_path_buf(),
                    owner: lock.owner(),
                },
                _ => io(e),
            });
        }
        Ok(lock)
    }

    /// Changes the lock's mode without waiting; `false` if another holder prevents it.
    /// Changing is not atomic (`flock(2)`): on `false` this lock may be gone, so a holder
    /// that tries to upgrade must be ready to lose it.
    pub fn try_change(&mut self, mode: LockMode) -> io::Result<bool> {
        match self.set(mode) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn set(&mut self, mode: LockMode) -> io::Result<()> {
        let how = match mode {
            LockMode::Shared => libc::LOCK_SH,
            LockMode::Exclusive => libc::LOCK_EX,
        };
        // SAFETY: flock on a descriptor this lock owns; LOCK_NB never blocks.
        if unsafe { libc::flock(self.file.as_raw_fd(), how | libc::LOCK_NB) } != 0 {
            return Err(io::Error::last_os_error());
        }
        self.mode = mode;
        Ok(())
    }

    /// Whether no one holds a lock on `path` (it is taken and released at once): a
    /// holder's process is gone. A missing file counts as free.
    pub fn is_free(path: &Path) -> io::Result<bool> {
        match FileLock::acquire(path, LockMode::Exclusive, LockOpen::ReadOnly) {
            Ok(_) => Ok(true),
            Err(LockError::Busy { .. }) => Ok(false),
            Err(LockError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                Ok(true)
            }
            Err(LockError::Io { source, .. }) => Err(source),
        }
    }

    /// Records `owner` (a pid) in the lock file, for [`LockError::Busy`] to name.
    pub fn write_owner(&mut self, owner: &str) -> io::Result<()> {
        self.file.set_len(0)?;
        self.file.rewind()?;
        self.file.write_all(owner.as_bytes())
    }

    /// What the holder wrote into the file, if anything.
    fn owner(&mut self) -> Option<String> {
        let mut s = String::new();
        self.file.rewind().ok()?;
        Read::by_ref(&mut self.file)
            .take(64)
            .read_to_string(&mut s)
            .ok()?;
        let s = s.trim();
        (!s.is_empty()).then(|| s.to_string())
    }

    /// Releases the lock now (`LOCK_UN`) and closes the file. Dropping a lock only closes
    /// this descriptor, and the lock lives on while another descriptor of the same open
    /// file description does: one a `fork` copied into a child. An owner that lets go of a
    /// store calls this, so a child forked while the store was open (and that never used
    /// it) does not keep it locked. A forked child must never call it: it would release
    /// its parent's lock.
    pub fn release(self) -> io::Result<()> {
        // SAFETY: flock on a descriptor this lock owns; LOCK_UN never blocks.
        if unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_UN) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn mode(&self) -> LockMode {
        self.mode
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_locks_coexist_and_exclude_an_exclusive_one() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("lock");
        let a = FileLock::acquire(&p, LockMode::Shared, LockOpen::Create).unwrap();
        let b = FileLock::acquire(&p, LockMode::Shared, LockOpen::ReadOnly).unwrap();
        let e = FileLock::acquire(&p, LockMode::Exclusive, LockOpen::Create).unwrap_err();
        assert!(matches!(e, LockError::Busy { .. }), "{e}");
        assert!(!FileLock::is_free(&p).unwrap());
        drop((a, b));
        assert!(FileLock::is_free(&p).unwrap());
        assert!(FileLock::is_free(&dir.path().join("none")).unwrap());
    }

    #[test]
    fn a_busy_lock_names_the_owner_written_into_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("lock");
        let mut a = FileLock::acquire(&p, LockMode::Exclusive, LockOpen::Create).unwrap();
        a.write_owner("4242").unwrap();
        let e = FileLock::acquire(&p, LockMode::Exclusive, LockOpen::Create).unwrap_err();
        assert!(e.to_string().contains("pid 4242"), "{e}");
    }

    #[test]
    fn release_lets_go_even_while_a_copied_descriptor_lives() {
        // What a fork leaves behind: a second descriptor of the same open file
        // description. Dropping the lock alone leaves it locked through the copy.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("lock");
        let a = FileLock::acquire(&p, LockMode::Exclusive, LockOpen::Create).unwrap();
        let copy = a.file.try_clone().unwrap();
        drop(a);
        assert!(!FileLock::is_free(&p).unwrap(), "the copy keeps it locked");
        drop(copy);
        let a = FileLock::acquire(&p, LockMode::Exclusive, LockOpen::Create).unwrap();
        let copy = a.file.try_clone().unwrap();
        a.release().unwrap();
        assert!(FileLock::is_free(&p).unwrap(), "released despite the copy");
        drop(copy);
    }

    #[test]
    fn a_shared_lock_upgrades_only_when_alone() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("lock");
        let mut a = FileLock::acquire(&p, LockMode::Shared, LockOpen::Create).unwrap();
        let b = FileLock::acquire(&p, LockMode::Shared, LockOpen::Create).unwrap();
        assert!(!a.try_change(LockMode::Exclusive).unwrap());
        drop(b);
        assert!(a.try_change(LockMode::Exclusive).unwrap());
        assert_eq!(a.mode(), LockMode::Exclusive);
    }

    #[test]
    fn a_fifo_in_place_of_the_lock_is_refused_not_waited_on() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("lock");
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo on a path we own.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = FileLock::acquire(&p, LockMode::Shared, LockOpen::Create).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }

    #[test]
    fn a_socket_or_a_link_loop_in_place_of_the_lock_is_named_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let e = FileLock::acquire(&sock, LockMode::Shared, LockOpen::Create).unwrap_err();
        assert!(
            e.to_string().contains("not a regular file (a socket)"),
            "{e}"
        );

        let a = dir.path().join("a");
        std::os::unix::fs::symlink(dir.path().join("b"), &a).unwrap();
        std::os::unix::fs::symlink(&a, dir.path().join("b")).unwrap();
        let e = FileLock::acquire(&a, LockMode::Shared, LockOpen::Create).unwrap_err();
        assert!(e.to_string().contains("symbolic link that loops"), "{e}");
    }
}
