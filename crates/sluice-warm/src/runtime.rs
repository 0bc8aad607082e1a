//! `sluice warm run` / `record`: launch a service and the runtime in one
//! cgroup, watch the model files, and drive a policy through the cache
//! manager until the service exits.
//!
//! One thread runs the loop: fanotify events (answered on the watch's own
//! thread before they get here) go to the policy; between events the
//! manager prefetches a few chunks; every 50 ms it samples mmap readers'
//! progress (pagemap) and checks memory. Prefetch runs in this process,
//! which sits in the service's cgroup, so the page cache it fills is
//! charged where the limit applies.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::builtin::{by_name, BuiltinConfig};
use crate::error::WarmError;
use crate::fanotify::{Level, Watch};
use crate::idle_gate::{IdleGate, ProcessTreeIo};
use crate::kernel::{mapped_addresses, KernelCache, Mechanism, MemorySource};
use crate::manager::{Manager, ManagerConfig, Stats};
use crate::policy::{AccessEvent, AccessKind, Guarded, PolicyContext};
use crate::sys::{self, Cgroup, NumaMap};

/// What to run and how.
pub struct RunConfig {
    pub model_dir: PathBuf,
    /// A built-in policy name.
    pub policy: String,
    pub builtin: BuiltinConfig,
    /// Creates a cgroup with this limit for the service and the runtime.
    pub memory_limit: Option<u64>,
    pub watermark: f64,
    pub mechanism: Mechanism,
    /// WILLNEED bytes in flight.
    pub in_flight_bytes: u64,
    /// fanotify level to insist on; `None` takes the best available.
    pub level: Option<Level>,
    /// No fanotify at all: only explicit triggers and samplers.
    pub explicit: bool,
    /// The service command line; empty for a daemon, which runs until
    /// `stop` is set.
    pub command: Vec<OsString>,
    /// Where to listen for explicit triggers (a named pipe), if anywhere.
    pub trigger_pipe: Option<PathBuf>,
    /// Until the service first accesses the model, prefetch runs only once
    /// the service's own storage reads have stood still this long (see
    /// [`IdleGate`]); zero lets it run regardless.
    pub launch_quiet: Duration,
}

/// Live state, for the summary line.
pub struct Status<'a> {
    pub elapsed: Duration,
    pub stats: &'a Stats,
    pub pending_bytes: u64,
}

/// How a run went.
#[derive(Debug)]
pub struct RunReport {
    /// The service's exit status (128 + signal when killed).
    pub exit_code: i32,
    pub stats: Stats,
    /// What fanotify could see; `None` in explicit mode.
    pub level: Option<Level>,
    /// Why the policy was disabled, if it was.
    pub policy_fault: Option<String>,
    pub seconds: f64,
    /// The cgroup the service ran in, when one was created.
    pub cgroup: Option<PathBuf>,
    /// fanotify events seen, permission events answered, events dropped
    /// because the policy side was behind.
    pub watch_events: u64,
    pub watch_answered: u64,
    pub watch_dropped: u64,
}

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
        return Err(WarmError::Config(format!(
            "{}: no model files in it",
            dir.display()
        )));
    }
    Ok(out)
}

/// A model file's two names: where it sits in the model directory (what
/// policies, templates and triggers use) and the file the kernel reports
/// (fanotify's descriptor, `/proc/PID/fd`, `/proc/PID/maps`), which differ
/// when the entry is a symlink.
#[derive(Default)]
struct Names {
    to_model: HashMap<PathBuf, PathBuf>,
    to_real: HashMap<PathBuf, PathBuf>,
}

