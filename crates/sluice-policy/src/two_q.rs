//! 2Q (Johnson & Shasha, VLDB'94), the full version: A1in, A1out and Am.
//!
//! - A1in is a FIFO of objects seen for the first time, sized to
//!   `a_in_ratio` of the capacity. Hits there change nothing: a burst of
//!   requests right after admission says little about long-term reuse.
//! - A1out is a FIFO of ids only (ghosts) of objects pushed out of A1in,
//!   `a_out_ratio` of the capacity counted in the ghosts' sizes. Ghosts hold
//!   no data and are not resident.
//! - Am is an LRU of objects requested again after they left A1in: a miss
//!   whose id is found in A1out is admitted straight into Am.
//!
//! Other misses enter A1in. To make room, 2Q takes from A1in while A1in is
//! over its share (its oldest object becomes a ghost in A1out), and
//! otherwise evicts Am's least recently used object, which is forgotten.
//!
//! Choices, following libCacheSim's `TwoQ` (defaults 0.25 and 0.5):
//! - A1in may grow past its share while the cache is not full; the share
//!   only decides where evictions come from.
//! - Am on its own never exceeds `capacity - A1in share`: admitting a ghost
//!   hit into a full Am evicts Am's least recently used objects.
//! - Objects larger than A1in's share are not admitted (they would flush
//!   A1in on their own).
//!
//! Deliberate differences, for small caches only: the A1in share is at
//! least one byte (libCacheSim rounds 0.25 x 3 down to 0 and then admits
//! nothing), a ghost hit too large for Am's share goes through A1in, and
//! A1in is evicted when Am is empty rather than failing.

use crate::error::PolicyError;
use crate::id_map::{id_map_with_capacity, IdMap};
use crate::params::{check, parse_value, Params};
use crate::policy::{Access, Evicted, Policy, Request};
use crate::slab::{List, Slab, Slot};
use crate::slru::share_of;

#[derive(Clone, Debug, PartialEq)]
pub struct TwoQConfig {
    /// Share of the capacity for A1in, the FIFO of first-time objects. 0.25
    /// as the 2Q paper recommends and libCacheSim uses.
    pub a_in_ratio: f64,
    /// Size of the A1out ghost list as a share of the capacity (in the
    /// ghosts' bytes). 0.5 as the 2Q paper recommends and libCacheSim uses.
    pub a_out_ratio: f64,
}

impl Default for TwoQConfig {
    fn default() -> TwoQConfig {
        TwoQConfig {
            a_in_ratio: 0.25,
            a_out_ratio: 0.5,
        }
    }
}

impl Params for TwoQConfig {
    const KNOWN: &'static str = "a_in_ratio, a_out_ratio";

    fn set(&mut self, key: &str, value: &str) -> Result<(), PolicyError> {
        match key {
            "a_in_ratio" => {
                let v: f64 = parse_value("2q", "a_in_ratio", value, "between 0 and 1, exclusive")?;
                check(
                    v > 0.0 && v < 1.0,
                    "2q",
                    "a_in_ratio",
                    v,
                    "between 0 and 1, exclusive",
                )?;
                self.a_in_ratio = v;
            }
            "a_out_ratio" => {
                let v: f64 = parse_value("2q", "a_out_ratio", value, "above 0, at most 4")?;
                check(
                    v > 0.0 && v <= 4.0,
                    "2q",
                    "a_out_ratio",
                    v,
                    "above 0, at most 4",
                )?;
                self.a_out_ratio = v;
            }
            _ => {
                return Err(PolicyError::UnknownParameter {
                    policy: "2q",
                    field: key.to_string(),
                    known: Self::KNOWN,
                })
            }
        }
        Ok(())
    }
}

/// Which queue an entry is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Queue {
    A1in,
    A1out,
    Am,
}

/// 2Q over a byte capacity.
pub struct TwoQ {
    capacity: u64,
    /// A1in's share: evictions come from A1in while it holds more.
    a_in_capacity: u64,
    /// Bytes of ghosts A1out remembers.
    a_out_capacity: u64,
    /// Most bytes Am holds: the capacity minus A1in's share.
    am_capacity: u64,
    slab: Slab<Queue>,
    map: IdMap<Slot>,
    a_in: List,
    a_out: List,
    am: List,
}

impl TwoQ {
    /// A 2Q cache of `capacity` bytes.
    pub fn new(capacity: u64, config: TwoQConfig) -> TwoQ {
        let a_in_capacity = share_of(capacity, config.a_in_ratio).max(1);
        let a_out_ratio = config.a_out_ratio.clamp(0.0, 4.0);
        let a_out_capacity = if a_out_ratio.is_nan() {
            0
        } else {
            (capacity as f64 * a_out_ratio) as u64
        };
        TwoQ {
            capacity,
            a_in_capacity,
            a_out_capacity,
            am_capacity: capacity.saturating_sub(a_in_capacity),
            slab: Slab::with_capacity(1024),
            map: id_map_with_capacity(1024),
            a_in: List::default(),
            a_out: List::default(),
            am: List::default(),
        }
    }

