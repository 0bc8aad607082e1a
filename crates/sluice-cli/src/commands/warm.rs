//! `sluice warm`: record, run, daemon, status.
//!
//! `record` and `run` launch the service after `--` and exit with its
//! status, as `env(1)` and `timeout(1)` do: its code, or 128 plus the
//! signal that ended it; warm's own failures are 125, a service command
//! that cannot be executed 126, one not found 127 (see
//! [`crate::launcher_exit_code`]). A live one-line summary goes to stderr
//! on a terminal, and every runtime publishes its state for `status`.
//!
//! SIGINT, SIGTERM and SIGHUP stop the run: the service is sent the signal
//! (unless the terminal sent it to the service already), gets
//! `--grace-period` to exit, and what is left of it is killed; a second
//! signal kills at once.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use sluice_warm::config::{RunMode, WarmEnv, WarmOptions};
use sluice_warm::runtime::{
    self, signal_name, RunConfig, RunReport, ServiceExit, Status, StopRequest,
};
use sluice_warm::status::{self as warm_status, RuntimeStatus};
use sluice_warm::template::TemplateStore;
use sluice_warm::trigger::TriggerRequest;
use sluice_warm::WarmError;

use super::human_bytes as human;
use crate::{WarmCommand, WarmCommonArgs, WarmStatusArgs, WarmTriggerArgs};

fn trigger(args: &WarmTriggerArgs, env: &WarmEnv) -> Result<(), WarmError> {
    let request = TriggerRequest {
        path: args.path.clone(),
        offset: args.offset,
        len: args.len,
        worker: args.worker,
        pid: args.pid,
    };
    sluice_warm::trigger::trigger(env, &request)
}

/// Set by SIGINT, SIGTERM and SIGHUP: the runtime stops and ends the
/// service.
static STOP: StopRequest = StopRequest::new();

extern "C" fn on_signal(signal: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // A terminal's signals (Ctrl-C, hang-up) come from the kernel and went
    // to the whole foreground process group, the service included.
    // SAFETY: with SA_SIGINFO the kernel passes a valid siginfo.
    let from_terminal = !info.is_null() && unsafe { (*info).si_code } == libc::SI_KERNEL;
    STOP.request(signal, from_terminal);
}

pub fn run(command: WarmCommand) -> Result<i32, WarmError> {
    let env = WarmEnv::from_env();
    let pid = std::process::id() as i32;
    let (options, common) = match command {
        WarmCommand::Status(args) => return status(&args, &env).map(|()| 0),
        WarmCommand::Trigger(args) => return trigger(&args, &env).map(|()| 0),
        WarmCommand::Record(args) => {
            let mut o = options(RunMode::Record, args.model, &args.common);
            o.command = args.command;
            o.keep_failed = args.keep_failed;
            o.grace_period = args.grace_period;
            (o, args.common)
        }
        WarmCommand::Run(args) => {
            let mut o = options(RunMode::Run, args.model, &args.common);
            o.policy = args.policy;
            o.memory_limit = args.memory_limit;
            o.command = args.command;
            o.grace_period = args.grace_period;
            (o, args.common)
        }
        WarmCommand::Daemon(args) => {
            let mut o = options(RunMode::Daemon, args.watch, &args.common);
            o.policy = args.policy;
            (o, args.common)
        }
    };
    let mode = options.mode;
    let config = options.into_run_config(&env, pid)?;
    // What a runtime killed before it could clean up left behind.
    if let Err(err) = warm_status::list(&env.run_dir()) {
        tracing::debug!("stale status files: {err}");
    }
    sluice_warm::runtime::sweep_dead_cgroups();
    execute(mode.name(), &common, config, &env)
}

/// The flags every runtime takes, as options.
fn options(mode: RunMode, model_dir: PathBuf, common: &WarmCommonArgs) -> WarmOptions {
    WarmOptions {
        service: common.service.clone(),
        template_dir: common.template_dir.clone(),
        watermark: common.watermark,
        bar_distance: common.bar_distance.clone(),
        start_at_launch: !common.start_at_first_access,
        launch_quiet_ms: common.launch_quiet_ms,
        prefetch: !common.no_prefetch,
        affinity: !common.no_affinity,
        burn_after_reading: !common.no_burn,
        mechanism: common.mechanism.clone(),
        in_flight: common.in_flight.clone(),
        events: common.events.clone(),
        ..WarmOptions::new(mode, model_dir)
    }
}

