//! `sluice warm`: record, run, daemon, status.
//!
//! `record` and `run` launch the service after `--` and return its exit
//! status; errors before it starts map to the usual statuses (2 bad option,
//! 3 bad template, 4 missing file). A live one-line summary goes to stderr
//! on a terminal, and every runtime publishes its state for `status`.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use sluice_warm::builtin::BuiltinConfig;
use sluice_warm::fanotify::Level;
use sluice_warm::runtime::{self, RunConfig, RunReport, Status};
use sluice_warm::status::{self as warm_status, RuntimeStatus};
use sluice_warm::template::{ServiceId, TemplateStore};
use sluice_warm::WarmError;

use crate::{WarmCommand, WarmCommonArgs, WarmStatusArgs, WarmTriggerArgs};

/// The trigger pipe of the runtime with this pid.
fn trigger_pipe_of(pid: i32) -> PathBuf {
    warm_status::run_dir().join(format!("{pid}.trigger"))
}

fn trigger(args: &WarmTriggerArgs) -> Result<(), WarmError> {
    let pid = match args.pid {
        Some(pid) => pid,
        None => {
            let running = warm_status::list(&warm_status::run_dir())?;
            match running.as_slice() {
                [one] => one.pid,
                [] => return Err(WarmError::Config("no warm runtime is running".into())),
                many => {
                    let pids: Vec<String> = many.iter().map(|s| s.pid.to_string()).collect();
                    return Err(WarmError::Config(format!(
                        "{} runtimes are running (pids {}): choose one with --pid",
                        many.len(),
                        pids.join(", ")
                    )));
                }
            }
        }
    };
    let line = serde_json::json!({
        "path": args.path,
        "offset": args.offset,
        "len": args.len,
        "worker": args.worker,
    });
    sluice_warm::trigger::send(&trigger_pipe_of(pid), &line.to_string())
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
    match command {
        WarmCommand::Status(args) => status(&args).map(|()| 0),
        WarmCommand::Trigger(args) => trigger(&args).map(|()| 0),
        WarmCommand::Record(args) => {
            let mut config = run_config(&args.common, "template", None, args.model, args.command)?;
            config.builtin.record = true;
            execute("record", &args.common, config)
        }
        WarmCommand::Run(args) => {
            let limit = args.memory_limit.as_deref().map(bytes).transpose()?;
            let config = run_config(&args.common, &args.policy, limit, args.model, args.command)?;
            execute("run", &args.common, config)
        }
        WarmCommand::Daemon(args) => {
            let config = run_config(&args.common, &args.policy, None, args.watch, Vec::new())?;
            execute("daemon", &args.common, config)
        }
    }
}

fn bytes(s: &str) -> Result<u64, WarmError> {
    sluice_load::parse_bytes(s).map_err(WarmError::Config)
}

/// The template directory: flag, `$SLUICE_TEMPLATE_DIR`, XDG cache, ~/.cache.
pub fn template_dir(flag: Option<PathBuf>) -> PathBuf {
    if let Some(dir) = flag.or_else(|| std::env::var_os("SLUICE_TEMPLATE_DIR").map(PathBuf::from)) {
        return dir;
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/cache"));
    cache.join("sluice/templates")
}

/// A 64-hex-digit id as given, else the hash of the spec.
fn service_id(spec: &str) -> ServiceId {
    if spec.len() == 64 {
        if let Ok(id) = ServiceId::parse_hex(spec) {
            return id;
        }
    }
    ServiceId::from_spec(spec)
}

fn run_config(
    common: &WarmCommonArgs,
    policy: &str,
    memory_limit: Option<u64>,
    model_dir: PathBuf,
    command: Vec<std::ffi::OsString>,
) -> Result<RunConfig, WarmError> {
    if !(common.watermark > 0.0 && common.watermark <= 1.0) {
        return Err(WarmError::Config(format!(
            "--watermark {} is not in (0, 1]",
            common.watermark
        )));
    }
    let service = common.service.as_deref().map(service_id);
    if policy == "template" && service.is_none() {
        return Err(WarmError::Config(
            "the template policy needs --service (the spec its template is recorded for)".into(),
        ));
    }
    let (level, explicit) = match common.events.as_str() {
        "auto" => (None, false),
        "pre-content" => (Some(Level::PreContent), false),
        "open" => (Some(Level::Open), false),
        "explicit" => (None, true),
        other => {
            return Err(WarmError::Config(format!(
                "--events {other:?}: use auto, pre-content, open or explicit"
            )))
        }
    };
    Ok(RunConfig {
        model_dir,
        policy: policy.to_string(),
        builtin: BuiltinConfig {
            service,
            spec: common.service.clone().unwrap_or_default(),
            template_dir: Some(template_dir(common.template_dir.clone())),
            prefetch: !common.no_prefetch,
            affinity: !common.no_affinity,
            burn_after_reading: !common.no_burn,
            record: false,
            start_at_launch: common.start_at_launch && !command.is_empty(),
            bar_distance_bytes: match common.bar_distance.as_str() {
                "auto" => memory_limit.map_or(1 << 30, |l| (l / 8).min(1 << 30)),
                other => bytes(other)?,
            },
        },
        memory_limit,
        watermark: common.watermark,
        mechanism: common.mechanism.parse()?,
        in_flight_bytes: bytes(&common.in_flight)?,
        level,
        explicit,
        command,
        trigger_pipe: Some(trigger_pipe_of(std::process::id() as i32)),
        launch_quiet: std::time::Duration::from_millis(common.launch_quiet_ms),
        runtime: runtime::RuntimeConfig::default(),
    })
}

fn execute(mode: &str, common: &WarmCommonArgs, config: RunConfig) -> Result<i32, WarmError> {
    install_signal_handlers();
    let live = !common.no_progress && !common.json && std::io::stderr().is_terminal();
    let run_dir = warm_status::run_dir();
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
        ("record", Some(id), Some(dir)) => {
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
            "superseded_bytes": r.stats.superseded_bytes,
            "evicted_bytes": r.stats.evicted_bytes,
            "pauses": r.stats.pauses,
            "prefetch_errors": r.stats.prefetch_errors,
            "policy_fault": r.policy_fault,
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
    if let Some(fault) = &r.policy_fault {
        eprintln!("sluice warm: the policy was disabled: {fault}");
    }
    if let Some(t) = template {
        eprintln!("sluice warm: template written to {t}");
    }
}

fn status(args: &WarmStatusArgs) -> Result<(), WarmError> {
    let all = warm_status::list(&warm_status::run_dir())?;
    if args.json {
        let text = serde_json::to_string(&all).map_err(|e| WarmError::Config(e.to_string()))?;
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
