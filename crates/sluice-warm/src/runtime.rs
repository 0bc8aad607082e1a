//! `sluice warm run` / `record` / `daemon`: launch a service and the
//! runtime in one cgroup, watch the model files, and drive a policy through
//! the cache manager until the service exits.
//!
//! This module wires the real pieces together; the loop itself is
//! [`Runtime`], generic over the page cache and its event sources, so it is
//! tested without root. The parts:
//! - [`model_files`] and [`ModelNames`]: the model's files and their two
//!   names (in the model directory, and as the kernel names them).
//! - [`EventSource`]: fanotify ([`FanotifySource`]), the trigger pipe
//!   ([`TriggerSource`]), the progress [`Samplers`], scripted events
//!   ([`MemoryEvents`]).
//! - [`Service`]: the launched command ([`ChildService`]), and how it is
//!   ended when the run is stopped or its root exits ([`shutdown`],
//!   asked for through a [`StopRequest`]).
//! - [`enter_cgroup`] / [`join_reader_cgroup`]: where prefetch is charged.
//!
//! Prefetch runs in this process, which sits in the service's cgroup, so
//! the page cache it fills is charged where the limit applies.

mod event_loop;
mod event_source;
mod model_files;
mod samplers;
mod service;
mod service_cgroup;
pub mod shutdown;
mod stop_request;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use event_loop::{Runtime, RuntimeConfig, Status, WorkerLookup};
pub use event_source::{
    EventSource, FanotifySource, Idle, MemoryEvents, SourceCounts, TriggerSource,
};
pub use model_files::{model_files, ModelNames};
pub use samplers::{worker_from_environ, Samplers};
pub use service::{exit_of, signal_name, ChildService, Service, ServiceExit};
pub use service_cgroup::{
    enter_cgroup, join_reader_cgroup, leave_cgroup, remove_cgroup, sweep_dead_cgroups,
    ServiceCgroup,
};
pub use shutdown::{end_service, Ending};
pub use stop_request::StopRequest;

use crate::builtin::{by_name, BuiltinConfig};
use crate::error::WarmError;
use crate::fanotify::{Level, Watch};
use crate::idle_gate::{IdleGate, ProcessTreeIo, ServiceIo};
use crate::kernel::{KernelCache, Mechanism, MemorySource};
use crate::manager::{Manager, ManagerConfig, Stats};
use crate::policy::{Guarded, PolicyContext};
use sluice_engine::numa::NumaMap;
use sluice_engine::page_cache;

/// What to run and how.
#[derive(Clone, Debug)]
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
    /// The loop's timings and bounds.
    pub runtime: RuntimeConfig,
    /// Accelerator → NUMA node overrides (`$SLUICE_NUMA_MAP`), else PCI
    /// sysfs decides.
    pub numa_map: Option<String>,
    /// `record`: write the template even when the service failed.
    pub keep_failed: bool,
    /// How long a stopped service gets to exit before what is left of it
    /// is killed (see [`shutdown`]).
    pub grace: Duration,
    /// Without a cgroup, make this process a child subreaper, so that what the service
    /// detaches is re-parented here and ended with it ([`shutdown::Adoption`]). Only for a
    /// process that runs one runtime at a time and starts no other children meanwhile
    /// (the `sluice warm` command): adopted orphans are reaped, and every child started
    /// after the service but the service itself counts as one.
    pub adopt_orphans: bool,
}

/// How a run went.
#[derive(Debug)]
pub struct RunReport {
    /// How the service ended and what the runtime did to end it; `None`
    /// for a daemon.
    pub ending: Option<Ending>,
    /// The cgroup's memory limit, when one was created.
    pub memory_limit: Option<u64>,
    /// Processes the kernel's OOM killer took in the cgroup; `None`
    /// without a cgroup or where the kernel does not count them.
    pub oom_kills: Option<u64>,
    /// The cgroup was removed after the run (false: left behind, logged).
    pub cgroup_removed: bool,
    pub stats: Stats,
    /// What fanotify could see; `None` in explicit mode.
    pub level: Option<Level>,
    /// Why the policy was disabled, if it was.
    pub policy_fault: Option<String>,
    pub seconds: f64,
    /// The cgroup the service ran in, when one was created.
    pub cgroup: Option<PathBuf>,
    /// fanotify events seen, permission events answered and not answered
    /// (the kernel refused the answer; logged), events dropped because the
    /// policy side was behind or their lengths did not add up.
    pub watch_events: u64,
    pub watch_answered: u64,
    pub watch_unanswered: u64,
    pub watch_dropped: u64,
    /// A recording not written because the service failed.
    pub recording_discarded: bool,
}

impl RunReport {
    /// The service's exit status (128 + signal when killed); 0 for a
    /// daemon.
    pub fn exit_code(&self) -> i32 {
        self.ending.as_ref().map_or(0, |e| e.exit.status())
    }
}