impl Names {
    fn new(files: &[(PathBuf, u64)]) -> Names {
        let mut names = Names::default();
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
    fn model(&self, real: PathBuf) -> PathBuf {
        match self.to_model.get(&real) {
            Some(model) => model.clone(),
            None => real,
        }
    }

    /// The name the kernel reports for a model file.
    fn real<'a>(&'a self, model: &'a Path) -> &'a Path {
        self.to_real.get(model).map_or(model, PathBuf::as_path)
    }
}

/// Runs the service under the policy until it exits (or, with no command,
/// until `stop` is set: the daemon); `on_status` is called about every
/// 200 ms (a TTY summary, the status file).
pub fn run(
    config: &RunConfig,
    stop: &AtomicBool,
    on_status: &mut dyn FnMut(&Status),
) -> Result<RunReport, WarmError> {
    let policy = by_name(&config.policy, &config.builtin)?;
    // A template that cannot be read is a usage error here, before the
    // service starts; inside a running runtime the policy fails open.
    if let (false, Some(service), Some(dir)) = (
        config.builtin.record,
        &config.builtin.service,
        &config.builtin.template_dir,
    ) {
        if config.policy == "template" {
            crate::template::TemplateStore::new(dir.clone()).load(service)?;
        }
    }
    run_with(config, policy, stop, on_status)
}

/// [`run`] with a policy object instead of a name (custom and Python
/// policies).
pub fn run_with(
    config: &RunConfig,
    policy: Box<dyn crate::policy::Policy>,
    stop: &AtomicBool,
    on_status: &mut dyn FnMut(&Status),
) -> Result<RunReport, WarmError> {
    let model_dir = config
        .model_dir
        .canonicalize()
        .map_err(WarmError::io(&config.model_dir))?;
    let files = model_files(&model_dir)?;
    let ctx = PolicyContext {
        model_dir: model_dir.clone(),
        files: files.clone(),
        memory_limited: config.memory_limit.is_some(),
    };
    let cgroup = match config.memory_limit {
        Some(limit) => Some(enter_cgroup(limit)?),
        None => None,
    };
    let outcome = run_in(config, &ctx, policy, cgroup.as_ref(), stop, on_status);
    if let Some((cgroup, _)) = cgroup {
        leave_cgroup(cgroup);
    }
    outcome
}

fn run_in(
    config: &RunConfig,
    ctx: &PolicyContext,
    policy: Box<dyn crate::policy::Policy>,
    cgroup: Option<&(Cgroup, u64)>,
    stop: &AtomicBool,
    on_status: &mut dyn FnMut(&Status),
) -> Result<RunReport, WarmError> {
    let started = Instant::now();
    let memory = match cgroup {
        Some((cg, limit)) => MemorySource::Cgroup {
            cgroup: cg.clone(),
            limit: *limit,
        },
        None => MemorySource::Pid(std::process::id() as i32),
    };
    let names = Names::new(&ctx.files);
    let chunk = sys::read_ahead_limit(&ctx.files[0].0);
    let mut cache = KernelCache::new(
        config.mechanism,
        chunk,
        config.in_flight_bytes,
        memory,
        NumaMap::detect(),
    );
    cache.set_real_names(names.to_real.clone());
    let manager_config = ManagerConfig {
        chunk_bytes: chunk,
        watermark: config.watermark,
        ..ManagerConfig::default()
    };
    let mut manager = Manager::new(Guarded::new(policy), cache, manager_config);
    // The policy decides at init what it needs (a template records or
    // replays), so it starts before the watch.
    manager.start(ctx);
    let paths: Vec<PathBuf> = ctx.files.iter().map(|(p, _)| p.clone()).collect();
    // Pre-content events make every read wait for our answer, and the
    // kernel turns readahead off for files watched so: ask for them only
    // when the policy needs exact read ranges (or the user insists).
    let level = match config.level {
        None if !manager.needs_read_ranges() => Some(Level::Open),
        level => level,
    };
    let watch = match Watch::open(&paths, level, 4096) {
        _ if config.explicit => None,
        Ok(w) => Some(w),
        Err(err) if config.level.is_none() => {
            tracing::warn!("{err}; running in explicit mode (no access events)");
            None
        }
        Err(err) => return Err(err),
    };
    // A launched service is a process tree: other processes opening the
    // model files (a monitoring tool, a second service) are not its
    // readers. Until the service's pid is known, the tree is ours (the
    // service will be our child); then it is the service's.
    if let (Some(w), false) = (&watch, config.command.is_empty()) {
        w.only_tree_of(std::process::id() as i32);
    }
    if manager.wait_for_init() {
        manager.drain();
    }
    let mut child = match config.command.is_empty() {
        true => None,
        false => Some(spawn(&config.command)?),
    };
    if let (Some(w), Some(c)) = (&watch, &child) {
        w.only_tree_of(c.id() as i32);
    }
    // What a policy queues before the service's first model access (a
    // replay from launch) waits for gaps in the service's own start-up I/O.
    let mut gate = child
        .as_ref()
        .filter(|_| !config.launch_quiet.is_zero())
        .map(|c| {
            IdleGate::new(
                ProcessTreeIo::new(c.id() as i32),
                config.launch_quiet,
                Instant::now(),
            )
        });
    let mut sampler = Samplers::default();
    let mut last_tick = Instant::now();
    let mut last_status = Instant::now();
    let mut triggers = match &config.trigger_pipe {
        Some(path) => match crate::trigger::TriggerPipe::create(path) {
            Ok(p) => Some(p),
            Err(err) => {
                tracing::warn!("explicit triggers unavailable: {err}");
                None
            }
        },
        None => None,
    };
    let daemon = config.command.is_empty() && cgroup.is_none();
    let mut joined = false;
    let exit_code = loop {
        if let Some(c) = child.as_mut() {
            if let Some(status) = c.try_wait().map_err(|e| WarmError::Config(e.to_string()))? {
                break exit_code_of(status);
            }
        }
        if stop.load(Ordering::SeqCst) {
            if let Some(c) = child.as_mut() {
                // Interrupted: the service goes down with us.
                let _ = c.kill();
                let status = c.wait().map_err(|e| WarmError::Config(e.to_string()))?;
                break exit_code_of(status);
            }
            break 0;
        }
        // Paused over the watermark or held by the gate, there is nothing
        // to do until the next event or tick: wait rather than spin.
        let open = match gate.as_mut() {
            Some(g) if manager.has_pending() => g.is_open(Instant::now()),
            _ => true,
        };
        let busy = manager.has_pending() && !manager.is_paused() && open;
        if let Some(w) = &watch {
            let wait = if busy {
                Duration::ZERO
            } else {
                Duration::from_millis(20)
            };
            let first = if wait.is_zero() {
                None
            } else {
                w.recv_timeout(wait)
            };
            for event in first.into_iter().chain(w.drain()) {
                if daemon && !joined && event.pid > 0 {
                    joined = join_reader_cgroup(event.pid).is_some();
                }
                gate = None;
                handle(&mut manager, &mut sampler, &names, event);
            }
        } else if !busy {
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Some(t) = triggers.as_mut() {
            for event in t.poll(&ctx.model_dir) {
                gate = None;
                handle(&mut manager, &mut sampler, &names, event);
            }
        }
        if open || gate.is_none() {
            manager.pump(4);
        }
        if last_tick.elapsed() >= Duration::from_millis(50) {
            for mut event in sampler.sample() {
                event.path = names.model(event.path);
                manager.on_event(&event);
            }
            manager.tick();
            last_tick = Instant::now();
        }
        if last_status.elapsed() >= Duration::from_millis(200) {
            on_status(&Status {
                elapsed: started.elapsed(),
                stats: manager.stats(),
                pending_bytes: manager.pending_bytes(),
            });
            last_status = Instant::now();
        }
    };
    // Events the watch took before the service ended still count (a
    // recording must not lose the last reads).
    if let Some(w) = &watch {
        while let Some(event) = w.recv_timeout(Duration::from_millis(20)) {
            handle(&mut manager, &mut sampler, &names, event);
        }
    }
    manager.stop();
    Ok(RunReport {
        exit_code,
        stats: manager.stats().clone(),
        level: watch.as_ref().map(|w| w.level),
        policy_fault: manager.policy().fault().map(str::to_string),
        seconds: started.elapsed().as_secs_f64(),
        cgroup: cgroup.map(|(c, _)| c.path.clone()),
        watch_events: watch
            .as_ref()
            .map_or(0, |w| w.stats.events.load(Ordering::Relaxed)),
        watch_answered: watch
            .as_ref()
            .map_or(0, |w| w.stats.answered.load(Ordering::Relaxed)),
        watch_dropped: watch
            .as_ref()
            .map_or(0, |w| w.stats.dropped.load(Ordering::Relaxed)),
    })
}

/// The loader worker a process is bound to, from its environment:
/// `SLUICE_WORKER`, else `LOCAL_RANK` (torchrun, vLLM and SGLang set it per
/// accelerator). `None` leaves the policy to number workers by spawn order.
fn worker_from_environ(pid: i32) -> Option<u32> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    worker_in_environ(&environ)
}

fn worker_in_environ(environ: &[u8]) -> Option<u32> {
    let vars: Vec<&[u8]> = environ.split(|&b| b == 0).collect();
    ["SLUICE_WORKER=", "LOCAL_RANK="].iter().find_map(|key| {
        vars.iter()
            .find_map(|v| v.strip_prefix(key.as_bytes()))
            .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse().ok())
    })
}

