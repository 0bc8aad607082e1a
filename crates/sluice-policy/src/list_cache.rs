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

    fn name(&self) -> &'static str {
        if PROMOTE {
            "lru"
        } else {
            "fifo"
        }
    }
}
