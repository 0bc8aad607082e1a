//! Object id → slot maps with a hasher made for integer keys.
//!
//! Trace ids are arbitrary `u64`s (often sequential, sometimes hashes), and
//! the map is touched on every request, so SipHash's DoS resistance buys
//! nothing and costs most of a request's time. A folded 128-bit multiply
//! mixes every input bit into both halves in a couple of cycles.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// `HashMap` keyed by object id.
pub type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// An empty [`IdMap`] sized for `capacity` entries.
pub fn id_map_with_capacity<V>(capacity: usize) -> IdMap<V> {
    IdMap::with_capacity_and_hasher(capacity, BuildHasherDefault::default())
}

/// Folded multiply hash of one `u64` (other inputs are folded in byte-wise).
#[derive(Default, Clone, Copy)]
pub struct IdHasher {
    hash: u64,
}

// An odd constant with well-spread bits (2^64 / golden ratio).
const MIX: u64 = 0x9E37_79B9_7F4A_7C15;

#[inline]
fn fold_mul(a: u64, b: u64) -> u64 {
    let full = u128::from(a) * u128::from(b);
    (full as u64) ^ ((full >> 64) as u64)
}

impl Hasher for IdHasher {
    #[inline]
    fn write_u64(&mut self, value: u64) {
        self.hash = fold_mul(self.hash ^ value, MIX);
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_ids_spread_over_buckets() {
        let mut low_bits = std::collections::HashSet::new();
        for id in 0..1024u64 {
            let mut h = IdHasher::default();
            h.write_u64(id);
            low_bits.insert(h.finish() & 1023);
        }
        // A uniform hash of 1024 keys into 1024 buckets fills about 63%.
        assert!(low_bits.len() > 550, "only {} buckets used", low_bits.len());
    }
}