impl RunReport {
    /// The service was killed by the OOM killer: it ended by SIGKILL (or
    /// with 137, as a shell whose child was killed so reports) that the
    /// runtime did not send, and the cgroup counted an OOM kill.
    pub fn service_oom_killed(&self) -> bool {
        let Some(e) = &self.ending else {
            return false;
        };
        let sigkill = matches!(
            e.exit,
            ServiceExit::Signal(libc::SIGKILL) | ServiceExit::Code(137)
        );
        sigkill && e.killed == 0 && self.oom_kills.unwrap_or(0) > 0
    }
}

/// Runs the service under the policy until it exits (or, with no command,
/// until a stop is requested: the daemon); `on_status` is called about
/// every 200 ms (a TTY summary, the status file).
pub fn run(
    config: &RunConfig,
    stop: &StopRequest,
    on_status: &mut dyn FnMut(&Status),
) -> Result<RunReport, WarmError> {
    let policy = by_name(&config.policy, &config.builtin)?;
    if let (true, Some(dir)) = (config.builtin.record, &config.builtin.template_dir) {
        crate::template::TemplateStore::new(dir.clone()).check_writable()?;
    }
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
    policy: Box<dyn crate::policy::WarmPolicy>,
    stop: &StopRequest,
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
    let Some(cgroup) = cgroup else {
        return outcome;
    };
    // Left already when a service ran; not when the run failed before.
    leave_cgroup(&cgroup);
    let removed = remove_cgroup(cgroup);
    outcome.map(|report| RunReport {
        cgroup_removed: removed,
        ..report
    })
}

/// The run inside its cgroup: the page cache, the manager, the watch, the
/// service and the loop.
fn run_in(
    config: &RunConfig,
    ctx: &PolicyContext,
    policy: Box<dyn crate::policy::WarmPolicy>,
    cgroup: Option<&ServiceCgroup>,
    stop: &StopRequest,
    on_status: &mut dyn FnMut(&Status),
) -> Result<RunReport, WarmError> {
    let started = Instant::now();
    let names = ModelNames::new(&ctx.files);
    // The device's per-call readahead: the manager's chunk and the loaders'.
    let chunk_bytes = page_cache::read_ahead_limit(&ctx.files[0].0);
    let mut manager = Manager::new(
        Guarded::new(policy),
        kernel_cache(config, chunk_bytes, &names, cgroup),
        ManagerConfig {
            chunk_bytes,
            watermark: config.watermark,
            ..ManagerConfig::default()
        },
    );
    // The policy decides at init what it needs (a template records or
    // replays), so it starts before the watch.
    manager.start(ctx);
    let watch = open_watch(config, ctx, manager.needs_read_ranges())?;
    let level = watch.as_ref().map(FanotifySource::level);
    // A launched service is a process tree: other processes opening the
    // model files (a monitoring tool, a second service, another child of
    // this process) are not its readers. Before the launch nothing counts;
    // during it events wait for the pid; then only the service's tree counts.
    if let (Some(w), false) = (&watch, config.command.is_empty()) {
        w.no_service_yet();
    }
    if manager.wait_for_init() {
        manager.drain();
    }
    // The trigger pipe exists before the service starts, so a service that
    // writes to it at once finds it (a `>` to a path not yet there would
    // create a plain file the runtime then replaces).
    let triggers = match &config.trigger_pipe {
        Some(pipe) => match crate::trigger::TriggerPipe::create(pipe) {
            Ok(p) => Some(TriggerSource::new(p, ctx.model_dir.clone())),
            Err(err) => {
                tracing::warn!("explicit triggers unavailable: {err}");
                None
            }
        },
        None => None,
    };
    if let (Some(w), false) = (&watch, config.command.is_empty()) {
        w.awaiting_service();
    }
    // Without a cgroup, what the service detaches is followed as the
    // runtime's adopted orphans (see `shutdown`).
    let adoption = match config.adopt_orphans && !config.command.is_empty() && cgroup.is_none() {
        true => shutdown::Adoption::before_launch(),
        false => None,
    };
    let mut service = match config.command.is_empty() {
        true => None,
        false => Some(ChildService::spawn(
            &config.command,
            cgroup.map(ServiceCgroup::service_oom_score),
        )?),
    };
    if let (Some(w), Some(s)) = (&watch, &service) {
        w.only_tree_of(s.pid());
    }
    let mut runtime = Runtime::new(manager, names, config.runtime.clone())
        .with_worker_lookup(worker_from_environ);
    runtime = match watch {
        Some(watch) => runtime.with_source(Box::new(watch)),
        None => runtime.with_source(Box::new(Idle)),
    };
    if let Some(triggers) = triggers {
        runtime = runtime.with_source(Box::new(triggers));
    }
    let sample_every = Duration::from_millis(config.runtime.sample_ms);
    runtime = runtime.with_source(Box::new(Samplers::new(sample_every)));
    // What a policy queues before the service's first model access (a
    // replay from launch) waits for gaps in the service's own start-up I/O.
    if let (Some(s), false) = (&service, config.launch_quiet.is_zero()) {
        let io: Box<dyn ServiceIo> = Box::new(ProcessTreeIo::new(s.pid()));
        runtime = runtime.with_gate(IdleGate::new(io, config.launch_quiet, Instant::now()));
    }
    if config.command.is_empty() && cgroup.is_none() {
        runtime = runtime.with_reader_cgroup_join();
    }
    let root = service.as_ref().map(|s| s.pid());
    // Orphans that exit while the service runs are reaped as the status
    // comes round (every 200 ms), so none stays a zombie.
    let mut status_and_reap = |status: &Status| {
        if let (Some(adoption), Some(root)) = (&adoption, root) {
            adoption.reap(root);
        }
        on_status(status)
    };
    let looped = runtime.run(
        service.as_mut().map(|s| s as &mut dyn Service),
        stop,
        &mut status_and_reap,
    );
    // Whatever ended the loop, the service ends with it.
    let ending = match service.as_mut() {
        Some(service) => Some(end(service, cgroup, adoption.as_ref(), stop, config.grace)?),
        None => None,
    };
    looped?;
    let exit_code = ending.as_ref().map_or(0, |e| e.exit.status());
    // A recording of a failed service may be partial: it is kept only when
    // asked for (the next run would replay it).
    let recording_discarded = config.builtin.record && exit_code != 0 && !config.keep_failed;
    if recording_discarded {
        runtime.manager_mut().discard();
    }
    runtime.finish();
    let counts = runtime.counts();
    let manager = runtime.manager();
    Ok(RunReport {
        ending,
        memory_limit: cgroup.map(|c| c.limit),
        oom_kills: cgroup.and_then(|c| c.cgroup.oom_kills()),
        cgroup_removed: false,
        stats: manager.stats().clone(),
        level,
        policy_fault: manager.policy().fault().map(str::to_string),
        seconds: started.elapsed().as_secs_f64(),
        cgroup: cgroup.map(|c| c.cgroup.path.clone()),
        watch_events: counts.events,
        watch_answered: counts.answered,
        watch_unanswered: counts.unanswered,
        watch_dropped: counts.dropped,
        recording_discarded,
    })
}

