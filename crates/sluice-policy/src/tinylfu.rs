//! TinyLFU admission in front of SLRU, and W-TinyLFU.
//!
//! TinyLFU (Einziger, Friedman, Manes, ACM TOS 2017) keeps a small count-min
//! sketch of recent request frequencies ([`crate::sketch`]) and admits a new
//! object only if it has been requested more often than the object it would
//! push out, so one-hit wonders cannot flush a popular working set.
//!
//! [`tinylfu_slru`] ("tinylfu") is the plain composition: an SLRU cache (80%
//! protected) behind the [`TinyLfuDoor`]. Every request is counted; on a miss
//! the candidate is compared with SLRU's next victim (the least recently used
//! end of probation). Brand-new objects start with a count of one, so against
//! a warm cache they are mostly rejected: low hit ratio on recency-driven
//! traces, very low backend traffic (seed 003's "bandwidth-bound" band).
//!
//! [`WTinyLfu`] ("wtinylfu") adds the paper's window: new objects always enter
//! a small LRU window (`window_ratio` of the capacity) and only the objects
//! the window pushes out face the door. Each such candidate goes to the main
//! SLRU's probation segment if everything fits; otherwise it is compared with
//! the main cache's victim (probation's LRU end, else protected's): if the
//! sketch counts the candidate strictly more often, the victim is evicted and
//! the comparison repeats until the candidate fits; otherwise the candidate
//! is evicted. With byte sizes a candidate may beat several victims in a row
//! (and still lose to a later one); an object larger than the window is its
//! own candidate at once, and is reported as not admitted if it loses. If
//! the window has not overflowed but the total still exceeds the capacity
//! (a small object arriving while a large one left the window short), main
//! victims are evicted without a comparison, as Caffeine does. Main hits
//! follow SLRU: a probation hit moves to protected, whose overflow is demoted
//! back to probation. The window and the segments share one slab, so an
//! object keeps its hit count as it moves between them. The window does not
//! adapt (Caffeine's hill climbing does); libCacheSim's is fixed too.
//!
//! libCacheSim's WTinyLFU sizes its sketch in bytes and refuses objects
//! larger than the window (research notes, pitfall 2), so it is only
//! comparable in object-count mode; the differential tests compare ours
//! with a naive model instead.

use crate::admission::Admitted;
use crate::error::PolicyError;
use crate::id_map::{id_map_with_capacity, IdMap};
use crate::params::{check, parse_value, Params};
use crate::policy::{Access, Evicted, Policy, Request};
use crate::sketch::CountMinSketch;
use crate::slab::{List, Slab, Slot};
use crate::slru::{Slru, SlruConfig};
use crate::tinylfu_door::{set_door_param, TinyLfuConfig, TinyLfuDoor};

#[derive(Clone, Debug, PartialEq)]
pub struct WTinyLfuConfig {
    /// Share of the capacity for the LRU admission window (at least one
    /// byte). 0.01 as in W-TinyLFU's paper and libCacheSim: just enough to
    /// let a burst of new objects build up frequency before they compete.
    pub window_ratio: f64,
    /// As TinyLfuConfig::cms_width, with its default.
    pub cms_width: usize,
    /// As TinyLfuConfig::cms_depth, with its default.
    pub cms_depth: usize,
    /// As TinyLfuConfig::reset_factor, with its default.
    pub reset_factor: u64,
    /// As TinyLfuConfig::protected_ratio, with its default.
    pub protected_ratio: f64,
    /// As TinyLfuConfig::seed, with its default.
    pub seed: u64,
}

impl Default for WTinyLfuConfig {
    fn default() -> WTinyLfuConfig {
        let door = TinyLfuConfig::default();
        WTinyLfuConfig {
            window_ratio: 0.01,
            cms_width: door.cms_width,
            cms_depth: door.cms_depth,
            reset_factor: door.reset_factor,
            protected_ratio: door.protected_ratio,
            seed: door.seed,
        }
    }
}

