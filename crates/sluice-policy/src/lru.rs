//! LRU: evict the least recently used object.
//!
//! One list, most recent at the front. A hit moves the entry to the front;
//! a miss inserts at the front and evicts from the back until the new object
//! fits. The code is [`ListCache`], shared with FIFO.

pub use crate::list_cache::ListCache;

/// Least recently used.
pub type Lru = ListCache<true>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Access, Policy, Request};

    fn run(p: &mut impl Policy, ids: &[u64]) -> Vec<bool> {
        let mut ev = Vec::new();
        ids.iter()
            .map(|&id| p.access(&Request::new(id, 1), &mut ev).is_hit())
            .collect()
    }

    #[test]
    fn evicts_least_recently_used() {
        let mut lru = Lru::new(2);
        // 1 2 1 3: 2 is least recent when 3 arrives, so 1 stays.
        assert_eq!(
            run(&mut lru, &[1, 2, 1, 3, 1, 2]),
            [false, false, true, false, true, false]
        );
    }

    #[test]
    fn byte_capacity_evicts_until_the_object_fits() {
        let mut lru = Lru::new(10);
        let mut ev = Vec::new();
        for id in 0..5 {
            lru.access(&Request::new(id, 2), &mut ev);
        }
        assert_eq!(
            lru.access(&Request::new(9, 7), &mut ev),
            Access::Miss { admitted: true }
        );
        assert_eq!(ev.iter().map(|e| e.id).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert_eq!((lru.used(), lru.len()), (9, 2));
        assert_eq!(
            lru.access(&Request::new(10, 11), &mut ev),
            Access::Miss { admitted: false }
        );
    }
}
