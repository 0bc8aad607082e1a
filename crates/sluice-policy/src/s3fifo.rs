//! S3-FIFO (Yang et al., SOSP'23): three static FIFO queues that demote
//! one-hit wonders quickly.
//!
//! - Small (`small_ratio` of the capacity): where objects seen for the first
//!   time wait. Most objects are never requested again and leave from here
//!   after a short stay.
//! - Main (the rest): objects that proved themselves. A FIFO with
//!   reinsertion and a 2-bit frequency, like CLOCK: at the back, an object
//!   hit since its last lap goes round again with its frequency lowered by
//!   one (capped at 3 first), an unhit object is evicted.
//! - Ghost (`ghost_ratio` of the capacity, counted in the ghosts' sizes): ids
//!   of objects recently evicted from small. Ghosts are not resident.
//!
//! Every hit raises the object's frequency; hits never move anything. A
//! miss whose id is in the ghost queue goes straight into main; other misses
//! enter small. To make room, S3-FIFO evicts from main when main holds more
//! than its share (or small is empty), else from small: small's oldest
//! object moves to main if it was hit at least `move_to_main_threshold`
//! times while in small, otherwise it is evicted and its id joins the ghost
//! queue. Objects move with their hit count (see [`Evicted::hits`]); their
//! frequency restarts at 0 in main.
//!
//! Semantics follow libCacheSim's `S3FIFO` (its current version, defaults
//! 0.1 / 0.9 / 2), including two details the paper leaves open: the
//! frequency counts hits only (insertion sets it to 0), and before the first
//! eviction, objects that find small already full go to main, so that the
//! whole cache fills up before anything is demoted.
//!
//! Deliberate differences, which only show in tiny caches or with objects
//! the size of the small queue: objects larger than the small queue are not
//! admitted (libCacheSim also refuses objects exactly its size, and evicts
//! before refusing), and the small queue gets at least one byte. So in
//! object-count mode a cache of fewer than 20 objects works here, where
//! libCacheSim refuses capacities under 10 and admits nothing below 20 (its
//! one-object small queue refuses objects of its own size); from 20 objects
//! up the two agree request for request.

use crate::error::PolicyError;
use crate::id_map::{id_map_with_capacity, IdMap};
use crate::params::{check, parse_value, Params};
use crate::policy::{Access, Evicted, Policy, Request};
use crate::slab::{List, Slab, Slot};
use crate::slru::share_of;

#[derive(Clone, Debug, PartialEq)]
pub struct S3FifoConfig {
    /// Share of the capacity for the small FIFO. 0.1 as in the S3-FIFO paper
    /// and libCacheSim: long enough to catch a quick second request, short
    /// enough that one-hit wonders leave soon.
    pub small_ratio: f64,
    /// Ghost FIFO size as a share of the capacity, in the ghosts' bytes. 0.9
    /// as in libCacheSim's default (the paper remembers as many ghosts as
    /// main holds objects).
    pub ghost_ratio: f64,
    /// Hits in the small FIFO needed to move to main instead of out. 2 as
    /// libCacheSim's default (its frequency counts hits, not the insertion).
    pub move_to_main_threshold: u32,
}

impl Default for S3FifoConfig {
    fn default() -> S3FifoConfig {
        S3FifoConfig {
            small_ratio: 0.1,
            ghost_ratio: 0.9,
            move_to_main_threshold: 2,
        }
    }
}

impl Params for S3FifoConfig {
    const KNOWN: &'static str = "small_ratio, ghost_ratio, move_to_main_threshold";