    fn resident_bytes(&self) -> u64 {
        self.a_in.bytes() + self.am.bytes()
    }

    /// Unlinks and frees a resident `slot`, reporting it.
    fn drop_resident(&mut self, slot: Slot, evicted: &mut Vec<Evicted>) {
        let gone = self.slab.get(slot).evicted();
        self.map.remove(&gone.id);
        self.slab.free(slot);
        evicted.push(gone);
    }

    /// Turns A1in's oldest object into a ghost at the front of A1out and
    /// trims A1out to its size.
    fn demote_a_in(&mut self, evicted: &mut Vec<Evicted>) -> bool {
        let Some(slot) = self.slab.pop_back(&mut self.a_in) else {
            return false;
        };
        let entry = self.slab.get(slot);
        evicted.push(entry.evicted());
        if entry.size > self.a_out_capacity {
            self.map.remove(&entry.id);
            self.slab.free(slot);
            return true;
        }
        self.slab.get_mut(slot).meta = Queue::A1out;
        self.slab.push_front(&mut self.a_out, slot);
        while self.a_out.bytes() > self.a_out_capacity {
            let Some(old) = self.slab.pop_back(&mut self.a_out) else {
                break;
            };
            self.map.remove(&self.slab.get(old).id);
            self.slab.free(old);
        }
        true
    }

    fn evict_am(&mut self, evicted: &mut Vec<Evicted>) -> bool {
        let Some(slot) = self.slab.pop_back(&mut self.am) else {
            return false;
        };
        self.drop_resident(slot, evicted);
        true
    }

    /// One reclaim step: A1in while it is over its share (or Am is empty),
    /// else Am.
    fn evict_one(&mut self, evicted: &mut Vec<Evicted>) -> bool {
        if self.a_in.bytes() > self.a_in_capacity || self.am.is_empty() {
            self.demote_a_in(evicted)
        } else {
            self.evict_am(evicted)
        }
    }

    /// Removes the A1out ghost in `slot`; true if it was one.
    fn forget_ghost(&mut self, slot: Slot) -> bool {
        let entry = self.slab.get(slot);
        if entry.meta != Queue::A1out {
            return false;
        }
        self.map.remove(&entry.id);
        self.slab.unlink(&mut self.a_out, slot);
        self.slab.free(slot);
        true
    }

    /// Admits a ghost hit at Am's most recent end, keeping Am within its
    /// share.
    fn admit_to_am(&mut self, req: &Request, evicted: &mut Vec<Evicted>) {
        while self.am.bytes() + req.size > self.am_capacity {
            if !self.evict_am(evicted) {
                break;
            }
        }
        let slot = self.slab.alloc(req.id, req.size, Queue::Am);
        self.slab.push_front(&mut self.am, slot);
        self.map.insert(req.id, slot);
    }

    fn admit_to_a_in(&mut self, req: &Request) {
        let slot = self.slab.alloc(req.id, req.size, Queue::A1in);
        self.slab.push_front(&mut self.a_in, slot);
        self.map.insert(req.id, slot);
    }
}

impl Policy for TwoQ {
    fn access(&mut self, req: &Request, evicted: &mut Vec<Evicted>) -> Access {
        let found = self.map.get(&req.id).copied();
        if let Some(slot) = found {
            let entry = self.slab.get_mut(slot);
            match entry.meta {
                Queue::A1in => {
                    entry.hits += 1;
                    return Access::Hit;
                }
                Queue::Am => {
                    entry.hits += 1;
                    self.slab.move_to_front(&mut self.am, slot);
                    return Access::Hit;
                }
                Queue::A1out => {}
            }
        }
        if req.size > self.a_in_capacity {
            return Access::Miss { admitted: false };
        }
        // The ghost leaves A1out before reclaiming, so that it neither takes
        // room there nor gets trimmed by the ghosts reclaiming adds.
        let was_ghost = found.is_some_and(|slot| self.forget_ghost(slot));
        while self.resident_bytes() + req.size > self.capacity {
            if !self.evict_one(evicted) {
                break;
            }
        }
        if was_ghost && req.size <= self.am_capacity {
            self.admit_to_am(req, evicted);
        } else {
            self.admit_to_a_in(req);
        }
        Access::Miss { admitted: true }
    }

    fn contains(&self, id: u64) -> bool {
        self.map
            .get(&id)
            .is_some_and(|&slot| self.slab.get(slot).meta != Queue::A1out)
    }

