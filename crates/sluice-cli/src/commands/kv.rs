//! `sluice kv`: replay a KV trace against a real store (`bench`), describe a store on
//! disk (`stats`), verify every block (`fsck`).
//!
//! `bench` reads the trace as `sluice sim` does (Mooncake JSONL, or `sim gen-kv`'s), sizes
//! blocks from `--model`, and replays each request the way an engine uses the store:
//! lookup the chain, load the hit prefix into page-aligned buffers, store the blocks
//! that missed. Every loaded block is compared with the bytes stored under its key, so a
//! wrong byte fails the run. With `--compare-sim` the same trace goes through
//! `sluice_sim::tiered` with the store's policies and capacities, and both sides' hit
//! ratios are printed: the simulator's prediction checked against the live store.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use sluice_engine::AlignedBuf;
use sluice_kv::{Fingerprint, KvConfig, KvError, KvStore, Namespace};
use sluice_policy::PolicyConfig;
use sluice_sim::source::TraceOptions;
use sluice_sim::tiered::{simulate_tiers, TierSpec, TieredStats};
use sluice_sim::{SimError, Trace};

use crate::{KvBenchArgs, KvFsckArgs, KvStatsArgs, KvTierArgs};

/// Why a `sluice kv` command failed.
#[derive(Debug, thiserror::Error)]
pub enum KvCliError {
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error(transparent)]
    Sim(#[from] SimError),
    /// A bad flag value.
    #[error("{0}")]
    Usage(String),
    /// The store served bytes other than those stored: the one result a bench must never
    /// report as a number.
    #[error("wrong bytes: {0}")]
    WrongBytes(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// fsck found bad blocks (reported, and dropped with --repair).
    #[error("{0}")]
    Damaged(String),
    /// A stop signal (SIGINT, SIGTERM, SIGHUP) ended the run; exit 128 + the signal.
    #[error("interrupted by signal {0} (the store the bench made is removed unless --keep-store)")]
    Interrupted(i32),
}

impl sluice_engine::Classify for KvCliError {
    fn class(&self) -> sluice_engine::ErrorClass {
        use sluice_engine::ErrorClass;
        match self {
            KvCliError::Kv(e) => e.class(),
            KvCliError::Sim(e) => e.class(),
            KvCliError::Usage(_) => ErrorClass::Config,
            KvCliError::Io { source, .. } => ErrorClass::of_io(source),
            KvCliError::WrongBytes(_) | KvCliError::Damaged(_) | KvCliError::Interrupted(_) => {
                ErrorClass::Failed
            }
        }
    }

    fn exit_status(&self) -> Option<i32> {
        match self {
            KvCliError::Interrupted(signal) => Some(128 + signal),
            _ => None,
        }
    }
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> KvCliError + '_ {
    move |source| KvCliError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// `sluice kv stats PATH`.
pub fn stats(args: &KvStatsArgs) -> Result<(), KvCliError> {
    let s = sluice_kv::store_summary(&args.path)?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&s).unwrap_or_default());
        return Ok(());
    }
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    outln!("store        {}", s.path.display());
    outln!("store id     {}", s.store_id);
    outln!(
        "blocks       {} of {} bytes ({:.2} GiB), in {} records",
        s.blocks,
        s.block_bytes,
        gib(s.block_bytes_total),
        s.records
    );
    outln!(
        "segments     {} ({} sealed, {} damaged), {:.2} GiB on disk",
        s.segments,
        s.sealed_segments,
        s.bad_segments,
        gib(s.segment_bytes)
    );
    outln!("free slots   {} (empty or torn)", s.empty_or_torn_slots);
    if s.block_bytes_total > 0 {
        outln!(
            "overhead     {:.2}x the blocks' bytes on disk (record and segment headers, free and dead slots)",
            s.segment_bytes as f64 / s.block_bytes_total as f64
        );
    }
    for (ns, n) in &s.namespaces {
        outln!("namespace    {ns}: {n} blocks");
    }
    Ok(())
}

