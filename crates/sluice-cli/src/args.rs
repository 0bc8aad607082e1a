//! The command line's argument types (clap): what each command and flag takes, with its
//! help text. `lib.rs` dispatches them; each command's code lives in `commands/`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// The exit statuses of `warm run` and `warm record`, for their `--help`.
const LAUNCHER_EXIT_STATUS_HELP: &str = "\
Exit status: the service's own (its code, or 128 + the signal that ended it, as a shell \
reports it: 137 for SIGKILL, also when the OOM killer took it); 125 when sluice warm itself \
failed (bad option, bad template, missing model, no cgroup, a template that cannot be \
written), 126 when the service command \
cannot be executed, 127 when it is not found. The report (--json: exit_code, service_exit, \
oom_killed, stopped_by) tells the service's end apart from warm's.

SIGINT, SIGTERM and SIGHUP stop the run: the signal is sent on to the service (not when the \
terminal sent it to the service already), which gets --grace-period to exit; then every process \
left (all of the cgroup with --memory-limit, else the service's process tree) is killed. A \
second signal kills at once.";

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
    /// Cache-policy studies: replay traces, generate KV-cache workloads.
    #[command(subcommand)]
    Sim(SimCommand),
    /// A programmable page cache for model loading: record and replay I/O templates.
    #[command(subcommand)]
    Warm(WarmCommand),
    /// The KV-cache block store: replay a trace against it, describe it, verify it.
    #[command(subcommand)]
    Kv(KvCommand),
    /// Checkpoint stores: list, inspect, verify, compare, collect garbage.
    #[command(subcommand)]
    Ckpt(CkptCommand),
    /// A read-only caching FUSE mount of an object-store prefix or a directory, with a
    /// shared block pool and safetensors-aware prefetch.
    Mount(MountArgs),
}

