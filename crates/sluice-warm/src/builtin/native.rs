//! `native`: the kernel's own readahead and LRU, untouched (the baseline).

use crate::policy::WarmPolicy;

/// The baseline: no prefetch, no eviction.
pub struct Native;

impl WarmPolicy for Native {
    fn name(&self) -> &str {
        "native"
    }

    fn needs_read_ranges(&self) -> bool {
        false
    }
}
