//! The FUSE adapter: translates kernel requests to [`MountFs`] calls and holds no logic of
//! its own. Reads run on a pool of threads, so one slow fetch does not hold up the
//! kernel's other requests (several streams of one mmap'd file arrive at once).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use fuser::{
    FileAttr, FileType, Filesystem, KernelConfig, MountOption, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen, ReplyXattr, Request,
};

use crate::error::MountError;
use crate::fs::{Attr, MountFs, Opened};

/// How long the kernel may cache names and attributes: the listing is fixed for the
/// mount's life.
const TTL: Duration = Duration::from_secs(3600);
/// Threads serving reads.
const READ_THREADS: usize = 16;
/// The kernel's readahead asked for at INIT; raised further through the bdi afterwards.
const MAX_READAHEAD: u32 = 8 << 20;

struct ReadJob {
    ino: u64,
    offset: u64,
    size: u32,
    reply: ReplyData,
}

struct Adapter {
    fs: Arc<MountFs>,
    reads: mpsc::Sender<ReadJob>,
    uid: u32,
    gid: u32,
    /// The kernel agreed to passthrough at INIT, and no backing file has been refused.
    passthrough: bool,
    /// The backing file registered for each passed-through inode: the kernel wants every
    /// open of an inode on the same one. Dropped (unregistered) at the inode's last
    /// passed-through release.
    backing: HashMap<u64, fuser::BackingId>,
    /// Files whose last cached handle closed, for the thread that drops the kernel's
    /// cached copy of those that will pass through from now on.
    closed: mpsc::Sender<u64>,
}

/// A node's attributes: the source's owner and read/execute bits where it has them (a
/// directory source: the kernel then grants through the mount what the source grants),
/// else world-readable and owned by the daemon's user (an object store).
fn attr(a: Attr, uid: u32, gid: u32) -> FileAttr {
    let now = SystemTime::UNIX_EPOCH;
    let (perm, uid, gid) = match a.perm {
        Some(p) => ((p.mode & 0o555) as u16, p.uid, p.gid),
        None => (if a.is_dir { 0o555 } else { 0o444 }, uid, gid),
    };
    FileAttr {
        ino: a.ino,
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        kind: if a.is_dir {
            FileType::Directory
        } else {
            FileType::RegularFile
        },
        perm,
        nlink: if a.is_dir { 2 } else { 1 },
        uid,
        gid,
        rdev: 0,
        blksize: 1 << 20,
        flags: 0,
    }
}