/// `sluice kv fsck PATH [--repair]`: exit 0 when every block verifies.
pub fn fsck(args: &KvFsckArgs) -> Result<(), KvCliError> {
    let r = sluice_kv::fsck(&args.path, args.repair)?;
    if let Some(why) = r.lock.strip_prefix("none: ") {
        errln!("note: checked without the store's lock ({why})");
    }
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
    } else {
        for p in &r.problems {
            match p.slot {
                Some(slot) => outln!("{} slot {slot}: {}", p.segment.display(), p.detail),
                None => outln!("{}: {}", p.segment.display(), p.detail),
            }
        }
        outln!(
            "{} segments, {} good blocks ({:.2} GiB verified), {} bad blocks, {} bad segments{}",
            r.segments,
            r.good_blocks,
            r.bytes_verified as f64 / (1u64 << 30) as f64,
            r.bad_blocks,
            r.bad_segments,
            if r.repaired && !r.problems.is_empty() {
                " (dropped)"
            } else {
                ""
            }
        );
    }
    if r.problems.is_empty() {
        return Ok(());
    }
    let what = format!(
        "{}: {} bad blocks, {} bad segments{}",
        args.path.display(),
        r.bad_blocks,
        r.bad_segments,
        if args.repair {
            " (dropped: later opens skip them)"
        } else {
            " (run with --repair to drop them)"
        }
    );
    Err(KvCliError::Damaged(what))
}

/// Per-request load latencies and the totals of one replay.
#[derive(Debug, Default, Serialize)]
struct Replay {
    requests: u64,
    blocks: u64,
    /// Blocks loaded from the store (each request's hit prefix).
    served_blocks: u64,
    served_dram: u64,
    served_ssd: u64,
    /// Policy hits per tier: blocks served, plus puts of blocks a tier already held.
    hits_dram: u64,
    hits_ssd: u64,
    stored_blocks: u64,
    load_seconds: f64,
    store_seconds: f64,
    /// Seconds of lookup + get per request that loaded something.
    latencies_s: Vec<f64>,
    /// Estimated seconds saved against recomputing the served prefixes.
    time_saved_s: f64,
    windows: Vec<Window>,
}

/// Hit ratios over a window of requests, per tier.
#[derive(Debug, Default, Serialize, Clone)]
struct Window {
    end_request: u64,
    blocks: u64,
    dram_hits: u64,
    ssd_hits: u64,
    served: u64,
}

/// The bytes stored under block id `id`: a shared random pool with the id stamped at
/// both ends, so every block differs and a misplaced one is caught by its stamp.
fn fill_block(pool: &[u8], id: u64, out: &mut [u8]) {
    out.copy_from_slice(pool);
    stamp(id, out);
}

fn stamp(id: u64, out: &mut [u8]) {
    let n = out.len();
    let tag = id.to_le_bytes();
    let k = tag.len().min(n);
    out[..k].copy_from_slice(&tag[..k]);
    if n >= 16 {
        out[n - 8..].copy_from_slice(&(!id).to_le_bytes());
    }
}

fn check_block(pool: &[u8], id: u64, got: &[u8], scratch: &mut [u8]) -> bool {
    fill_block(pool, id, scratch);
    got == scratch
}

fn random_pool(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = sluice_policy::rng::Rng::new(seed);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    out.truncate(len);
    out
}

pub(crate) fn parse_size(flag: &str, v: &str) -> Result<u64, KvCliError> {
    sluice_load::parse_bytes(v).map_err(|e| KvCliError::Usage(format!("--{flag} {v:?}: {e}")))
}

fn policy(flag: &str, spec: &str) -> Result<PolicyConfig, KvCliError> {
    PolicyConfig::parse(spec).map_err(|e| KvCliError::Usage(format!("--{flag} {spec:?}: {e}")))
}

