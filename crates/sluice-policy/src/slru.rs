//! SLRU: segmented LRU, a probation segment for objects seen once and a
//! protected segment for objects hit since admission.
//!
//! Both segments are LRU lists. A new object enters probation at the most
//! recently used end. A hit in probation promotes the object to protected's
//! most recently used end; a hit in protected refreshes it there. The
//! protected segment holds at most `protected_ratio x capacity` bytes: when a
//! promotion overflows it, its least recently used objects are demoted to
//! probation's most recently used end, where they get one more chance to be
//! hit before they fall out. Evictions take probation's least recently used
//! object, or protected's when probation is empty.
//!
//! One-hit wonders therefore only ever compete with each other for the
//! probation share, while objects with proven reuse are protected from a
//! scan. This is the two-segment SLRU of Karedla et al. and the main cache of
//! TinyLFU (Einziger et al.); libCacheSim's `SLRU` generalises it to n equal
//! segments, so its numbers differ.
//!
//! [`Policy::victim`] is exact: the next eviction is always the least
//! recently used end of probation (or of protected when probation is empty).

use crate::error::PolicyError;
use crate::id_map::{id_map_with_capacity, IdMap};
use crate::params::{check, parse_value, Params};
use crate::policy::{Access, Evicted, Policy, Request};
use crate::slab::{List, Slab, Slot};

#[derive(Clone, Debug, PartialEq)]
pub struct SlruConfig {
    /// Share of the capacity for the protected segment; the rest is
    /// probation. 0.8 as in TinyLFU's SLRU main cache (Einziger et al.).
    pub protected_ratio: f64,
}

impl Default for SlruConfig {
    fn default() -> SlruConfig {
        SlruConfig {
            protected_ratio: 0.8,
        }
    }
}

impl Params for SlruConfig {
    const KNOWN: &'static str = "protected_ratio";

    fn set(&mut self, key: &str, value: &str) -> Result<(), PolicyError> {
        match key {
            "protected_ratio" => {
                let v: f64 = parse_value(
                    "slru",
                    "protected_ratio",
                    value,
                    "between 0 and 1, exclusive",
                )?;
                check(
                    v > 0.0 && v < 1.0,
                    "slru",
                    "protected_ratio",
                    v,
                    "between 0 and 1, exclusive",
                )?;
                self.protected_ratio = v;
            }
            _ => {
                return Err(PolicyError::UnknownParameter {
                    policy: "slru",
                    field: key.to_string(),
                    known: Self::KNOWN,
                })
            }
        }
        Ok(())
    }
}

/// Which segment an entry is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Segment {
    Probation,
    Protected,
}

/// SLRU over a byte capacity.
pub struct Slru {
    capacity: u64,
    /// Most bytes the protected segment may hold.
    protected_capacity: u64,
    slab: Slab<Segment>,
    map: IdMap<Slot>,
    probation: List,
    protected: List,
}

/// `ratio x capacity`, rounded down, for ratios in [0, 1] (others clamped).
pub(crate) fn share_of(capacity: u64, ratio: f64) -> u64 {
    let ratio = if ratio.is_nan() {
        0.0
    } else {
        ratio.clamp(0.0, 1.0)
    };
    ((capacity as f64 * ratio) as u64).min(capacity)
}

impl Slru {
    /// An SLRU cache of `capacity` bytes whose protected segment holds at
    /// most `protected_ratio x capacity` bytes.
    pub fn new(capacity: u64, config: SlruConfig) -> Slru {
        Slru {
            capacity,
            protected_capacity: share_of(capacity, config.protected_ratio),
            slab: Slab::with_capacity(1024),
            map: id_map_with_capacity(1024),
            probation: List::default(),
            protected: List::default(),
        }
    }

    /// Moves a probation entry to protected's most recent end, demoting
    /// protected's least recent entries while it is over its share.
    fn promote(&mut self, slot: Slot) {
        self.slab.unlink(&mut self.probation, slot);
        self.slab.get_mut(slot).meta = Segment::Protected;
        self.slab.push_front(&mut self.protected, slot);
        while self.protected.bytes() > self.protected_capacity {
            let Some(demoted) = self.slab.pop_back(&mut self.protected) else {
                break;
            };
            self.slab.get_mut(demoted).meta = Segment::Probation;
            self.slab.push_front(&mut self.probation, demoted);
        }
    }

    fn evict_one(&mut self, evicted: &mut Vec<Evicted>) -> bool {
        let list = if self.probation.is_empty() {
            &mut self.protected
        } else {
            &mut self.probation
        };
        let Some(slot) = self.slab.pop_back(list) else {
            return false;
        };
        let gone = self.slab.get(slot).evicted();
        self.map.remove(&gone.id);
        self.slab.free(slot);
        evicted.push(gone);
        true
    }
}

