//! Load configuration: every knob, its default and why.

use sluice_engine::{ConfigError, DirectMode, EngineChoice, PinWith};
use sluice_formats::parse_bytes;

const MIB: usize = 1 << 20;

/// How a checkpoint is read.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadConfig {
    /// O_DIRECT policy. Auto: direct for cold files on file systems that
    /// support it, buffered for warm files and where it is refused.
    pub direct: DirectMode,
    /// Reader implementation. Auto: io_uring where the probe passes.
    pub engine: EngineChoice,
    /// Reads in flight at once. 32: fio on virtio and NVMe devices reaches
    /// its plateau by QD32 with 4 MiB reads; deeper queues only add memory.
    pub concurrency: usize,
    /// Bytes per read. 4 MiB: large enough that per-request overhead is
    /// under 1% at 1–10 GB/s, small enough that 32 of them (128 MiB) fit in
    /// a modest memory limit.
    pub chunk_bytes: usize,
    /// Target size of a window, the unit of delivery and buffer reuse.
    /// 64 MiB: 16 reads per window keeps the queue full across window
    /// boundaries, and a streamed tensor waits for at most that much I/O.
    /// A tensor larger than this gets a window of its own. Never below
    /// `chunk_bytes` (the loader raises it to that).
    pub window_bytes: usize,
    /// Gap between selected tensors that is read over rather than split into
    /// two windows. 1 MiB costs under a millisecond at device speed, less
    /// than a second request's latency.
    pub max_gap_bytes: u64,
    /// Byte budget for the buffers of a stream; `None` means
    /// [`DEFAULT_STREAM_MEMORY_LIMIT`]. A full load ignores it: its buffers
    /// are the result.
    pub memory_limit: Option<u64>,
    /// After each buffered read, drop its pages from the page cache ("burn
    /// after reading"): a model read once should not evict everything else.
    pub drop_cache: bool,
    /// With `direct = Auto`, serve a window whose pages are all in the page
    /// cache by mapping them (zero copy) instead of reading them. Fast for
    /// warm restarts; like any mmap loader, a file truncated by someone else
    /// while its tensors are alive raises SIGBUS on access. Off:
    /// `SLUICE_MAP_CACHED=0`.
    pub map_cached: bool,
    /// Load the shards that are there when some are absent (an index's
    /// file that does not exist, a gap in a `-NNNNN-of-MMMMM` series), with
    /// a warning naming each. Off: a missing shard is an error, never a
    /// smaller model presented as the whole.
    pub allow_partial: bool,
    /// Treat io_uring as unavailable (`SLUICE_IO_URING=0`): for hosts where
    /// it misbehaves, and to exercise the thread-pool fallback.
    pub io_uring_disabled: bool,
    /// Register a stream's buffers with this GPU runtime (page-locked for DMA) while they
    /// are mapped, so copies from them to a device run asynchronously: the loader reads
    /// straight into pinned memory. `None`: plain host memory.
    pub pin: Option<PinWith>,
}

/// 512 MiB: eight 64 MiB windows, enough to keep 32 reads in flight while the
/// consumer holds a few windows, and small next to any model worth streaming.
pub const DEFAULT_STREAM_MEMORY_LIMIT: u64 = 512 << 20;

impl Default for LoadConfig {
    fn default() -> Self {
        LoadConfig {
            direct: DirectMode::Auto,
            engine: EngineChoice::Auto,
            concurrency: 32,
            chunk_bytes: 4 * MIB,
            window_bytes: 64 * MIB,
            max_gap_bytes: MIB as u64,
            memory_limit: None,
            drop_cache: false,
            io_uring_disabled: false,
            map_cached: true,
            allow_partial: false,
            pin: None,
        }
    }
}

impl LoadConfig {
    /// Applies `SLUICE_*` environment overrides, logging each one. This is
    /// the only place the environment is read.
    pub fn with_env_overrides(mut self) -> Result<Self, ConfigError> {
        self.with_vars(|name| std::env::var(name).ok())?;
        Ok(self)
    }