/// A daemon prefetches for services it did not start: it joins the memory
/// cgroup of the first reader it sees, so the page cache it fills is
/// charged where that service's limit applies (and its watermark is the
/// service's). Returns whether it moved, or `None` when the reader's
/// cgroup could not be read (it already exited: a short-lived `cat` of a
/// config file), so the next reader is tried.
fn join_reader_cgroup(pid: i32) -> Option<bool> {
    let theirs = sys::memory_cgroup_of(pid)?;
    if sys::memory_cgroup_of(std::process::id() as i32).as_ref() == Some(&theirs) {
        return Some(false);
    }
    match theirs.add_pid(std::process::id() as i32) {
        Ok(()) => {
            tracing::info!(cgroup = %theirs.path.display(), pid, "prefetch now charged to the reader's cgroup");
            Some(true)
        }
        Err(err) => {
            tracing::warn!(
                "cannot join the reader's cgroup {}: {err}",
                theirs.path.display()
            );
            Some(false)
        }
    }
}

/// One access event (from fanotify, named as the kernel names the file,
/// or from a trigger, named in the model directory): samplers follow the
/// real file, the policy sees the model-directory name.
fn handle(
    manager: &mut Manager<KernelCache>,
    sampler: &mut Samplers,
    names: &Names,
    mut event: AccessEvent,
) {
    event.path = names.model(event.path);
    if event.worker.is_none() && event.pid > 0 {
        event.worker = *sampler
            .workers
            .entry(event.pid)
            .or_insert_with(|| worker_from_environ(event.pid));
    }
    let event = &event;
    let real = names.real(&event.path);
    match event.kind {
        AccessKind::Mmap => sampler.mmap.watch(event.pid, real, event.len),
        // Without read ranges, the file position of read() loaders and the
        // pagemap of mmap loaders are the progress signals.
        AccessKind::Open => {
            sampler.reads.watch(event.pid, real, None);
            let len = std::fs::metadata(real).map_or(0, |m| m.len());
            sampler.mmap.watch(event.pid, real, len);
        }
        _ => {}
    }
    if event.pid > 0 {
        manager.cache_mut().add_reader(event.pid);
    }
    manager.on_event(event);
}

fn spawn(command: &[OsString]) -> Result<Child, WarmError> {
    Command::new(&command[0])
        .args(&command[1..])
        .spawn()
        .map_err(WarmError::io(PathBuf::from(&command[0])))
}

