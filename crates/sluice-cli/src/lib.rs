//! The `sluice` command line: dispatch (the argument types are in `args.rs`). Each command lives in
//! `commands/` and returns its plane's error on failure; every error type knows its
//! `sluice_engine::ErrorClass`, and [`exit_code`] turns that into the process's exit
//! status in one place (the Python exceptions come from the same classes).

#[macro_use]
mod output;
mod args;
mod commands;
mod logging;

pub use args::*;

pub use logging::{init_logging, log_filter};

use clap::Parser;
use sluice_engine::{Classify, ConfigError};
pub use sluice_engine::{EXIT_FAILED, EXIT_INVALID, EXIT_NOT_FOUND, EXIT_USAGE};
use sluice_load::{LoadConfig, LoadError};

/// `sluice warm run` / `record` pass the service's status through, so their
/// own failures use the codes `env(1)`, `timeout(1)` and `docker run` keep
/// for themselves: sluice warm itself failed (a bad option, a bad template,
/// a missing model, no cgroup), before or after the service started.
pub const EXIT_WARM_FAILED: i32 = 125;
/// The service command was found but could not be executed.
pub const EXIT_SERVICE_NOT_EXECUTABLE: i32 = 126;
/// The service command was not found.
pub const EXIT_SERVICE_NOT_FOUND: i32 = 127;

/// The whole command line, shared by the `sluice` binary and the Python
/// console script (`sluice._sluice.cli_main`) so the two cannot drift: parses
/// `args` (the program name first), sets up logging and runs the command.
/// Returns the exit status; `--help` and `--version` print and give 0, usage
/// errors print and give 2, exactly as clap's own `exit` would.
pub fn main_with_args<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(err) => {
            // Like clap's `Error::exit`: a closed stdout is no error here.
            let _ = err.print();
            return match err.exit_code() {
                2 if launches_service(&args) => EXIT_WARM_FAILED,
                code => code,
            };
        }
    };
    init_logging(cli.verbose);
    // `warm run` and `record` pass the service's status through: their own failure to
    // print the report is 125, which a service's status cannot be mistaken for.
    let failed = match launches_service(&args) {
        true => EXIT_WARM_FAILED,
        false => EXIT_FAILED,
    };
    output::finish(run(cli), failed)
}

/// Runs the command and returns the process exit status.
pub fn run(cli: Cli) -> i32 {
    match cli.command {
        Command::Load(args) => report(commands::load::run(&args)),
        Command::Inspect(args) => report(commands::inspect::run(&args)),
        Command::Sim(SimCommand::Run(args)) => report(commands::sim::run(&args)),
        Command::Sim(SimCommand::GenKv(args)) => report(commands::gen_kv::run(&args)),
        Command::Sim(SimCommand::Models(args)) => report(commands::sim::models(&args)),
        Command::Kv(KvCommand::Bench(args)) => report(commands::kv::bench(&args)),
        Command::Kv(KvCommand::Stats(args)) => report(commands::kv::stats(&args)),
        Command::Kv(KvCommand::Fsck(args)) => report(commands::kv::fsck(&args)),
        Command::Kv(KvCommand::Serve(args)) => report(commands::kv_serve::serve(&args)),
        Command::Ckpt(c) => report(match c {
            CkptCommand::Ls(a) => commands::ckpt::ls(&a),
            CkptCommand::Inspect(a) => commands::ckpt::inspect(&a),
            CkptCommand::Verify(a) => commands::ckpt::verify(&a),
            CkptCommand::Diff(a) => commands::ckpt::diff_cmd(&a),
            CkptCommand::Gc(a) => commands::ckpt::gc(&a),
        }),
        Command::Mount(args) => report(commands::mount::run(&args)),
        Command::Warm(command) => {
            let launcher = matches!(command, WarmCommand::Run(_) | WarmCommand::Record(_));
            match commands::warm::run(command) {
                Ok(code) => code,
                Err(err) => {
                    errln!("sluice: error: {err}");
                    match launcher {
                        true => launcher_exit_code(&err),
                        false => exit_code(&err),
                    }
                }
            }
        }
    }
}

fn report<E: Classify>(outcome: Result<(), E>) -> i32 {
    match outcome {
        Ok(()) => 0,
        Err(err) => {
            errln!("sluice: error: {err}");
            exit_code(&err)
        }
    }
}

/// The one place an error becomes an exit status: its class's (`sluice_engine::ErrorClass`,
/// the table the Python exceptions come from too). 2 a bad flag, option or argument; 3 input
/// that is not what it should be; 4 a missing path, object, store or checkpoint; 1 the rest.
pub fn exit_code(err: &impl Classify) -> i32 {
    err.exit_status().unwrap_or_else(|| err.class().exit_code())
}

/// Whether a command line (program name first) is `sluice warm run` or
/// `sluice warm record`, whose usage errors exit [`EXIT_WARM_FAILED`].
fn launches_service(args: &[std::ffi::OsString]) -> bool {
    let mut words = args
        .iter()
        .skip(1)
        .filter(|a| !a.to_string_lossy().starts_with('-'));
    words.next().is_some_and(|w| w == "warm")
        && words.next().is_some_and(|w| w == "run" || w == "record")
}

/// Exit status of a failed `sluice warm run` or `record`, which otherwise
/// exit with the service's status: 127 for a service command not found,
/// 126 for one that cannot be executed, 125 for anything else.
pub fn launcher_exit_code(err: &sluice_warm::WarmError) -> i32 {
    match err {
        sluice_warm::WarmError::Launch { source, .. }
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            EXIT_SERVICE_NOT_FOUND
        }
        sluice_warm::WarmError::Launch { .. } => EXIT_SERVICE_NOT_EXECUTABLE,
        _ => EXIT_WARM_FAILED,
    }
}

/// Flags into a `LoadConfig` (after `SLUICE_*` environment overrides).
pub fn load_config(args: &LoadArgs) -> Result<LoadConfig, LoadError> {
    let flag = |name: &str, value: &str| {
        let what = format!("--{name} {value}");
        move |problem: String| LoadError::Config(ConfigError::new(what, problem))
    };
    let mut cfg = LoadConfig::default().with_env_overrides()?;
    cfg.direct = args.direct.parse().map_err(flag("direct", &args.direct))?;
    cfg.engine = args.engine.parse().map_err(flag("engine", &args.engine))?;
    if let Some(c) = args.concurrency {
        cfg.concurrency = c;
    }
    if let Some(c) = &args.chunk_bytes {
        let bytes = sluice_load::parse_bytes(c).map_err(flag("chunk-bytes", c))?;
        cfg.chunk_bytes =
            usize::try_from(bytes).map_err(|e| flag("chunk-bytes", c)(e.to_string()))?;
    }
    if let Some(m) = &args.memory_limit {
        cfg.memory_limit = Some(sluice_load::parse_bytes(m).map_err(flag("memory-limit", m))?);
    }
    cfg.drop_cache |= args.drop_cache;
    cfg.allow_partial |= args.allow_partial;
    cfg.validate()?;
    Ok(cfg)
}
