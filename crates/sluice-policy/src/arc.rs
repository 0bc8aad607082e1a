//! ARC (Megiddo & Modha, FAST'03): adaptive replacement between recency and
//! frequency, with byte sizes.
//!
//! Four LRU lists, most recent at the front:
//! - T1: resident objects requested once since they entered the cache;
//! - T2: resident objects requested at least twice;
//! - B1, B2: ghosts (ids and sizes, no data) of objects recently evicted
//!   from T1 and T2. Ghosts are not resident: they count in neither
//!   `used()` nor `len()`, and `contains` is false for them.
//!
//! A target `p` (bytes) says how much of the cache T1 should get. REPLACE
//! evicts T1's least recent object into B1 when T1 holds more than `p`
//! (or exactly `p` and the request is a B2 ghost), and T2's least recent
//! object into B2 otherwise. Moving a resident object to a ghost list is an
//! eviction and is reported as one.
//!
//! - Hit in T1 or T2: the object moves to T2's front.
//! - Miss found in B1: recency would have helped, so `p` grows by
//!   `max(|B2| / |B1|, 1)`; REPLACE makes room; the object enters T2.
//! - Miss found in B2: frequency would have helped, so `p` shrinks by
//!   `max(|B1| / |B2|, 1)`; REPLACE makes room; the object enters T2.
//! - Other misses keep the directory within bounds: when T1 + B1 would pass
//!   the capacity, B1's oldest ghost is dropped and REPLACE runs (or, with
//!   B1 empty, T1's least recent object is evicted without a ghost); else
//!   B2's oldest ghost is dropped when all four lists would pass twice the
//!   capacity, and REPLACE runs. The object enters T1's front.
//!
//! `p` and the ratios are real numbers, as in the paper and libCacheSim's
//! `ARC`; in object-count mode (unit sizes) this is exactly the paper's
//! algorithm and libCacheSim's, request for request. With byte sizes three
//! choices are ours:
//! - a ghost hit moves `p` by the ratio times the ghost's size, so that one
//!   byte of ghost counts like one page does in the paper (libCacheSim moves
//!   `p` by the ratio alone, a byte or so, which leaves `p` all but fixed in
//!   a cache of gigabytes);
//! - a ghost hit evicts only while the object does not fit (libCacheSim
//!   runs REPLACE once even when there is room, then the case-IV steps);
//! - when an object seen in no list needs room, B1 or B2 ghosts are dropped
//!   until the directory bounds hold for its size, not just one.
//!
//! On generated traces with variable sizes the miss ratio stays within
//! about one point of libCacheSim's.

use crate::id_map::{id_map_with_capacity, IdMap};
use crate::policy::{Access, Evicted, Policy, Request};
use crate::slab::{List, Slab, Slot};

/// The list an entry is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lists {
    T1,
    T2,
    B1,
    B2,
}

/// ARC over a byte capacity.
pub struct Arc {
    capacity: u64,
    /// Target bytes for T1, between 0 and the capacity. Real-valued, as in
    /// the paper and libCacheSim: ghost-list ratios are fractions.
    p: f64,
    slab: Slab<Lists>,
    map: IdMap<Slot>,
    t1: List,
    t2: List,
    b1: List,
    b2: List,
}

impl Arc {
    /// An ARC cache of `capacity` bytes, starting with `p = 0`.
    pub fn new(capacity: u64) -> Arc {
        Arc {
            capacity,
            p: 0.0,
            slab: Slab::with_capacity(1024),
            map: id_map_with_capacity(1024),
            t1: List::default(),
            t2: List::default(),
            b1: List::default(),
            b2: List::default(),
        }
    }

    /// The adaptive target for T1, in bytes.
    pub fn target(&self) -> f64 {
        self.p
    }

    fn list_mut(&mut self, which: Lists) -> &mut List {
        match which {
            Lists::T1 => &mut self.t1,
            Lists::T2 => &mut self.t2,
            Lists::B1 => &mut self.b1,
            Lists::B2 => &mut self.b2,
        }
    }

    /// Moves `slot` from the list it is on to the front of `to`.
    fn relink(&mut self, slot: Slot, to: Lists) {
        let from = self.slab.get(slot).meta;
        let mut list = std::mem::take(self.list_mut(from));
        self.slab.unlink(&mut list, slot);
        *self.list_mut(from) = list;
        self.slab.get_mut(slot).meta = to;
        let mut list = std::mem::take(self.list_mut(to));
        self.slab.push_front(&mut list, slot);
        *self.list_mut(to) = list;
    }

    /// Whether REPLACE takes from T1 (else from T2).
    fn replace_from_t1(&self, request_in_b2: bool) -> bool {
        let t1 = self.t1.bytes() as f64;
        let over_target = t1 > self.p || (request_in_b2 && t1 == self.p);
        (!self.t1.is_empty() && over_target) || self.t2.is_empty()
    }

