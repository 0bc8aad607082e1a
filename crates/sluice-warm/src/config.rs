//! A warm runtime's options as a user gives them (CLI flags, keyword
//! arguments), their defaults, their checks, and what they become: a
//! [`RunConfig`].
//!
//! Every default is written once, here, and the fronts read it from here
//! (the CLI's flag defaults are these constants). Every check is made here,
//! so each front accepts and refuses the same things, and a bad value is a
//! [`WarmConfigError`] naming the option, the value and what it must be.
//!
//! The environment is read in one place, [`WarmEnv::from_vars`], and every
//! override is logged.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use crate::builtin::BuiltinConfig;
use crate::fanotify::Level;
use crate::idle_gate::{IdleGate, ProcessTreeIo};
use crate::runtime::{RunConfig, RuntimeConfig};
use crate::template::ServiceId;

pub use crate::env::WarmEnv;
pub use crate::error::WarmConfigError;
pub use crate::manager::DEFAULT_WATERMARK;

/// The policy `run` and `daemon` use: the MAIO template (it records on the
/// first run of a service and replays afterwards).
pub const DEFAULT_POLICY: &str = "template";

/// Prefetch mechanism: `MADV_POPULATE_READ` on loader threads, whose 2 MiB
/// folios evict and measure 10-50x faster than WILLNEED's 4 KiB ones, for
/// the fastest loads and the least runtime CPU (docs/design/warm.md).
pub const DEFAULT_MECHANISM: &str = "populate";

/// Prefetch bytes in flight. 16 MiB measured best on this kind of machine:
/// deeper queues delay the service's own start-up reads (libraries,
/// configs) behind prefetch.
pub const DEFAULT_IN_FLIGHT: &str = "16MiB";

/// Access events: the best the kernel and file system allow.
pub const DEFAULT_EVENTS: &str = "auto";

/// How far behind the reader burn-after-reading stops: `auto` is
/// [`AUTO_BAR_DISTANCE_BYTES`], capped at an eighth of the memory limit.
pub const DEFAULT_BAR_DISTANCE: &str = "auto";

/// Seed 000's bar distance: data just read may not have reached the
/// accelerator yet.
pub const AUTO_BAR_DISTANCE_BYTES: u64 = 1 << 30;

/// Until the service first touches the model, prefetch waits for this much
/// quiet in the service's own storage reads ([`IdleGate::DEFAULT_QUIET`]).
pub const DEFAULT_LAUNCH_QUIET_MS: u64 =
    IdleGate::<ProcessTreeIo>::DEFAULT_QUIET.as_millis() as u64;

/// How long a stopped service (SIGINT, SIGTERM or SIGHUP to the runtime)
/// gets to exit before everything left of it is killed. 10 s, as `docker
/// stop`: long enough for a server to close its sockets and flush its logs,
/// short enough for a person at a terminal (systemd's 90 s is not).
pub const DEFAULT_GRACE_PERIOD: &str = "10s";

/// The smallest `--memory-limit` a run accepts: 32 MiB. The runtime's own
/// allocations after it joins the cgroup come to about 1.5 MiB, its default
/// prefetch window is 16 MiB of page cache, and a bare Python interpreter
/// starts in 8 MiB (measured with `memory.max_usage_in_bytes`, 2026-11-26);
/// below that not even the start-up fits, and the kernel's OOM killer, not
/// the policy, decides the run (a 2 MiB limit killed the runtime itself).
pub const MIN_MEMORY_LIMIT_BYTES: u64 = 32 << 20;

/// The access-event choices `--events` takes.
const EVENT_CHOICES: &str = "use auto, pre-content, open or explicit";

/// What a runtime does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunMode {
    /// Run the service once and record its template.
    Record,
    /// Run the service under a policy.
    Run,
    /// Watch a model directory for services started elsewhere, until stopped.
    Daemon,
}

impl RunMode {
    /// The name the CLI and the status files use.
    pub fn name(self) -> &'static str {
        match self {
            RunMode::Record => "record",
            RunMode::Run => "run",
            RunMode::Daemon => "daemon",
        }
    }
}