/// A named option's value (`--direct`, `--write-mode`, `--durability`), parsed as the
/// store names it; a bad one is a usage error naming the flag and what it takes.
pub(crate) fn named<T: std::str::FromStr<Err = KvError>>(
    flag: &str,
    v: &str,
) -> Result<T, KvCliError> {
    v.parse().map_err(|e: KvError| match e {
        KvError::Config { expected, .. } => {
            KvCliError::Usage(format!("--{flag} {v:?}: {expected}"))
        }
        other => KvCliError::Kv(other),
    })
}

/// The tier flags into a store config.
pub(crate) fn apply_tiers(c: &mut KvConfig, t: &KvTierArgs) -> Result<(), KvCliError> {
    c.dram_bytes = parse_size("dram", &t.dram)?;
    c.ssd_bytes = parse_size("ssd", &t.ssd)?;
    let shared = t.policy.as_str();
    c.dram_policy = policy("dram-policy", t.dram_policy.as_deref().unwrap_or(shared))?;
    c.ssd_policy = policy("ssd-policy", t.ssd_policy.as_deref().unwrap_or(shared))?;
    c.direct = named("direct", &t.direct)?;
    if let Some(n) = t.io_threads {
        c.io_threads = n;
    }
    c.shared_dir = t.shared_dir.clone();
    c.shared_bytes = parse_size("shared", &t.shared)?;
    c.shared_policy = policy("shared-policy", &t.shared_policy)?;
    c.remote = t.remote.clone();
    c.remote_timeout_ms = t.remote_timeout_ms;
    Ok(())
}

/// The store configuration the flags describe.
fn store_config(args: &KvBenchArgs, block_bytes: u64, model: &str) -> Result<KvConfig, KvCliError> {
    let ns = Namespace {
        model: model.to_string(),
        kv_format: "sluice-kv-bench".into(),
        tp_size: 1,
        ..Namespace::default()
    };
    let mut c = KvConfig::new(block_bytes, ns);
    apply_tiers(&mut c, &args.tiers)?;
    c.validate()?;
    Ok(c)
}

/// `sluice kv bench`.
pub fn bench(args: &KvBenchArgs) -> Result<(), KvCliError> {
    if !(args.prefill_tokens_per_s.is_finite() && args.prefill_tokens_per_s > 0.0) {
        return Err(KvCliError::Usage(format!(
            "--prefill-tokens-per-s {}: must be a positive rate",
            args.prefill_tokens_per_s
        )));
    }
    let options = TraceOptions {
        format: args.format.parse()?,
        csv_columns: None,
        model: args.model.clone(),
        block_tokens: args.block_tokens,
    };
    let reader = options.reader()?;
    let model_name = reader.kv_model().map(|m| m.name.clone());
    let block_bytes = match (&args.block_bytes, reader.kv_model()) {
        (Some(b), _) => parse_size("block-bytes", b)?,
        (None, Some(m)) => m.block_bytes(args.block_tokens),
        (None, None) => {
            return Err(KvCliError::Usage(
                "--model (a preset or spec, as `sluice sim` takes) or --block-bytes sizes the \
                 blocks"
                    .into(),
            ))
        }
    };
    let mut trace = reader.open(&args.trace)?;
    if let Some(limit) = args.requests {
        truncate_requests(&mut trace, limit);
    }
    if trace.records.is_empty() {
        return Err(KvCliError::Usage(format!(
            "{}: the trace has no blocks to replay",
            args.trace.display()
        )));
    }
    let config = store_config(args, block_bytes, model_name.as_deref().unwrap_or("custom"))?;
    std::fs::create_dir_all(&args.out).map_err(io_err(&args.out))?;
    let store_dir = args.store.clone().unwrap_or_else(|| args.out.join("store"));
    clear_store_dir(&store_dir)?;
    errln!(
        "replaying {} requests ({} blocks of {} bytes) into {} ({})",
        trace.request_starts.len().max(1),
        trace.records.len(),
        block_bytes,
        store_dir.display(),
        describe_tiers(&config)
    );
    // From here on a stop signal ends the replay at the next request, and the store this
    // bench made is removed on the way out (unless --keep-store).
    let stop = StopOnSignal::install();
    let store = KvStore::open(&store_dir, config.clone())?;
    let marker = store_dir.join(BENCH_MARKER);
    std::fs::write(&marker, std::process::id().to_string()).map_err(io_err(&marker))?;
    let outcome = replay(args, &store, &trace, block_bytes);
    let closed = store.close();
    let stats = store.stats();
    drop(store);
    match args.keep_store {
        false => {
            let _ = std::fs::remove_dir_all(&store_dir);
        }
        // A kept store is the user's now: the next bench will not replace it.
        true => {
            let _ = std::fs::remove_file(&marker);
        }
    }
    let replay = outcome?;
    closed?;
    let sim = match args.compare_sim {
        true => Some(simulate_like_store(&trace, &config)?),
        false => None,
    };
    stop.check()?;
    drop(stop);
    let report = report_json(args, block_bytes, &config, &replay, &stats, sim.as_ref());
    let path = args.out.join("bench.json");
    let text = serde_json::to_string_pretty(&report).unwrap_or_default();
    std::fs::write(&path, text).map_err(io_err(&path))?;
    if args.json {
        outln!(
            "{}",
            serde_json::to_string(&report["summary"]).unwrap_or_default()
        );
    } else {
        print_summary(&report);
        outln!("wrote {}", path.display());
    }
    if !args.no_plots {
        super::sim::draw_plots_with(&args.out, "sluice.kv");
    }
    Ok(())
}