#[derive(Args, Debug)]
pub struct MountArgs {
    /// What to mount: `s3://bucket/prefix/` (or `gs://`, `az://`), or a directory.
    pub source: String,
    /// An existing empty directory.
    pub mountpoint: PathBuf,
    /// The shared block pool's budget (ready blocks plus blocks in flight).
    #[arg(long, default_value = "2GiB")]
    pub pool: String,
    /// Fetch and cache unit.
    #[arg(long, default_value = "8MiB")]
    pub block: String,
    /// Threads fetching prefetched blocks (GETs in flight for prefetch).
    #[arg(long, default_value_t = 16)]
    pub prefetch_threads: usize,
    /// Sequential streams followed per file.
    #[arg(long, default_value_t = 8)]
    pub streams: usize,
    /// Next .safetensors files (name order) to start prefetching when a reader passes the
    /// middle of one.
    #[arg(long, default_value_t = 1)]
    pub lookahead_files: usize,
    /// A local directory (an SSD) keeping fetched blocks, checksummed, across restarts: a
    /// second tier under the pool. New or empty, or one a mount made before.
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// The disk tier's budget [default: 16GiB].
    #[arg(long, requires = "cache_dir")]
    pub cache_size: Option<String>,
    /// Read every file through the daemon, even one the disk tier holds whole. By default
    /// such a file is handed to the kernel as the open's backing file (FUSE passthrough,
    /// Linux 6.9+, root), and read at local disk and page-cache speed.
    #[arg(long, requires = "cache_dir")]
    pub no_passthrough: bool,
    /// Run in the background; print the daemon's pid once the mount is up.
    #[arg(long)]
    pub daemon: bool,
    /// The daemon's log, only with --daemon (default: $TMPDIR/sluice-mount-<daemon pid>.log).
    #[arg(long)]
    pub log: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum CkptCommand {
    /// The checkpoints of a store, with their sizes: logical, unique, shared with others.
    Ls(CkptLsArgs),
    /// A checkpoint's entries (dtype, shape, bytes, chunks) and its dedup ratio.
    Inspect(CkptPathArgs),
    /// Re-hash every chunk of a checkpoint. Exit 1 if any is damaged or missing.
    Verify(CkptPathArgs),
    /// Entries changed, added and removed from checkpoint A to B, with the bytes that changed.
    Diff(CkptDiffArgs),
    /// Keep the N newest checkpoints; remove the rest and every chunk no kept one uses.
    Gc(CkptGcArgs),
}

#[derive(Args, Debug)]
pub struct CkptLsArgs {
    /// The store: a directory, or an s3://, gs:// or az:// prefix.
    pub path: PathBuf,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct CkptPathArgs {
    /// A checkpoint: STORE/NAME (STORE a directory or an s3://, gs://, az:// prefix).
    pub path: PathBuf,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct CkptDiffArgs {
    /// The older checkpoint (STORE/NAME).
    pub a: PathBuf,
    /// The newer checkpoint (STORE/NAME).
    pub b: PathBuf,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct CkptGcArgs {
    /// The store: a directory, or an s3://, gs:// or az:// prefix.
    pub path: PathBuf,
    /// How many of the newest checkpoints to keep.
    #[arg(long)]
    pub keep: usize,
    /// Object stores only (they have no lock): unreferenced chunks written less than this
    /// many seconds ago are left, as a save in flight may be about to publish them.
    #[arg(long, default_value_t = 3600.0, value_parser = grace_seconds)]
    pub grace_s: f64,
    #[arg(long)]
    pub json: bool,
}

fn grace_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("{s:?}: expected seconds >= 0")),
    }
}

#[derive(Subcommand, Debug)]
pub enum KvCommand {
    /// Replay a KV trace against a real store: lookup, load the hit prefix, store the rest.
    Bench(Box<KvBenchArgs>),
    /// Describe a store on disk: blocks, segments, bytes, namespaces (reads headers only).
    Stats(KvStatsArgs),
    /// Verify every block's checksum; with --repair drop the bad ones. Exit 1 if any is bad.
    Fsck(KvFsckArgs),
    /// Own a store and serve it to engine processes on a Unix socket (`sluice.kv.connect`),
    /// until SIGINT or SIGTERM.
    Serve(Box<KvServeArgs>),
}

/// The tier flags `kv bench` and `kv serve` share.
#[derive(Args, Debug)]
pub struct KvTierArgs {
    /// DRAM tier budget (0: none).
    #[arg(long, default_value = "0")]
    pub dram: String,
    /// SSD tier budget.
    #[arg(long, default_value = "8GiB")]
    pub ssd: String,
    /// Eviction policy of both tiers, by `sluice sim` name.
    #[arg(long, default_value_t = sluice_kv::kv_defaults().policy)]
    pub policy: String,
    #[arg(long)]
    pub dram_policy: Option<String>,
    #[arg(long)]
    pub ssd_policy: Option<String>,
    /// O_DIRECT for segment I/O: auto, on, off.
    #[arg(long, default_value_t = sluice_kv::kv_defaults().direct.to_string())]
    pub direct: String,
    /// I/O threads of the store (default: the store's).
    #[arg(long)]
    pub io_threads: Option<usize>,
    /// A directory other nodes mount too (NFS, Lustre): the shared tier. The store writes
    /// its own segments there and reads those other stores sealed.
    #[arg(long)]
    pub shared_dir: Option<PathBuf>,
    /// Budget of this store's own segments in --shared-dir (0: only read others').
    #[arg(long, default_value = "0")]
    pub shared: String,
    /// Eviction policy of this store's shared segments.
    #[arg(long, default_value_t = sluice_kv::kv_defaults().shared_policy)]
    pub shared_policy: String,
    /// The shared tier in an object store instead of --shared-dir (s3://bucket/prefix,
    /// gs://, az://): sealed segments go up in the background, other stores' are read by
    /// ranged GETs. --shared is its budget; credentials come from the environment.
    #[arg(long, value_name = "URL")]
    pub remote: Option<String>,
    /// How long one read of another store's block from --remote may take before it is a
    /// miss.
    #[arg(long, default_value_t = sluice_kv::kv_defaults().remote_timeout_ms)]
    pub remote_timeout_ms: u64,
}

#[derive(Args, Debug)]
pub struct KvServeArgs {
    /// The store directory (created if absent).
    pub path: PathBuf,
    /// The Unix socket to listen on. A socket file left by a server that died is replaced.
    #[arg(long)]
    pub socket: PathBuf,
    /// Block bytes ("2MiB"); an existing store's own size when left out.
    #[arg(long)]
    pub block_bytes: Option<String>,
    #[command(flatten)]
    pub tiers: KvTierArgs,
    /// write-through (a put is acknowledged once its record is on SSD) or write-back
    /// (acknowledged in DRAM; written to SSD when DRAM evicts it, or at a client's sync).
    #[arg(long, default_value_t = sluice_kv::kv_defaults().write_mode.to_string())]
    pub write_mode: String,
    /// batch (a put returns once its blocks are fdatasynced) or none (`sync` does it).
    #[arg(long, default_value_t = sluice_kv::kv_defaults().durability.to_string())]
    pub durability: String,
    /// Clients connected at once; one more is told the server is busy.
    #[arg(long, default_value_t = sluice_kv::kv_defaults().max_clients)]
    pub max_clients: usize,
    /// Permissions of the socket file, octal (600: only this user; 660: its group too).
    #[arg(long, default_value_t = sluice_kv::kv_defaults().socket_mode)]
    pub socket_mode: String,
}

#[derive(Args, Debug)]
pub struct KvBenchArgs {
    /// A KV trace: Mooncake JSONL (timestamp, input_length, output_length, hash_ids), e.g.
    /// from `sluice sim gen-kv`.
    #[arg(long)]
    pub trace: PathBuf,
    /// auto (by extension), mooncake, csv, oracle.
    #[arg(long, default_value = "auto")]
    pub format: String,
    /// Model preset (llama3-8b, llama3.1-70b, deepseek-v3, gpt-oss-120b) or spec
    /// ("layers=32,kv_heads=8,head_dim=128,dtype_bytes=2"): block bytes = bytes per token ×
    /// --block-tokens, as `sluice sim` sizes them.
    #[arg(long)]
    pub model: Option<String>,
    /// Tokens per hashed block of the trace.
    #[arg(long, default_value_t = sluice_sim::trace::mooncake::DEFAULT_BLOCK_TOKENS)]
    pub block_tokens: u64,
    /// Block bytes, overriding --model's sizing ("2MiB").
    #[arg(long)]
    pub block_bytes: Option<String>,
    #[command(flatten)]
    pub tiers: KvTierArgs,
    /// The store directory: must be empty or absent (default OUT/store); removed after the
    /// run unless --keep-store.
    #[arg(long)]
    pub store: Option<PathBuf>,
    #[arg(long)]
    pub keep_store: bool,
    /// Replay only the first N requests.
    #[arg(long)]
    pub requests: Option<u64>,
    /// The engine's prefill rate, for the time saved against recomputing the hits (an
    /// assumption: set it to your engine's measured rate).
    #[arg(long, default_value_t = 10_000.0)]
    pub prefill_tokens_per_s: f64,
    /// Also run `sluice sim`'s tiered replay on the trace with the store's policies and
    /// capacities, and print both hit ratios side by side.
    #[arg(long)]
    pub compare_sim: bool,
    /// Requests per point of the hit-ratio-over-time plot (default: 1/50 of the trace).
    #[arg(long)]
    pub window: Option<u64>,
    /// Directory for bench.json and the PNGs.
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long)]
    pub no_plots: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    #[arg(long)]
    pub no_progress: bool,
}

