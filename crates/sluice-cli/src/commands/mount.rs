//! `sluice mount REMOTE MOUNTPOINT`: a read-only caching FUSE mount of an object-store
//! prefix (`s3://bucket/models/`) or a directory, served until SIGINT, SIGTERM or SIGHUP,
//! then unmounted. `--daemon` starts the same command in the background and returns once
//! the mount is up.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_mount::{
    Backend, DirBackend, DiskCacheOptions, MountError, MountFs, MountOptions, ObjectBackend,
};
use sluice_remote::{ObjectUrl, RemoteOptions, RemoteStore};

use crate::MountArgs;

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    STOP.store(true, Ordering::Release);
}

/// Set in a `--daemon`'s child: the pipe it writes [`READY`] to once its mount is up.
const READY_FD_ENV: &str = "SLUICE_MOUNT_READY_FD";
const READY: &[u8] = b"ready\n";

fn options(args: &MountArgs) -> Result<MountOptions, MountError> {
    let size = |flag: &str, v: &str| {
        sluice_load::parse_bytes(v).map_err(|e| MountError::config(format!("--{flag}"), e))
    };
    let mut opts = MountOptions {
        pool_bytes: size("pool", &args.pool)?,
        block_bytes: size("block", &args.block)?,
        prefetch_threads: args.prefetch_threads,
        lookahead_files: args.lookahead_files,
        disk_cache: match &args.cache_dir {
            Some(dir) => Some(DiskCacheOptions {
                dir: dir.clone(),
                budget: size("cache-size", args.cache_size.as_deref().unwrap_or("16GiB"))?,
            }),
            None => None,
        },
        passthrough: !args.no_passthrough,
        ..MountOptions::default()
    };
    opts.streams.max_cursors = args.streams;
    opts.validate()?;
    if args.log.is_some() && !args.daemon && ready_fd().is_none() {
        return Err(MountError::config(
            "--log",
            "is the log of a --daemon; in the foreground the log goes to stderr",
        ));
    }
    if let Some(dir) = &args.cache_dir {
        // Blocks kept under the mount point would be written through the mount itself.
        let inside = |d: &Path| {
            let m = args.mountpoint.canonicalize().ok()?;
            let d = std::path::absolute(d).ok()?;
            let d = d.ancestors().find_map(|a| a.canonicalize().ok())?;
            Some(d.starts_with(m))
        };
        if inside(dir) == Some(true) {
            return Err(MountError::config(
                format!("--cache-dir {}", dir.display()),
                format!("lies under the mount point {}", args.mountpoint.display()),
            ));
        }
    }
    Ok(opts)
}

fn backend(source: &str) -> Result<Arc<dyn Backend>, MountError> {
    if sluice_load::is_remote(source) {
        let url = ObjectUrl::parse(source)?;
        let store = RemoteStore::open(&url, &RemoteOptions::from_env()?)?;
        return Ok(Arc::new(ObjectBackend::new(Arc::new(store), url)));
    }
    let dir = DirBackend::new(Path::new(source)).map_err(|e| MountError::Backend {
        root: source.to_string(),
        source: e,
    })?;
    Ok(Arc::new(dir))
}

pub fn run(args: &MountArgs) -> Result<(), MountError> {
    let opts = options(args)?;
    sluice_mount::check_mount_point(&args.mountpoint)?;
    if args.daemon {
        return daemonize(args);
    }
    // Catch the stop signals before any thread starts, so they all inherit the mask.
    STOP.store(false, Ordering::Release);
    let handlers = super::signals::install(on_signal);
    let outcome = serve(args, opts);
    handlers.restore();
    outcome
}

/// In a `--daemon`'s child, the pipe to tell the parent the mount is up on (taken once).
fn ready_fd() -> Option<std::os::fd::RawFd> {
    let fd: std::os::fd::RawFd = std::env::var(READY_FD_ENV).ok()?.parse().ok()?;
    // SAFETY: F_GETFD only asks whether the descriptor is open.
    (fd > 2 && unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0).then_some(fd)
}

/// Tells a `--daemon` parent that the mount is up (a foreground mount has none).
fn tell_ready() {
    use std::io::Write;
    use std::os::fd::FromRawFd;
    static TOLD: AtomicBool = AtomicBool::new(false);
    let Some(fd) = ready_fd() else { return };
    if TOLD.swap(true, Ordering::AcqRel) {
        return;
    }
    // SAFETY: the parent passed this descriptor (checked open) for this one write; it is
    // owned and closed here, once (`TOLD`).
    let mut pipe = unsafe { std::fs::File::from_raw_fd(fd) };
    if let Err(e) = pipe.write_all(READY) {
        tracing::warn!(error = %e, "cannot tell the parent the mount is up");
    }
}

