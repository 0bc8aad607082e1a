//! CLOCK-Pro (Jiang, Chen, Zhang, USENIX ATC 2005): CLOCK that tells hot
//! pages from cold ones by reuse distance, in byte sizes.
//!
//! Resident pages are hot or cold. A cold page is on probation: when it is
//! placed at the clock head it starts a *test period*, and if it is requested
//! again before the test period ends, its reuse distance is short enough to
//! make it hot. A cold page evicted during its test period stays in the clock
//! as a non-resident *test* entry (metadata only); a miss on it means the page
//! would have been a hit with more cold space, so it comes back hot and the
//! cold target grows. A test period ends when the hot hand passes the page.
//!
//! Three hands move around the clock, all in one direction:
//! - the cold hand evicts: an unreferenced cold page leaves (becoming a test
//!   entry if in its test period); a referenced one in its test period turns
//!   hot; a referenced one past its test period gets a new test period at the
//!   head;
//! - the hot hand demotes: it clears hot pages' reference bits and turns the
//!   first unreferenced hot page cold; it runs whenever hot bytes exceed
//!   `capacity - cold_target`; every cold page and test entry it passes ends
//!   its test period;
//! - the test hand bounds the metadata: when test entries hold more than
//!   `capacity` bytes, it drops the oldest.
//!
//! `cold_target` adapts: + the entry's size on a test hit, - the entry's
//! size when a test entry's period ends unused (floor 1 byte, cap the
//! capacity). A miss always admits (unless the object exceeds the capacity)
//! and the cold hand evicts until it fits, so the cache fills to capacity.
//! libCacheSim's ClockPro instead refuses inserts once cold bytes reach its
//! cold limit, so it plateaus at that limit (see the research notes,
//! pitfall 3); its numbers are not a reference for this policy.
//!
//! Representation, O(1) amortized per request: every hand moves entries to
//! the head or out of the clock, so each hand's sweep is a FIFO queue of the
//! entries it acts on. Hot pages (hot hand), cold pages (cold hand) and test
//! entries (test hand) are three lists ordered by a *stamp*, a counter taken
//! whenever an entry is placed at the head. Stamps also replace the hot
//! hand's walk over cold entries: the hot hand stands at the oldest hot
//! page, so everything stamped before it has been passed. That stamp is the
//! `frontier`; a cold page is in its test period iff it started one and its
//! stamp is at least the frontier, and test entries older than the frontier
//! are dropped as it advances. Deliberate simplifications of the paper: the
//! cold target moves only on test entries (libCacheSim's version does the
//! same), and hot-to-cold demotion does not start a test period.

use crate::error::PolicyError;
use crate::id_map::{id_map_with_capacity, IdMap};
use crate::params::{check, parse_value, Params};
use crate::policy::{Access, Evicted, Policy, Request};
use crate::slab::{List, Slab, Slot};

#[derive(Clone, Debug, PartialEq)]
pub struct ClockProConfig {
    /// Initial share of the capacity targeted at cold pages; it adapts from
    /// there. 0.01 as LIRS's share of resident HIR blocks, which CLOCK-Pro's
    /// cold pages stand for: start by trusting reuse distance, let test hits
    /// grow the cold share on recency-friendly traces. (libCacheSim defaults
    /// to 0.5 or 1.0, but it never adapts away from a full cold share; see
    /// the module header.)
    pub initial_cold_ratio: f64,
}

impl Default for ClockProConfig {
    fn default() -> ClockProConfig {
        ClockProConfig {
            initial_cold_ratio: 0.01,
        }
    }
}

impl Params for ClockProConfig {
    const KNOWN: &'static str = "initial_cold_ratio";