fn code(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

impl Filesystem for Adapter {
    fn init(&mut self, _req: &Request<'_>, config: &mut KernelConfig) -> Result<(), libc::c_int> {
        if let Err(nearest) = config.set_max_readahead(MAX_READAHEAD) {
            let _ = config.set_max_readahead(nearest);
        }
        let _ = config.add_capabilities(fuser::consts::FUSE_ASYNC_READ);
        if let Err(nearest) = config.set_max_background(64) {
            let _ = config.set_max_background(nearest);
        }
        if self.fs.options().passthrough && self.fs.options().disk_cache.is_some() {
            // Depth 2: the cache directory may itself sit on a stacked file system.
            let agreed = config
                .add_capabilities(fuser::consts::FUSE_PASSTHROUGH)
                .is_ok()
                && config.set_max_stack_depth(2).is_ok();
            if !agreed {
                tracing::info!(
                    "the kernel has no FUSE passthrough; cached files are read through the daemon"
                );
            }
            self.passthrough = agreed;
        }
        Ok(())
    }

    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        let Some(name) = name.to_str() else {
            return reply.error(libc::ENOENT);
        };
        match self.fs.lookup(parent, name) {
            Ok(a) => reply.entry(&TTL, &attr(a, self.uid, self.gid), 0),
            Err(e) => reply.error(code(&e)),
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        match self.fs.getattr(ino) {
            Ok(a) => reply.attr(&TTL, &attr(a, self.uid, self.gid)),
            Err(e) => reply.error(code(&e)),
        }
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen) {
        if flags & libc::O_ACCMODE != libc::O_RDONLY {
            return reply.error(libc::EROFS);
        }
        let opened = match self.fs.open_handle(ino, self.passthrough) {
            Ok(Opened::Backed(fh, file)) => {
                let id = match self.backing.entry(ino) {
                    std::collections::hash_map::Entry::Occupied(e) => Ok(e.into_mut()),
                    std::collections::hash_map::Entry::Vacant(v) => {
                        reply.open_backing(&file).map(|id| v.insert(id))
                    }
                };
                match id {
                    Ok(id) => return reply.opened_passthrough(fh, 0, id),
                    Err(e) => {
                        // Not root, or a cache directory the kernel cannot stack on.
                        tracing::warn!(error = %e, "the kernel refused a backing file; passthrough off for this mount");
                        self.passthrough = false;
                        self.fs.backing_refused(ino, fh)
                    }
                }
            }
            other => other,
        };
        match opened {
            // The bytes never change under a handle: let the kernel keep its cache.
            Ok(o) => reply.opened(o.fh(), fuser::consts::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(code(&e)),
        }
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(libc::EINVAL);
        };
        let job = ReadJob {
            ino,
            offset,
            size,
            reply,
        };
        let sent = self.reads.send(job);
        if let Err(mpsc::SendError(job)) = sent {
            job.reply.error(libc::EIO);
        }
    }

    fn release(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        fh: u64,
        _flags: i32,
        _lock_owner: Option<u64>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        match self.fs.release_handle(ino, fh) {
            Ok(released) => {
                if released.backed && released.last {
                    self.backing.remove(&ino);
                }
                if !released.backed && released.last && self.passthrough {
                    let _ = self.closed.send(ino);
                }
                reply.ok()
            }
            Err(e) => reply.error(code(&e)),
        }
    }

    // Answered here, quietly, so fuser does not log a warning for each. ENOSYS makes the
    // kernel stop asking: a read-only file has nothing to flush (and a FLUSH would turn a
    // close after the daemon stopped into ENOTCONN) and no extended attributes.
    fn flush(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _owner: u64, reply: ReplyEmpty) {
        reply.error(libc::ENOSYS);
    }

    fn getxattr(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(libc::ENOSYS);
    }

    fn listxattr(&mut self, _req: &Request<'_>, _ino: u64, _size: u32, reply: ReplyXattr) {
        reply.error(libc::ENOSYS);
    }

    /// No ioctls (a Python `open` asks whether the file is a terminal).
    fn ioctl(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _fh: u64,
        _flags: u32,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(libc::ENOTTY);
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        let entries = match self.fs.readdir(ino) {
            Ok(e) => e,
            Err(e) => return reply.error(code(&e)),
        };
        let dots = [
            (ino, FileType::Directory, ".".to_string()),
            (ino, FileType::Directory, "..".to_string()),
        ];
        let all = dots.into_iter().chain(entries.into_iter().map(|e| {
            let kind = if e.is_dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            (e.ino, kind, e.name)
        }));
        for (i, (child, kind, name)) in all.enumerate().skip(offset.max(0) as usize) {
            if reply.add(child, i as i64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }
}

/// Drops the kernel's page cache of each file that will pass through from now on: the
/// kernel would drop it at the first passed-through open anyway (about 30 ms per 512 MiB,
/// in that open), and until then it holds a second copy of bytes the local copy has. Runs
/// off the session thread: an invalidation waits on the kernel's locks.
fn drop_kernel_copies(fs: Arc<MountFs>, closed: mpsc::Receiver<u64>, notifier: fuser::Notifier) {
    for ino in closed {
        if fs.passes_through(ino) {
            if let Err(e) = notifier.inval_inode(ino, 0, 0) {
                tracing::debug!(ino, error = %e, "cannot drop the kernel's cache of a file");
            }
        }
    }
}

fn serve_reads(fs: Arc<MountFs>, jobs: Arc<Mutex<mpsc::Receiver<ReadJob>>>) {
    loop {
        let job = match jobs.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok(job) = job else { return };
        match fs.read_data(job.ino, job.offset, job.size) {
            Ok(bytes) => job.reply.data(&bytes),
            Err(e) => job.reply.error(code(&e)),
        }
    }
}

/// A live mount; dropping it unmounts.
pub struct Mounted {
    session: Option<std::thread::JoinHandle<io::Result<()>>>,
    /// fuser's handle on the mount: unmounting through it first means the session's own
    /// unmount at its end finds nothing left to do (else it tries again and logs EINVAL).
    unmounter: fuser::SessionUnmounter,
    path: PathBuf,
    fs: Arc<MountFs>,
    /// The mount's device number, which names its FUSE connection.
    dev: u64,
}

/// How long an unmount waits for the session to end before aborting the connection.
const UNMOUNT_GRACE: Duration = Duration::from_secs(2);

impl Mounted {
    pub fn fs(&self) -> &Arc<MountFs> {
        &self.fs
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True once the kernel side has gone (unmounted from outside, or the connection
    /// aborted).
    pub fn is_finished(&self) -> bool {
        self.session.as_ref().is_none_or(|s| s.is_finished())
    }

    /// Unmounts and waits for the session to end.
    pub fn unmount(mut self) {
        self.stop();
    }

    /// Unmounts: a plain unmount, else (files still open) a lazy one, so the mount point
    /// is free at once; then the session ends when the kernel lets go, or after
    /// [`UNMOUNT_GRACE`] by aborting the FUSE connection (readers still holding files get
    /// ENOTCONN, never stale or wrong bytes).
    fn stop(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        if is_mount_point(&self.path) {
            let _ = self.unmounter.unmount();
            if is_mount_point(&self.path) {
                // Files are still open: detach it, so the mount point is free at once.
                lazy_unmount(&self.path);
            }
        }
        let deadline = std::time::Instant::now() + UNMOUNT_GRACE;
        while !session.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if !session.is_finished() {
            let knob = format!("/sys/fs/fuse/connections/{}/abort", libc::minor(self.dev));
            if !Path::new(&knob).exists() {
                mount_fusectl();
            }
            match std::fs::write(&knob, "1") {
                Ok(()) => tracing::info!(%knob, "files still open; aborted the FUSE connection"),
                Err(e) => {
                    tracing::warn!(%knob, error = %e, "cannot abort the FUSE connection; leaving its thread");
                    return;
                }
            }
        }
        if let Ok(Err(e)) = session.join() {
            tracing::warn!(error = %e, "FUSE session ended with an error");
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Mounts the FUSE control file system where systemd has not (containers), so a
/// connection can be aborted; logged when it cannot be.
fn mount_fusectl() {
    let (src, dir, fstype) = (c"fusectl", c"/sys/fs/fuse/connections", c"fusectl");
    // SAFETY: every argument is a valid NUL-terminated string; no data is passed.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            dir.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        tracing::debug!(error = %e, "cannot mount fusectl");
    }
}

fn lazy_unmount(path: &Path) {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return;
    };
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
        let e = io::Error::last_os_error();
        tracing::warn!(path = %path.display(), error = %e, "unmount failed");
    }
}

/// Whether `path` is a mount point now (its line in /proc/self/mountinfo).
fn is_mount_point(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let canon = std::fs::canonicalize(path)
        .or_else(|_| std::path::absolute(path))
        .unwrap_or_else(|_| path.to_path_buf());
    let Ok(info) = std::fs::read("/proc/self/mountinfo") else {
        return false;
    };
    let want = canon.as_os_str().as_bytes();
    info.split(|&b| b == b'\n')
        .filter_map(|l| l.split(|&b| b == b' ').nth(4))
        .any(|m| unescape_mountinfo(m) == want)
}

/// A path as mountinfo writes it: space, tab, newline and backslash as `\NNN` (octal).
fn unescape_mountinfo(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .map(|d| d.iter().fold(0u32, |n, c| n * 8 + (c - b'0') as u32))
            .filter(|&n| n <= 0xff);
        match octal {
            Some(n) => {
                out.push(n as u8);
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
}

/// Refuses a mount point that is not an empty directory, is already a mount, or holds a
/// stale mount left by a daemon that died (ENOTCONN).
pub fn check_mount_point(path: &Path) -> Result<(), MountError> {
    let bad = |why: &str| MountError::MountPoint {
        path: path.to_path_buf(),
        why: why.to_string(),
    };
    match std::fs::metadata(path) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            return Err(MountError::Stale {
                path: path.to_path_buf(),
            })
        }
        Err(e) => return Err(bad(&format!("cannot use as a mount point: {e}"))),
        Ok(m) if !m.is_dir() => return Err(bad("not a directory")),
        Ok(_) => {}
    }
    if is_mount_point(path) {
        // The kernel may answer a stat from its cache; listing asks the daemon.
        if let Err(e) = std::fs::read_dir(path) {
            if e.raw_os_error() == Some(libc::ENOTCONN) {
                return Err(MountError::Stale {
                    path: path.to_path_buf(),
                });
            }
        }
        return Err(bad("something is already mounted here"));
    }
    match std::fs::read_dir(path).map(|mut d| d.next().is_some()) {
        Ok(false) => Ok(()),
        Ok(true) => Err(bad(
            "not empty (the mount would hide its files): use an empty directory",
        )),
        Err(e) => Err(bad(&format!("cannot list: {e}"))),
    }
}

/// Mounts `fs` read-only at `path` and serves it on background threads.
pub fn mount(fs: Arc<MountFs>, path: &Path, fs_name: &str) -> Result<Mounted, MountError> {
    check_mount_point(path)?;
    let (tx, rx) = mpsc::channel();
    let rx = Arc::new(Mutex::new(rx));
    for i in 0..READ_THREADS {
        let fs = Arc::clone(&fs);
        let rx = Arc::clone(&rx);
        std::thread::Builder::new()
            .name(format!("sluice-fuse-read-{i}"))
            .spawn(move || serve_reads(fs, rx))
            .map_err(MountError::Thread)?;
    }
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let (closed_tx, closed_rx) = mpsc::channel();
    let adapter = Adapter {
        fs: Arc::clone(&fs),
        reads: tx,
        uid,
        gid,
        passthrough: false,
        backing: HashMap::new(),
        closed: closed_tx,
    };
    let options = [
        MountOption::RO,
        MountOption::FSName(fs_name.to_string()),
        MountOption::Subtype("sluice".to_string()),
        MountOption::AllowOther,
        MountOption::DefaultPermissions,
    ];
    let mount_error = |source| MountError::Mount {
        path: path.to_path_buf(),
        source,
    };
    let mut session = fuser::Session::new(adapter, path, &options).map_err(mount_error)?;
    let unmounter = session.unmount_callable();
    let notifier = session.notifier();
    {
        let fs = Arc::clone(&fs);
        std::thread::Builder::new()
            .name("sluice-fuse-inval".into())
            .spawn(move || drop_kernel_copies(fs, closed_rx, notifier))
            .map_err(MountError::Thread)?;
    }
    let runner = std::thread::Builder::new()
        .name("sluice-fuse".into())
        .spawn(move || session.run())
        .map_err(MountError::Thread)?;
    // Only now, with the session answering: a stat of the mount point asks it.
    let dev = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).map(|m| m.dev()).unwrap_or(0)
    };
    raise_readahead(dev, fs.options().block_bytes);
    Ok(Mounted {
        session: Some(runner),
        unmounter,
        path: path.to_path_buf(),
        fs,
        dev,
    })
}

/// FUSE caps readahead at the bdi's 128 KiB default whatever INIT asked for; as root, the
/// mount's bdi can be raised so an mmap fault reads ahead a whole block. Logged when not.
fn raise_readahead(dev: u64, block_bytes: u64) {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let knob = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    let kb = (block_bytes / 1024).to_string();
    if let Err(e) = std::fs::write(&knob, &kb) {
        tracing::info!(%knob, error = %e, "cannot raise the mount's readahead; the kernel's 128 KiB stays");
    }
}

#[cfg(test)]
mod tests {
    use super::unescape_mountinfo;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(
            unescape_mountinfo(br"/mnt/a\040b\011c\012d\134e"),
            b"/mnt/a b\tc\nd\\e"
        );
        // Not an escape: left as it is.
        assert_eq!(unescape_mountinfo(br"/x\9\01"), br"/x\9\01");
        assert_eq!(unescape_mountinfo(b"/plain"), b"/plain");
    }
}