/// The tiers' capacities and what they take beyond their budgets, for the first line of
/// `kv bench` and `kv serve`: "dram 64 blocks (68 slots), ssd 256 blocks, up to 1.2 GiB on
/// disk".
pub(crate) fn describe_tiers(c: &KvConfig) -> String {
    let mut parts = Vec::new();
    if c.dram_bytes > 0 {
        parts.push(format!(
            "dram {} blocks ({} slots with the spares)",
            c.dram_policy_blocks(),
            c.dram_arena_slots()
        ));
    }
    if c.ssd_bytes > 0 {
        parts.push(format!(
            "ssd {} blocks, up to {:.2} GiB on disk",
            c.ssd_blocks(),
            c.ssd_disk_bytes_limit() as f64 / (1u64 << 30) as f64
        ));
    }
    parts.join(", ")
}

/// A file `kv bench` writes into the store it creates, naming its pid, and removes with
/// the store: a store that still has it was left by a bench killed mid-run.
const BENCH_MARKER: &str = "sluice-kv-bench.pid";

/// Makes sure `dir` is empty or absent before a bench creates its store there. A store a
/// killed bench left (it has [`BENCH_MARKER`], and no process has it open) is removed,
/// saying so; anything else that is not empty is refused, never written into.
fn clear_store_dir(dir: &Path) -> Result<(), KvCliError> {
    let mut entries = match std::fs::read_dir(dir) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(dir)(e)),
    };
    if entries.next().is_none() {
        return Ok(());
    }
    let marker = dir.join(BENCH_MARKER);
    let is_store = dir.join(sluice_kv::MANIFEST_NAME).is_file();
    if !(is_store && marker.is_file()) {
        return Err(KvCliError::Usage(format!(
            "{}: not empty; a bench starts from an empty store (remove it, or pass another \
             --store)",
            dir.display()
        )));
    }
    // Refused while a running bench (or anything else) has it open.
    sluice_kv::check_store_closed(dir)?;
    let pid = std::fs::read_to_string(&marker).unwrap_or_default();
    errln!(
        "{}: replacing the store a previous `sluice kv bench` left (pid {}, stopped before it \
         could remove it)",
        dir.display(),
        pid.trim()
    );
    std::fs::remove_dir_all(dir).map_err(io_err(dir))
}

/// The signal that stopped the bench (0: none yet).
static STOPPED_BY: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn on_stop_signal(signal: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    STOPPED_BY.store(signal, std::sync::atomic::Ordering::Release);
}

