//! A count-min sketch of recent request frequencies, the memory of the
//! TinyLFU door ([`crate::tinylfu_door`]) and of W-TinyLFU.
//!
//! TinyLFU (Einziger, Friedman, Manes, ACM TOS 2017) admits a new object only
//! when it has been requested more often, recently, than the object it would
//! displace. Counting every object exactly would cost a map entry per object
//! ever seen; a count-min sketch answers "how often was `id` requested?" in
//! fixed memory, over-estimating only when ids collide.
//!
//! The sketch is `depth` rows of `width` 4-bit counters. Each row hashes the
//! id with its own seed to one counter; an increment bumps that counter in
//! every row (saturating at 15) and an estimate is the minimum over the rows,
//! so a collision has to happen in every row to inflate it. Four bits are
//! enough because TinyLFU compares frequencies within one sample period, in
//! which a count above 15 no longer changes any admission decision.
//!
//! Freshness comes from the "reset": after `reset_factor x capacity`
//! increments (TinyLFU's sample size W, 10 x the cache size in objects by
//! default) every counter is halved, so history fades geometrically. Halving
//! works on 16 packed counters per `u64` at a time. For byte capacities the
//! cache size in objects is estimated as `capacity / mean size`, the mean
//! taken over the sizes shown to the sketch so far ([`CountMinSketch::observe_size`]);
//! before any size is seen, sizes count as 1.
//!
//! Unlike the paper, there is no "doorkeeper" Bloom filter in front of the
//! sketch: it only saves memory, which a 32 KiB sketch does not need.

use crate::rng::Rng;

/// Counters are 4 bits: 16 to a word.
const COUNTERS_PER_WORD: usize = 16;
const COUNTER_MAX: u64 = 15;
/// Clears the bit each counter would shift into its lower neighbour.
const HALVE_MASK: u64 = 0x7777_7777_7777_7777;
/// Rows beyond this add nothing (error probability e^-8) and cost a hash each.
const MAX_DEPTH: usize = 8;
/// 2^24 counters (8 MiB) a row: enough for caches of tens of millions of
/// objects; wider only wastes memory, and a typo must not allocate terabytes.
const MAX_WIDTH: usize = 1 << 24;

/// Fixed-memory frequency estimates with periodic halving.
#[derive(Clone, Debug)]
pub struct CountMinSketch {
    words: Vec<u64>,
    width: usize,
    seeds: Vec<u64>,
    /// Cache size in bytes (objects in object-count mode); with the mean
    /// object size it sets the sample size between resets.
    capacity: u64,
    reset_factor: u64,
    increments: u64,
    size_sum: u128,
    sizes_seen: u64,
    resets: u64,
}

impl CountMinSketch {
    /// `width` counters per row (1 to 2^24) and `depth` rows (1 to 8), with
    /// row hashes derived from `seed`; values outside are clamped. Without
    /// [`with_reset`](Self::with_reset) the sketch never halves.
    pub fn new(width: usize, depth: usize, seed: u64) -> CountMinSketch {
        let width = width.clamp(1, MAX_WIDTH);
        let depth = depth.clamp(1, MAX_DEPTH);
        let mut rng = Rng::new(seed);
        let seeds = (0..depth).map(|_| rng.next_u64()).collect();
        let words = (width * depth).div_ceil(COUNTERS_PER_WORD);
        CountMinSketch {
            words: vec![0; words],
            width,
            seeds,
            capacity: 0,
            reset_factor: 0,
            increments: 0,
            size_sum: 0,
            sizes_seen: 0,
            resets: 0,
        }
    }

    /// Halves every counter after `reset_factor x capacity-in-objects`
    /// increments, `capacity` being in bytes (see the module header).
    pub fn with_reset(mut self, capacity: u64, reset_factor: u64) -> CountMinSketch {
        self.capacity = capacity;
        self.reset_factor = reset_factor;
        self
    }

    /// Records one request for `id`, halving all counters when the sample
    /// period is over.
    pub fn increment(&mut self, id: u64) {
        for row in 0..self.seeds.len() {
            let (word, shift) = self.locate(id, row);
            if (self.words[word] >> shift) & COUNTER_MAX < COUNTER_MAX {
                self.words[word] += 1 << shift;
            }
        }
        self.increments += 1;
        if self.sample_is_full() {
            self.halve();
        }
    }

    /// How often `id` was recorded (decayed by the resets), never less than
    /// the truth, at most 15.
    pub fn estimate(&self, id: u64) -> u8 {
        let mut min = COUNTER_MAX;
        for row in 0..self.seeds.len() {
            let (word, shift) = self.locate(id, row);
            min = min.min((self.words[word] >> shift) & COUNTER_MAX);
        }
        min as u8
    }