fn execute(
    mode: &str,
    common: &WarmCommonArgs,
    config: RunConfig,
    env: &WarmEnv,
) -> Result<i32, WarmError> {
    let handlers = super::signals::install(on_signal);
    let live = !common.no_progress && !common.json && std::io::stderr().is_terminal();
    let run_dir = env.run_dir();
    let pid = std::process::id() as i32;
    let mut base = RuntimeStatus {
        pid,
        mode: mode.to_string(),
        policy: config.policy.clone(),
        model_dir: config.model_dir.display().to_string(),
        service: config.builtin.service.map(|s| s.to_hex()),
        events_from: if config.explicit {
            "explicit".into()
        } else {
            "fanotify".into()
        },
        ..RuntimeStatus::default()
    };
    let mut on_status = |s: &Status| {
        base.elapsed_s = s.elapsed.as_secs_f64();
        base.events = s.stats.events;
        base.prefetched_bytes = s.stats.prefetched_bytes;
        base.evicted_bytes = s.stats.evicted_bytes;
        base.superseded_bytes = s.stats.superseded_bytes;
        base.pending_bytes = s.pending_bytes;
        base.reader = s
            .stats
            .last_reader
            .as_ref()
            .map(|(p, o)| (p.display().to_string(), *o));
        if let Err(err) = warm_status::publish(&run_dir, &base) {
            tracing::debug!("status file: {err}");
        }
        if live {
            errout!("\r\x1b[2K{}", summary_line(&base));
            let _ = std::io::stderr().flush();
        }
    };
    let outcome = runtime::run(&config, &STOP, &mut on_status);
    handlers.restore();
    warm_status::retract(&run_dir, pid);
    if live {
        errout!("\r\x1b[2K");
    }
    let report = outcome?;
    print_report(mode, &config, &report, common.json);
    // A recorder that failed (a full disk at the end, say) leaves no template, or an old
    // one: a failure of warm's own, even when the service succeeded.
    if mode == "record" && report.policy_fault.is_some() && !report.recording_discarded {
        errln!("sluice warm: no template was written (the recorder failed: above)");
        if report.exit_code() == 0 {
            return Ok(crate::EXIT_WARM_FAILED);
        }
    }
    Ok(report.exit_code())
}

fn summary_line(s: &RuntimeStatus) -> String {
    let reader = s.reader.as_ref().map_or("-".to_string(), |(p, o)| {
        let name = p.rsplit('/').next().unwrap_or(p);
        format!("{name}@{}", human(*o))
    });
    format!(
        "warm {} {:.1}s: prefetched {}, evicted {}, pending {}, reader {reader}, {} events",
        s.policy,
        s.elapsed_s,
        human(s.prefetched_bytes),
        human(s.evicted_bytes),
        human(s.pending_bytes),
        s.events
    )
}

fn print_report(mode: &str, config: &RunConfig, r: &RunReport, json: bool) {
    let template = match (mode, &config.builtin.service, &config.builtin.template_dir) {
        ("record", Some(id), Some(dir)) if !r.recording_discarded && r.policy_fault.is_none() => {
            let path = TemplateStore::new(dir.clone()).path_for(id);
            path.exists().then(|| path.display().to_string())
        }
        _ => None,
    };
    let level = match (r.level, config.explicit) {
        (_, true) | (None, _) => "explicit".to_string(),
        (Some(l), _) => format!("{l:?}"),
    };
    if json {
        let ending = r.ending.as_ref();
        let service_exit = ending.map(|e| match e.exit {
            ServiceExit::Code(code) => serde_json::json!({ "code": code }),
            ServiceExit::Signal(signal) => {
                serde_json::json!({ "signal": signal, "signal_name": signal_name(signal) })
            }
        });
        let value = serde_json::json!({
            "mode": mode,
            "policy": config.policy,
            "exit_code": r.exit_code(),
            "service_exit": service_exit,
            "oom_killed": r.service_oom_killed(),
            "oom_kills": r.oom_kills,
            "memory_limit": r.memory_limit,
            "stopped_by": ending.and_then(|e| e.stopped_by).map(signal_name),
            "signal_forwarded": ending.is_some_and(|e| e.forwarded),
            "grace_period_s": ending.map(|e| e.grace.as_secs_f64()),
            "leftover_processes": ending.map_or(0, |e| e.leftovers),
            "killed_processes": ending.map_or(0, |e| e.killed),
            "surviving_processes": ending.map_or(0, |e| e.survivors),
            "cgroup_removed": r.cgroup.as_ref().map(|_| r.cgroup_removed),
            "seconds": r.seconds,
            "events_from": level,
            "events": r.stats.events,
            "prefetched_bytes": r.stats.prefetched_bytes,
            "skipped_bytes": r.stats.skipped_bytes,
            "refused_bytes": r.stats.refused_bytes,
            "superseded_bytes": r.stats.superseded_bytes,
            "evicted_bytes": r.stats.evicted_bytes,
            "pauses": r.stats.pauses,
            "prefetch_errors": r.stats.prefetch_errors,
            "policy_fault": r.policy_fault,
            "watch_events": r.watch_events,
            "watch_unanswered": r.watch_unanswered,
            "watch_dropped": r.watch_dropped,
            "recording_discarded": r.recording_discarded,
            "cgroup": r.cgroup.as_ref().map(|p| p.display().to_string()),
            "template": template,
        });
        outln!("{value}");
        return;
    }
    errln!(
        "sluice warm {mode} ({}, events: {level}): {} after {:.2} s; \
         prefetched {}, evicted {}, superseded {}, {} events",
        config.policy,
        service_outcome(r),
        r.seconds,
        human(r.stats.prefetched_bytes),
        human(r.stats.evicted_bytes),
        human(r.stats.superseded_bytes),
        r.stats.events
    );
    if r.watch_unanswered > 0 || r.watch_dropped > 0 {
        errln!(
            "sluice warm: of {} access events, {} permission answers were refused by the kernel \
             and {} events were dropped (logged above)",
            r.watch_events,
            r.watch_unanswered,
            r.watch_dropped
        );
    }
    if let Some(fault) = &r.policy_fault {
        errln!("sluice warm: the policy was disabled: {fault}");
    }
    print_ending(r);
    if r.recording_discarded {
        errln!(
            "sluice warm: the service exited {}: no template written (--keep-failed keeps a \
             failed run's recording)",
            r.exit_code()
        );
    } else if let Some(t) = template {
        errln!("sluice warm: template written to {t}");
    }
}