/// A warm runtime's options, as given.
#[derive(Clone, Debug)]
pub struct WarmOptions {
    pub mode: RunMode,
    /// The model directory the service loads (or the daemon watches).
    pub model_dir: PathBuf,
    /// A built-in policy name or a Python `module:Class`.
    pub policy: String,
    /// The service's spec string (hashed into its id), or the
    /// 64-hex-digit id itself.
    pub service: Option<String>,
    /// Where templates live; see [`WarmEnv::template_dir`].
    pub template_dir: Option<PathBuf>,
    /// A cgroup memory limit for the service and the runtime (`run` only),
    /// as a size (`6GiB`).
    pub memory_limit: Option<String>,
    /// See [`DEFAULT_WATERMARK`].
    pub watermark: f64,
    /// A size, or `auto` (see [`DEFAULT_BAR_DISTANCE`]).
    pub bar_distance: String,
    /// Template: replay from launch (the default) rather than from the
    /// service's first model access.
    pub start_at_launch: bool,
    /// See [`DEFAULT_LAUNCH_QUIET_MS`]; 0 lets launch prefetch run at once.
    pub launch_quiet_ms: u64,
    /// Template breakdown: prefetch along the template.
    pub prefetch: bool,
    /// Template breakdown: place prefetch near each worker's accelerator.
    pub affinity: bool,
    /// Template breakdown: evict what every reader passed.
    pub burn_after_reading: bool,
    /// `populate`, `willneed` or `read` (see [`DEFAULT_MECHANISM`]).
    pub mechanism: String,
    /// A size (see [`DEFAULT_IN_FLIGHT`]).
    pub in_flight: String,
    /// `auto`, `pre-content`, `open` or `explicit`.
    pub events: String,
    /// The service command; empty for a daemon.
    pub command: Vec<OsString>,
    /// `record`: keep the recording when the service fails (it may be
    /// partial, and the next `run` would replay it).
    pub keep_failed: bool,
    /// A duration (see [`DEFAULT_GRACE_PERIOD`]): `10s`, `500ms`, `2.5`.
    pub grace_period: String,
}

impl WarmOptions {
    /// The defaults for `mode` over `model_dir`.
    pub fn new(mode: RunMode, model_dir: PathBuf) -> WarmOptions {
        WarmOptions {
            mode,
            model_dir,
            policy: DEFAULT_POLICY.into(),
            service: None,
            template_dir: None,
            memory_limit: None,
            watermark: DEFAULT_WATERMARK,
            bar_distance: DEFAULT_BAR_DISTANCE.into(),
            start_at_launch: true,
            launch_quiet_ms: DEFAULT_LAUNCH_QUIET_MS,
            prefetch: true,
            affinity: true,
            burn_after_reading: true,
            mechanism: DEFAULT_MECHANISM.into(),
            in_flight: DEFAULT_IN_FLIGHT.into(),
            events: DEFAULT_EVENTS.into(),
            command: Vec::new(),
            keep_failed: false,
            grace_period: DEFAULT_GRACE_PERIOD.into(),
        }
    }

    /// Checks every option and builds the run's configuration; `pid` names
    /// the runtime's trigger pipe. `record` always uses the template
    /// policy; a daemon launches nothing.
    pub fn into_run_config(self, env: &WarmEnv, pid: i32) -> Result<RunConfig, WarmConfigError> {
        if !(self.watermark > 0.0 && self.watermark <= 1.0) {
            return Err(invalid("watermark", self.watermark, "must be in (0, 1]"));
        }
        let policy = match self.mode {
            RunMode::Record => "template".to_string(),
            _ => self.policy,
        };
        let service = self.service.as_deref().map(service_id);
        if policy == "template" && service.is_none() {
            return Err(WarmConfigError::Missing {
                policy: "template",
                option: "service",
                why: "the spec its template is recorded for",
            });
        }
        let memory_limit = match (&self.memory_limit, self.mode) {
            (Some(limit), RunMode::Run) => Some(memory_limit(limit)?),
            _ => None,
        };
        let (level, explicit) = events(&self.events)?;
        let command = match self.mode {
            RunMode::Daemon => Vec::new(),
            _ => self.command,
        };
        Ok(RunConfig {
            model_dir: self.model_dir,
            builtin: BuiltinConfig {
                service,
                spec: self.service.unwrap_or_default(),
                template_dir: Some(env.template_dir(self.template_dir)),
                prefetch: self.prefetch,
                affinity: self.affinity,
                burn_after_reading: self.burn_after_reading,
                record: self.mode == RunMode::Record,
                start_at_launch: self.start_at_launch && !command.is_empty(),
                bar_distance_bytes: bar_distance(&self.bar_distance, memory_limit)?,
            },
            policy,
            memory_limit,
            watermark: self.watermark,
            mechanism: self.mechanism.parse()?,
            in_flight_bytes: size("in-flight", &self.in_flight)?,
            level,
            explicit,
            command,
            trigger_pipe: Some(env.trigger_pipe(pid)),
            launch_quiet: Duration::from_millis(self.launch_quiet_ms),
            runtime: RuntimeConfig::default(),
            numa_map: env.numa_map.clone(),
            keep_failed: self.keep_failed,
            grace: duration("grace-period", &self.grace_period)?,
            // The `sluice warm` process runs this one runtime.
            adopt_orphans: true,
        })
    }
}

