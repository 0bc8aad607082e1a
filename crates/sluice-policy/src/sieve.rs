//! SIEVE (Zhang et al., NSDI'24): one FIFO queue, a visited bit per object
//! and a hand that sifts out the objects nobody asked for.
//!
//! New objects enter at the front (head) of the queue with the bit clear; a
//! hit only sets the bit, so hits never move anything. To make room the hand
//! walks from where it last stopped toward the front: an object with the bit
//! set has it cleared and stays where it is; the first object with the bit
//! clear is evicted, and the hand stays at its newer neighbour for next time.
//! When the hand falls off the front it wraps to the back (oldest object).
//!
//! Unlike CLOCK, survivors are not moved to the front: objects that keep
//! being hit settle behind the hand while new objects pass in front of them
//! and are examined first, which is what gives SIEVE its quick demotion of
//! one-hit wonders. This follows the paper and libCacheSim's `Sieve` exactly
//! (a hit sets the bit; the hand starts at the back on the first eviction).
//!
//! [`Policy::victim`] names the object under the hand when its bit is clear
//! and answers `None` when the hand would have to sweep.

use crate::id_map::{id_map_with_capacity, IdMap};
use crate::policy::{Access, Evicted, Policy, Request};
use crate::slab::{List, Slab, Slot};

/// SIEVE over a byte capacity; the entry's `meta` is its visited bit.
pub struct Sieve {
    capacity: u64,
    slab: Slab<bool>,
    map: IdMap<Slot>,
    queue: List,
    /// Where the next eviction starts looking; `None` means the back.
    hand: Option<Slot>,
}

impl Sieve {
    /// A SIEVE cache of `capacity` bytes.
    pub fn new(capacity: u64) -> Sieve {
        Sieve {
            capacity,
            slab: Slab::with_capacity(1024),
            map: id_map_with_capacity(1024),
            queue: List::default(),
            hand: None,
        }
    }

    /// Moves the hand over visited objects (clearing their bits) to the
    /// first unvisited one, evicts it and leaves the hand at its newer
    /// neighbour. The sweep ends within one lap: after a lap every bit is
    /// clear.
    fn evict_one(&mut self, evicted: &mut Vec<Evicted>) -> bool {
        let Some(mut slot) = self.hand.or(self.queue.back()) else {
            return false;
        };
        while self.slab.get(slot).meta {
            self.slab.get_mut(slot).meta = false;
            slot = match self.slab.newer(slot).or(self.queue.back()) {
                Some(next) => next,
                None => return false,
            };
        }
        self.hand = self.slab.newer(slot);
        self.slab.unlink(&mut self.queue, slot);
        let gone = self.slab.get(slot).evicted();
        self.map.remove(&gone.id);
        self.slab.free(slot);
        evicted.push(gone);
        true
    }
}

impl Policy for Sieve {
    fn access(&mut self, req: &Request, evicted: &mut Vec<Evicted>) -> Access {
        if let Some(&slot) = self.map.get(&req.id) {
            let entry = self.slab.get_mut(slot);
            entry.hits += 1;
            entry.meta = true;
            return Access::Hit;
        }
        if req.size > self.capacity {
            return Access::Miss { admitted: false };
        }
        while self.queue.bytes() + req.size > self.capacity {
            if !self.evict_one(evicted) {
                break;
            }
        }
        let slot = self.slab.alloc(req.id, req.size, false);
        self.slab.push_front(&mut self.queue, slot);
        self.map.insert(req.id, slot);
        Access::Miss { admitted: true }
    }

    fn contains(&self, id: u64) -> bool {
        self.map.contains_key(&id)
    }

    fn victim(&self) -> Option<u64> {
        let entry = self.slab.get(self.hand.or(self.queue.back())?);
        (!entry.meta).then_some(entry.id)
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn used(&self) -> u64 {
        self.queue.bytes()
    }

    fn len(&self) -> usize {
        self.queue.len()
    }

    fn for_each_resident(&self, f: &mut dyn FnMut(Evicted)) {
        self.slab.report(&[&self.queue], f);
    }

    fn name(&self) -> &'static str {
        "sieve"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(p: &mut Sieve, ids: &[u64], ev: &mut Vec<Evicted>) -> Vec<bool> {
        ids.iter()
            .map(|&id| p.access(&Request::new(id, 1), ev).is_hit())
            .collect()
    }

    fn ids(ev: &[Evicted]) -> Vec<u64> {
        ev.iter().map(|e| e.id).collect()
    }

    #[test]
    fn keeps_a_visited_object_when_the_hand_passes_it() {
        let mut c = Sieve::new(3);
        let mut ev = Vec::new();
        touch(&mut c, &[1, 2, 3, 1], &mut ev);
        // The hand starts at 1 (oldest), clears its bit and evicts 2.
        touch(&mut c, &[4], &mut ev);
        assert_eq!(ids(&ev), [2]);
        assert!(c.contains(1));
    }

    #[test]
    fn the_hand_resumes_where_it_stopped_instead_of_at_the_back() {
        let mut c = Sieve::new(3);
        let mut ev = Vec::new();
        // Queue (old to new) 1 2 3; 1 and 3 visited. 4 evicts 2 and the
        // hand rests on 3. 3's bit is cleared on the way to 4, which is
        // evicted next although 1 (now unvisited) is older.
        touch(&mut c, &[1, 2, 3, 1, 3, 4], &mut ev);
        assert_eq!(ids(&ev), [2]);
        touch(&mut c, &[5], &mut ev);
        assert_eq!(ids(&ev), [2, 4]);
        // The hand fell off the front and wrapped: 1 goes next.
        touch(&mut c, &[6], &mut ev);
        assert_eq!(ids(&ev), [2, 4, 1]);
    }

    #[test]
    fn hits_do_not_move_objects() {
        let mut c = Sieve::new(2);
        let mut ev = Vec::new();
        // Both visited: a full lap clears both bits and the oldest goes.
        touch(&mut c, &[1, 2, 2, 1, 3], &mut ev);
        assert_eq!(ids(&ev), [1]);
    }

    #[test]
    fn victim_is_named_only_without_a_sweep() {
        let mut c = Sieve::new(2);
        let mut ev = Vec::new();
        touch(&mut c, &[1, 2], &mut ev);
        assert_eq!(c.victim(), Some(1));
        touch(&mut c, &[1], &mut ev);
        assert_eq!(c.victim(), None);
    }

    #[test]
    fn byte_capacity_and_oversized_objects() {
        let mut c = Sieve::new(10);
        let mut ev = Vec::new();
        for id in 0..5 {
            c.access(&Request::new(id, 2), &mut ev);
        }
        c.access(&Request::new(1, 2), &mut ev);
        assert_eq!(
            c.access(&Request::new(9, 5), &mut ev),
            Access::Miss { admitted: true }
        );
        assert_eq!(ids(&ev), [0, 2, 3]);
        assert_eq!((c.used(), c.len()), (9, 3));
        assert_eq!(
            c.access(&Request::new(10, 11), &mut ev),
            Access::Miss { admitted: false }
        );
        assert_eq!(ev.len(), 3);
        assert_eq!(
            ev[0],
            Evicted {
                id: 0,
                size: 2,
                hits: 0
            }
        );
    }
}