fn exit_code_of(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// Creates a cgroup with `limit` and moves this process into it; the
/// service, spawned later, inherits it.
fn enter_cgroup(limit: u64) -> Result<(Cgroup, u64), WarmError> {
    let name = format!("sluice-warm-{}", std::process::id());
    let cgroup = sys::create_cgroup(&name, Some(limit))?;
    if let Err(err) = cgroup.add_pid(std::process::id() as i32) {
        let _ = cgroup.clone().remove();
        return Err(err);
    }
    tracing::info!(cgroup = %cgroup.path.display(), limit, "service cgroup created");
    Ok((cgroup, limit))
}

/// Moves this process back to the parent cgroup and removes ours.
fn leave_cgroup(cgroup: Cgroup) {
    if let Some(parent) = cgroup.path.parent() {
        let procs = parent.join("cgroup.procs");
        if let Err(e) = std::fs::write(&procs, std::process::id().to_string()) {
            tracing::warn!("leaving {}: {e}", cgroup.path.display());
        }
    }
    let path = cgroup.path.clone();
    if let Err(e) = cgroup.remove() {
        tracing::warn!("cgroup {} left behind: {e}", path.display());
    }
}

/// Progress samplers: pagemap for mmap readers, fdinfo for read() readers.
#[derive(Default)]
struct Samplers {
    /// State: the file's length.
    mmap: Follower<u64>,
    /// State: the descriptor the reader opened the file with, once found.
    reads: Follower<Option<u32>>,
    /// Each reader's worker from its environment, read once per pid.
    workers: HashMap<i32, Option<u32>>,
}

impl Samplers {
    fn sample(&mut self) -> Vec<AccessEvent> {
        let mut events = self
            .mmap
            .sample(|pid, path, len, from| furthest_present(pid, path, *len, from));
        // pread() loaders leave the file position alone: where one of their
        // threads is blocked in a pread-family call, its offset is the
        // position (sampled once per process for all its files).
        let mut preads: HashMap<i32, Vec<(PathBuf, u64)>> = HashMap::new();
        for (pid, ..) in &self.reads.readers {
            preads.entry(*pid).or_insert_with(|| blocked_preads(*pid));
        }
        events.extend(self.reads.sample(|pid, path, fd, _| {
            let pread = preads
                .get(&pid)
                .into_iter()
                .flatten()
                .filter(|(p, _)| p == path)
                .map(|&(_, at)| at)
                .max();
            read_position(pid, path, fd).max(pread)
        }));
        events
    }
}

/// Readers followed through one progress signal: for each (pid, file), a
/// sampler state and the furthest offset reported as a `Progress` event.
struct Follower<S> {
    readers: Vec<(i32, PathBuf, S, u64)>,
}

impl<S> Default for Follower<S> {
    fn default() -> Follower<S> {
        Follower {
            readers: Vec::new(),
        }
    }
}

impl<S> Follower<S> {
    fn watch(&mut self, pid: i32, path: &Path, state: S) {
        if !self.readers.iter().any(|r| r.0 == pid && r.1 == path) {
            self.readers.push((pid, path.to_path_buf(), state, 0));
        }
    }

    /// Asks `position(pid, path, state, reported)` where each live reader
    /// is; a position past the last one reported becomes an event.
    fn sample(
        &mut self,
        mut position: impl FnMut(i32, &Path, &mut S, u64) -> Option<u64>,
    ) -> Vec<AccessEvent> {
        self.readers
            .retain(|r| Path::new(&format!("/proc/{}", r.0)).exists());
        let mut events = Vec::new();
        for (pid, path, state, reported) in &mut self.readers {
            match position(*pid, path, state, *reported) {
                Some(at) if at > *reported => {
                    *reported = at;
                    events.push(AccessEvent {
                        pid: *pid,
                        worker: None,
                        path: path.clone(),
                        offset: at,
                        len: 0,
                        kind: AccessKind::Progress,
                    });
                }
                _ => {}
            }
        }
        events
    }
}

/// A read() loader's file position (`/proc/PID/fdinfo/FD`, `pos:`) on the
/// descriptor it opened the model file with. pread() does not move it:
/// [`blocked_preads`] covers those loaders.
fn read_position(pid: i32, path: &Path, fd: &mut Option<u32>) -> Option<u64> {
    // The descriptor found before may be closed by now, or its number
    // reused for another file (a shell's `exec 3< f` may open at one number
    // and move it to 3; a loader closes a shard after its header and opens
    // it again): look again unless it still names the model file.
    let names_path = |n: u32| {
        std::fs::read_link(format!("/proc/{pid}/fd/{n}"))
            .ok()
            .as_deref()
            == Some(path)
    };
    if !fd.is_some_and(names_path) {
        *fd = find_fd(pid, path);
    }
    let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", (*fd)?)).ok()?;
    fdinfo_pos(&info)
}

/// The files and offsets of the pread-family calls (`pread64`, `preadv`,
/// `preadv2`) that `pid`'s threads are blocked in now, from
/// `/proc/PID/task/TID/syscall`. The kernel shows a thread's call only
/// while it sleeps (a cold read waiting for the disk, which is when the
/// position matters: the reader caught up with prefetch); a running thread
/// reads `running`. io_uring reads are not system calls of the reader and
/// stay invisible.
fn blocked_preads(pid: i32) -> Vec<(PathBuf, u64)> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for task in tasks.flatten() {
        let Ok(line) = std::fs::read_to_string(task.path().join("syscall")) else {
            continue;
        };
        let Some((fd, at)) = pread_in_syscall(&line) else {
            continue;
        };
        if let Ok(path) = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")) {
            found.push((path, at));
        }
    }
    found
}

/// `(fd, offset)` of a `/proc/PID/task/TID/syscall` line when the call is
/// in the pread family: `NR fd buf count pos ...` for pread64, `NR fd iov
/// iovcnt pos_l ...` for preadv and preadv2 (the low word is the whole
/// offset on 64-bit kernels).
fn pread_in_syscall(line: &str) -> Option<(u32, u64)> {
    let mut fields = line.split_whitespace();
    let nr: i64 = fields.next()?.parse().ok()?;
    if ![libc::SYS_pread64, libc::SYS_preadv, libc::SYS_preadv2].contains(&nr) {
        return None;
    }
    let args: Vec<u64> = fields
        .take(4)
        .map(|a| u64::from_str_radix(a.strip_prefix("0x")?, 16).ok())
        .collect::<Option<_>>()?;
    let [fd, _, _, at] = args[..] else {
        return None;
    };
    Some((u32::try_from(fd).ok()?, at))
}

/// The descriptor through which `pid` has `path` open, if any.
fn find_fd(pid: i32, path: &Path) -> Option<u32> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    for entry in dir.flatten() {
        if std::fs::read_link(entry.path()).ok().as_deref() == Some(path) {
            return entry.file_name().to_str()?.parse().ok();
        }
    }
    None
}

