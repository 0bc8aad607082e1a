//! FIFO: evict the object admitted first; hits change nothing. The code is
//! [`ListCache`], shared with LRU.

pub use crate::list_cache::ListCache;

/// First in, first out.
pub type Fifo = ListCache<false>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Evicted, Policy, Request};

    #[test]
    fn hits_do_not_protect_an_object() {
        let mut fifo = Fifo::new(2);
        let mut ev = Vec::new();
        let hits: Vec<bool> = [1, 2, 1, 3, 1]
            .iter()
            .map(|&id| fifo.access(&Request::new(id, 1), &mut ev).is_hit())
            .collect();
        // 3 evicts 1 (admitted first) although 1 was just hit.
        assert_eq!(hits, [false, false, true, false, false]);
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