#[derive(Args, Debug)]
pub struct KvStatsArgs {
    /// The store directory.
    pub path: PathBuf,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct KvFsckArgs {
    /// The store directory (not open elsewhere: fsck takes its lock).
    pub path: PathBuf,
    /// Drop bad records (zero their headers) and damaged segments.
    #[arg(long)]
    pub repair: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum WarmCommand {
    /// Run CMD once and record each loader worker's reads of the model as a template.
    #[command(after_help = LAUNCHER_EXIT_STATUS_HELP)]
    Record(WarmRecordArgs),
    /// Run CMD with a page-cache policy (template, eager, precache, native).
    #[command(after_help = LAUNCHER_EXIT_STATUS_HELP)]
    Run(WarmRunArgs),
    /// Watch a model directory and apply a policy to whoever loads it, until stopped.
    Daemon(WarmDaemonArgs),
    /// Show the running warm runtimes: policy, prefetched, evicted, reader position.
    Status(WarmStatusArgs),
    /// Tell a running runtime that a range is about to be read (an explicit access event).
    Trigger(WarmTriggerArgs),
}

#[derive(Args, Debug)]
pub struct WarmTriggerArgs {
    /// The file, absolute or relative to the runtime's model directory.
    #[arg(long)]
    pub path: String,
    /// First byte (default 0).
    #[arg(long)]
    pub offset: Option<u64>,
    /// Bytes (default: to the end of the file).
    #[arg(long)]
    pub len: Option<u64>,
    /// The loader worker this access belongs to.
    #[arg(long)]
    pub worker: Option<u32>,
    /// The runtime's pid (see `sluice warm status`); needed when several run.
    #[arg(long)]
    pub pid: Option<i32>,
}

/// Options every warm runtime takes.
#[derive(Args, Debug, Clone)]
pub struct WarmCommonArgs {
    /// The service: a spec string hashed into its id (model path, parallel config, anything
    /// that changes what the loaders read), or the 64-hex-digit id itself.
    #[arg(long)]
    pub service: Option<String>,
    /// Template directory (may be shared storage). Default: $SLUICE_TEMPLATE_DIR, else
    /// $XDG_CACHE_HOME/sluice/templates, else ~/.cache/sluice/templates.
    #[arg(long)]
    pub template_dir: Option<PathBuf>,
    /// Memory share above which prefetch pauses and the policy evicts.
    #[arg(long, default_value_t = sluice_warm::config::DEFAULT_WATERMARK)]
    pub watermark: f64,
    /// How far behind the reader burn-after-reading stops, e.g. 1GiB. auto: 1 GiB (seed 000's
    /// default), capped at 1/8 of --memory-limit, which measured faster under tight limits.
    #[arg(long, default_value = sluice_warm::config::DEFAULT_BAR_DISTANCE)]
    pub bar_distance: String,
    /// Template: replay from the start of each worker's sequence as soon as the service is
    /// launched (MAIO: a template is known at launch, so the model's I/O overlaps the
    /// service's start-up), in the gaps of the service's own start-up reads
    /// (--launch-quiet-ms). The default; kept as a flag for scripts that pass it.
    #[arg(long, conflicts_with = "start_at_first_access")]
    pub start_at_launch: bool,
    /// Template: replay only from the service's first model access instead of from launch.
    #[arg(long)]
    pub start_at_first_access: bool,
    /// Until the service first touches the model, prefetch (a replay from launch, a Python
    /// policy's init) runs only once the service's own storage reads (libraries, start-up) have
    /// stood still this long, in ms; 0: regardless.
    #[arg(long, default_value_t = sluice_warm::config::DEFAULT_LAUNCH_QUIET_MS)]
    pub launch_quiet_ms: u64,
    /// Template breakdown: do not prefetch.
    #[arg(long)]
    pub no_prefetch: bool,
    /// Template breakdown: ignore accelerator affinity.
    #[arg(long)]
    pub no_affinity: bool,
    /// Template breakdown: no burn-after-reading eviction.
    #[arg(long)]
    pub no_burn: bool,
    /// Prefetch mechanism: populate (MADV_POPULATE_READ on loader threads, 2 MiB folios),
    /// willneed (fadvise, asynchronous, 4 KiB folios) or read (pread into a scratch buffer).
    #[arg(long, default_value = sluice_warm::config::DEFAULT_MECHANISM)]
    pub mechanism: String,
    /// Prefetch bytes in flight (populate and read: one loader thread per read_ahead_kb
    /// chunk of it). 16 MiB measured best here: deeper queues delay the service's own
    /// start-up reads (libraries, configs) behind prefetch.
    #[arg(long, default_value = sluice_warm::config::DEFAULT_IN_FLIGHT)]
    pub in_flight: String,
    /// Access events: auto (best available), pre-content, open, or explicit (none).
    #[arg(long, default_value = sluice_warm::config::DEFAULT_EVENTS)]
    pub events: String,
    /// Print the final report as JSON.
    #[arg(long)]
    pub json: bool,
    /// No live summary even on a terminal.
    #[arg(long)]
    pub no_progress: bool,
}

#[derive(Args, Debug)]
pub struct WarmRecordArgs {
    /// The model directory the service loads.
    #[arg(long)]
    pub model: PathBuf,
    /// Write the template even when the service fails (its recording may be
    /// partial, and the next run would replay it).
    #[arg(long)]
    pub keep_failed: bool,
    /// After SIGINT, SIGTERM or SIGHUP, how long the service gets to exit before what is
    /// left of it is killed, e.g. 10s, 500ms.
    #[arg(long, default_value = sluice_warm::config::DEFAULT_GRACE_PERIOD)]
    pub grace_period: String,
    #[command(flatten)]
    pub common: WarmCommonArgs,
    /// The service command, after --.
    #[arg(last = true, required = true)]
    pub command: Vec<std::ffi::OsString>,
}

#[derive(Args, Debug)]
pub struct WarmRunArgs {
    /// The model directory the service loads.
    #[arg(long)]
    pub model: PathBuf,
    /// template, eager, precache, native, or a Python policy as module:Class.
    #[arg(long, default_value = sluice_warm::config::DEFAULT_POLICY)]
    pub policy: String,
    /// Run the service and the runtime in a new cgroup with this memory limit, e.g. 6GiB
    /// (at least 32MiB). The runtime is exempt from the OOM killer there; the service is not.
    #[arg(long)]
    pub memory_limit: Option<String>,
    /// After SIGINT, SIGTERM or SIGHUP, how long the service gets to exit before what is
    /// left of it is killed, e.g. 10s, 500ms.
    #[arg(long, default_value = sluice_warm::config::DEFAULT_GRACE_PERIOD)]
    pub grace_period: String,
    #[command(flatten)]
    pub common: WarmCommonArgs,
    /// The service command, after --.
    #[arg(last = true, required = true)]
    pub command: Vec<std::ffi::OsString>,
}

#[derive(Args, Debug)]
pub struct WarmDaemonArgs {
    /// The model directory to watch.
    #[arg(long)]
    pub watch: PathBuf,
    /// template, eager, precache, native, or a Python policy as module:Class.
    #[arg(long, default_value = sluice_warm::config::DEFAULT_POLICY)]
    pub policy: String,
    #[command(flatten)]
    pub common: WarmCommonArgs,
}

#[derive(Args, Debug)]
pub struct WarmStatusArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum SimCommand {
    /// Replay traces through policies at several cache sizes; write JSON, CSV and plots.
    Run(SimRunArgs),
    /// Generate a Mooncake-style JSONL KV-cache workload (seeded, reproducible).
    GenKv(GenKvArgs),
    /// List the KV model presets with their KV-cache bytes per token and per block.
    Models(SimModelsArgs),
}

#[derive(Args, Debug)]
pub struct SimModelsArgs {
    /// Tokens per block, for the per-block column.
    #[arg(long, default_value_t = sluice_sim::trace::mooncake::DEFAULT_BLOCK_TOKENS)]
    pub block_tokens: u64,
    /// A custom spec to describe as well, e.g. "layers=32,kv_heads=8,head_dim=128,dtype=fp8".
    #[arg(long)]
    pub model: Option<String>,
}

/// How trace files are read (shared by the sim commands).
#[derive(Args, Debug)]
pub struct SimTraceArgs {
    /// auto (by extension: .jsonl KV, .csv CSV, else oracleGeneral), oracle, csv, mooncake.
    #[arg(long, default_value_t = sluice_sim::source::TraceFormat::default().to_string())]
    pub format: String,
    /// CSV columns, 1-based, e.g. "time-col=1,id-col=2,size-col=3,has-header=true,delimiter=;";
    /// id-is-num=false hashes non-numeric ids. Default: the time,id,size layout. Without
    /// has-header, a first row is a header when its numeric columns hold words.
    #[arg(long)]
    pub csv_columns: Option<String>,
    /// KV traces: model preset (llama3-8b, llama3.1-70b, deepseek-v3, gpt-oss-120b) or
    /// "layers=32,kv_heads=8,head_dim=128,dtype_bytes=2"; blocks are sized from its bytes per
    /// token. Without it every block counts 1.
    #[arg(long)]
    pub model: Option<String>,
    /// KV traces: tokens per hashed block.
    #[arg(long, default_value_t = sluice_sim::trace::mooncake::DEFAULT_BLOCK_TOKENS)]
    pub block_tokens: u64,
}

#[derive(Args, Debug)]
pub struct SimRunArgs {
    /// A trace file (repeat for several).
    #[arg(long = "trace", required = true)]
    pub traces: Vec<PathBuf>,
    #[command(flatten)]
    pub trace_args: SimTraceArgs,
    /// Policy specs, comma-separated; parameters in parentheses, e.g. "lru,s3fifo(small_ratio=0.2)".
    #[arg(long, default_value_t = sluice_sim::study::DEFAULT_POLICIES.join(","))]
    pub policies: String,
    /// Cache sizes as fractions of each trace's working set (bytes, or objects with --count-mode).
    #[arg(
        long,
        default_value_t = sluice_sim::study::DEFAULT_FRACTIONS.map(|f| f.to_string()).join(",")
    )]
    pub fractions: String,
    /// Count objects instead of bytes: every object has size 1 for the policies.
    #[arg(long)]
    pub count_mode: bool,
    /// Worker threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Directory for results.json, results.csv, hit_ratio.png and pareto.png.
    #[arg(long)]
    pub out: PathBuf,
    /// Do not draw the PNG plots.
    #[arg(long)]
    pub no_plots: bool,
    /// Print the rows as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// No progress bar even on a terminal.
    #[arg(long)]
    pub no_progress: bool,
}

