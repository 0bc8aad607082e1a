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

/// Exit status of a failed mount: bad options 2, a stale or busy mount point 3, a
/// missing source 4, the rest 1.
pub fn exit_code(err: &MountError) -> i32 {
    match err {
        MountError::Config(_) => 2,
        MountError::Stale { .. } | MountError::MountPoint { .. } => 3,
        MountError::Backend { source, .. } if source.kind() == std::io::ErrorKind::NotFound => 4,
        MountError::Remote(sluice_remote::RemoteError::NotFound { .. }) => 4,
        MountError::Remote(e) if e.is_config() => 2,
        _ => 1,
    }
}

fn options(args: &MountArgs) -> Result<MountOptions, MountError> {
    let size = |flag: &str, v: &str| {
        sluice_load::parse_bytes(v).map_err(|e| MountError::Config(format!("--{flag}: {e}")))
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
    if let Some(dir) = &args.cache_dir {
        // Blocks kept under the mount point would be written through the mount itself.
        let inside = |d: &Path| {
            let m = args.mountpoint.canonicalize().ok()?;
            let d = std::path::absolute(d).ok()?;
            let d = d.ancestors().find_map(|a| a.canonicalize().ok())?;
            Some(d.starts_with(m))
        };
        if inside(dir) == Some(true) {
            return Err(MountError::Config(format!(
                "--cache-dir {} lies under the mount point {}",
                dir.display(),
                args.mountpoint.display()
            )));
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

fn serve(args: &MountArgs, opts: MountOptions) -> Result<(), MountError> {
    let backend = backend(&args.source)?;
    let fs = Arc::new(MountFs::new(backend, opts)?);
    let mounted = sluice_mount::mount(Arc::clone(&fs), &args.mountpoint, &args.source)?;
    eprintln!(
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
    while !STOP.load(Ordering::Acquire) && !mounted.is_finished() {
        std::thread::sleep(Duration::from_millis(100));
    }
    let outside = mounted.is_finished();
    mounted.unmount();
    let s = fs.stats();
    eprintln!(
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
        eprintln!(
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

/// Runs this command again without `--daemon`, in its own session, and waits until its
/// mount is up (or it failed, whose log is then shown).
fn daemonize(args: &MountArgs) -> Result<(), MountError> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().map_err(MountError::Thread)?;
    let log_path = args.log.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("sluice-mount-{}.log", std::process::id()))
    });
    let log = std::fs::File::create(&log_path).map_err(|e| MountError::MountPoint {
        path: log_path.clone(),
        why: format!("cannot create the log: {e}"),
    })?;
    let err_log = log.try_clone().map_err(MountError::Thread)?;
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os()
        .skip(1)
        .filter(|a| a != "--daemon")
        .collect();
    if argv.is_empty() {
        argv.push("mount".into());
    }
    let mut cmd = std::process::Command::new(exe);
    cmd.args(argv)
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(err_log);
    // SAFETY: setsid is async-signal-safe and touches no memory of this process.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(MountError::Thread)?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let said = std::fs::read_to_string(&log_path).unwrap_or_default();
            return Err(MountError::MountPoint {
                path: args.mountpoint.clone(),
                why: format!("the mount daemon exited ({status}): {}", said.trim()),
            });
        }
        if sluice_mount::check_mount_point(&args.mountpoint).is_err() {
            println!("{}", child.id());
            eprintln!(
                "sluice: mount daemon {} serves {} (log {}); `kill {}` or `umount {}` stops it",
                child.id(),
                args.mountpoint.display(),
                log_path.display(),
                child.id(),
                args.mountpoint.display()
            );
            return Ok(());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err(MountError::MountPoint {
                path: args.mountpoint.clone(),
                why: "the mount daemon did not mount within 120 s".into(),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