    fn victim(&self) -> Option<u64> {
        let slot = if self.a_in.bytes() > self.a_in_capacity || self.am.is_empty() {
            self.a_in.back()
        } else {
            self.am.back()
        };
        Some(self.slab.get(slot?).id)
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn used(&self) -> u64 {
        self.resident_bytes()
    }

    fn len(&self) -> usize {
        self.a_in.len() + self.am.len()
    }

    fn for_each_resident(&self, f: &mut dyn FnMut(Evicted)) {
        self.slab.report(&[&self.a_in, &self.am], f);
    }

    fn name(&self) -> &'static str {
        "2q"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_q(capacity: u64) -> TwoQ {
        TwoQ::new(capacity, TwoQConfig::default())
    }

    fn touch(p: &mut TwoQ, ids: &[u64], ev: &mut Vec<Evicted>) -> Vec<bool> {
        ids.iter()
            .map(|&id| p.access(&Request::new(id, 1), ev).is_hit())
            .collect()
    }

    fn ids(ev: &[Evicted]) -> Vec<u64> {
        ev.iter().map(|e| e.id).collect()
    }

    #[test]
    fn promotes_an_object_found_in_a1out_into_am() {
        // Capacity 4: A1in share 1, Am 3, A1out 2 ghosts.
        let mut c = two_q(4);
        let mut ev = Vec::new();
        touch(&mut c, &[1, 2, 3, 4, 5], &mut ev);
        assert_eq!(ids(&ev), [1]);
        assert!(!c.contains(1), "a ghost is not resident");
        assert_eq!(touch(&mut c, &[1], &mut ev), [false]);
        assert_eq!(c.slab.get(c.map[&1]).meta, Queue::Am);
        // In Am, 1 now outlives the first-timers that follow.
        touch(&mut c, &[6, 7, 8, 9], &mut ev);
        assert!(c.contains(1));
    }

    #[test]
    fn hits_in_a1in_do_not_protect_an_object() {
        let mut c = two_q(4);
        let mut ev = Vec::new();
        // 1 is hit while in A1in but still leaves first, as a ghost.
        assert!(touch(&mut c, &[1, 1, 2, 3, 4, 5], &mut ev)[1]);
        assert_eq!(
            ev[0],
            Evicted {
                id: 1,
                size: 1,
                hits: 1
            }
        );
    }

    #[test]
    fn a1out_forgets_its_oldest_ghosts() {
        let mut c = two_q(4);
        let mut ev = Vec::new();
        // Ghosts 1, 2, 3 pass through A1out, which holds 2: 1 is forgotten.
        touch(&mut c, &[1, 2, 3, 4, 5, 6, 7], &mut ev);
        assert_eq!(ids(&ev), [1, 2, 3]);
        assert_eq!(c.a_out.len(), 2);
        touch(&mut c, &[1], &mut ev);
        assert_eq!(c.slab.get(c.map[&1]).meta, Queue::A1in);
        touch(&mut c, &[3], &mut ev);
        assert_eq!(c.slab.get(c.map[&3]).meta, Queue::Am);
    }

    #[test]
    fn am_evicts_its_least_recently_used_object() {
        let mut c = two_q(4);
        let mut ev = Vec::new();
        // 1, 2, 3 reach Am through A1out; hitting 1 leaves 2 as Am's LRU.
        touch(&mut c, &[1, 2, 3, 4, 5, 6, 1, 2, 3, 1], &mut ev);
        let am: Vec<u64> = c.slab.iter(&c.am).map(|e| e.id).collect();
        assert_eq!(am, [1, 3, 2]);
        ev.clear();
        // A1in holds only its share, so the next reclaim comes from Am.
        touch(&mut c, &[8], &mut ev);
        assert_eq!(ids(&ev), [2]);
        // Now A1in is over its share again and gives up its oldest.
        touch(&mut c, &[9], &mut ev);
        assert_eq!(ids(&ev), [2, 6]);
        assert_eq!(c.victim(), Some(8));
    }

    #[test]
    fn byte_capacity_and_objects_larger_than_a1in() {
        let mut c = two_q(100);
        let mut ev = Vec::new();
        // A1in's share is 25 bytes: 26 bytes is refused, 25 is admitted.
        assert_eq!(
            c.access(&Request::new(1, 26), &mut ev),
            Access::Miss { admitted: false }
        );
        assert_eq!(
            c.access(&Request::new(1, 25), &mut ev),
            Access::Miss { admitted: true }
        );
        for id in 2..5 {
            c.access(&Request::new(id, 25), &mut ev);
        }
        assert_eq!(c.used(), 100);
        c.access(&Request::new(5, 10), &mut ev);
        assert_eq!(ids(&ev), [1]);
        assert_eq!((c.used(), c.len()), (85, 4));
        assert!(c.used() <= c.capacity());
    }
}