/// The `pos:` field of an fdinfo file.
fn fdinfo_pos(info: &str) -> Option<u64> {
    info.lines()
        .find_map(|l| l.strip_prefix("pos:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Mmap readers are followed through their mappings: the furthest page a
/// reader has faulted in (pagemap present bit), sampled one page per 2 MiB.
const SAMPLE_STRIDE: u64 = 2 << 20;

/// The end of the furthest sampled block of `path` that `pid` has present
/// in its mapping, scanning from `from`.
fn furthest_present(pid: i32, path: &Path, len: u64, from: u64) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let maps = mapped_addresses(pid, path, 0, len);
    let (addr, mapped_len) = *maps.first()?;
    let pagemap = std::fs::File::open(format!("/proc/{pid}/pagemap")).ok()?;
    let page = sys::page_size();
    let mut furthest = None;
    let mut off = from / SAMPLE_STRIDE * SAMPLE_STRIDE;
    let mut entry = [0u8; 8];
    while off < mapped_len {
        let vpage = (addr + off) / page;
        if pagemap.read_exact_at(&mut entry, vpage * 8).is_err() {
            break;
        }
        if u64::from_le_bytes(entry) >> 63 == 1 {
            furthest = Some((off + SAMPLE_STRIDE).min(mapped_len));
        }
        off += SAMPLE_STRIDE;
    }
    furthest
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Policy, Prefetch};
    use crate::sys::test_util::is_root;

    /// A two-file model, synced and dropped from the page cache (clean
    /// pages only can be dropped), so prefetch has something to do.
    fn model(dir: &Path) -> PathBuf {
        let m = dir.join("model");
        std::fs::create_dir(&m).unwrap();
        for (name, len) in [("a.safetensors", 8usize << 20), ("b.safetensors", 4 << 20)] {
            let path = m.join(name);
            let f = std::fs::File::create(&path).unwrap();
            std::io::Write::write_all(&mut &f, &vec![1u8; len]).unwrap();
            f.sync_all().unwrap();
            crate::sys::dontneed(&f, &path, 0, u64::MAX).unwrap();
        }
        std::fs::write(m.join(".hidden"), b"x").unwrap();
        m
    }

    /// A model on a disk file system, when running as root (else `None`:
    /// the caller skips, as fanotify needs root).
    fn root_model() -> Option<(tempfile::TempDir, PathBuf)> {
        if !is_root() {
            eprintln!("skipped: needs root for fanotify");
            return None;
        }
        let dir = crate::sys::test_util::disk_tempdir()?;
        let m = model(dir.path());
        Some((dir, m))
    }

    fn config(model_dir: &Path, command: &[&str]) -> RunConfig {
        RunConfig {
            model_dir: model_dir.to_path_buf(),
            policy: "native".into(),
            builtin: BuiltinConfig::default(),
            memory_limit: None,
            watermark: 0.8,
            mechanism: Mechanism::WillNeed,
            in_flight_bytes: 64 << 20,
            level: None,
            explicit: false,
            command: command.iter().map(Into::into).collect(),
            trigger_pipe: None,
            launch_quiet: IdleGate::<ProcessTreeIo>::DEFAULT_QUIET,
        }
    }

    /// Sleeps on every event, and panics on the fifth.
    struct Stuck {
        calls: u32,
    }

    impl Policy for Stuck {
        fn name(&self) -> &str {
            "stuck"
        }

        fn on_access(&mut self, _: &AccessEvent) -> Result<Vec<Prefetch>, WarmError> {
            self.calls += 1;
            std::thread::sleep(Duration::from_millis(20));
            assert!(self.calls < 5, "policy bug");
            Ok(Vec::new())
        }
    }

    /// Asks for the whole model at init, as a replay from launch does.
    struct AtInit;

    impl Policy for AtInit {
        fn name(&self) -> &str {
            "at-init"
        }

        fn needs_read_ranges(&self) -> bool {
            false
        }

        fn init(&mut self, ctx: &PolicyContext) -> Result<Vec<Prefetch>, WarmError> {
            let whole = |(path, len): &(PathBuf, u64)| Prefetch {
                stream: 0,
                range: crate::policy::FileRange::new(path, 0, *len),
            };
            Ok(ctx.files.iter().map(whole).collect())
        }
    }

    /// A model, and a cold 128 MiB file outside it that a service can spend
    /// its start-up reading; `None` (skip) without a disk file system or
    /// without /proc/PID/io.
    fn model_and_startup_file() -> Option<(tempfile::TempDir, PathBuf, PathBuf)> {
        if !Path::new("/proc/self/io").exists() {
            eprintln!("skipped: no /proc/PID/io (a kernel without task I/O accounting)");
            return None;
        }
        let dir = crate::sys::test_util::disk_tempdir()?;
        let m = model(dir.path());
        let (f, libs) = crate::sys::test_util::synced_file(&dir, 128 << 20);
        crate::sys::dontneed(&f, &libs, 0, u64::MAX).unwrap();
        Some((dir, m, libs))
    }

    #[test]
    fn prefetch_queued_before_the_first_access_waits_while_the_service_reads() {
        let Some((_dir, m, libs)) = model_and_startup_file() else {
            return;
        };
        // The service only starts up (reads its "libraries") and exits
        // without touching the model: a gate that needs 2 s of quiet holds
        // the launch prefetch back the whole time.
        let startup = format!("cat {} > /dev/null", libs.display());
        let mut c = config(&m, &["sh", "-c", &startup]);
        c.launch_quiet = Duration::from_secs(2);
        let stop = AtomicBool::new(false);
        let held = run_with(&c, Box::new(AtInit), &stop, &mut |_| {}).unwrap();
        assert_eq!(held.exit_code, 0);
        assert_eq!(held.stats.prefetched_bytes, 0, "{held:?}");
        // Without the gate the same prefetch runs alongside the start-up.
        let f = std::fs::File::open(&libs).unwrap();
        crate::sys::dontneed(&f, &libs, 0, u64::MAX).unwrap();
        c.launch_quiet = Duration::ZERO;
        let free = run_with(&c, Box::new(AtInit), &stop, &mut |_| {}).unwrap();
        assert!(free.stats.prefetched_bytes > 0, "{free:?}");
    }

    #[test]
    fn the_first_model_access_lets_launch_prefetch_run() {
        if !is_root() {
            eprintln!("skipped: needs root for fanotify");
            return;
        }
        let Some((_dir, m, libs)) = model_and_startup_file() else {
            return;
        };
        let a = m.join("a.safetensors");
        let service = format!(
            "cat {} > /dev/null; head -c 4096 {} > /dev/null; sleep 0.5",
            libs.display(),
            a.display()
        );
        let mut c = config(&m, &["sh", "-c", &service]);
        c.launch_quiet = Duration::from_secs(60);
        let stop = AtomicBool::new(false);
        let report = run_with(&c, Box::new(AtInit), &stop, &mut |_| {}).unwrap();
        if report.level.is_none() {
            eprintln!("skipped: no fanotify here");
            return;
        }
        assert_eq!(report.exit_code, 0);
        assert!(report.stats.prefetched_bytes > 0, "{report:?}");
    }

    #[test]
    fn workers_come_from_the_loader_environment() {
        assert_eq!(worker_in_environ(b"PATH=/bin\0LOCAL_RANK=3\0"), Some(3));
        assert_eq!(
            worker_in_environ(b"LOCAL_RANK=3\0SLUICE_WORKER=1\0"),
            Some(1)
        );
        assert_eq!(worker_in_environ(b"LOCAL_RANK=x\0"), None);
        assert_eq!(worker_in_environ(b""), None);
        assert_eq!(worker_from_environ(i32::MAX), None);
    }

    #[test]
    fn a_reader_gone_before_its_cgroup_is_read_leaves_the_join_to_the_next() {
        assert_eq!(join_reader_cgroup(i32::MAX), None);
        // Our own cgroup: decided, nothing to move.
        let me = std::process::id() as i32;
        if sys::memory_cgroup_of(me).is_some() {
            assert_eq!(join_reader_cgroup(me), Some(false));
        }
    }

    #[test]
    fn a_vanished_model_file_is_counted_and_the_rest_is_prefetched() {
        let dir = tempfile::tempdir().unwrap();
        let m = model(dir.path());
        let fifo = dir.path().join("run/v.trigger");
        // The service deletes b, then asks for the model: eager fetches a and
        // fails on b without stopping.
        let cmd = format!(
            "rm {}; echo '{{\"path\": \"a.safetensors\"}}' > {}; sleep 0.5",
            m.join("b.safetensors").display(),
            fifo.display()
        );
        let mut c = config(&m, &["sh", "-c", &cmd]);
        c.policy = "eager".into();
        c.explicit = true;
        c.trigger_pipe = Some(fifo);
        let stop = AtomicBool::new(false);
        let report = run(&c, &stop, &mut |_| {}).unwrap();
        assert_eq!(report.exit_code, 0);
        assert!(report.stats.prefetch_errors >= 1, "{report:?}");
        // a is 8 MiB; it may already be cached (the test wrote it), so at most.
        assert!(report.stats.prefetched_bytes <= 8 << 20, "{report:?}");
    }

    #[test]
    fn a_descriptor_number_reused_for_another_file_is_looked_up_again() {
        use std::io::{Seek, SeekFrom};
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, vec![0u8; 8192]).unwrap();
        std::fs::write(&b, vec![0u8; 8192]).unwrap();
        let me = std::process::id() as i32;
        let mut fa = std::fs::File::open(&a).unwrap();
        fa.seek(SeekFrom::Start(100)).unwrap();
        let mut fd = None;
        assert_eq!(read_position(me, &a, &mut fd), Some(100));
        let first = fd.unwrap();
        // a's number now holds b, at another position; a lives on elsewhere.
        let moved = std::fs::File::open(&a).unwrap();
        let mut fb = std::fs::File::open(&b).unwrap();
        fb.seek(SeekFrom::Start(7000)).unwrap();
        // SAFETY: both descriptors are open and owned here; dup2 replaces
        // `first` (fa's) with a copy of fb's.
        assert!(unsafe { libc::dup2(fb.as_raw_fd(), first as i32) } >= 0);
        let mut moved_at = moved;
        moved_at.seek(SeekFrom::Start(300)).unwrap();
        assert_eq!(read_position(me, &a, &mut fd), Some(300), "not b's 7000");
        assert_ne!(fd, Some(first));
        drop(fa); // closes `first`, which holds b now
    }

    #[test]
    fn fdinfo_positions_parse_and_garbage_does_not() {
        assert_eq!(fdinfo_pos("pos:\t4096\nflags:\t02100000\n"), Some(4096));
        assert_eq!(fdinfo_pos("flags: 0\n"), None);
        assert_eq!(fdinfo_pos("pos: lots\n"), None);
        assert_eq!(find_fd(i32::MAX, Path::new("/x")), None);
    }

    #[test]
    fn read_loaders_are_followed_through_their_file_position_with_open_events_only() {
        let Some((_dir, m)) = root_model() else {
            return;
        };
        let a = m.join("a.safetensors");
        // Read 3 MiB through one descriptor, then hold it open a moment.
        let cmd = format!(
            "exec 3< {}; dd bs=1M count=3 <&3 >/dev/null 2>&1; sleep 0.4",
            a.display()
        );
        let mut c = config(&m, &["sh", "-c", &cmd]);
        c.level = Some(Level::Open);
        let stop = AtomicBool::new(false);
        let report = run(&c, &stop, &mut |_| {}).unwrap();
        assert_eq!(report.level, Some(Level::Open));
        let (path, at) = report.stats.last_reader.clone().expect("progress seen");
        assert_eq!(path, a.canonicalize().unwrap());
        assert_eq!(at, 3 << 20, "{report:?}");
    }

    #[test]
    fn pread_calls_parse_from_the_syscall_file_and_others_do_not() {
        let pread = format!(
            "{} 0x7 0x7f00 0x100000 0x500000 0x0 0x0 0x7ffd 0x7f01",
            libc::SYS_pread64
        );
        assert_eq!(pread_in_syscall(&pread), Some((7, 5 << 20)));
        let preadv2 = format!(
            "{} 0x3 0x7f00 0x2 0x1000 0x0 0x8 0x7ffd 0x7f01",
            libc::SYS_preadv2
        );
        assert_eq!(pread_in_syscall(&preadv2), Some((3, 4096)));
        let read = format!(
            "{} 0x3 0x7f00 0x1000 0x0 0x0 0x0 0x7ffd 0x7f01",
            libc::SYS_read
        );
        for line in [
            read.as_str(),
            "running",
            "-1 0x7ffd 0x7f01",
            "",
            "17 0x3 zz 0x1 0x2",
        ] {
            assert_eq!(pread_in_syscall(line), None, "{line:?}");
        }
        assert!(blocked_preads(i32::MAX).is_empty());
    }

    #[test]
    fn pread_loaders_are_followed_through_their_blocked_calls_with_open_events_only() {
        let Some((_dir, m)) = root_model() else {
            return;
        };
        let Some(python) = ["python3", "python"].into_iter().find(|p| {
            Command::new(p)
                .arg("-c")
                .arg("")
                .status()
                .is_ok_and(|s| s.success())
        }) else {
            eprintln!("skipped: no python3 to run a pread loader");
            return;
        };
        let a = m.join("a.safetensors");
        // A pread() loader that keeps rereading 1 MiB at 5 MiB from a cold
        // cache: its file position never moves, each call waits for the disk.
        let script = format!(
            "import os, time\n\
             fd = os.open({a:?}, os.O_RDONLY)\n\
             end = time.monotonic() + 0.8\n\
             while time.monotonic() < end:\n\
             \x20   os.posix_fadvise(fd, 5 << 20, 1 << 20, os.POSIX_FADV_DONTNEED)\n\
             \x20   os.pread(fd, 1 << 20, 5 << 20)\n"
        );
        let mut c = config(&m, &[python, "-c", &script]);
        c.level = Some(Level::Open);
        let stop = AtomicBool::new(false);
        let report = run(&c, &stop, &mut |_| {}).unwrap();
        assert_eq!(report.exit_code, 0, "{report:?}");
        let (path, at) = report.stats.last_reader.clone().expect("progress seen");
        assert_eq!(path, a.canonicalize().unwrap());
        assert_eq!(at, 5 << 20, "{report:?}");
    }

    #[test]
    fn policies_without_read_ranges_watch_opens_only() {
        let Some((_dir, m)) = root_model() else {
            return;
        };
        let cat = format!("cat {} > /dev/null", m.join("a.safetensors").display());
        let stop = AtomicBool::new(false);
        let mut c = config(&m, &["sh", "-c", &cat]);
        let native = run(&c, &stop, &mut |_| {}).unwrap();
        assert_eq!(
            native.level,
            Some(Level::Open),
            "a no-op policy costs readers nothing"
        );
        assert_eq!(native.watch_answered, 0);
        let custom = run_with(&c, Box::new(Stuck { calls: 10 }), &stop, &mut |_| {}).unwrap();
        if custom.level == Some(Level::PreContent) {
            assert!(custom.watch_answered > 0);
        }
        c.level = Some(Level::PreContent);
        match (custom.level, run(&c, &stop, &mut |_| {})) {
            (Some(Level::PreContent), Ok(forced)) => assert_eq!(
                forced.level,
                Some(Level::PreContent),
                "--events pre-content is obeyed"
            ),
            // Asked for and missing (before 6.14, tmpfs): a typed error,
            // not a silent downgrade.
            (_, Err(WarmError::Unsupported { feature, reason })) => {
                assert_eq!(feature, "fanotify", "{reason}");
                assert!(reason.contains("a.safetensors"), "{reason}");
            }
            (level, other) => panic!("auto chose {level:?}, forced gave {other:?}"),
        }
    }

    #[test]
    fn explicit_triggers_reach_the_policy() {
        let dir = tempfile::tempdir().unwrap();
        let m = model(dir.path());
        let fifo = dir.path().join("run/t.trigger");
        let cmd = format!(
            "sleep 0.3; echo '{{\"path\": \"b.safetensors\"}}' > {}; sleep 0.5",
            fifo.display()
        );
        let mut c = config(&m, &["sh", "-c", &cmd]);
        c.policy = "eager".into();
        c.explicit = true;
        c.trigger_pipe = Some(fifo.clone());
        let stop = AtomicBool::new(false);
        let report = run(&c, &stop, &mut |_| {}).unwrap();
        assert_eq!(report.exit_code, 0);
        assert_eq!(report.stats.events, 1, "{report:?}");
        assert_eq!(
            report.stats.prefetched_bytes,
            12 << 20,
            "eager fetched the model"
        );
        assert!(!fifo.exists(), "the pipe is removed at exit");
    }

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
        assert!(model_files(&empty)
            .unwrap_err()
            .to_string()
            .contains("no model files"));
        let err = model_files(&dir.path().join("missing")).unwrap_err();
        assert!(matches!(err, WarmError::Io { .. }), "{err}");
    }

    /// A Hugging Face cache: `snapshots/rev/*.safetensors` are symlinks to
    /// `blobs/*`. Returns the snapshot directory.
    fn hf_layout(dir: &Path) -> PathBuf {
        let m = model(dir);
        let blobs = dir.join("blobs");
        let snap = dir.join("snapshots/rev");
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::rename(&m, &blobs).unwrap();
        for (name, blob) in [
            ("a.safetensors", "a.safetensors"),
            ("b.safetensors", "b.safetensors"),
        ] {
            std::os::unix::fs::symlink(format!("../../blobs/{blob}"), snap.join(name)).unwrap();
        }
        snap
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
        let names = Names::new(&files);
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

    #[test]
    fn readers_of_a_symlinked_model_are_followed_under_the_model_names() {
        if !is_root() {
            eprintln!("skipped: needs root for fanotify");
            return;
        }
        let Some(dir) = crate::sys::test_util::disk_tempdir() else {
            return;
        };
        let snap = hf_layout(dir.path());
        let a = snap.join("a.safetensors");
        let cmd = format!(
            "exec 3< {}; dd bs=1M count=3 <&3 >/dev/null 2>&1; sleep 0.4",
            a.display()
        );
        let mut c = config(&snap, &["sh", "-c", &cmd]);
        c.policy = "eager".into();
        let stop = AtomicBool::new(false);
        let report = run(&c, &stop, &mut |_| {}).unwrap();
        assert_eq!(report.level, Some(Level::Open));
        let (path, at) = report.stats.last_reader.clone().expect("progress seen");
        assert_eq!(path, snap.canonicalize().unwrap().join("a.safetensors"));
        assert_eq!(at, 3 << 20, "{report:?}");
        assert!(report.stats.prefetched_bytes > 0, "{report:?}");
        assert_eq!(report.stats.prefetch_errors, 0, "{report:?}");
    }

    #[test]
    fn a_stuck_and_panicking_policy_never_holds_the_reader_back() {
        let Some((_dir, m)) = root_model() else {
            return;
        };
        let a = m.join("a.safetensors");
        // 64 reads of 128 KiB: far more events than the policy can take at 20 ms each.
        let cmd = format!("dd if={} of=/dev/null bs=128k status=none", a.display());
        let config = config(&m, &["sh", "-c", &cmd]);
        let stop = AtomicBool::new(false);
        let report = run_with(&config, Box::new(Stuck { calls: 0 }), &stop, &mut |_| {}).unwrap();
        assert_eq!(report.exit_code, 0);
        if report.level != Some(Level::PreContent) {
            // Opens only: too few events to reach the fault, and none of
            // them holds the reader.
            eprintln!("skipped: no pre-content events here ({:?})", report.level);
            return;
        }
        assert!(
            report
                .policy_fault
                .as_deref()
                .unwrap_or("")
                .contains("policy bug"),
            "{report:?}"
        );
        assert!(report.watch_events >= 64, "{report:?}");
        assert_eq!(
            report.watch_answered, report.watch_events,
            "every event answered"
        );
    }

    #[test]
    fn explicit_mode_runs_without_fanotify_and_exit_codes_pass_through() {
        let dir = tempfile::tempdir().unwrap();
        let m = model(dir.path());
        let mut c = config(&m, &["sh", "-c", "exit 7"]);
        c.explicit = true;
        let stop = AtomicBool::new(false);
        let report = run(&c, &stop, &mut |_| {}).unwrap();
        assert_eq!((report.exit_code, report.level), (7, None));
        c.command = vec!["/nonexistent/loader".into()];
        let err = run(&c, &stop, &mut |_| {}).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/loader"), "{err}");
        c.policy = "lru".into();
        assert!(run(&c, &stop, &mut |_| {}).is_err());
    }

    #[test]
    fn stop_ends_a_daemon_and_kills_a_service() {
        let dir = tempfile::tempdir().unwrap();
        let m = model(dir.path());
        let mut c = config(&m, &["sleep", "30"]);
        c.explicit = true;
        let stop = AtomicBool::new(false);
        let mut calls = 0;
        let report = run(&c, &stop, &mut |_| {
            calls += 1;
            stop.store(true, Ordering::SeqCst);
        })
        .unwrap();
        assert_eq!(report.exit_code, 128 + libc::SIGKILL);
        c.command.clear();
        stop.store(false, Ordering::SeqCst);
        let report = run(&c, &stop, &mut |_| stop.store(true, Ordering::SeqCst)).unwrap();
        assert_eq!(report.exit_code, 0);
        assert!(calls >= 1);
    }

    #[test]
    fn a_recording_ignores_processes_outside_the_service() {
        let Some((dir, m)) = root_model() else {
            return;
        };
        let (a, b) = (m.join("a.safetensors"), m.join("b.safetensors"));
        // The service reads a; a process the service did not start (a
        // monitoring tool, say) reads b meanwhile.
        let service = format!("sleep 0.3; cat {} > /dev/null; sleep 0.3", a.display());
        let mut c = config(&m, &["sh", "-c", &service]);
        c.policy = "template".into();
        c.builtin.service = Some(crate::template::ServiceId::from_spec("outsiders"));
        c.builtin.template_dir = Some(dir.path().join("templates"));
        c.builtin.record = true;
        let stop = AtomicBool::new(false);
        let outsider = std::thread::spawn(move || {
            for _ in 0..6 {
                std::thread::sleep(Duration::from_millis(100));
                let done = std::process::Command::new("cat").arg(&b).output().unwrap();
                assert!(done.status.success());
            }
        });
        let rec = run(&c, &stop, &mut |_| {}).unwrap();
        outsider.join().unwrap();
        if rec.level != Some(Level::PreContent) {
            // A read() loader this short is recorded from exact ranges only.
            eprintln!("skipped: no pre-content events here ({:?})", rec.level);
            return;
        }
        let store = crate::template::TemplateStore::new(dir.path().join("templates"));
        let t = store
            .load(c.builtin.service.as_ref().unwrap())
            .unwrap()
            .expect("a template was written");
        let read: Vec<&str> = t
            .workers
            .iter()
            .flat_map(|w| &w.ranges)
            .map(|r| t.files[r.file as usize].path.as_str())
            .collect();
        assert_eq!(t.workers.len(), 1, "one worker, the service: {read:?}");
        assert!(
            read.iter().all(|p| *p == "a.safetensors"),
            "only the service's reads: {read:?}"
        );
        assert_eq!(t.total_bytes(), 8 << 20);
    }

    #[test]
    fn a_template_run_prefetches_the_recorded_sequence() {
        let Some((dir, m)) = root_model() else {
            return;
        };
        let templates = dir.path().join("templates");
        let read_all = format!(
            "cat {} {} > /dev/null",
            m.join("a.safetensors").display(),
            m.join("b.safetensors").display()
        );
        let mut c = config(&m, &["sh", "-c", &read_all]);
        c.policy = "template".into();
        c.builtin.service = Some(crate::template::ServiceId::from_spec("rt-test"));
        c.builtin.template_dir = Some(templates.clone());
        c.builtin.record = true;
        let stop = AtomicBool::new(false);
        let rec = run(&c, &stop, &mut |_| {}).unwrap();
        if rec.level != Some(Level::PreContent) {
            eprintln!("skipped: no pre-content events here ({:?})", rec.level);
            return;
        }
        let store = crate::template::TemplateStore::new(templates);
        let t = store
            .load(c.builtin.service.as_ref().unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(t.total_bytes(), 12 << 20);
        // Replay: drop the cache, read the first 128 KiB, then wait a moment.
        for (p, _) in model_files(&m).unwrap() {
            let f = std::fs::File::open(&p).unwrap();
            crate::sys::dontneed(&f, &p, 0, u64::MAX).unwrap();
        }
        c.builtin.record = false;
        // The default mechanism: synchronous, so what was handed over is in
        // the cache when `run` returns (WILLNEED's readahead is best effort:
        // under memory pressure its allocations may give up on a few pages).
        c.mechanism = Mechanism::Populate;
        let first = format!(
            "head -c 131072 {} > /dev/null; sleep 0.5",
            m.join("a.safetensors").display()
        );
        c.command = vec!["sh".into(), "-c".into(), first.into()];
        let replay = run(&c, &stop, &mut |_| {}).unwrap();
        assert_eq!(replay.exit_code, 0);
        assert!(replay.stats.prefetched_bytes >= 11 << 20, "{replay:?}");
        let b = m.join("b.safetensors");
        let f = std::fs::File::open(&b).unwrap();
        let resident = crate::sys::resident_bytes(&f, &b, 0, 0).unwrap();
        let missing: Vec<u64> = (0..(4u64 << 20))
            .step_by(4096)
            .filter(|&at| crate::sys::resident_bytes(&f, &b, at, 4096).unwrap() == 0)
            .collect();
        assert_eq!(
            resident,
            4 << 20,
            "b was prefetched before anyone read it; pages missing at {missing:?}; {replay:?}"
        );
    }
}