fn invalid(option: &'static str, value: impl ToString, expected: &'static str) -> WarmConfigError {
    WarmConfigError::Invalid {
        option,
        value: value.to_string(),
        expected,
    }
}

/// A size option (`512MiB`, `1.5G`, `4096`).
fn size(option: &'static str, value: &str) -> Result<u64, WarmConfigError> {
    sluice_formats::parse_bytes(value).map_err(|e| match e.contains("out of range") {
        true => invalid(option, value, "is out of range (a size below 16 EiB)"),
        false => invalid(option, value, "must be a size like 4096, 512KiB or 6GiB"),
    })
}

/// A memory limit, at least [`MIN_MEMORY_LIMIT_BYTES`].
fn memory_limit(value: &str) -> Result<u64, WarmConfigError> {
    let bytes = size("memory-limit", value)?;
    if bytes < MIN_MEMORY_LIMIT_BYTES {
        return Err(invalid(
            "memory-limit",
            value,
            "must be at least 32MiB: the runtime, its 16 MiB prefetch window and the \
             service's start-up must fit in it",
        ));
    }
    Ok(bytes)
}

/// A duration option: seconds (`10`, `2.5`, `10s`) or milliseconds
/// (`500ms`).
fn duration(option: &'static str, value: &str) -> Result<Duration, WarmConfigError> {
    let (number, scale) = match value.strip_suffix("ms") {
        Some(ms) => (ms, 1e-3),
        None => (value.strip_suffix('s').unwrap_or(value), 1.0),
    };
    number
        .trim()
        .parse::<f64>()
        .ok()
        .and_then(|n| Duration::try_from_secs_f64(n * scale).ok())
        .ok_or_else(|| invalid(option, value, "must be a duration like 10s, 2.5 or 500ms"))
}

/// `auto`: [`AUTO_BAR_DISTANCE_BYTES`], at most an eighth of the memory
/// limit (measured faster under tight limits); else a size.
fn bar_distance(value: &str, memory_limit: Option<u64>) -> Result<u64, WarmConfigError> {
    match value {
        "auto" => Ok(memory_limit.map_or(AUTO_BAR_DISTANCE_BYTES, |limit| {
            (limit / 8).min(AUTO_BAR_DISTANCE_BYTES)
        })),
        other => size("bar-distance", other),
    }
}

/// The fanotify level to insist on, and whether to run without fanotify.
fn events(value: &str) -> Result<(Option<Level>, bool), WarmConfigError> {
    match value {
        "auto" => Ok((None, false)),
        "pre-content" => Ok((Some(Level::PreContent), false)),
        "open" => Ok((Some(Level::Open), false)),
        "explicit" => Ok((None, true)),
        other => Err(invalid("events", format!("{other:?}"), EVENT_CHOICES)),
    }
}