    /// REPLACE: turns T1's or T2's least recent object into a ghost.
    fn replace(&mut self, request_in_b2: bool, evicted: &mut Vec<Evicted>) -> bool {
        let (from, to) = if self.replace_from_t1(request_in_b2) {
            (self.t1, Lists::B1)
        } else {
            (self.t2, Lists::B2)
        };
        let Some(slot) = from.back() else {
            return false;
        };
        evicted.push(self.slab.get(slot).evicted());
        self.relink(slot, to);
        true
    }

    /// Drops the oldest ghost of B1 or B2.
    fn drop_ghost(&mut self, which: Lists) -> bool {
        let mut list = std::mem::take(self.list_mut(which));
        let popped = self.slab.pop_back(&mut list);
        *self.list_mut(which) = list;
        let Some(slot) = popped else {
            return false;
        };
        self.map.remove(&self.slab.get(slot).id);
        self.slab.free(slot);
        true
    }

    /// Evicts T1's least recent object outright, leaving no ghost.
    fn evict_t1_without_ghost(&mut self, evicted: &mut Vec<Evicted>) -> bool {
        let Some(slot) = self.slab.pop_back(&mut self.t1) else {
            return false;
        };
        let gone = self.slab.get(slot).evicted();
        self.map.remove(&gone.id);
        self.slab.free(slot);
        evicted.push(gone);
        true
    }

    /// One step of making room for an object seen in no list (case IV).
    fn make_room_for_new(&mut self, size: u64, evicted: &mut Vec<Evicted>) -> bool {
        let c = self.capacity;
        if self.t1.bytes() + self.b1.bytes() + size > c {
            while self.t1.bytes() + self.b1.bytes() + size > c && self.drop_ghost(Lists::B1) {}
            if self.t1.bytes() + size > c {
                return self.evict_t1_without_ghost(evicted);
            }
        } else {
            while self.directory_bytes() + size > 2 * c && self.drop_ghost(Lists::B2) {}
        }
        self.replace(false, evicted)
    }

    fn directory_bytes(&self) -> u64 {
        self.t1.bytes() + self.t2.bytes() + self.b1.bytes() + self.b2.bytes()
    }

    /// Adapts `p` for a hit on the ghost in `slot` and takes the ghost off
    /// its list (the slot stays allocated, unlinked).
    fn adapt_and_unlink_ghost(&mut self, slot: Slot) -> Lists {
        let (size, which) = {
            let e = self.slab.get(slot);
            (e.size, e.meta)
        };
        // The ghost is still on its list, so its list is never empty here.
        let (b1, b2) = (self.b1.bytes() as f64, self.b2.bytes() as f64);
        let size = size as f64;
        if which == Lists::B1 {
            let delta = size * (b2 / b1.max(1.0)).max(1.0);
            self.p = (self.p + delta).min(self.capacity as f64);
            self.slab.unlink(&mut self.b1, slot);
        } else {
            let delta = size * (b1 / b2.max(1.0)).max(1.0);
            self.p = (self.p - delta).max(0.0);
            self.slab.unlink(&mut self.b2, slot);
        }
        which
    }

    /// A miss found in B1 or B2: adapt, make room, enter T2.
    fn admit_ghost(&mut self, slot: Slot, req: &Request, evicted: &mut Vec<Evicted>) {
        let which = self.adapt_and_unlink_ghost(slot);
        while self.used() + req.size > self.capacity {
            if !self.replace(which == Lists::B2, evicted) {
                break;
            }
        }
        let entry = self.slab.get_mut(slot);
        entry.size = req.size;
        entry.hits = 0;
        entry.meta = Lists::T2;
        self.slab.push_front(&mut self.t2, slot);
    }

    fn admit_new(&mut self, req: &Request, evicted: &mut Vec<Evicted>) {
        while self.used() + req.size > self.capacity {
            if !self.make_room_for_new(req.size, evicted) {
                break;
            }
        }
        let slot = self.slab.alloc(req.id, req.size, Lists::T1);
        self.slab.push_front(&mut self.t1, slot);
        self.map.insert(req.id, slot);
    }
}

impl Policy for Arc {
    fn access(&mut self, req: &Request, evicted: &mut Vec<Evicted>) -> Access {
        let found = self.map.get(&req.id).copied();
        if let Some(slot) = found {
            match self.slab.get(slot).meta {
                Lists::T1 | Lists::T2 => {
                    self.slab.get_mut(slot).hits += 1;
                    self.relink(slot, Lists::T2);
                    return Access::Hit;
                }
                Lists::B1 | Lists::B2 => {}
            }
        }
        if req.size > self.capacity {
            return Access::Miss { admitted: false };
        }
        match found {
            Some(ghost) => self.admit_ghost(ghost, req, evicted),
            None => self.admit_new(req, evicted),
        }
        Access::Miss { admitted: true }
    }

    fn contains(&self, id: u64) -> bool {
        self.map
            .get(&id)
            .is_some_and(|&slot| matches!(self.slab.get(slot).meta, Lists::T1 | Lists::T2))
    }