/// "service exited 3", "service was killed by SIGTERM", "service was
/// OOM-killed (limit 64.0 MiB)"; "no service" for a daemon.
fn service_outcome(r: &RunReport) -> String {
    match (&r.ending, r.memory_limit) {
        (_, Some(limit)) if r.service_oom_killed() => {
            format!("service was OOM-killed (limit {})", human(limit))
        }
        (None, _) => "stopped".to_string(),
        (Some(e), _) => match e.exit {
            ServiceExit::Code(code) => format!("service exited {code}"),
            ServiceExit::Signal(signal) => {
                format!("service was killed by {}", signal_name(signal))
            }
        },
    }
}

/// How the runtime ended the service, when it did more than watch it exit.
fn print_ending(r: &RunReport) {
    let Some(e) = &r.ending else {
        return;
    };
    let grace = e.grace.as_secs_f64();
    if let Some(signal) = e.stopped_by {
        let sent = match e.forwarded {
            true => "sent it to the service",
            false => "the service got it from the terminal",
        };
        let then = match e.killed {
            0 => format!("the service ended within the {grace} s grace period"),
            n => format!(
                "{n} processes still running after the {grace} s grace period (or a second \
                 signal) were killed"
            ),
        };
        errln!(
            "sluice warm: stopped by {}: {sent}; {then}",
            signal_name(signal)
        );
    } else if e.leftovers > 0 {
        errln!(
            "sluice warm: the service left {} processes running: sent SIGTERM, {} killed after \
             the {grace} s grace period",
            e.leftovers,
            e.killed
        );
    }
    if e.survivors > 0 {
        errln!(
            "sluice warm: {} processes of the service did not die after SIGKILL",
            e.survivors
        );
    }
    if let (Some(n @ 1..), Some(limit), false) =
        (r.oom_kills, r.memory_limit, r.service_oom_killed())
    {
        errln!(
            "sluice warm: the OOM killer killed {n} processes in the service's cgroup (limit {})",
            human(limit)
        );
    }
    if let (Some(path), false) = (&r.cgroup, r.cgroup_removed) {
        errln!(
            "sluice warm: cgroup {} left behind (logged above)",
            path.display()
        );
    }
}

fn status(args: &WarmStatusArgs, env: &WarmEnv) -> Result<(), WarmError> {
    let all = warm_status::list(&env.run_dir())?;
    if args.json {
        let text = serde_json::to_string(&all).expect("statuses serialize: plain fields only");
        outln!("{text}");
        return Ok(());
    }
    if all.is_empty() {
        outln!("no warm runtime is running");
    }
    for s in &all {
        outln!("pid {} {}: {}", s.pid, s.mode, summary_line(s));
        if let Some(f) = &s.policy_fault {
            outln!("  policy disabled: {f}");
        }
    }
    Ok(())
}
