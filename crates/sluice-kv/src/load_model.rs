//! [`LoadModel`]: how long a get takes per block on each tier, measured, for
//! `lookup_worth_loading` (a hit that loads slower than the engine recomputes it is not
//! worth loading).

use std::time::Duration;

/// Seconds per block a get spends on each tier: moving averages of what gets measured,
/// starting from conservative guesses (DRAM at 4 GB/s, SSD at 0.5 GB/s) until the first
/// gets of each tier are timed.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct LoadModel {
    pub dram_block_s: f64,
    pub ssd_block_s: f64,
    pub shared_block_s: f64,
}

impl LoadModel {
    /// Weight of a new measurement in the moving averages.
    const ALPHA: f64 = 0.25;

    pub(crate) fn new(block_bytes: u64) -> LoadModel {
        LoadModel {
            dram_block_s: block_bytes as f64 / 4e9,
            ssd_block_s: block_bytes as f64 / 0.5e9,
            // A network file system, until measured.
            shared_block_s: block_bytes as f64 / 0.1e9,
        }
    }

    /// A get batch served `tiers` in `elapsed`. A batch with SSD hits is charged to SSD
    /// (its reads dominate), one with only DRAM hits to DRAM. Per block, amortized over
    /// the batch's parallel reads: what a prefix of that many blocks costs to load.
    pub(crate) fn record(&mut self, tiers: &GetTiers, elapsed: Duration) {
        let t = elapsed.as_secs_f64();
        let ewma = |old: f64, new: f64| old + Self::ALPHA * (new - old);
        if tiers.shared > 0 {
            self.shared_block_s = ewma(self.shared_block_s, t / tiers.shared as f64);
        } else if tiers.ssd > 0 {
            self.ssd_block_s = ewma(self.ssd_block_s, t / tiers.ssd as f64);
        } else if tiers.dram > 0 {
            self.dram_block_s = ewma(self.dram_block_s, t / tiers.dram as f64);
        }
    }
}

/// How many keys of a get batch each tier served.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct GetTiers {
    pub dram: u64,
    pub ssd: u64,
    /// Our segments in the shared directory, or another store's.
    pub shared: u64,
}
