//! [`MountOptions`]: how a mount caches and prefetches, with its checks.

use crate::disk_cache::DiskCacheOptions;
use crate::error::MountError;
use crate::streams::StreamConfig;

/// How a mount caches and prefetches.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// Cache and fetch unit.
    pub block_bytes: u64,
    /// The shared pool's budget: blocks ready plus blocks being fetched.
    pub pool_bytes: u64,
    /// Threads fetching prefetched blocks (each one GET in flight).
    pub prefetch_threads: usize,
    pub streams: StreamConfig,
    /// Next `.safetensors` files (in name order) whose start is prefetched once a reader
    /// passes the middle of one: Alluxio's `lookahead.files.count`.
    pub lookahead_files: usize,
    /// The optional second tier: blocks kept in a local directory under their own budget.
    pub disk_cache: Option<DiskCacheOptions>,
    /// Hand a file whose every block the disk tier holds (checked) to the kernel as the
    /// open's backing file (FUSE passthrough), so reads run at local page-cache speed.
    pub passthrough: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            block_bytes: 8 << 20,
            pool_bytes: 2 << 30,
            prefetch_threads: 16,
            streams: StreamConfig::default(),
            lookahead_files: 1,
            disk_cache: None,
            passthrough: true,
        }
    }
}

impl MountOptions {
    pub fn validate(&self) -> Result<(), MountError> {
        let bad = |what: &str, why: String| Err(MountError::config(what, why));
        if !(64 << 10..=256 << 20).contains(&self.block_bytes) {
            return bad(
                "block size",
                format!("must be 64 KiB..=256 MiB, not {}", self.block_bytes),
            );
        }
        if self.pool_bytes < 4 * self.block_bytes {
            return bad(
                "pool",
                format!(
                    "{} bytes must hold at least 4 blocks of {} bytes",
                    self.pool_bytes, self.block_bytes
                ),
            );
        }
        if self.prefetch_threads == 0 || self.prefetch_threads > 256 {
            return bad(
                "prefetch threads",
                format!("must be 1..=256, not {}", self.prefetch_threads),
            );
        }
        if self.streams.max_cursors == 0 {
            return bad("streams per file", "must be at least 1, not 0".into());
        }
        if let Some(d) = &self.disk_cache {
            if d.budget < 4 * self.block_bytes {
                return bad(
                    "disk cache",
                    format!(
                        "{} bytes must hold at least 4 blocks of {} bytes",
                        d.budget, self.block_bytes
                    ),
                );
            }
        }
        Ok(())
    }
}