/// Knobs of `sluice sim gen-kv`; every one defaults to the generator's default
/// (see docs/sim.md for what each models and why its default is what it is).
#[derive(Args, Debug)]
pub struct GenKvArgs {
    /// Output JSONL file (Mooncake layout: timestamp, input_length, output_length, hash_ids).
    #[arg(long)]
    pub out: PathBuf,
    /// Seed of every random draw: the same seed and knobs give byte-identical output.
    #[arg(long, default_value_t = sluice_sim::generator::KvWorkloadConfig::default().seed)]
    pub seed: u64,
    /// Requests to generate.
    #[arg(long)]
    pub requests: Option<u64>,
    /// Distinct sessions (chat threads and agents users return to).
    #[arg(long)]
    pub sessions: Option<u32>,
    /// Distinct system prompts shared across sessions (0: none).
    #[arg(long)]
    pub system_prompts: Option<u32>,
    /// Tokens of each system prompt.
    #[arg(long)]
    pub system_prompt_tokens: Option<u64>,
    /// Zipf exponent of session popularity (0: uniform).
    #[arg(long)]
    pub zipf_alpha: Option<f64>,
    /// Tokens per user message: "lognormal:median=200,sigma=1.0", "uniform:min=10,max=100", "fixed:200".
    #[arg(long)]
    pub user_tokens: Option<String>,
    /// Tokens per answer (or agent tool call), same syntax.
    #[arg(long)]
    pub answer_tokens: Option<String>,
    /// Most turns of one chat thread.
    #[arg(long)]
    pub max_turns: Option<u32>,
    /// Share of sessions that are agents running tool loops, in [0, 1].
    #[arg(long)]
    pub agentic_fraction: Option<f64>,
    /// Most steps of one agent task.
    #[arg(long)]
    pub agentic_max_turns: Option<u32>,
    /// Tokens per tool output, same syntax as --user-tokens.
    #[arg(long)]
    pub tool_output_tokens: Option<String>,
    /// Mean seconds between the steps of an agent task.
    #[arg(long)]
    pub tool_time: Option<f64>,
    /// Visits per second over all sessions.
    #[arg(long)]
    pub arrival_rate: Option<f64>,
    /// Mean seconds a user thinks before the next turn.
    #[arg(long)]
    pub think_time: Option<f64>,
    /// Tokens per hashed block.
    #[arg(long)]
    pub block_tokens: Option<u64>,
    /// Longest prompt in tokens; a thread that would pass it starts over.
    #[arg(long)]
    pub max_context_tokens: Option<u64>,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
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
    /// Load the shards that are there when some are missing (warned about,
    /// and reported); without it a missing shard is an error.
    #[arg(long)]
    pub allow_partial: bool,
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
    /// List what is there when shards are missing (reported as partial,
    /// exit 0); without it a missing shard is an error.
    #[arg(long)]
    pub allow_partial: bool,
}
