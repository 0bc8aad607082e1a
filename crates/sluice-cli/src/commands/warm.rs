//! `sluice warm`: record, run, daemon, status.
//!
//! `record` and `run` launch the service after `--` and return its exit
//! status; errors before it starts map to the usual statuses (2 bad option,
//! 3 bad template, 4 missing file). A live one-line summary goes to stderr
//! on a terminal, and every runtime publishes its state for `status`.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use sluice_warm::config::{RunMode, WarmEnv, WarmOptions};
use sluice_warm::runtime::{self, RunConfig, RunReport, Status};
use sluice_warm::status::{self as warm_status, RuntimeStatus};
use sluice_warm::template::TemplateStore;
use sluice_warm::trigger::TriggerRequest;
use sluice_warm::WarmError;

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

/// Set by SIGINT/SIGTERM: the runtime stops (and stops the service).
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
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
            (o, args.common)
        }
        WarmCommand::Run(args) => {
            let mut o = options(RunMode::Run, args.model, &args.common);
            o.policy = args.policy;
            o.memory_limit = args.memory_limit;
            o.command = args.command;
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
    execute(mode.name(), &common, config, &env)
}

/// The flags every runtime takes, as options.
fn options(mode: RunMode, model_dir: PathBuf, common: &WarmCommonArgs) -> WarmOptions {
    WarmOptions {
        service: common.service.clone(),
        template_dir: common.template_dir.clone(),
        watermark: common.watermark,
        bar_distance: common.bar_distance.clone(),
        start_at_launch: common.start_at_launch,
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
    install_signal_handlers();
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
            eprint!("\r\x1b[2K{}", summary_line(&base));
            let _ = std::io::stderr().flush();
        }
    };
    let outcome = runtime::run(&config, &STOP, &mut on_status);
    warm_status::retract(&run_dir, pid);
    if live {
        eprint!("\r\x1b[2K");
    }
    let report = outcome?;
    print_report(mode, &config, &report, common.json);
    Ok(report.exit_code)
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

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

fn print_report(mode: &str, config: &RunConfig, r: &RunReport, json: bool) {
    let template = match (mode, &config.builtin.service, &config.builtin.template_dir) {
        ("record", Some(id), Some(dir)) if !r.recording_discarded => {
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
        let value = serde_json::json!({
            "mode": mode,
            "policy": config.policy,
            "exit_code": r.exit_code,
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
        println!("{value}");
        return;
    }
    eprintln!(
        "sluice warm {mode} ({}, events: {level}): service exited {} after {:.2} s; \
         prefetched {}, evicted {}, superseded {}, {} events",
        config.policy,
        r.exit_code,
        r.seconds,
        human(r.stats.prefetched_bytes),
        human(r.stats.evicted_bytes),
        human(r.stats.superseded_bytes),
        r.stats.events
    );
    if r.watch_unanswered > 0 || r.watch_dropped > 0 {
        eprintln!(
            "sluice warm: of {} access events, {} permission answers were refused by the kernel \
             and {} events were dropped (logged above)",
            r.watch_events, r.watch_unanswered, r.watch_dropped
        );
    }
    if let Some(fault) = &r.policy_fault {
        eprintln!("sluice warm: the policy was disabled: {fault}");
    }
    if r.recording_discarded {
        eprintln!(
            "sluice warm: the service exited {}: no template written (--keep-failed keeps a \
             failed run's recording)",
            r.exit_code
        );
    } else if let Some(t) = template {
        eprintln!("sluice warm: template written to {t}");
    }
}

fn status(args: &WarmStatusArgs, env: &WarmEnv) -> Result<(), WarmError> {
    let all = warm_status::list(&env.run_dir())?;
    if args.json {
        let text = serde_json::to_string(&all).expect("statuses serialize: plain fields only");
        println!("{text}");
        return Ok(());
    }
    if all.is_empty() {
        println!("no warm runtime is running");
    }
    for s in &all {
        println!("pid {} {}: {}", s.pid, s.mode, summary_line(s));
        if let Some(f) = &s.policy_fault {
            println!("  policy disabled: {f}");
        }
    }
    Ok(())
}