/// Ends the service (see [`shutdown`]): with a cgroup, every process in
/// it, after the runtime left it; without, its root's process tree and the
/// orphans the runtime adopted.
fn end(
    service: &mut ChildService,
    cgroup: Option<&ServiceCgroup>,
    adoption: Option<&shutdown::Adoption>,
    stop: &StopRequest,
    grace: Duration,
) -> Result<Ending, WarmError> {
    match cgroup {
        Some(cgroup) => {
            leave_cgroup(cgroup);
            let mut processes = shutdown::CgroupProcesses(&cgroup.cgroup);
            end_service(service, &mut processes, stop, grace)
        }
        None => {
            let mut processes = shutdown::ProcessTree::new(service.pid(), adoption);
            end_service(service, &mut processes, stop, grace)
        }
    }
}

/// The kernel's page cache for this run, its memory read from the run's
/// cgroup (or this process's), its loaders per NUMA node.
fn kernel_cache(
    config: &RunConfig,
    chunk_bytes: u64,
    names: &ModelNames,
    cgroup: Option<&ServiceCgroup>,
) -> KernelCache {
    let memory = match cgroup {
        Some(c) => MemorySource::Cgroup {
            cgroup: c.cgroup.clone(),
            limit: c.limit,
        },
        None => MemorySource::Pid(std::process::id() as i32),
    };
    let mut cache = KernelCache::new(
        config.mechanism,
        chunk_bytes,
        config.in_flight_bytes,
        memory,
        NumaMap::detect(config.numa_map.as_deref()),
    );
    cache.set_real_names(names.real_names().clone());
    cache
}

/// The fanotify watch over the model files, or `None` in explicit mode.
/// Pre-content events make every read wait for an answer, and the kernel
/// turns readahead off for files watched so: they are asked for only when
/// the policy needs exact read ranges (or the user insists). Where no
/// fanotify works and none was insisted on, the run goes on without.
fn open_watch(
    config: &RunConfig,
    ctx: &PolicyContext,
    needs_read_ranges: bool,
) -> Result<Option<FanotifySource>, WarmError> {
    if config.explicit {
        return Ok(None);
    }
    let level = match config.level {
        None if !needs_read_ranges => Some(Level::Open),
        level => level,
    };
    let paths: Vec<PathBuf> = ctx.files.iter().map(|(p, _)| p.clone()).collect();
    match Watch::open(&paths, level, config.runtime.event_queue) {
        Ok(w) => Ok(Some(FanotifySource::new(w))),
        Err(err) if config.level.is_none() => {
            tracing::warn!("{err}; running in explicit mode (no access events)");
            Ok(None)
        }
        Err(err) => Err(err),
    }
}