    fn set(&mut self, key: &str, value: &str) -> Result<(), PolicyError> {
        match key {
            "initial_cold_ratio" => {
                let v: f64 = parse_value(
                    "clockpro",
                    "initial_cold_ratio",
                    value,
                    "between 0 and 1, exclusive",
                )?;
                check(
                    v > 0.0 && v < 1.0,
                    "clockpro",
                    "initial_cold_ratio",
                    v,
                    "between 0 and 1, exclusive",
                )?;
                self.initial_cold_ratio = v;
            }
            _ => {
                return Err(PolicyError::UnknownParameter {
                    policy: "clockpro",
                    field: key.to_string(),
                    known: Self::KNOWN,
                })
            }
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Hot,
    Cold,
    /// Non-resident cold page in its test period.
    Test,
}

#[derive(Clone, Copy, Debug)]
struct Page {
    status: Status,
    referenced: bool,
    /// Whether placing the page at the head started a test period.
    test_started: bool,
    /// When the page was last placed at the clock head.
    stamp: u64,
}

pub struct ClockPro {
    capacity: u64,
    slab: Slab<Page>,
    map: IdMap<Slot>,
    /// Resident hot pages; the back is the hot hand.
    hot: List,
    /// Resident cold pages; the back is the cold hand.
    cold: List,
    /// Test entries; the back is the test hand.
    test: List,
    cold_target: u64,
    next_stamp: u64,
    /// Entries stamped before this have been passed by the hot hand.
    frontier: u64,
}

impl ClockPro {
    pub fn new(capacity: u64, config: ClockProConfig) -> ClockPro {
        let initial = (capacity as f64 * config.initial_cold_ratio) as u64;
        ClockPro {
            capacity,
            slab: Slab::with_capacity(1024),
            map: id_map_with_capacity(1024),
            hot: List::default(),
            cold: List::default(),
            test: List::default(),
            cold_target: initial.clamp(1, capacity.max(1)),
            next_stamp: 0,
            frontier: 0,
        }
    }

    /// Bytes the cold pages aim to hold; hot pages get the rest.
    pub fn cold_target(&self) -> u64 {
        self.cold_target
    }

    /// Bytes of the non-resident test entries.
    pub fn test_bytes(&self) -> u64 {
        self.test.bytes()
    }

    fn take_stamp(&mut self) -> u64 {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        stamp
    }

    fn in_test(&self, page: Page) -> bool {
        page.test_started && page.stamp >= self.frontier
    }

    fn used_bytes(&self) -> u64 {
        self.hot.bytes() + self.cold.bytes()
    }

    /// Drops a test entry whose test period ended without a request.
    fn expire(&mut self, slot: Slot) {
        let entry = self.slab.get(slot);
        let (id, size) = (entry.id, entry.size);
        self.cold_target = self.cold_target.saturating_sub(size).max(1);
        self.map.remove(&id);
        self.slab.free(slot);
    }

    /// One hot-hand step: spare a referenced hot page or demote an
    /// unreferenced one, then advance the frontier. False when no hot page.
    fn step_hot(&mut self) -> bool {
        let Some(slot) = self.slab.pop_back(&mut self.hot) else {
            return false;
        };
        let stamp = self.take_stamp();
        let page = &mut self.slab.get_mut(slot).meta;
        page.stamp = stamp;
        if page.referenced {
            page.referenced = false;
            self.slab.push_front(&mut self.hot, slot);
        } else {
            page.status = Status::Cold;
            page.test_started = false;
            self.slab.push_front(&mut self.cold, slot);
        }
        self.frontier = match self.hot.back() {
            Some(oldest) => self.slab.get(oldest).meta.stamp,
            None => self.next_stamp,
        };
        while let Some(oldest) = self.test.back() {
            if self.slab.get(oldest).meta.stamp >= self.frontier {
                break;
            }
            self.slab.unlink(&mut self.test, oldest);
            self.expire(oldest);
        }
        true
    }

    /// Runs the hot hand until hot pages fit `capacity - cold_target` (the
    /// target can shrink on the way, as passed test entries expire).
    fn balance_hot(&mut self) {
        while self.hot.bytes() > self.capacity.saturating_sub(self.cold_target) {
            if !self.step_hot() {
                break;
            }
        }
    }

    /// One cold-hand step (or a hot-hand step when no page is cold). False
    /// when nothing is resident.
    fn step_cold(&mut self, evicted: &mut Vec<Evicted>) -> bool {
        let Some(slot) = self.cold.back() else {
            return self.step_hot();
        };
        let page = self.slab.get(slot).meta;
        self.slab.unlink(&mut self.cold, slot);
        if !page.referenced {
            self.evict(slot, page, evicted);
            return true;
        }
        let promote = self.in_test(page);
        let stamp = self.take_stamp();
        let page_mut = &mut self.slab.get_mut(slot).meta;
        page_mut.referenced = false;
        page_mut.stamp = stamp;
        if promote {
            page_mut.status = Status::Hot;
            self.slab.push_front(&mut self.hot, slot);
            self.balance_hot();
        } else {
            page_mut.test_started = true;
            self.slab.push_front(&mut self.cold, slot);
        }
        true
    }

    /// Evicts the unlinked cold page at `slot`, keeping it as a test entry
    /// when it is in its test period.
    fn evict(&mut self, slot: Slot, page: Page, evicted: &mut Vec<Evicted>) {
        let gone = self.slab.get(slot).evicted();
        evicted.push(gone);
        if !self.in_test(page) {
            self.map.remove(&gone.id);
            self.slab.free(slot);
            return;
        }
        self.slab.get_mut(slot).meta.status = Status::Test;
        self.slab.push_front(&mut self.test, slot);
        while self.test.bytes() > self.capacity {
            let Some(oldest) = self.slab.pop_back(&mut self.test) else {
                break;
            };
            self.expire(oldest);
        }
    }

    /// A miss on a test entry: forget the entry and grow the cold target.
    fn test_hit(&mut self, slot: Slot) {
        let entry = self.slab.get(slot);
        let (id, size) = (entry.id, entry.size);
        self.slab.unlink(&mut self.test, slot);
        self.slab.free(slot);
        self.map.remove(&id);
        self.cold_target = (self.cold_target + size).min(self.capacity);
    }

    fn insert(&mut self, req: &Request, hot: bool) {
        let page = Page {
            status: if hot { Status::Hot } else { Status::Cold },
            referenced: false,
            test_started: !hot,
            stamp: self.take_stamp(),
        };
        let slot = self.slab.alloc(req.id, req.size, page);
        self.map.insert(req.id, slot);
        if hot {
            self.slab.push_front(&mut self.hot, slot);
            self.balance_hot();
        } else {
            self.slab.push_front(&mut self.cold, slot);
        }
    }
}

impl Policy for ClockPro {
    fn access(&mut self, req: &Request, evicted: &mut Vec<Evicted>) -> Access {
        let known = self.map.get(&req.id).copied();
        if let Some(slot) = known {
            let entry = self.slab.get_mut(slot);
            if entry.meta.status != Status::Test {
                entry.meta.referenced = true;
                entry.hits += 1;
                return Access::Hit;
            }
        }
        if req.size > self.capacity {
            return Access::Miss { admitted: false };
        }
        if let Some(slot) = known {
            self.test_hit(slot);
        }
        while self.used_bytes() + req.size > self.capacity {
            if !self.step_cold(evicted) {
                break;
            }
        }
        self.insert(req, known.is_some());
        Access::Miss { admitted: true }
    }

    fn contains(&self, id: u64) -> bool {
        self.map
            .get(&id)
            .is_some_and(|&s| self.slab.get(s).meta.status != Status::Test)
    }

    /// The cold hand's page when it would be evicted as is; `None` when the
    /// hand would first have to sweep.
    fn victim(&self) -> Option<u64> {
        let slot = self.cold.back()?;
        let entry = self.slab.get(slot);
        (!entry.meta.referenced).then_some(entry.id)
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn used(&self) -> u64 {
        self.used_bytes()
    }

    fn len(&self) -> usize {
        self.hot.len() + self.cold.len()
    }

    fn for_each_resident(&self, f: &mut dyn FnMut(Evicted)) {
        self.slab.report(&[&self.hot, &self.cold], f);
    }

    fn name(&self) -> &'static str {
        "clockpro"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clock_pro(capacity: u64, initial_cold_ratio: f64) -> ClockPro {
        ClockPro::new(capacity, ClockProConfig { initial_cold_ratio })
    }

    fn run(p: &mut ClockPro, ids: &[u64]) -> Vec<bool> {
        let mut ev = Vec::new();
        ids.iter()
            .map(|&id| p.access(&Request::new(id, 1), &mut ev).is_hit())
            .collect()
    }

    fn status(p: &ClockPro, id: u64) -> Option<Status> {
        p.map.get(&id).map(|&s| p.slab.get(s).meta.status)
    }

    #[test]
    fn new_pages_start_cold_and_a_hit_in_the_test_period_makes_them_hot() {
        let mut p = clock_pro(4, 0.25);
        run(&mut p, &[1, 2, 3, 4, 1]);
        assert_eq!(status(&p, 1), Some(Status::Cold));
        // 5 needs room: the cold hand finds 1 referenced in its test period.
        run(&mut p, &[5]);
        assert_eq!(status(&p, 1), Some(Status::Hot));
        assert!(!p.contains(2), "2 was the first unreferenced cold page");
        assert_eq!(status(&p, 2), Some(Status::Test));
    }

    #[test]
    fn a_miss_on_a_test_entry_comes_back_hot_and_grows_the_cold_target() {
        let mut p = clock_pro(4, 0.25);
        run(&mut p, &[1, 2, 3, 4, 5]);
        assert_eq!(status(&p, 1), Some(Status::Test));
        let before = p.cold_target();
        assert_eq!(run(&mut p, &[1]), [false]);
        assert_eq!(status(&p, 1), Some(Status::Hot));
        assert_eq!(p.cold_target(), before + 1);
    }

    #[test]
    fn hot_pages_survive_a_scan() {
        let mut p = clock_pro(10, 0.3);
        // Make 1..=3 hot, then scan 100 new objects through the cache.
        run(&mut p, &[1, 2, 3, 1, 2, 3]);
        for id in 10..20 {
            run(&mut p, &[id]);
        }
        run(&mut p, &[1, 2, 3]);
        for id in 100..200 {
            run(&mut p, &[id]);
        }
        assert_eq!(run(&mut p, &[1, 2, 3]), [true, true, true]);
    }

    #[test]
    fn test_entries_are_bounded_by_the_capacity() {
        let mut p = clock_pro(8, 0.5);
        for id in 0..1_000 {
            run(&mut p, &[id]);
            assert!(p.test_bytes() <= 8);
        }
        assert!(p.map.len() <= 16);
    }

    #[test]
    fn fills_the_cache_with_variable_sizes() {
        let mut p = clock_pro(1_000, 0.01);
        let mut ev = Vec::new();
        for id in 0..5_000u64 {
            let size = 1 + (id * 37) % 50;
            p.access(&Request::new(id % 700, size), &mut ev);
            assert!(p.used() <= 1_000);
        }
        assert!(p.used() > 1_000 - 50, "used {}", p.used());
    }

    #[test]
    fn rejects_objects_larger_than_the_capacity() {
        let mut p = clock_pro(10, 0.5);
        let mut ev = Vec::new();
        assert_eq!(
            p.access(&Request::new(1, 11), &mut ev),
            Access::Miss { admitted: false }
        );
        assert!(p.is_empty() && ev.is_empty());
    }

    #[test]
    fn the_cold_target_stays_between_one_byte_and_the_capacity() {
        let mut p = clock_pro(16, 0.5);
        let ids: Vec<u64> = (0..4_000u64).map(|i| (i * i + i / 3) % 40).collect();
        for chunk in ids.chunks(50) {
            run(&mut p, chunk);
            assert!((1..=16).contains(&p.cold_target()), "{}", p.cold_target());
        }
    }
}