    /// Shows the sketch an object size, for the mean that converts a byte
    /// capacity into a number of objects.
    pub fn observe_size(&mut self, size: u64) {
        self.size_sum += u128::from(size);
        self.sizes_seen += 1;
    }

    /// Halves every counter and restarts the sample period.
    pub fn halve(&mut self) {
        for w in &mut self.words {
            *w = (*w >> 1) & HALVE_MASK;
        }
        self.increments = 0;
        self.resets += 1;
    }

    /// Resets (halvings) so far.
    pub fn resets(&self) -> u64 {
        self.resets
    }

    /// The number of increments between resets right now.
    pub fn sample_size(&self) -> u64 {
        let objects = match (self.sizes_seen, self.size_sum) {
            (0, _) | (_, 0) => u128::from(self.capacity),
            (n, sum) => u128::from(self.capacity) * u128::from(n) / sum,
        };
        let sample = u128::from(self.reset_factor) * objects.max(1);
        u64::try_from(sample).unwrap_or(u64::MAX)
    }

    fn sample_is_full(&self) -> bool {
        self.reset_factor > 0 && self.increments >= self.sample_size()
    }

    /// The word and bit offset of `id`'s counter in `row`.
    #[inline]
    fn locate(&self, id: u64, row: usize) -> (usize, u32) {
        let hash = mix(id ^ self.seeds[row]);
        // Multiply-shift maps the hash onto 0..width without a division.
        let column = ((u128::from(hash) * self.width as u128) >> 64) as usize;
        let index = row * self.width + column;
        (
            index / COUNTERS_PER_WORD,
            (index % COUNTERS_PER_WORD) as u32 * 4,
        )
    }
}

/// SplitMix64's finalizer: every input bit affects every output bit.
#[inline]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_count_increments_and_saturate_at_fifteen() {
        let mut cms = CountMinSketch::new(1024, 4, 7);
        for _ in 0..5 {
            cms.increment(42);
        }
        assert_eq!((cms.estimate(42), cms.estimate(43)), (5, 0));
        for _ in 0..100 {
            cms.increment(42);
        }
        assert_eq!(cms.estimate(42), 15);
    }

    #[test]
    fn estimates_never_undercount_even_when_crowded() {
        // 16 counters per row for 200 ids: collisions everywhere.
        let mut cms = CountMinSketch::new(16, 2, 1);
        for id in 0..200u64 {
            for _ in 0..(id % 4) {
                cms.increment(id);
            }
        }
        for id in 0..200u64 {
            assert!(u64::from(cms.estimate(id)) >= id % 4, "id {id}");
        }
    }

    #[test]
    fn halves_every_reset_factor_times_capacity_increments() {
        // Capacity 4 objects, factor 10: a reset every 40 increments.
        let mut cms = CountMinSketch::new(256, 4, 3).with_reset(4, 10);
        for _ in 0..12 {
            cms.increment(1);
        }
        for i in 0..27 {
            cms.increment(100 + i);
        }
        assert_eq!((cms.resets(), cms.estimate(1)), (0, 12));
        cms.increment(2); // the 40th increment
        assert_eq!((cms.resets(), cms.estimate(1)), (1, 6));
    }

    #[test]
    fn byte_capacities_reset_by_mean_object_size() {
        // 1000 bytes of 100-byte objects hold 10 objects: W = 2 x 10.
        let mut cms = CountMinSketch::new(256, 4, 3).with_reset(1000, 2);
        assert_eq!(cms.sample_size(), 2000, "no sizes seen: sizes count as 1");
        cms.observe_size(50);
        cms.observe_size(150);
        assert_eq!(cms.sample_size(), 20);
    }

    #[test]
    fn absurd_widths_are_clamped_instead_of_allocating_without_bound() {
        let cms = CountMinSketch::new(usize::MAX, 99, 0);
        assert_eq!((cms.width, cms.seeds.len()), (MAX_WIDTH, MAX_DEPTH));
        let cms = CountMinSketch::new(0, 0, 0);
        assert_eq!((cms.width, cms.seeds.len(), cms.estimate(5)), (1, 1, 0));
    }

    #[test]
    fn rows_hash_differently_and_seeds_change_placement() {
        let a = CountMinSketch::new(1 << 16, 4, 1);
        let b = CountMinSketch::new(1 << 16, 4, 2);
        let cols = |s: &CountMinSketch| (0..4).map(|r| s.locate(99, r)).collect::<Vec<_>>();
        assert_ne!(cols(&a), cols(&b));
    }
}