    fn with_vars(&mut self, get: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        if let Some(v) = read_var(&get, "SLUICE_DIRECT", str::parse)? {
            self.direct = v;
        }
        if let Some(v) = read_var(&get, "SLUICE_ENGINE", str::parse)? {
            self.engine = v;
        }
        // SLUICE_QUEUE_DEPTH is the name this knob had before; still read.
        for name in ["SLUICE_QUEUE_DEPTH", "SLUICE_CONCURRENCY"] {
            if let Some(v) = read_var(&get, name, parse_count)? {
                self.concurrency = v;
            }
        }
        if let Some(v) = read_var(&get, "SLUICE_CHUNK_BYTES", parse_bytes)? {
            self.chunk_bytes = usize::try_from(v).map_err(|e| {
                ConfigError::new(
                    format!("environment variable SLUICE_CHUNK_BYTES={v}"),
                    e.to_string(),
                )
            })?;
        }
        if let Some(v) = read_var(&get, "SLUICE_MEMORY_LIMIT", parse_bytes)? {
            self.memory_limit = Some(v);
        }
        if let Some(v) = read_var(&get, "SLUICE_DROP_CACHE", parse_bool)? {
            self.drop_cache = v;
        }
        if let Some(v) = read_var(&get, "SLUICE_MAP_CACHED", parse_bool)? {
            self.map_cached = v;
        }
        if let Some(v) = read_var(&get, "SLUICE_IO_URING", parse_bool)? {
            self.io_uring_disabled = !v;
        }
        Ok(())
    }

    /// Rejects values no load can run with.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.concurrency == 0 || self.concurrency > 4096 {
            return Err(ConfigError::new(
                "concurrency",
                format!("must be 1..=4096, not {}", self.concurrency),
            ));
        }
        if self.chunk_bytes < 4096 || self.chunk_bytes > 1 << 30 {
            return Err(ConfigError::new(
                "chunk_bytes",
                format!("must be 4 KiB..=1 GiB, not {}", self.chunk_bytes),
            ));
        }
        if self.memory_limit == Some(0) {
            return Err(ConfigError::new("memory_limit", "must be positive"));
        }
        Ok(())
    }
}

fn read_var<T>(
    get: &impl Fn(&str) -> Option<String>,
    name: &'static str,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<Option<T>, ConfigError> {
    let Some(value) = get(name) else {
        return Ok(None);
    };
    let parsed = parse(value.trim()).map_err(|reason| {
        ConfigError::new(
            format!("environment variable {name}={value:?}"),
            format!("invalid: {reason}"),
        )
    })?;
    tracing::info!(%name, %value, "config override from environment");
    Ok(Some(parsed))
}

fn parse_count(s: &str) -> Result<usize, String> {
    s.parse().map_err(|e| format!("not a count: {e}"))
}

fn parse_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        other => Err(format!("not a boolean: {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_overrides_apply_and_bad_values_name_the_variable() {
        let mut cfg = LoadConfig::default();
        cfg.with_vars(|n| match n {
            "SLUICE_DIRECT" => Some("off".into()),
            "SLUICE_MEMORY_LIMIT" => Some("256MiB".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(cfg.direct, DirectMode::Off);
        assert_eq!(cfg.memory_limit, Some(256 << 20));
        let err = cfg
            .with_vars(|n| (n == "SLUICE_QUEUE_DEPTH").then(|| "lots".into()))
            .unwrap_err();
        assert!(err.to_string().contains("SLUICE_QUEUE_DEPTH"), "{err}");
    }

    #[test]
    fn validate_rejects_unusable_values() {
        let bad = LoadConfig {
            concurrency: 0,
            ..LoadConfig::default()
        };
        assert!(bad.validate().is_err());
        let bad = LoadConfig {
            chunk_bytes: 100,
            ..LoadConfig::default()
        };
        assert!(bad.validate().is_err());
        assert!(LoadConfig::default().validate().is_ok());
    }
}
