//! [`open_regular`]: open a file for reading only if it is a regular file.
//!
//! `open(2)` of a FIFO for reading blocks until a writer appears, and
//! reading a character device or a socket never ends. A checkpoint, trace
//! or template path that names one (a typo, a hostile directory, a FIFO
//! left in a template store) would hang the caller, and a blocked `open`
//! does not even see SIGINT handlers run. So every file Sluice reads is
//! opened with `O_NONBLOCK` (which makes opening a FIFO return at once),
//! checked with `fstat`, and refused unless it is a regular file; then
//! `O_NONBLOCK` is cleared (it means nothing for regular files, but the
//! descriptor should not carry it).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Opens `path` for reading with extra `flags` (`O_DIRECT`, or 0), refusing
/// anything but a regular file with an `InvalidInput` error that says what
/// the path is (a FIFO, a directory, a device, a socket). The error does
/// not name the path: callers add it, as for every other open error.
pub fn open_regular(path: &Path, flags: i32) -> io::Result<File> {
    open_checked(path, flags, false)
}

/// [`open_regular`] for reading and writing an existing file (a store's own data files,
/// which a hostile directory could also replace by a FIFO).
pub fn open_regular_rw(path: &Path, flags: i32) -> io::Result<File> {
    open_checked(path, flags, true)
}

fn open_checked(path: &Path, flags: i32, write: bool) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(flags | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|err| match err.raw_os_error() {
            // open(2) of a Unix socket fails with ENXIO ("No such device or address"), and
            // of a directory for writing with EISDIR: say what the path is, as for the
            // other kinds.
            Some(libc::ENXIO | libc::EISDIR) => match std::fs::metadata(path) {
                Ok(meta) => not_regular(meta.file_type()),
                Err(_) => err,
            },
            Some(libc::ELOOP) => wrong_kind_named("a regular file", LINK_LOOP),
            _ => err,
        })?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        return Err(not_regular(kind));
    }
    clear_nonblocking(&file);
    Ok(file)
}

/// Clears `O_NONBLOCK` on `file`, opened with it only so that opening a FIFO returns at
/// once: the descriptor itself should not carry it (a terminal would see `EAGAIN`).
pub fn clear_nonblocking(file: &File) {
    // SAFETY: F_GETFL/F_SETFL on a descriptor the caller holds open.
    unsafe {
        let fl = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(file.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
    }
}

/// The refusal of a path of type `kind`, saying what it is.
fn not_regular(kind: std::fs::FileType) -> io::Error {
    wrong_kind("a regular file", kind)
}

/// What a path that is a symbolic link looping back on itself is called in messages.
const LINK_LOOP: &str = "a symbolic link that loops";

/// The refusal of a path of type `kind` where `want` belongs ("a directory", "a socket"),
/// saying what it is: bad input, which [`is_not_regular`] recognises, as for a FIFO where
/// a regular file belongs.
pub fn wrong_kind(want: &'static str, kind: std::fs::FileType) -> io::Error {
    wrong_kind_named(want, kind_name(kind))
}

/// [`wrong_kind`] of a path whose `metadata` failed with `err`: a symbolic link that loops
/// is named as such; any other error is `None`.
pub fn wrong_kind_of_error(want: &'static str, err: &io::Error) -> Option<io::Error> {
    (err.raw_os_error() == Some(libc::ELOOP)).then(|| wrong_kind_named(want, LINK_LOOP))
}

fn wrong_kind_named(want: &'static str, what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, NotRegular { want, what })
}

/// What a path of type `kind` is, for messages: "a FIFO", "a directory", "a device", "a
/// socket", "a regular file" or "something else".
pub fn kind_name(kind: std::fs::FileType) -> &'static str {
    if kind.is_file() {
        "a regular file"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "something else"
    }
}

/// [`open_regular`]'s refusal (or [`wrong_kind`]'s), carried inside the `io::Error` so
/// callers can tell it from a failed read whatever wraps it.
#[derive(Debug, thiserror::Error)]
#[error("not {want} but {what}")]
struct NotRegular {
    want: &'static str,
    what: &'static str,
}

/// Whether `err` is [`open_regular`]'s refusal of a path that is not a regular file (or
/// [`wrong_kind`]'s, of a path that is not what it must be): bad input, not a failed
/// read.
pub fn is_not_regular(err: &io::Error) -> bool {
    err.get_ref().is_some_and(|inner| inner.is::<NotRegular>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_a_directory_and_a_device_are_refused_at_once_and_files_open() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        sluice_testkit::mkfifo(&fifo);
        // No writer: a plain open would block here forever.
        let err = open_regular(&fifo, 0).unwrap_err();
        assert!(
            is_not_regular(&err) && err.to_string().contains("FIFO"),
            "{err}"
        );
        let err = open_regular(dir.path(), 0).unwrap_err();
        assert!(err.to_string().contains("directory"), "{err}");
        let err = open_regular(Path::new("/dev/zero"), 0).unwrap_err();
        assert!(err.to_string().contains("device"), "{err}");
        let file = dir.path().join("f");
        std::fs::write(&file, b"bytes").unwrap();
        let f = open_regular(&file, 0).unwrap();
        // SAFETY: F_GETFL on a live descriptor.
        let fl = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) };
        assert_eq!(fl & libc::O_NONBLOCK, 0, "O_NONBLOCK cleared");
        let missing = open_regular(&dir.path().join("missing"), 0).unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
        assert!(!is_not_regular(&missing));
    }

    #[test]
    fn a_directory_opened_for_writing_or_a_link_loop_is_named_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let err = open_regular_rw(dir.path(), 0).unwrap_err();
        assert!(is_not_regular(&err), "{err}");
        assert_eq!(err.to_string(), "not a regular file but a directory");
        let a = dir.path().join("a");
        std::os::unix::fs::symlink(dir.path().join("b"), &a).unwrap();
        std::os::unix::fs::symlink(&a, dir.path().join("b")).unwrap();
        let err = open_regular_rw(&a, 0).unwrap_err();
        assert!(is_not_regular(&err), "{err}");
        assert!(
            err.to_string().contains("symbolic link that loops"),
            "{err}"
        );
    }

    #[test]
    fn a_socket_is_refused_as_not_a_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sock");
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        // open(2) itself fails here (ENXIO), before any fstat.
        let err = open_regular(&path, 0).unwrap_err();
        assert!(
            is_not_regular(&err) && err.to_string().contains("socket"),
            "{err}"
        );
    }
}