/// A 64-hex-digit id as given, else the hash of the spec.
pub fn service_id(spec: &str) -> ServiceId {
    if spec.len() == 64 {
        if let Ok(id) = ServiceId::parse_hex(spec) {
            return id;
        }
    }
    ServiceId::from_spec(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::Mechanism;
    use std::path::Path;

    fn options(mode: RunMode) -> WarmOptions {
        let mut o = WarmOptions::new(mode, PathBuf::from("/models/m"));
        o.service = Some("svc".into());
        o.command = vec!["serve".into()];
        o
    }

    fn env() -> WarmEnv {
        WarmEnv::from_vars(|name| match name {
            "HOME" => Some("/home/u".into()),
            "SLUICE_RUN_DIR" => Some("/run/x".into()),
            _ => None,
        })
    }

    #[test]
    fn defaults_become_a_run_config_with_the_documented_values() {
        let c = options(RunMode::Run).into_run_config(&env(), 42).unwrap();
        assert_eq!(c.policy, "template");
        assert_eq!(c.watermark, DEFAULT_WATERMARK);
        assert_eq!(c.mechanism, Mechanism::Populate);
        assert_eq!(c.in_flight_bytes, 16 << 20);
        assert_eq!((c.level, c.explicit), (None, false));
        assert_eq!(c.builtin.bar_distance_bytes, AUTO_BAR_DISTANCE_BYTES);
        assert_eq!(c.launch_quiet, Duration::from_millis(150));
        assert_eq!(c.grace, Duration::from_secs(10));
        assert_eq!(
            c.builtin.template_dir.as_deref(),
            Some(Path::new("/home/u/.cache/sluice/templates"))
        );
        assert_eq!(
            c.trigger_pipe.as_deref(),
            Some(Path::new("/run/x/42.trigger"))
        );
        assert_eq!(c.builtin.service, Some(ServiceId::from_spec("svc")));
    }

    #[test]
    fn modes_decide_the_policy_the_command_and_the_limit() {
        let mut rec = options(RunMode::Record);
        rec.policy = "eager".into();
        rec.memory_limit = Some("2GiB".into());
        let c = rec.into_run_config(&env(), 1).unwrap();
        assert_eq!(
            (c.policy.as_str(), c.builtin.record, c.memory_limit),
            ("template", true, None)
        );
        // Replay starts at launch unless asked otherwise (issue 12, item 10);
        // a daemon has no launch.
        let c = options(RunMode::Run).into_run_config(&env(), 1).unwrap();
        assert!(c.builtin.start_at_launch);
        let mut first = options(RunMode::Run);
        first.start_at_launch = false;
        assert!(
            !first
                .into_run_config(&env(), 1)
                .unwrap()
                .builtin
                .start_at_launch
        );
        let mut daemon = options(RunMode::Daemon);
        daemon.start_at_launch = true;
        let c = daemon.into_run_config(&env(), 1).unwrap();
        assert!(c.command.is_empty() && !c.builtin.start_at_launch);
        let mut run = options(RunMode::Run);
        run.memory_limit = Some("4GiB".into());
        run.grace_period = "250ms".into();
        let c = run.into_run_config(&env(), 1).unwrap();
        assert_eq!(c.memory_limit, Some(4 << 30));
        assert_eq!(c.grace, Duration::from_millis(250));
        for (given, seconds) in [("0", 0.0), ("2.5", 2.5), ("3s", 3.0)] {
            assert_eq!(
                duration("grace-period", given).unwrap().as_secs_f64(),
                seconds
            );
        }
        let mut floor = options(RunMode::Run);
        floor.memory_limit = Some("32MiB".into());
        assert_eq!(
            floor.into_run_config(&env(), 1).unwrap().memory_limit,
            Some(MIN_MEMORY_LIMIT_BYTES)
        );
        assert_eq!(
            c.builtin.bar_distance_bytes,
            512 << 20,
            "an eighth of the limit"
        );
    }

    #[test]
    fn bad_options_name_the_option_and_the_value() {
        type Breaks = fn(&mut WarmOptions);
        let cases: Vec<(Breaks, &str)> = vec![
            (|o| o.watermark = 0.0, "--watermark 0"),
            (|o| o.watermark = 1.5, "--watermark 1.5"),
            (|o| o.watermark = f64::NAN, "--watermark NaN"),
            (|o| o.events = "all".into(), "--events \"all\""),
            (|o| o.mechanism = "mmap".into(), "--mechanism \"mmap\""),
            (|o| o.in_flight = "lots".into(), "--in-flight lots"),
            (|o| o.bar_distance = "-1".into(), "--bar-distance -1"),
            (
                |o| o.memory_limit = Some("6 parsecs".into()),
                "--memory-limit 6 parsecs",
            ),
            (
                |o| o.memory_limit = Some("2MiB".into()),
                "--memory-limit 2MiB: must be at least 32MiB",
            ),
            (
                |o| o.memory_limit = Some("0".into()),
                "--memory-limit 0: must be at least 32MiB",
            ),
            (|o| o.grace_period = "soon".into(), "--grace-period soon"),
            (|o| o.grace_period = "-1s".into(), "--grace-period -1s"),
            (|o| o.service = None, "needs --service"),
        ];
        for (break_it, needle) in cases {
            let mut o = options(RunMode::Run);
            break_it(&mut o);
            let err = o.into_run_config(&env(), 1).unwrap_err();
            assert!(err.to_string().contains(needle), "{needle}: {err}");
        }
        let mut eager = options(RunMode::Run);
        eager.policy = "eager".into();
        eager.service = None;
        assert!(
            eager.into_run_config(&env(), 1).is_ok(),
            "only template needs a service"
        );
    }

    #[test]
    fn the_environment_is_read_once_with_its_fallbacks() {
        let e = WarmEnv::from_vars(|name| match name {
            "SLUICE_TEMPLATE_DIR" => Some("/shared/t".into()),
            "XDG_CACHE_HOME" => Some("/xdg".into()),
            "HOME" => Some("/home/u".into()),
            _ => None,
        });
        assert_eq!(e.template_dir(None), PathBuf::from("/shared/t"));
        assert_eq!(e.template_dir(Some("/flag".into())), PathBuf::from("/flag"));
        let e = WarmEnv::from_vars(|name| (name == "XDG_CACHE_HOME").then(|| "/xdg".into()));
        assert_eq!(e.template_dir(None), PathBuf::from("/xdg/sluice/templates"));
        let e = WarmEnv::from_vars(|_| None);
        assert_eq!(
            e.template_dir(None),
            PathBuf::from("/var/cache/sluice/templates")
        );
        let hex = "ab".repeat(32);
        assert_eq!(service_id(&hex).to_hex(), hex);
        assert_eq!(service_id("llama tp=1"), ServiceId::from_spec("llama tp=1"));
    }
}
