//! `sluice load`: stream a checkpoint through memory and report throughput.

use std::io::IsTerminal;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use sluice_load::{LoadError, LoadStats, Loader};

use crate::{load_config, LoadArgs};

pub fn run(args: &LoadArgs) -> Result<(), LoadError> {
    let cfg = load_config(args)?;
    let started = Instant::now();
    let loader = Loader::open(&args.path, cfg)?;
    let (mut stream, mut stats) = loader.stream(args.names.as_deref())?;
    let bar = progress_bar(args, stats.tensor_bytes);
    let mut tensors = 0usize;
    while let Some(window) = stream.next_window() {
        tensors += window?.tensors.len();
        bar.set_position(stream.progress().done_bytes);
    }
    bar.finish_and_clear();
    stats.elapsed = started.elapsed();
    stats.peak_pool_bytes = stream.pool().stats().peak_mapped_bytes;
    stats.tensors = tensors;
    print_result(args, &stats, stream.bytes_read());
    Ok(())
}

fn progress_bar(args: &LoadArgs, total: u64) -> ProgressBar {
    if args.json || args.no_progress || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    let style = ProgressStyle::with_template(
        "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}

fn print_result(args: &LoadArgs, stats: &LoadStats, bytes_read: u64) {
    let secs = stats.elapsed.as_secs_f64();
    if args.json {
        let files: Vec<_> = stats
            .files
            .iter()
            .map(|f| serde_json::json!({"path": f.path, "direct": f.direct, "buffered_reason": f.reason}))
            .collect();
        let out = serde_json::json!({
            "path": args.path,
            "tensors": stats.tensors,
            "bytes": stats.tensor_bytes,
            "bytes_read": bytes_read,
            "seconds": secs,
            "gb_per_s": stats.gb_per_s(),
            "engine": stats.engine,
            "io_mode": stats.io_mode(),
            "peak_buffer_bytes": stats.peak_pool_bytes,
            "files": files,
            "complete": stats.missing_shards.is_empty(),
            "missing_shards": stats.missing_shards,
        });
        outln!("{out}");
        return;
    }
    outln!(
        "loaded {} tensors, {:.3} GB in {:.3} s: {:.2} GB/s (engine {}, {} I/O, peak buffers {:.0} MiB)",
        stats.tensors,
        stats.tensor_bytes as f64 / 1e9,
        secs,
        stats.gb_per_s(),
        stats.engine,
        stats.io_mode(),
        stats.peak_pool_bytes as f64 / (1 << 20) as f64,
    );
    for f in stats.files.iter().filter(|f| !f.direct) {
        outln!(
            "  buffered: {} ({})",
            f.path.display(),
            f.reason.as_deref().unwrap_or("-")
        );
    }
    if bytes_read < stats.tensor_bytes {
        // Windows already in the page cache are mapped, not read: the rate above is
        // not a read rate then.
        outln!(
            "  read {:.3} GB; the rest was mapped from the page cache (SLUICE_MAP_CACHED=0 reads it)",
            bytes_read as f64 / 1e9
        );
    }
    let shown = super::inspect::MISSING_SHOWN;
    for path in stats.missing_shards.iter().take(shown) {
        outln!("  MISSING (--allow-partial): {}", path.display());
    }
    if stats.missing_shards.len() > shown {
        let more = stats.missing_shards.len() - shown;
        outln!("  ... and {more} more MISSING (--json lists them all)");
    }
}
