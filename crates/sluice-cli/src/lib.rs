//! The `sluice` command line: argument types and dispatch. Each command
//! lives in `commands/` and returns a `LoadError` on failure, which
//! [`exit_code`] maps to the process's exit status in one place.

mod commands;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use sluice_load::{LoadConfig, LoadError};

/// Exit status for an invalid checkpoint (bad header, index or layout).
pub const EXIT_INVALID: i32 = 3;
/// Exit status for a missing file or a permission problem.
pub const EXIT_NOT_FOUND: i32 = 4;
/// Exit status for other I/O or load failures.
pub const EXIT_FAILED: i32 = 1;

#[derive(Parser, Debug)]
#[command(
    name = "sluice",
    version,
    about = "Move AI checkpoints at the speed of the hardware"
)]
pub struct Cli {
    /// More logging (-v: info, -vv: debug). SLUICE_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Read a checkpoint (file, directory or index) as fast as the device allows.
    Load(LoadArgs),
    /// List tensors, dtypes, shapes and bytes per shard, and validate the checkpoint.
    Inspect(InspectArgs),
}

#[derive(Args, Debug)]
pub struct LoadArgs {
    /// A .safetensors file, a directory of shards, or a model.safetensors.index.json.
    pub path: PathBuf,
    /// O_DIRECT: auto (probe each file), on (require), off (page cache).
    #[arg(long, default_value = "auto")]
    pub direct: String,
    /// Reader: auto (io_uring if it works), io_uring, threads.
    #[arg(long, default_value = "auto")]
    pub engine: String,
    /// Reads in flight (default 32).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Bytes per read, e.g. 4MiB.
    #[arg(long)]
    pub chunk_bytes: Option<String>,
    /// Memory for read buffers, e.g. 512MiB (the data is read and discarded).
    #[arg(long)]
    pub memory_limit: Option<String>,
    /// Load only these tensors (comma-separated names).
    #[arg(long, value_delimiter = ',')]
    pub names: Option<Vec<String>>,
    /// Drop what was read from the page cache (buffered reads only).
    #[arg(long)]
    pub drop_cache: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// No progress bar even on a terminal.
    #[arg(long)]
    pub no_progress: bool,
}

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// A .safetensors file, a directory of shards, or a model.safetensors.index.json.
    pub path: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Only the per-shard summary, not every tensor.
    #[arg(long)]
    pub summary: bool,
}

/// Runs the command and returns the process exit status.
pub fn run(cli: Cli) -> i32 {
    let outcome = match cli.command {
        Command::Load(args) => commands::load::run(&args),
        Command::Inspect(args) => commands::inspect::run(&args),
    };
    match outcome {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("sluice: error: {err}");
            exit_code(&err)
        }
    }
}

/// The one place an error becomes an exit status.
pub fn exit_code(err: &LoadError) -> i32 {
    if err.is_not_found() || err.is_permission_denied() {
        return EXIT_NOT_FOUND;
    }
    match err {
        LoadError::Format(_) | LoadError::NoShards { .. } | LoadError::UnknownTensor { .. } => {
            EXIT_INVALID
        }
        LoadError::Config(_) => 2,
        _ => EXIT_FAILED,
    }
}

/// Logs to stderr at warn, info or debug; `SLUICE_LOG` overrides.
pub fn init_logging(verbose: u8) {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Flags into a `LoadConfig` (after `SLUICE_*` environment overrides).
pub fn load_config(args: &LoadArgs) -> Result<LoadConfig, LoadError> {
    let mut cfg = LoadConfig::default()
        .with_env_overrides()
        .map_err(|e| LoadError::Config(e.to_string()))?;
    cfg.direct = args.direct.parse().map_err(LoadError::Config)?;
    cfg.engine = args.engine.parse().map_err(LoadError::Config)?;
    if let Some(c) = args.concurrency {
        cfg.queue_depth = c;
    }
    if let Some(c) = &args.chunk_bytes {
        let bytes = sluice_load::parse_bytes(c).map_err(LoadError::Config)?;
        cfg.chunk_bytes = usize::try_from(bytes).map_err(|e| LoadError::Config(e.to_string()))?;
    }
    if let Some(m) = &args.memory_limit {
        cfg.memory_limit = Some(sluice_load::parse_bytes(m).map_err(LoadError::Config)?);
    }
    cfg.drop_cache |= args.drop_cache;
    cfg.validate().map_err(LoadError::Config)?;
    Ok(cfg)
}