fn serve(args: &MountArgs, opts: MountOptions) -> Result<(), MountError> {
    let backend = backend(&args.source)?;
    let fs = Arc::new(MountFs::new(backend, opts)?);
    let mounted = sluice_mount::mount(Arc::clone(&fs), &args.mountpoint, &args.source)?;
    errln!(
        "sluice: mounted {} at {} (pool {}, block {}{}); Ctrl-C or SIGTERM unmounts",
        args.source,
        args.mountpoint.display(),
        super::human_bytes(fs.options().pool_bytes),
        super::human_bytes(fs.options().block_bytes),
        match &fs.options().disk_cache {
            Some(d) => format!(
                ", disk cache {} of {} ({} held)",
                d.dir.display(),
                super::human_bytes(d.budget),
                super::human_bytes(fs.stats().disk.held_bytes)
            ),
            None => String::new(),
        },
    );
    tell_ready();
    while !STOP.load(Ordering::Acquire) && !mounted.is_finished() {
        std::thread::sleep(Duration::from_millis(100));
    }
    let outside = mounted.is_finished();
    mounted.unmount();
    let s = fs.stats();
    errln!(
        "sluice: unmounted {}{}: fetched {} in {} reads ({} failed), pool peak {}, {} hits, {} misses ({} waited on prefetch, {} not prefetched)",
        args.mountpoint.display(),
        if outside { " (from outside)" } else { "" },
        super::human_bytes(s.backend_bytes),
        s.backend_reads,
        s.backend_errors,
        super::human_bytes(s.pool.peak_bytes),
        s.pool.hits,
        s.pool.misses,
        s.waited_on_prefetch,
        s.demand_fetches,
    );
    if let Some(dir) = &args.cache_dir {
        let d = s.disk;
        errln!(
            "sluice: disk cache {}: {} hits, {} misses, {} corrupt blocks refetched, {} written ({} write errors), {} evicted, holds {}, {} opens passed through{}",
            dir.display(),
            d.hits,
            d.misses,
            d.corrupt,
            super::human_bytes(d.written_bytes),
            d.write_errors,
            d.evicted,
            super::human_bytes(d.held_bytes),
            d.passthrough_opens - s.passthrough_refused,
            match s.passthrough_refused {
                0 => String::new(),
                n => format!(" ({n} refused by the kernel)"),
            },
        );
    }
    Ok(())
}

/// The daemon's log, created or truncated: a regular file, or a character device such
/// as `/dev/null`. A FIFO (which would block the open until a reader came), a socket or
/// a directory is a bad option.
fn open_log(path: &std::path::Path) -> Result<std::fs::File, MountError> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let bad = |why: String| MountError::config(format!("--log {}", path.display()), why);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match std::fs::metadata(path) {
            Ok(m) if !m.is_file() => bad(format!(
                "not a regular file but {}",
                sluice_engine::kind_name(m.file_type())
            )),
            _ => bad(format!("cannot create: {e}")),
        })?;
    let kind = file.metadata().map_err(|e| bad(e.to_string()))?.file_type();
    if !(kind.is_file() || kind.is_char_device()) {
        return Err(bad(format!(
            "not a regular file but {}",
            sluice_engine::kind_name(kind)
        )));
    }
    sluice_engine::clear_nonblocking(&file);
    Ok(file)
}

/// Runs this command again without `--daemon`, in its own session, and waits until it
/// says (through a pipe) that its mount is up, or it exits: then this exits as it did,
/// with its log shown.
fn daemonize(args: &MountArgs) -> Result<(), MountError> {
    use std::io::Read;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().map_err(MountError::Thread)?;
    let default_log = |pid: u32| std::env::temp_dir().join(format!("sluice-mount-{pid}.log"));
    let mut log_path = args
        .log
        .clone()
        .unwrap_or_else(|| default_log(std::process::id()));
    let log = open_log(&log_path)?;
    let err_log = log.try_clone().map_err(MountError::Thread)?;
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(MountError::Thread(std::io::Error::last_os_error()));
    }
    // SAFETY: pipe2 just opened both; each is owned once, here.
    let (ready_rx, ready_tx) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let tx = ready_tx.as_raw_fd();
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os()
        .skip(1)
        .filter(|a| a != "--daemon")
        .collect();
    if argv.is_empty() {
        argv.push("mount".into());
    }
    let mut cmd = std::process::Command::new(exe);
    cmd.args(argv)
        .env(READY_FD_ENV, tx.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(err_log);
    // SAFETY: setsid and fcntl are async-signal-safe and touch no memory of this process.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 || libc::fcntl(tx, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(MountError::Thread)?;
    // Only the child may hold the write end: the pipe ends when it exits.
    drop(ready_tx);
    if args.log.is_none() {
        let named = default_log(child.id());
        if std::fs::rename(&log_path, &named).is_ok() {
            log_path = named;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut pipe = std::fs::File::from(ready_rx);
    let mut said = Vec::new();
    let ready = loop {
        if said.ends_with(READY) {
            break true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let _ = child.kill();
            let _ = child.wait();
            return Err(MountError::MountPoint {
                path: args.mountpoint.clone(),
                why: format!(
                    "the mount daemon did not mount within 120 s (log {})",
                    log_path.display()
                ),
            });
        }
        let mut poll = libc::pollfd {
            fd: pipe.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut poll, 1, left.as_millis().min(1000) as i32) };
        if n <= 0 {
            continue; // timeout or EINTR: check the deadline again
        }
        let mut buf = [0u8; 16];
        match pipe.read(&mut buf) {
            Ok(0) => break false,
            Ok(got) => said.extend_from_slice(&buf[..got]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break false,
        }
    };
    if !ready {
        // The pipe closed without a word: the child exited (or is exiting).
        let status = child.wait().map_err(MountError::Thread)?;
        let said = std::fs::read_to_string(&log_path).unwrap_or_default();
        let said = said.trim().trim_start_matches("sluice: error: ");
        return Err(MountError::Daemon {
            code: status.code().unwrap_or(1),
            said: format!("{said} (log {})", log_path.display()),
        });
    }
    outln!("{}", child.id());
    errln!(
        "sluice: mount daemon {} serves {} (log {}); `kill {}` or `umount {}` stops it",
        child.id(),
        args.mountpoint.display(),
        log_path.display(),
        child.id(),
        args.mountpoint.display()
    );
    Ok(())
}
