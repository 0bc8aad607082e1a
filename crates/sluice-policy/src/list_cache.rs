//! FIFO and LRU: one list of entries, admitted at the front, evicted from
//! the back until a new object fits. The only difference is a hit: LRU
//! moves the entry back to the front, FIFO leaves it where it is.

use crate::id_map::{id_map_with_capacity, IdMap};
use crate::policy::{Access, Evicted, Policy, Request};
use crate::slab::{List, Slab, Slot};

/// A list-ordered cache; `PROMOTE` moves hit entries to the front (LRU).
pub struct ListCache<const PROMOTE: bool> {
    capacity: u64,
    slab: Slab<()>,
    map: IdMap<Slot>,
    list: List,
}

impl<const PROMOTE: bool> ListCache<PROMOTE> {
    pub fn new(capacity: u64) -> ListCache<PROMOTE> {
        ListCache {
            capacity,
            slab: Slab::with_capacity(1024),
            map: id_map_with_capacity(1024),
            list: List::default(),
        }
    }
}

impl<const PROMOTE: bool> Policy for ListCache<PROMOTE> {
    fn access(&mut self, req: &Request, evicted: &mut Vec<Evicted>) -> Access {
        if let Some(&slot) = self.map.get(&req.id) {
            self.slab.get_mut(slot).hits += 1;
            if PROMOTE {
                self.slab.move_to_front(&mut self.list, slot);
            }
            return Access::Hit;
        }
        if req.size > self.capacity {
            return Access::Miss { admitted: false };
        }
        while self.list.bytes() + req.size > self.capacity {
            let Some(victim) = self.slab.pop_back(&mut self.list) else {
                break;
            };
            let gone = self.slab.get(victim).evicted();
            self.map.remove(&gone.id);
            self.slab.free(victim);
            evicted.push(gone);
        }
        let slot = self.slab.alloc(req.id, req.size, ());
        self.slab.push_front(&mut self.list, slot);
        self.map.insert(req.id, slot);
        Access::Miss { admitted: true }
    }

    fn contains(&self, id: u64) -> bool {
        self.map.contains_key(&id)
    }

    fn victim(&self) -> Option<u64> {
        self.list.back().map(|s| self.slab.get(s).id)
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn used(&self) -> u64 {
        self.list.bytes()
    }

    fn len(&self) -> usize {
        self.list.len()
    }

    fn for_each_resident(&self, f: &mut dyn FnMut(Evicted)) {
        self.slab.report(&[&self.list], f);
    }

    fn remove(&mut self, id: u64) -> bool {
        let Some(slot) = self.map.remove(&id) else {
            return false;
        };
        self.slab.unlink(&mut self.list, slot);
        self.slab.free(slot);
        true
    }

    fn name(&self) -> &'static str {
        if PROMOTE {
            "lru"
        } else {
            "fifo"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ListCache;
    use crate::policy::{Evicted, Policy, Request};

    fn put(p: &mut impl Policy, id: u64) -> Vec<u64> {
        let mut ev: Vec<Evicted> = Vec::new();
        p.access(&Request::new(id, 1), &mut ev);
        ev.iter().map(|e| e.id).collect()
    }

    /// A removed object frees its room at once: the next admission evicts nothing, and
    /// the objects left keep their order.
    fn removal_frees_room(p: &mut impl Policy) {
        for id in [1, 2, 3] {
            put(p, id);
        }
        assert!(p.remove(2));
        assert!(!p.remove(2), "a second remove finds nothing");
        assert!(!p.remove(99), "an id never admitted");
        assert!(!p.contains(2));
        assert_eq!((p.len(), p.used()), (2, 2));
        assert_eq!(put(p, 4), Vec::<u64>::new());
        assert_eq!(put(p, 5), vec![1], "the oldest object left is next");
        assert_eq!(p.victim(), Some(3));
        assert!(p.remove(5) && p.remove(4) && p.remove(3));
        assert_eq!((p.len(), p.used(), p.victim()), (0, 0, None));
    }

    #[test]
    fn lru_and_fifo_forget_a_removed_object() {
        removal_frees_room(&mut ListCache::<true>::new(3)); // lru
        removal_frees_room(&mut ListCache::<false>::new(3)); // fifo
    }
}