    fn victim(&self) -> Option<u64> {
        let list = if self.replace_from_t1(false) {
            &self.t1
        } else {
            &self.t2
        };
        Some(self.slab.get(list.back()?).id)
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn used(&self) -> u64 {
        self.t1.bytes() + self.t2.bytes()
    }

    fn len(&self) -> usize {
        self.t1.len() + self.t2.len()
    }

    fn for_each_resident(&self, f: &mut dyn FnMut(Evicted)) {
        self.slab.report(&[&self.t1, &self.t2], f);
    }

    fn name(&self) -> &'static str {
        "arc"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(p: &mut Arc, ids: &[u64], ev: &mut Vec<Evicted>) -> Vec<bool> {
        ids.iter()
            .map(|&id| p.access(&Request::new(id, 1), ev).is_hit())
            .collect()
    }

    fn ids_on(arc: &Arc, list: &List) -> Vec<u64> {
        arc.slab.iter(list).map(|e| e.id).collect()
    }

    #[test]
    fn a_second_request_moves_an_object_to_t2() {
        let mut c = Arc::new(4);
        let mut ev = Vec::new();
        assert_eq!(touch(&mut c, &[1, 2, 1], &mut ev), [false, false, true]);
        assert_eq!(ids_on(&c, &c.t1), [2]);
        assert_eq!(ids_on(&c, &c.t2), [1]);
    }

    #[test]
    fn adapts_p_toward_the_ghost_list_that_hit() {
        let mut c = Arc::new(2);
        let mut ev = Vec::new();
        // 1 reaches T2; 2 and 3 go to T1, and 3's arrival pushes 2 from T1
        // into B1 (an eviction).
        touch(&mut c, &[1, 1, 2, 3], &mut ev);
        assert_eq!(
            ev,
            [Evicted {
                id: 2,
                size: 1,
                hits: 0
            }]
        );
        assert_eq!((ids_on(&c, &c.b1), c.target()), (vec![2], 0.0));
        assert!(!c.contains(2) && c.len() == 2);
        // A hit on B1's ghost says T1 was too small: p grows, and T1 (at
        // its target now) keeps 3 while T2's 1 becomes a B2 ghost.
        assert_eq!(touch(&mut c, &[2], &mut ev), [false]);
        assert_eq!(c.target(), 1.0);
        assert_eq!((ids_on(&c, &c.t2), ids_on(&c, &c.b2)), (vec![2], vec![1]));
        // A hit on B2's ghost says T2 was too small: p shrinks.
        touch(&mut c, &[1], &mut ev);
        assert_eq!(c.target(), 0.0);
        assert!(c.contains(1));
        assert_eq!(ids_on(&c, &c.b1), [3]);
    }

    #[test]
    fn ghosts_are_bounded_by_the_directory() {
        let mut c = Arc::new(4);
        let mut ev = Vec::new();
        let scan: Vec<u64> = (0..100).collect();
        touch(&mut c, &scan, &mut ev);
        // A scan keeps T1 + B1 within the capacity.
        assert_eq!(c.t1.len() + c.b1.len(), 4);
        assert_eq!(c.len(), 4);
        assert_eq!(c.map.len(), 4);
    }

    #[test]
    fn frequent_objects_survive_a_scan() {
        let mut c = Arc::new(4);
        let mut ev = Vec::new();
        touch(&mut c, &[1, 1, 2, 2], &mut ev);
        let scan: Vec<u64> = (10..40).collect();
        touch(&mut c, &scan, &mut ev);
        assert!(c.contains(1) && c.contains(2));
    }

    #[test]
    fn byte_capacity_and_oversized_objects() {
        let mut c = Arc::new(10);
        let mut ev = Vec::new();
        for id in 0..5 {
            c.access(&Request::new(id, 2), &mut ev);
        }
        assert_eq!(
            c.access(&Request::new(9, 5), &mut ev),
            Access::Miss { admitted: true }
        );
        // T1 held the whole cache with no ghosts: its oldest go, ghostless.
        let gone: Vec<u64> = ev.iter().map(|e| e.id).collect();
        assert_eq!(gone, [0, 1, 2]);
        assert_eq!((c.used(), c.len()), (9, 3));
        assert_eq!(
            c.access(&Request::new(10, 11), &mut ev),
            Access::Miss { admitted: false }
        );
        assert!(c.used() <= c.capacity());
    }

    #[test]
    fn a_byte_sized_ghost_hit_moves_p_by_its_size() {
        let mut c = Arc::new(10);
        let mut ev = Vec::new();
        for (id, size) in [(1, 4), (1, 4), (2, 3), (3, 3), (4, 3)] {
            c.access(&Request::new(id, size), &mut ev);
        }
        assert_eq!(ids_on(&c, &c.b1), [2]);
        c.access(&Request::new(2, 3), &mut ev);
        assert_eq!(c.target(), 3.0);
        assert_eq!(ids_on(&c, &c.b1), [3]);
        assert_eq!((c.used(), c.len()), (10, 3));
    }
}