impl Params for WTinyLfuConfig {
    const KNOWN: &'static str =
        "window_ratio, cms_width, cms_depth, reset_factor, protected_ratio, seed";

    fn set(&mut self, key: &str, value: &str) -> Result<(), PolicyError> {
        const RATIO: &str = "between 0 and 1, exclusive";
        match key {
            "window_ratio" => {
                let v: f64 = parse_value("wtinylfu", "window_ratio", value, RATIO)?;
                check(v > 0.0 && v < 1.0, "wtinylfu", "window_ratio", v, RATIO)?;
                self.window_ratio = v;
                Ok(())
            }
            // No admission draw: the window already lets newcomers in.
            "admit_probability" => Err(PolicyError::UnknownParameter {
                policy: "wtinylfu",
                field: key.to_string(),
                known: Self::KNOWN,
            }),
            _ => {
                let mut door = self.door();
                set_door_param(&mut door, "wtinylfu", Self::KNOWN, key, value)?;
                self.cms_width = door.cms_width;
                self.cms_depth = door.cms_depth;
                self.reset_factor = door.reset_factor;
                self.protected_ratio = door.protected_ratio;
                self.seed = door.seed;
                Ok(())
            }
        }
    }
}

impl WTinyLfuConfig {
    /// The door parameters as a TinyLFU config (no admission draw).
    fn door(&self) -> TinyLfuConfig {
        TinyLfuConfig {
            cms_width: self.cms_width,
            cms_depth: self.cms_depth,
            admit_probability: 0.0,
            reset_factor: self.reset_factor,
            protected_ratio: self.protected_ratio,
            seed: self.seed,
        }
    }
}