    fn set(&mut self, key: &str, value: &str) -> Result<(), PolicyError> {
        match key {
            "small_ratio" => {
                let v: f64 =
                    parse_value("s3fifo", "small_ratio", value, "between 0 and 1, exclusive")?;
                check(
                    v > 0.0 && v < 1.0,
                    "s3fifo",
                    "small_ratio",
                    v,
                    "between 0 and 1, exclusive",
                )?;
                self.small_ratio = v;
            }
            "ghost_ratio" => {
                let v: f64 = parse_value("s3fifo", "ghost_ratio", value, "0 to 4")?;
                check(
                    (0.0..=4.0).contains(&v),
                    "s3fifo",
                    "ghost_ratio",
                    v,
                    "0 to 4",
                )?;
                self.ghost_ratio = v;
            }
            "move_to_main_threshold" => {
                let v: u32 = parse_value("s3fifo", "move_to_main_threshold", value, "1 to 4")?;
                check(
                    (1..=4).contains(&v),
                    "s3fifo",
                    "move_to_main_threshold",
                    v,
                    "1 to 4",
                )?;
                self.move_to_main_threshold = v;
            }
            _ => {
                return Err(PolicyError::UnknownParameter {
                    policy: "s3fifo",
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
    Small,
    Main,
    Ghost,
}

/// Per-entry state: its queue and its frequency (hits, saturating).
#[derive(Clone, Copy, Debug)]
struct Meta {
    queue: Queue,
    freq: u8,
}

/// Main's reinsertion counter is 2 bits wide.
const MAIN_MAX_FREQ: u8 = 3;

/// S3-FIFO over a byte capacity.
pub struct S3Fifo {
    capacity: u64,
    small_capacity: u64,
    main_capacity: u64,
    ghost_capacity: u64,
    move_to_main_threshold: u32,
    /// False until the first eviction: until then objects that find small
    /// full go to main.
    has_evicted: bool,
    slab: Slab<Meta>,
    map: IdMap<Slot>,
    small: List,
    main: List,
    ghost: List,
}

impl S3Fifo {
    /// An S3-FIFO cache of `capacity` bytes.
    pub fn new(capacity: u64, config: S3FifoConfig) -> S3Fifo {
        let small_capacity = share_of(capacity, config.small_ratio).max(1);
        let ghost_ratio = config.ghost_ratio.clamp(0.0, 4.0);
        let ghost_capacity = if ghost_ratio.is_nan() {
            0
        } else {
            (capacity as f64 * ghost_ratio) as u64
        };
        S3Fifo {
            capacity,
            small_capacity,
            main_capacity: capacity.saturating_sub(small_capacity),
            ghost_capacity,
            move_to_main_threshold: config.move_to_main_threshold,
            has_evicted: false,
            slab: Slab::with_capacity(1024),
            map: id_map_with_capacity(1024),
            small: List::default(),
            main: List::default(),
            ghost: List::default(),
        }
    }

    fn evict_from_main_next(&self) -> bool {
        self.main.bytes() > self.main_capacity || self.small.is_empty()
    }

    /// One reclaim step; false when there is nothing left to take.
    fn evict_one(&mut self, evicted: &mut Vec<Evicted>) -> bool {
        self.has_evicted = true;
        if self.evict_from_main_next() {
            self.evict_main(evicted)
        } else {
            self.evict_small(evicted)
        }
    }

    /// Takes objects from small's back until one is evicted: those hit often
    /// enough move to main's front instead. True if anything moved.
    fn evict_small(&mut self, evicted: &mut Vec<Evicted>) -> bool {
        let mut moved = false;
        while let Some(slot) = self.slab.pop_back(&mut self.small) {
            let entry = self.slab.get_mut(slot);
            if u32::from(entry.meta.freq) >= self.move_to_main_threshold {
                entry.meta = Meta {
                    queue: Queue::Main,
                    freq: 0,
                };
                self.slab.push_front(&mut self.main, slot);
                moved = true;
                continue;
            }
            evicted.push(entry.evicted());
            self.remember_ghost(slot);
            return true;
        }
        moved
    }

    /// Turns the evicted entry in `slot` into a ghost, trimming the ghost
    /// queue to its size.
    fn remember_ghost(&mut self, slot: Slot) {
        let entry = self.slab.get(slot);
        if entry.size > self.ghost_capacity {
            self.map.remove(&entry.id);
            self.slab.free(slot);
            return;
        }
        self.slab.get_mut(slot).meta.queue = Queue::Ghost;
        self.slab.push_front(&mut self.ghost, slot);
        while self.ghost.bytes() > self.ghost_capacity {
            let Some(old) = self.slab.pop_back(&mut self.ghost) else {
                break;
            };
            self.map.remove(&self.slab.get(old).id);
            self.slab.free(old);
        }
    }

    /// Sweeps main's back: hit objects go round with one less frequency,
    /// the first unhit one is evicted.
    fn evict_main(&mut self, evicted: &mut Vec<Evicted>) -> bool {
        while let Some(slot) = self.main.back() {
            let entry = self.slab.get_mut(slot);
            if entry.meta.freq > 0 {
                entry.meta.freq = entry.meta.freq.min(MAIN_MAX_FREQ) - 1;
                self.slab.move_to_front(&mut self.main, slot);
                continue;
            }
            self.slab.unlink(&mut self.main, slot);
            let gone = self.slab.get(slot).evicted();
            self.map.remove(&gone.id);
            self.slab.free(slot);
            evicted.push(gone);
            return true;
        }
        false
    }

    /// Removes the ghost in `slot`; true if it was one.
    fn forget_ghost(&mut self, slot: Slot) -> bool {
        let entry = self.slab.get(slot);
        if entry.meta.queue != Queue::Ghost {
            return false;
        }
        self.map.remove(&entry.id);
        self.slab.unlink(&mut self.ghost, slot);
        self.slab.free(slot);
        true
    }

    fn insert(&mut self, req: &Request, to_main: bool) {
        let to_main = to_main || (!self.has_evicted && self.small.bytes() >= self.small_capacity);
        let queue = if to_main { Queue::Main } else { Queue::Small };
        let slot = self.slab.alloc(req.id, req.size, Meta { queue, freq: 0 });
        let list = if to_main {
            &mut self.main
        } else {
            &mut self.small
        };
        self.slab.push_front(list, slot);
        self.map.insert(req.id, slot);
    }
}

impl Policy for S3Fifo {
    fn access(&mut self, req: &Request, evicted: &mut Vec<Evicted>) -> Access {
        let found = self.map.get(&req.id).copied();
        if let Some(slot) = found {
            let entry = self.slab.get_mut(slot);
            if entry.meta.queue != Queue::Ghost {
                entry.hits += 1;
                entry.meta.freq = entry.meta.freq.saturating_add(1);
                return Access::Hit;
            }
        }
        if req.size > self.small_capacity {
            return Access::Miss { admitted: false };
        }
        // The ghost leaves before reclaiming so that new ghosts cannot push
        // it out first.
        let was_ghost = found.is_some_and(|slot| self.forget_ghost(slot));
        while self.used() + req.size > self.capacity {
            if !self.evict_one(evicted) {
                break;
            }
        }
        self.insert(req, was_ghost);
        Access::Miss { admitted: true }
    }

    fn contains(&self, id: u64) -> bool {
        self.map
            .get(&id)
            .is_some_and(|&slot| self.slab.get(slot).meta.queue != Queue::Ghost)
    }

    fn victim(&self) -> Option<u64> {
        // Named only when the back object would go without a sweep.
        if self.evict_from_main_next() {
            let entry = self.slab.get(self.main.back()?);
            (entry.meta.freq == 0).then_some(entry.id)
        } else {
            let entry = self.slab.get(self.small.back()?);
            (u32::from(entry.meta.freq) < self.move_to_main_threshold).then_some(entry.id)
        }
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn used(&self) -> u64 {
        self.small.bytes() + self.main.bytes()
    }

    fn len(&self) -> usize {
        self.small.len() + self.main.len()
    }

    fn for_each_resident(&self, f: &mut dyn FnMut(Evicted)) {
        self.slab.report(&[&self.small, &self.main], f);
    }

    fn name(&self) -> &'static str {
        "s3fifo"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3fifo(capacity: u64, small_ratio: f64) -> S3Fifo {
        S3Fifo::new(
            capacity,
            S3FifoConfig {
                small_ratio,
                ..S3FifoConfig::default()
            },
        )
    }

    fn touch(p: &mut S3Fifo, ids: &[u64], ev: &mut Vec<Evicted>) -> Vec<bool> {
        ids.iter()
            .map(|&id| p.access(&Request::new(id, 1), ev).is_hit())
            .collect()
    }

    fn ids(ev: &[Evicted]) -> Vec<u64> {
        ev.iter().map(|e| e.id).collect()
    }

    fn queue_of(p: &S3Fifo, id: u64) -> Option<Queue> {
        p.map.get(&id).map(|&slot| p.slab.get(slot).meta.queue)
    }

    #[test]
    fn the_cache_fills_before_anything_is_demoted() {
        // Small holds 1 object; before the first eviction the rest go to
        // main, so ten objects fit in a cache of ten.
        let mut c = s3fifo(10, 0.1);
        let mut ev = Vec::new();
        touch(&mut c, &(1..=10).collect::<Vec<_>>(), &mut ev);
        assert_eq!((c.len(), ev.len()), (10, 0));
        assert_eq!(queue_of(&c, 1), Some(Queue::Small));
        assert_eq!(queue_of(&c, 2), Some(Queue::Main));
    }

    #[test]
    fn a_one_hit_wonder_leaves_from_small_into_the_ghost_queue() {
        let mut c = s3fifo(10, 0.1);
        let mut ev = Vec::new();
        touch(&mut c, &(1..=11).collect::<Vec<_>>(), &mut ev);
        assert_eq!(ids(&ev), [1]);
        assert_eq!(queue_of(&c, 1), Some(Queue::Ghost));
        assert!(!c.contains(1) && c.len() == 10);
        assert_eq!(queue_of(&c, 11), Some(Queue::Small));
    }

    #[test]
    fn a_ghost_hit_goes_straight_to_main() {
        let mut c = s3fifo(10, 0.1);
        let mut ev = Vec::new();
        touch(&mut c, &(1..=11).collect::<Vec<_>>(), &mut ev);
        assert_eq!(touch(&mut c, &[1], &mut ev), [false]);
        assert_eq!(queue_of(&c, 1), Some(Queue::Main));
        // Small's 11 made the room; main is now over its share, so the next
        // miss evicts main's oldest unhit object.
        assert_eq!(ids(&ev), [1, 11]);
        touch(&mut c, &[12], &mut ev);
        assert_eq!(ids(&ev), [1, 11, 2]);
    }

    #[test]
    fn an_object_hit_twice_in_small_moves_to_main() {
        let mut c = s3fifo(4, 0.5);
        let mut ev = Vec::new();
        // Small holds 1 and 2; 3 and 4 go to main. 1 is hit twice.
        touch(&mut c, &[1, 2, 3, 4, 1, 1, 5], &mut ev);
        assert_eq!(ids(&ev), [2]);
        assert_eq!(queue_of(&c, 1), Some(Queue::Main));
        // Hit once, 2 would not have been enough: it became a ghost.
        assert_eq!(queue_of(&c, 2), Some(Queue::Ghost));
    }

    #[test]
    fn main_gives_a_hit_object_another_lap() {
        let mut c = s3fifo(4, 0.5);
        let mut ev = Vec::new();
        // Main holds 3 and 4; 3 is hit. 5 evicts 1 from small; 1's ghost
        // hit evicts 2 and pushes main over its share.
        touch(&mut c, &[1, 2, 3, 4, 3, 5, 1], &mut ev);
        assert_eq!(ids(&ev), [1, 2]);
        touch(&mut c, &[6], &mut ev);
        assert_eq!(ids(&ev), [1, 2, 4]);
        assert!(c.contains(3));
    }

    #[test]
    fn objects_keep_their_hits_when_they_move_to_main() {
        let mut c = s3fifo(2, 0.5);
        let mut ev = Vec::new();
        // 1 moves to main when 3 arrives; 3's ghost hit later pushes main
        // over its share and 1, unhit since the move, is evicted.
        touch(&mut c, &[1, 2, 1, 1, 3, 4, 3, 5], &mut ev);
        let one = ev.iter().find(|e| e.id == 1).copied();
        assert_eq!(
            one,
            Some(Evicted {
                id: 1,
                size: 1,
                hits: 2
            })
        );
    }

    #[test]
    fn victim_is_small_oldest_unless_main_is_over_its_share() {
        let mut c = s3fifo(10, 0.1);
        let mut ev = Vec::new();
        touch(&mut c, &(1..=11).collect::<Vec<_>>(), &mut ev);
        assert_eq!(c.victim(), Some(11));
        touch(&mut c, &[1], &mut ev);
        assert_eq!(c.victim(), Some(2));
    }

    #[test]
    fn byte_capacity_and_objects_larger_than_small() {
        let mut c = s3fifo(100, 0.1);
        let mut ev = Vec::new();
        assert_eq!(
            c.access(&Request::new(1, 11), &mut ev),
            Access::Miss { admitted: false }
        );
        assert_eq!(
            c.access(&Request::new(1, 10), &mut ev),
            Access::Miss { admitted: true }
        );
        assert_eq!(
            c.access(&Request::new(2, 101), &mut ev),
            Access::Miss { admitted: false }
        );
        for id in 2..12 {
            c.access(&Request::new(id, 10), &mut ev);
        }
        assert!(c.used() <= c.capacity());
        assert_eq!((c.used(), ids(&ev)), (100, vec![1]));
    }
}