impl Policy for Slru {
    fn access(&mut self, req: &Request, evicted: &mut Vec<Evicted>) -> Access {
        if let Some(&slot) = self.map.get(&req.id) {
            let entry = self.slab.get_mut(slot);
            entry.hits += 1;
            match entry.meta {
                Segment::Probation => self.promote(slot),
                Segment::Protected => self.slab.move_to_front(&mut self.protected, slot),
            }
            return Access::Hit;
        }
        if req.size > self.capacity {
            return Access::Miss { admitted: false };
        }
        while self.used() + req.size > self.capacity {
            if !self.evict_one(evicted) {
                break;
            }
        }
        let slot = self.slab.alloc(req.id, req.size, Segment::Probation);
        self.slab.push_front(&mut self.probation, slot);
        self.map.insert(req.id, slot);
        Access::Miss { admitted: true }
    }

    fn contains(&self, id: u64) -> bool {
        self.map.contains_key(&id)
    }

    fn victim(&self) -> Option<u64> {
        let slot = self.probation.back().or(self.protected.back())?;
        Some(self.slab.get(slot).id)
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn used(&self) -> u64 {
        self.probation.bytes() + self.protected.bytes()
    }

    fn len(&self) -> usize {
        self.probation.len() + self.protected.len()
    }

    fn for_each_resident(&self, f: &mut dyn FnMut(Evicted)) {
        self.slab.report(&[&self.probation, &self.protected], f);
    }

    fn name(&self) -> &'static str {
        "slru"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slru(capacity: u64, protected_ratio: f64) -> Slru {
        Slru::new(capacity, SlruConfig { protected_ratio })
    }

    fn touch(p: &mut Slru, ids: &[u64], ev: &mut Vec<Evicted>) -> Vec<bool> {
        ids.iter()
            .map(|&id| p.access(&Request::new(id, 1), ev).is_hit())
            .collect()
    }

    fn ids(ev: &[Evicted]) -> Vec<u64> {
        ev.iter().map(|e| e.id).collect()
    }

    #[test]
    fn a_hit_object_survives_a_scan_of_new_objects() {
        let mut c = slru(4, 0.5);
        let mut ev = Vec::new();
        touch(&mut c, &[1, 1], &mut ev);
        // 1 is protected; a scan of new ids only churns probation.
        touch(&mut c, &[10, 11, 12, 13, 14, 15], &mut ev);
        assert!(c.contains(1));
        assert_eq!(ids(&ev), [10, 11, 12]);
    }

    #[test]
    fn protected_overflow_demotes_to_probation_head() {
        let mut c = slru(4, 0.5);
        let mut ev = Vec::new();
        // 1, 2, 3 are promoted in that order; protected holds 2, so 1 is
        // demoted to probation's most recent end, ahead of 4.
        touch(&mut c, &[4, 1, 2, 3, 1, 2, 3], &mut ev);
        assert!(ev.is_empty());
        assert_eq!(c.victim(), Some(4));
        touch(&mut c, &[5], &mut ev);
        assert_eq!(ids(&ev), [4]);
        assert_eq!(c.victim(), Some(1));
    }

    #[test]
    fn evicts_from_protected_when_probation_is_empty() {
        let mut c = slru(2, 0.99);
        let mut ev = Vec::new();
        // Protected holds 1 object (share 1.98 rounds down to 1).
        touch(&mut c, &[1, 1, 2, 2], &mut ev);
        // 1 was demoted by 2's promotion, so 1 is probation and goes first.
        touch(&mut c, &[3], &mut ev);
        assert_eq!(ids(&ev), [1]);
        let mut only_protected = slru(1, 0.99);
        let mut ev = Vec::new();
        touch(&mut only_protected, &[1, 1], &mut ev);
        // Protected's share is 0 bytes, so 1 bounced back to probation.
        assert_eq!(only_protected.victim(), Some(1));
    }

    #[test]
    fn byte_capacity_and_oversized_objects() {
        let mut c = slru(10, 0.5);
        let mut ev = Vec::new();
        for id in 0..5 {
            c.access(&Request::new(id, 2), &mut ev);
        }
        c.access(&Request::new(0, 2), &mut ev);
        assert_eq!(
            c.access(&Request::new(9, 6), &mut ev),
            Access::Miss { admitted: true }
        );
        // Probation loses its least recent objects; protected 0 stays.
        assert_eq!(ids(&ev), [1, 2, 3]);
        assert_eq!((c.used(), c.len()), (10, 3));
        assert_eq!(
            c.access(&Request::new(10, 11), &mut ev),
            Access::Miss { admitted: false }
        );
        assert_eq!(c.used(), 10);
    }

    #[test]
    fn demoted_objects_keep_their_hits() {
        let mut c = slru(2, 0.5);
        let mut ev = Vec::new();
        touch(&mut c, &[1, 1, 2, 2, 3, 4], &mut ev);
        assert_eq!(
            ev[0],
            Evicted {
                id: 1,
                size: 1,
                hits: 1
            }
        );
    }
}