/// TinyLFU + SLRU: an SLRU cache behind the TinyLFU door.
pub fn tinylfu_slru(capacity: u64, config: TinyLfuConfig) -> Admitted<Slru, TinyLfuDoor> {
    let slru = Slru::new(
        capacity,
        SlruConfig {
            protected_ratio: config.protected_ratio,
        },
    );
    Admitted::new(slru, TinyLfuDoor::new(capacity, &config), "tinylfu")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Segment {
    Window,
    Probation,
    Protected,
}

pub struct WTinyLfu {
    capacity: u64,
    window_limit: u64,
    protected_limit: u64,
    slab: Slab<Segment>,
    map: IdMap<Slot>,
    window: List,
    probation: List,
    protected: List,
    sketch: CountMinSketch,
}

/// `ratio x bytes`, rounded down, within `0..=bytes`.
fn share(bytes: u64, ratio: f64) -> u64 {
    ((bytes as f64 * ratio) as u64).min(bytes)
}

impl WTinyLfu {
    pub fn new(capacity: u64, config: WTinyLfuConfig) -> WTinyLfu {
        let window_limit = share(capacity, config.window_ratio).max(1);
        let main = capacity.saturating_sub(window_limit);
        let sketch = CountMinSketch::new(config.cms_width, config.cms_depth, config.seed)
            .with_reset(capacity, config.reset_factor);
        WTinyLfu {
            capacity,
            window_limit,
            protected_limit: share(main, config.protected_ratio),
            slab: Slab::with_capacity(1024),
            map: id_map_with_capacity(1024),
            window: List::default(),
            probation: List::default(),
            protected: List::default(),
            sketch,
        }
    }

    /// The frequency sketch, for inspection.
    pub fn sketch(&self) -> &CountMinSketch {
        &self.sketch
    }

    fn used_bytes(&self) -> u64 {
        self.window.bytes() + self.probation.bytes() + self.protected.bytes()
    }

    fn hit(&mut self, slot: Slot) {
        let entry = self.slab.get_mut(slot);
        entry.hits += 1;
        match entry.meta {
            Segment::Window => self.slab.move_to_front(&mut self.window, slot),
            Segment::Protected => self.slab.move_to_front(&mut self.protected, slot),
            Segment::Probation => self.promote(slot),
        }
    }

    /// Probation to protected; protected's overflow back to probation.
    fn promote(&mut self, slot: Slot) {
        self.slab.unlink(&mut self.probation, slot);
        self.slab.get_mut(slot).meta = Segment::Protected;
        self.slab.push_front(&mut self.protected, slot);
        while self.protected.bytes() > self.protected_limit {
            let Some(demoted) = self.slab.pop_back(&mut self.protected) else {
                break;
            };
            self.slab.get_mut(demoted).meta = Segment::Probation;
            self.slab.push_front(&mut self.probation, demoted);
        }
    }

    /// The main cache's next victim: probation's LRU end, else protected's.
    fn main_victim(&self) -> Option<Slot> {
        self.probation.back().or(self.protected.back())
    }

    /// Forgets the unlinked `slot`, reporting it unless it is `new_id`,
    /// the object of the current miss, which was never admitted.
    fn drop_slot(&mut self, slot: Slot, new_id: u64, evicted: &mut Vec<Evicted>) {
        let gone = self.slab.get(slot).evicted();
        self.map.remove(&gone.id);
        self.slab.free(slot);
        if gone.id != new_id {
            evicted.push(gone);
        }
    }

    /// Unlinks `slot` from its segment and forgets it.
    fn evict_linked(&mut self, slot: Slot, new_id: u64, evicted: &mut Vec<Evicted>) {
        let list = match self.slab.get(slot).meta {
            Segment::Window => &mut self.window,
            Segment::Probation => &mut self.probation,
            Segment::Protected => &mut self.protected,
        };
        self.slab.unlink(list, slot);
        self.drop_slot(slot, new_id, evicted);
    }

    /// Moves the window's overflow, oldest first, through the door.
    fn drain_window(&mut self, new_id: u64, evicted: &mut Vec<Evicted>) {
        while self.window.bytes() > self.window_limit {
            let Some(candidate) = self.slab.pop_back(&mut self.window) else {
                break;
            };
            self.admit_to_main(candidate, new_id, evicted);
        }
    }

    /// Puts the unlinked `candidate` into probation, evicting main victims
    /// it beats on frequency, or evicts it when it loses.
    fn admit_to_main(&mut self, candidate: Slot, new_id: u64, evicted: &mut Vec<Evicted>) {
        let (id, size) = {
            let e = self.slab.get(candidate);
            (e.id, e.size)
        };
        while self.used_bytes() + size > self.capacity {
            let Some(victim) = self.main_victim() else {
                self.drop_slot(candidate, new_id, evicted);
                return;
            };
            let victim_id = self.slab.get(victim).id;
            if self.sketch.estimate(id) <= self.sketch.estimate(victim_id) {
                self.drop_slot(candidate, new_id, evicted);
                return;
            }
            self.evict_linked(victim, new_id, evicted);
        }
        self.slab.get_mut(candidate).meta = Segment::Probation;
        self.slab.push_front(&mut self.probation, candidate);
    }

    /// Evicts main victims (then the window's oldest) until all fits.
    fn fit_total(&mut self, new_id: u64, evicted: &mut Vec<Evicted>) {
        while self.used_bytes() > self.capacity {
            let Some(victim) = self.main_victim().or(self.window.back()) else {
                break;
            };
            self.evict_linked(victim, new_id, evicted);
        }
    }
}

impl Policy for WTinyLfu {
    fn access(&mut self, req: &Request, evicted: &mut Vec<Evicted>) -> Access {
        self.sketch.observe_size(req.size);
        self.sketch.increment(req.id);
        if let Some(&slot) = self.map.get(&req.id) {
            self.hit(slot);
            return Access::Hit;
        }
        if req.size > self.capacity {
            return Access::Miss { admitted: false };
        }
        let slot = self.slab.alloc(req.id, req.size, Segment::Window);
        self.slab.push_front(&mut self.window, slot);
        self.map.insert(req.id, slot);
        self.drain_window(req.id, evicted);
        self.fit_total(req.id, evicted);
        Access::Miss {
            admitted: self.map.contains_key(&req.id),
        }
    }

    fn contains(&self, id: u64) -> bool {
        self.map.contains_key(&id)
    }

    /// The main cache's victim, or the window's oldest object when the main
    /// cache is empty. A window candidate may still win against it.
    fn victim(&self) -> Option<u64> {
        let slot = self.main_victim().or(self.window.back())?;
        Some(self.slab.get(slot).id)
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn used(&self) -> u64 {
        self.used_bytes()
    }

    fn len(&self) -> usize {
        self.window.len() + self.probation.len() + self.protected.len()
    }

    fn for_each_resident(&self, f: &mut dyn FnMut(Evicted)) {
        self.slab
            .report(&[&self.window, &self.probation, &self.protected], f);
    }

    fn name(&self) -> &'static str {
        "wtinylfu"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config with the `key=value` pairs of `spec` set, as the registry
    /// sets them.
    fn with_params<C: Params + Default>(spec: &str) -> Result<C, PolicyError> {
        let mut config = C::default();
        for pair in spec.split(',') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            config.set(key, value)?;
        }
        Ok(config)
    }

    #[test]
    fn both_variants_parse_the_shared_door_parameters_and_name_themselves() {
        let spec = "cms_width=64,cms_depth=2,reset_factor=3,protected_ratio=0.5,seed=9";
        let t: TinyLfuConfig = with_params(spec).expect("tinylfu parses");
        let w: WTinyLfuConfig =
            with_params(&format!("{spec},window_ratio=0.2")).expect("wtinylfu parses");
        assert_eq!(
            (t.cms_width, t.cms_depth, t.reset_factor, t.seed),
            (64, 2, 3, 9)
        );
        assert_eq!(
            w.door(),
            TinyLfuConfig {
                admit_probability: 0.0,
                ..t
            }
        );
        assert_eq!(w.window_ratio, 0.2);
        let wtinylfu = |spec| with_params::<WTinyLfuConfig>(spec).unwrap_err().to_string();
        let tinylfu = |spec| with_params::<TinyLfuConfig>(spec).unwrap_err().to_string();
        for (err, needle) in [
            (wtinylfu("cms_depth=9"), "wtinylfu"),
            (tinylfu("cms_width=8"), "cms_width"),
            (wtinylfu("admit_probability=0.5"), "window_ratio"),
            (tinylfu("admit_probability=1.5"), "admit_probability"),
            (wtinylfu("protected_ratio=1"), "protected_ratio"),
        ] {
            assert!(err.contains(needle), "{needle}: {err}");
        }
    }

    fn w_tinylfu(capacity: u64) -> WTinyLfu {
        WTinyLfu::new(
            capacity,
            WTinyLfuConfig {
                window_ratio: 0.1,
                ..WTinyLfuConfig::default()
            },
        )
    }

    fn run(p: &mut impl Policy, reqs: &[(u64, u64)]) -> Vec<Access> {
        let mut ev = Vec::new();
        reqs.iter()
            .map(|&(id, size)| p.access(&Request::new(id, size), &mut ev))
            .collect()
    }

    fn unit(ids: &[u64]) -> Vec<(u64, u64)> {
        ids.iter().map(|&id| (id, 1)).collect()
    }

    fn segment(p: &WTinyLfu, id: u64) -> Option<Segment> {
        p.map.get(&id).map(|&s| p.slab.get(s).meta)
    }

    #[test]
    fn new_objects_always_enter_the_window() {
        let mut p = w_tinylfu(10);
        run(&mut p, &unit(&[1, 1, 1, 2, 2, 3, 4, 5, 6, 7, 8, 9, 10]));
        assert_eq!(run(&mut p, &unit(&[42])), [Access::Miss { admitted: true }]);
        assert_eq!(segment(&p, 42), Some(Segment::Window));
        assert_eq!(run(&mut p, &unit(&[42])), [Access::Hit]);
    }

    #[test]
    fn a_frequent_window_candidate_displaces_the_main_victim() {
        let mut p = w_tinylfu(10);
        run(&mut p, &unit(&(1..=10).collect::<Vec<_>>()));
        // Main holds 1..=9, the window 10. 11 pushes 10 out (a tie with the
        // victim 1: dropped); 11 is then requested twice more in the window,
        // so when 12 pushes it out it beats 1, seen once.
        run(&mut p, &unit(&[11, 11, 11, 12]));
        assert!(!p.contains(10), "ties go to the victim");
        assert_eq!(segment(&p, 11), Some(Segment::Probation));
        assert!(!p.contains(1), "the main victim went");
    }

    #[test]
    fn a_one_hit_wonder_leaving_the_window_is_dropped() {
        let mut p = w_tinylfu(10);
        run(&mut p, &unit(&(1..=10).collect::<Vec<_>>()));
        run(&mut p, &unit(&(1..=9).collect::<Vec<_>>()));
        let mut ev = Vec::new();
        p.access(&Request::new(50, 1), &mut ev);
        ev.clear();
        p.access(&Request::new(51, 1), &mut ev);
        // 50 left the window for 51 and lost to a victim seen twice.
        assert_eq!(
            ev,
            [Evicted {
                id: 50,
                size: 1,
                hits: 0
            }]
        );
        assert_eq!(p.len(), 10);
    }

    #[test]
    fn a_frequent_working_set_survives_a_scan() {
        let mut p = w_tinylfu(20);
        let hot: Vec<u64> = (0..15).collect();
        for _ in 0..5 {
            run(&mut p, &unit(&hot));
        }
        run(&mut p, &unit(&(1_000..1_500).collect::<Vec<_>>()));
        let hits = run(&mut p, &unit(&hot))
            .iter()
            .filter(|a| a.is_hit())
            .count();
        assert!(hits >= 14, "{hits} of 15");
    }

    #[test]
    fn probation_hits_promote_and_protected_overflow_is_demoted() {
        let mut p = w_tinylfu(10); // window 1, main 9, protected 7
        run(&mut p, &unit(&(1..=10).collect::<Vec<_>>()));
        run(&mut p, &unit(&(1..=9).collect::<Vec<_>>()));
        assert_eq!(p.protected.len(), 7);
        assert_eq!(segment(&p, 1), Some(Segment::Probation), "demoted first");
        assert_eq!(segment(&p, 9), Some(Segment::Protected));
    }

    #[test]
    fn byte_sizes_keep_used_within_capacity_and_refuse_losing_giants() {
        let mut p = w_tinylfu(100); // window 10 bytes
        for round in 0..3 {
            for id in 0..9 {
                run(&mut p, &[(id, 11)]);
                assert!(p.used() <= 100, "round {round}");
            }
        }
        // 99 is larger than the window: it competes at once and loses to
        // objects seen three times.
        let mut ev = Vec::new();
        assert_eq!(
            p.access(&Request::new(99, 30), &mut ev),
            Access::Miss { admitted: false }
        );
        assert!(ev.is_empty() && !p.contains(99));
        assert_eq!(
            run(&mut p, &[(99, 200)]),
            [Access::Miss { admitted: false }]
        );
    }

    #[test]
    fn tinylfu_keeps_frequent_objects_and_rejects_one_hit_wonders() {
        let mut p = tinylfu_slru(10, TinyLfuConfig::default());
        let hot: Vec<u64> = (0..10).collect();
        for _ in 0..3 {
            run(&mut p, &unit(&hot));
        }
        let scan = run(&mut p, &unit(&(100..200).collect::<Vec<_>>()));
        assert!(scan.iter().all(|a| *a == Access::Miss { admitted: false }));
        assert!(run(&mut p, &unit(&hot)).iter().all(|a| a.is_hit()));
        assert_eq!(p.name(), "tinylfu");
    }
}