/// SIGINT, SIGTERM and SIGHUP caught for the length of a bench: the replay stops at the
/// next request and the bench cleans up. The old handlers come back when it is dropped.
struct StopOnSignal(Option<super::signals::SavedHandlers>);

impl StopOnSignal {
    fn install() -> StopOnSignal {
        STOPPED_BY.store(0, std::sync::atomic::Ordering::Release);
        StopOnSignal(Some(super::signals::install(on_stop_signal)))
    }

    /// `Err(Interrupted)` once a stop signal came.
    fn check(&self) -> Result<(), KvCliError> {
        match STOPPED_BY.load(std::sync::atomic::Ordering::Acquire) {
            0 => Ok(()),
            signal => Err(KvCliError::Interrupted(signal)),
        }
    }
}

impl Drop for StopOnSignal {
    fn drop(&mut self) {
        if let Some(saved) = self.0.take() {
            saved.restore();
        }
    }
}

/// Keeps the first `limit` requests of a trace.
fn truncate_requests(trace: &mut Trace, limit: u64) {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    if trace.request_starts.is_empty() {
        trace.records.truncate(limit);
    } else if let Some(&end) = trace.request_starts.get(limit) {
        trace.records.truncate(end);
        trace.request_starts.truncate(limit);
    }
}

fn replay(
    args: &KvBenchArgs,
    store: &KvStore,
    trace: &Trace,
    block_bytes: u64,
) -> Result<Replay, KvCliError> {
    let bb = usize::try_from(block_bytes)
        .map_err(|_| KvCliError::Usage(format!("block of {block_bytes} bytes is too large")))?;
    let pool = random_pool(bb, 0x5eed_cafe);
    let mut scratch = vec![0u8; bb];
    let mut bufs: Vec<AlignedBuf> = Vec::new();
    let mut staged: Vec<Vec<u8>> = Vec::new();
    let reqs = trace.request_ranges();
    let window = args.window.unwrap_or((reqs.len() as u64 / 50).max(1));
    let bar = progress(args, reqs.len() as u64);
    let block_tokens = args.block_tokens as f64;
    let mut r = Replay::default();
    let mut w = Window::default();
    let mut last = store.stats();
    for (i, range) in reqs.iter().enumerate() {
        if let sig @ 1.. = STOPPED_BY.load(std::sync::atomic::Ordering::Acquire) {
            bar.finish_and_clear();
            return Err(KvCliError::Interrupted(sig));
        }
        let ids: Vec<u64> = trace.records[range.clone()].iter().map(|x| x.id).collect();
        let keys: Vec<[u8; 8]> = ids.iter().map(|id| id.to_le_bytes()).collect();
        let key_refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
        while bufs.len() < keys.len() {
            bufs.push(AlignedBuf::new(bb).map_err(io_err(&args.out))?);
        }
        let started = Instant::now();
        let n = store.lookup(&key_refs, true)?;
        let served = if n > 0 {
            let mut out: Vec<&mut [u8]> = bufs[..n].iter_mut().map(|b| b.as_mut_slice()).collect();
            store.get_batch_into(&key_refs[..n], &mut out)?
        } else {
            Vec::new()
        };
        let load_s = started.elapsed().as_secs_f64();
        let served_n = served.iter().take_while(|ok| **ok).count();
        for (j, id) in ids[..served_n].iter().enumerate() {
            if !check_block(&pool, *id, bufs[j].as_slice(), &mut scratch) {
                return Err(KvCliError::WrongBytes(format!(
                    "request {i}: block {id} came back with other bytes than were stored"
                )));
            }
        }
        if n > 0 {
            r.latencies_s.push(load_s);
            r.load_seconds += load_s;
            r.time_saved_s += served_n as f64 * block_tokens / args.prefill_tokens_per_s - load_s;
        }
        let rest = &key_refs[served_n..];
        if !rest.is_empty() {
            while staged.len() < rest.len() {
                staged.push(vec![0u8; bb]);
            }
            for (j, id) in ids[served_n..].iter().enumerate() {
                fill_block(&pool, *id, &mut staged[j]);
            }
            let blocks: Vec<&[u8]> = staged[..rest.len()].iter().map(|s| s.as_slice()).collect();
            let t = Instant::now();
            let ok = store.put_batch(rest, &blocks)?;
            r.store_seconds += t.elapsed().as_secs_f64();
            r.stored_blocks += ok.iter().filter(|o| **o).count() as u64;
        }
        r.requests += 1;
        r.blocks += ids.len() as u64;
        r.served_blocks += served_n as u64;
        w.blocks += ids.len() as u64;
        w.served += served_n as u64;
        if (i as u64 + 1) % window == 0 || i + 1 == reqs.len() {
            let now = store.stats();
            w.dram_hits =
                (now.hits_dram + now.put_hits_dram) - (last.hits_dram + last.put_hits_dram);
            w.ssd_hits = (now.hits_ssd + now.put_hits_ssd) - (last.hits_ssd + last.put_hits_ssd);
            w.end_request = i as u64 + 1;
            r.windows.push(std::mem::take(&mut w));
            last = now;
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let s = store.stats();
    r.served_dram = s.hits_dram;
    r.served_ssd = s.hits_ssd;
    r.hits_dram = s.hits_dram + s.put_hits_dram;
    r.hits_ssd = s.hits_ssd + s.put_hits_ssd;
    Ok(r)
}

fn progress(args: &KvBenchArgs, len: u64) -> ProgressBar {
    if args.no_progress || args.json || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} requests {per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// The trace through `sluice_sim::tiered` with the store's policies and capacities, its
/// block ids replaced by the fingerprints the store's policies see.
fn simulate_like_store(trace: &Trace, config: &KvConfig) -> Result<TieredStats, KvCliError> {
    let ns = config.namespace.id();
    let mut t = trace.clone();
    for r in &mut t.records {
        r.id = Fingerprint::of(&ns, &r.id.to_le_bytes()).0;
    }
    let mut tiers = Vec::new();
    if config.dram_bytes > 0 {
        tiers.push(TierSpec {
            name: "dram".into(),
            policy: config.dram_policy.clone(),
            capacity_blocks: config.dram_policy_blocks(),
        });
    }
    if config.ssd_bytes > 0 {
        tiers.push(TierSpec {
            name: "ssd".into(),
            policy: config.ssd_policy.clone(),
            capacity_blocks: config.ssd_blocks(),
        });
    }
    Ok(simulate_tiers(&t, &tiers)?)
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn report_json(
    args: &KvBenchArgs,
    block_bytes: u64,
    config: &KvConfig,
    r: &Replay,
    stats: &sluice_kv::KvStats,
    sim: Option<&TieredStats>,
) -> serde_json::Value {
    let mut lat = r.latencies_s.clone();
    lat.sort_by(f64::total_cmp);
    let ratio = |n: u64| {
        if r.blocks == 0 {
            0.0
        } else {
            n as f64 / r.blocks as f64
        }
    };
    let gbps = |bytes: f64, s: f64| if s > 0.0 { bytes / s / 1e9 } else { 0.0 };
    let served_bytes = r.served_blocks as f64 * block_bytes as f64;
    let summary = serde_json::json!({
        "requests": r.requests,
        "blocks": r.blocks,
        "block_bytes": block_bytes,
        "hit_ratio": ratio(r.hits_dram + r.hits_ssd),
        "prefix_hit_ratio": ratio(r.served_blocks),
        "dram_hit_ratio": ratio(r.hits_dram),
        "ssd_hit_ratio": ratio(r.hits_ssd),
        "served_bytes_dram": r.served_dram * block_bytes,
        "served_bytes_ssd": r.served_ssd * block_bytes,
        "stored_blocks": r.stored_blocks,
        "load_gbps": gbps(served_bytes, r.load_seconds),
        "store_gbps": gbps(r.stored_blocks as f64 * block_bytes as f64, r.store_seconds),
        "load_p50_ms": quantile(&lat, 0.5) * 1e3,
        "load_p99_ms": quantile(&lat, 0.99) * 1e3,
        "prefill_tokens_per_s": args.prefill_tokens_per_s,
        "time_saved_s": r.time_saved_s,
        "corrupt_blocks": stats.corrupt_blocks,
        "read_errors": stats.read_errors,
        "write_errors": stats.write_errors,
    });
    let sim = sim.map(|s| {
        let tier = |name: &str| s.tiers.iter().find(|t| t.name == name).map(|t| t.hits);
        let blocks = s.blocks.max(1) as f64;
        serde_json::json!({
            "hit_ratio": s.hit_ratio(),
            "prefix_hit_ratio": s.prefix_hit_ratio(),
            "dram_hit_ratio": tier("dram").map(|h| h as f64 / blocks),
            "ssd_hit_ratio": tier("ssd").map(|h| h as f64 / blocks),
            "tiers": s.tiers,
        })
    });
    serde_json::json!({
        "trace": args.trace.display().to_string(),
        "model": args.model,
        "block_tokens": args.block_tokens,
        "config": {
            "dram_bytes": config.dram_bytes,
            "ssd_bytes": config.ssd_bytes,
            "dram_policy": config.dram_policy.kind().name(),
            "ssd_policy": config.ssd_policy.kind().name(),
            "dram_capacity_blocks": config.dram_policy_blocks(),
            "dram_arena_bytes": config.dram_arena_slots() * block_bytes,
            "ssd_capacity_blocks": config.ssd_blocks(),
            "ssd_disk_bytes_limit": config.ssd_disk_bytes_limit(),
            "io_threads": config.io_threads,
            "direct": format!("{:?}", config.direct).to_lowercase(),
        },
        "summary": summary,
        "sim": sim,
        "windows": r.windows,
        "latencies_ms": lat.iter().map(|s| s * 1e3).collect::<Vec<_>>(),
        "store_stats": stats,
    })
}

fn print_summary(report: &serde_json::Value) {
    let s = &report["summary"];
    let f = |k: &str| s[k].as_f64().unwrap_or(0.0);
    outln!(
        "{} requests, {} blocks of {} bytes",
        s["requests"],
        s["blocks"],
        s["block_bytes"]
    );
    outln!(
        "hit ratio {:.4} (dram {:.4}, ssd {:.4}); prefix served {:.4}",
        f("hit_ratio"),
        f("dram_hit_ratio"),
        f("ssd_hit_ratio"),
        f("prefix_hit_ratio")
    );
    outln!(
        "load {:.2} GB/s, per request p50 {:.3} ms, p99 {:.3} ms; store {:.2} GB/s",
        f("load_gbps"),
        f("load_p50_ms"),
        f("load_p99_ms"),
        f("store_gbps")
    );
    outln!(
        "served {:.2} GiB from DRAM, {:.2} GiB from SSD; {:.1} s saved against recomputing at \
         {:.0} tokens/s",
        f("served_bytes_dram") / (1u64 << 30) as f64,
        f("served_bytes_ssd") / (1u64 << 30) as f64,
        f("time_saved_s"),
        f("prefill_tokens_per_s")
    );
    let sim = &report["sim"];
    if sim.is_null() {
        return;
    }
    outln!("{:<20}{:>10}{:>10}{:>12}", "", "live", "sim", "diff (pts)");
    for (label, key) in [
        ("hit ratio", "hit_ratio"),
        ("prefix hit ratio", "prefix_hit_ratio"),
        ("dram hit ratio", "dram_hit_ratio"),
        ("ssd hit ratio", "ssd_hit_ratio"),
    ] {
        let (Some(live), Some(pred)) = (s[key].as_f64(), sim[key].as_f64()) else {
            continue;
        };
        outln!(
            "{label:<20}{live:>10.4}{pred:>10.4}{:>+12.2}",
            (live - pred) * 100.0
        );
    }
}
