//! Namespaces and block fingerprints.
//!
//! An engine's block key is a prefix-chained hash over token ids. It says nothing about the
//! model, dtype or tensor-parallel layout that produced the KV, so the same key from two
//! deployments names different bytes. A [`Namespace`] carries those facts; its digest is
//! stored in every record and mixed into every fingerprint, so two namespaces never see
//! each other's blocks, even in one store directory.
//!
//! The in-memory index is keyed by a 64-bit [`Fingerprint`] of (namespace, key), which
//! keeps an index entry small. Two keys can share a fingerprint (about one pair in 2^64);
//! the record on disk holds the full key and namespace and a read compares both, so a
//! collision costs a miss, never another block's bytes.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use serde::{Deserialize, Serialize};

/// What KV bytes depend on besides the token prefix.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Namespace {
    /// Model name or path, with anything that changes its weights (a fine-tune id).
    pub model: String,
    /// KV dtype (`bfloat16`, `fp8_e4m3`).
    pub dtype: String,
    pub tp_rank: u32,
    pub tp_size: u32,
    pub pp_stage: u32,
    /// Layout of a block's bytes (the engine's KV format name and version).
    pub kv_format: String,
    /// Anything else that must separate blocks: bump it to invalidate a store's contents.
    pub salt: String,
}

impl Namespace {
    /// Checks the layout fields: a tensor-parallel rank is below its group's size. A size
    /// of 0 means "not given" and takes rank 0 only. (There is no pipeline size to check
    /// `pp_stage` against.)
    pub fn validate(&self) -> Result<(), crate::error::KvError> {
        let ok = match self.tp_size {
            0 => self.tp_rank == 0,
            n => self.tp_rank < n,
        };
        if !ok {
            return Err(crate::error::KvError::config(
                "tp_rank",
                self.tp_rank,
                format!(
                    "must be below tp_size ({}): ranks are 0 to tp_size - 1",
                    self.tp_size
                ),
            ));
        }
        Ok(())
    }

    /// The 16-byte digest stored in every record of this namespace.
    pub fn id(&self) -> [u8; 16] {
        let mut h = blake3::Hasher::new();
        h.update(b"sluice-kv namespace v1\0");
        for part in [&self.model, &self.dtype, &self.kv_format, &self.salt] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        for n in [self.tp_rank, self.tp_size, self.pp_stage] {
            h.update(&n.to_le_bytes());
        }
        let mut id = [0u8; 16];
        id.copy_from_slice(&h.finalize().as_bytes()[..16]);
        id
    }
}

/// The index key of a block: a 64-bit hash of (namespace id, key).
///
/// Fingerprints live only in memory (the index is rebuilt from the records at open), so
/// the hash need not be stable across builds, only fast and well mixed: a lookup of a
/// 1,000-key chain hashes every key, and BLAKE3 cost about 55 ns a key where SipHash-1-3
/// (the standard library's hasher, with its fixed keys) costs about 11. Keys come from the
/// engine, not from an adversary, and a collision costs a miss, never bytes, since every
/// read compares the full key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub u64);

impl Fingerprint {
    pub fn of(namespace_id: &[u8; 16], key: &[u8]) -> Fingerprint {
        let mut h = std::hash::DefaultHasher::new();
        h.write(namespace_id);
        h.write(key);
        Fingerprint(h.finish())
    }
}

/// A map keyed by fingerprints. They are already hashes, so the table uses them as they
/// are instead of hashing them again.
pub type FpMap<V> = HashMap<Fingerprint, V, BuildHasherDefault<FpHasher>>;

/// An [`FpMap`] with room for `n` entries.
pub fn fp_map<V>(n: usize) -> FpMap<V> {
    HashMap::with_capacity_and_hasher(n, BuildHasherDefault::default())
}

/// Bytes an [`FpMap`] of `V` holds: its buckets (hashbrown keeps a power of two of them,
/// of which it fills 7/8) times an entry plus a control byte.
pub fn fp_map_bytes<V>(map: &FpMap<V>) -> usize {
    let cap = map.capacity();
    let buckets = match cap {
        0 => return 0,
        c if c < 8 => (c + 1).next_power_of_two(),
        c => (c * 8 / 7).next_power_of_two(),
    };
    buckets * (std::mem::size_of::<(Fingerprint, V)>() + 1)
}

/// The identity hasher behind [`FpMap`]: a fingerprint hashes to itself.
#[derive(Default)]
pub struct FpHasher(u64);

impl Hasher for FpHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used by `Fingerprint`'s Hash; mix anything else in anyway.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_bytes_count_the_buckets_a_map_really_holds() {
        // 36,700 entries take 65,536 buckets of 16 + 1 bytes (the stats once counted twice
        // that, rounding 7/8 of a power of two up to the next one).
        let m: FpMap<u64> = fp_map(36_700);
        assert_eq!(m.capacity(), 57_344);
        assert_eq!(fp_map_bytes(&m), 65_536 * 17);
        assert_eq!(fp_map_bytes(&fp_map::<u64>(0)), 0);
    }

    #[test]
    fn every_field_separates_namespaces() {
        let base = Namespace {
            model: "m".into(),
            dtype: "bfloat16".into(),
            tp_rank: 0,
            tp_size: 2,
            pp_stage: 0,
            kv_format: "vllm".into(),
            salt: String::new(),
        };
        let variants = [
            Namespace {
                model: "m2".into(),
                ..base.clone()
            },
            Namespace {
                dtype: "float16".into(),
                ..base.clone()
            },
            Namespace {
                tp_rank: 1,
                ..base.clone()
            },
            Namespace {
                tp_size: 4,
                ..base.clone()
            },
            Namespace {
                pp_stage: 1,
                ..base.clone()
            },
            Namespace {
                kv_format: "sglang".into(),
                ..base.clone()
            },
            Namespace {
                salt: "r2".into(),
                ..base.clone()
            },
        ];
        for v in &variants {
            assert_ne!(v.id(), base.id(), "{v:?}");
            assert_ne!(
                Fingerprint::of(&v.id(), b"k"),
                Fingerprint::of(&base.id(), b"k")
            );
        }
    }

    #[test]
    fn field_boundaries_are_unambiguous() {
        let a = Namespace {
            model: "ab".into(),
            dtype: "c".into(),
            ..Default::default()
        };
        let b = Namespace {
            model: "a".into(),
            dtype: "bc".into(),
            ..Default::default()
        };
        assert_ne!(a.id(), b.id());
    }
}
