//! CLOCK: FIFO with second chances, counted by an n-bit reference counter.
//!
//! Objects sit on one queue in admission order. A new object enters at the
//! front with its counter at 0; a hit raises the counter by one, saturating
//! at `2^bits - 1`. To make room the hand looks at the oldest object: a
//! counter above 0 is decremented and the object goes back to the front (it
//! has earned another lap); an object whose counter is 0 is evicted. With
//! `bits = 1` this is the textbook second-chance CLOCK; more bits let a
//! frequently hit object survive several laps.
//!
//! The circular hand of the textbook and the "FIFO with reinsertion" used
//! here visit objects in the same order, so they evict the same objects;
//! reinsertion keeps the queue a plain list. libCacheSim's `Clock` (default
//! one bit, counter 0 at insertion) is built the same way.
//!
//! [`Policy::victim`] names the oldest object only when its counter is
//! already 0; otherwise the hand would have to sweep, and it answers `None`.

use crate::error::PolicyError;
use crate::id_map::{id_map_with_capacity, IdMap};
use crate::params::{check, parse_value, Params};
use crate::policy::{Access, Evicted, Policy, Request};
use crate::slab::{List, Slab, Slot};

#[derive(Clone, Debug, PartialEq)]
pub struct ClockConfig {
    /// Bits of the per-object reference counter (1 = classic CLOCK, second
    /// chance). 1 because it is the textbook policy and libCacheSim's default.
    pub bits: u8,
}

impl Default for ClockConfig {
    fn default() -> ClockConfig {
        ClockConfig { bits: 1 }
    }
}

impl Params for ClockConfig {
    const KNOWN: &'static str = "bits";

    fn set(&mut self, key: &str, value: &str) -> Result<(), PolicyError> {
        match key {
            "bits" => {
                let v: u8 = parse_value("clock", "bits", value, "1 to 8")?;
                check((1..=8).contains(&v), "clock", "bits", v, "1 to 8")?;
                self.bits = v;
            }
            _ => {
                return Err(PolicyError::UnknownParameter {
                    policy: "clock",
                    field: key.to_string(),
                    known: Self::KNOWN,
                })
            }
        }
        Ok(())
    }
}

/// CLOCK over a byte capacity; the entry's `meta` is its reference counter.
pub struct Clock {
    capacity: u64,
    /// Highest counter value, `2^bits - 1`.
    max_count: u8,
    slab: Slab<u8>,
    map: IdMap<Slot>,
    queue: List,
}

impl Clock {
    /// A CLOCK cache of `capacity` bytes. `bits` outside 1..=8 is clamped
    /// into that range (the registry rejects such values before this).
    pub fn new(capacity: u64, config: ClockConfig) -> Clock {
        let bits = u32::from(config.bits.clamp(1, 8));
        let max_count = u8::try_from((1u32 << bits) - 1).unwrap_or(u8::MAX);
        Clock {
            capacity,
            max_count,
            slab: Slab::with_capacity(1024),
            map: id_map_with_capacity(1024),
            queue: List::default(),
        }
    }

    /// Sweeps from the oldest object, giving counted objects another lap,
    /// and evicts the first one whose counter is 0.
    fn evict_one(&mut self, evicted: &mut Vec<Evicted>) -> bool {
        while let Some(slot) = self.queue.back() {
            let entry = self.slab.get_mut(slot);
            if entry.meta > 0 {
                entry.meta -= 1;
                self.slab.move_to_front(&mut self.queue, slot);
                continue;
            }
            self.slab.unlink(&mut self.queue, slot);
            let gone = self.slab.get(slot).evicted();
            self.map.remove(&gone.id);
            self.slab.free(slot);
            evicted.push(gone);
            return true;
        }
        false
    }
}

impl Policy for Clock {
    fn access(&mut self, req: &Request, evicted: &mut Vec<Evicted>) -> Access {
        if let Some(&slot) = self.map.get(&req.id) {
            let entry = self.slab.get_mut(slot);
            entry.hits += 1;
            entry.meta = entry.meta.saturating_add(1).min(self.max_count);
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
        let slot = self.slab.alloc(req.id, req.size, 0);
        self.slab.push_front(&mut self.queue, slot);
        self.map.insert(req.id, slot);
        Access::Miss { admitted: true }
    }

    fn contains(&self, id: u64) -> bool {
        self.map.contains_key(&id)
    }

    fn victim(&self) -> Option<u64> {
        let entry = self.slab.get(self.queue.back()?);
        (entry.meta == 0).then_some(entry.id)
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
        "clock"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clock(capacity: u64, bits: u8) -> Clock {
        Clock::new(capacity, ClockConfig { bits })
    }

    fn run(p: &mut impl Policy, ids: &[u64]) -> (Vec<bool>, Vec<u64>) {
        let mut ev = Vec::new();
        let hits = ids
            .iter()
            .map(|&id| p.access(&Request::new(id, 1), &mut ev).is_hit())
            .collect();
        (hits, ev.iter().map(|e| e.id).collect())
    }

    #[test]
    fn a_referenced_object_gets_a_second_chance() {
        let mut c = clock(2, 1);
        // 1 is hit, so when 3 arrives the hand spares 1 and evicts 2.
        let (hits, gone) = run(&mut c, &[1, 2, 1, 3, 1]);
        assert_eq!(hits, [false, false, true, false, true]);
        assert_eq!(gone, [2]);
    }

    #[test]
    fn the_second_chance_is_used_up_by_one_lap() {
        let mut c = clock(2, 1);
        // 1 survives 3's arrival with its bit cleared, then goes for 4.
        let (_, gone) = run(&mut c, &[1, 2, 1, 3, 4]);
        assert_eq!(gone, [2, 1]);
    }

    #[test]
    fn a_wider_counter_survives_more_laps() {
        // Three hits on 1: one bit remembers one, two bits remember three.
        let trace = [1, 2, 1, 1, 1, 3, 4, 5];
        let (_, one_bit) = run(&mut clock(2, 1), &trace);
        let (_, two_bits) = run(&mut clock(2, 2), &trace);
        assert_eq!(one_bit, [2, 1, 3]);
        assert_eq!(two_bits, [2, 3, 4]);
    }

    #[test]
    fn victim_is_named_only_when_no_sweep_is_needed() {
        let mut c = clock(2, 1);
        run(&mut c, &[1, 2]);
        assert_eq!(c.victim(), Some(1));
        run(&mut c, &[1]);
        assert_eq!(c.victim(), None);
    }

    #[test]
    fn byte_capacity_evicts_until_the_object_fits_and_refuses_oversized() {
        let mut c = clock(10, 1);
        let mut ev = Vec::new();
        for id in 0..5 {
            c.access(&Request::new(id, 2), &mut ev);
        }
        c.access(&Request::new(0, 2), &mut ev);
        assert_eq!(
            c.access(&Request::new(9, 5), &mut ev),
            Access::Miss { admitted: true }
        );
        // 0 was hit and gets a lap; 1, 2, 3 go.
        assert_eq!(ev.iter().map(|e| e.id).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!((c.used(), c.len()), (9, 3));
        assert_eq!(
            c.access(&Request::new(10, 11), &mut ev),
            Access::Miss { admitted: false }
        );
        assert!(!c.contains(10));
    }

    #[test]
    fn evictions_report_hits_since_admission() {
        let mut c = clock(1, 1);
        let mut ev = Vec::new();
        for id in [7, 7, 7, 8] {
            c.access(&Request::new(id, 1), &mut ev);
        }
        assert_eq!(
            ev,
            [Evicted {
                id: 7,
                size: 1,
                hits: 2
            }]
        );
    }
}
