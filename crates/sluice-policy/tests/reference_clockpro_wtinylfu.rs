//! CLOCK-Pro and W-TinyLFU against naive models of the same semantics.
//!
//! libCacheSim's versions of these two misbehave (ClockPro stops filling at
//! its cold limit, WTinyLFU sizes its sketch in bytes and refuses objects
//! larger than its window), so instead of comparing with it we compare the
//! fast policies with models written the obvious way: every object in a
//! `Vec`, every hand or list end found by a linear scan. Random traces
//! (object-count mode and small byte sizes, ids from a small range so there
//! are hits, random capacities and parameters) go through both, and every
//! answer must agree: the `Access` of each request, the objects evicted in
//! order with their sizes and hit counts, and the bytes in use.
//!
//! The CLOCK-Pro model keeps no lists at all: each page carries its stamp
//! (when it was last placed at the clock head) and each hand is "the page
//! of its kind with the smallest stamp", so it also checks that the fast
//! version's three FIFO lists really stay in stamp order. The W-TinyLFU
//! model uses the crate's `CountMinSketch` (the sketch has its own unit
//! tests) and plain vectors for the window and the SLRU segments.

use proptest::prelude::*;
use sluice_policy::clock_pro::{ClockPro, ClockProConfig};
use sluice_policy::sketch::CountMinSketch;
use sluice_policy::tinylfu::{WTinyLfu, WTinyLfuConfig};
use sluice_policy::{Access, Evicted, Policy, Request};

/// One object in a model.
#[derive(Clone, Copy, Debug)]
struct Obj {
    id: u64,
    size: u64,
    hits: u32,
}

impl Obj {
    fn new(id: u64, size: u64) -> Obj {
        Obj { id, size, hits: 0 }
    }

    fn report(self) -> Evicted {
        Evicted {
            id: self.id,
            size: self.size,
            hits: self.hits,
        }
    }
}

fn bytes(objs: &[Obj]) -> u64 {
    objs.iter().map(|o| o.size).sum()
}

/// The model interface the comparison drives.
trait Model {
    fn access(&mut self, id: u64, size: u64, evicted: &mut Vec<Evicted>) -> Access;
    fn used(&self) -> u64;
}

// ---------------------------------------------------------------- CLOCK-Pro

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Hot,
    Cold,
    Test,
}

#[derive(Clone, Copy, Debug)]
struct ModelPage {
    obj: Obj,
    kind: Kind,
    referenced: bool,
    test_started: bool,
    stamp: u64,
}

struct ClockProModel {
    capacity: u64,
    pages: Vec<ModelPage>,
    cold_target: u64,
    next_stamp: u64,
    frontier: u64,
}

impl ClockProModel {
    fn new(capacity: u64, initial_cold_ratio: f64) -> ClockProModel {
        let cold_target = ((capacity as f64 * initial_cold_ratio) as u64).clamp(1, capacity);
        ClockProModel {
            capacity,
            pages: Vec::new(),
            cold_target,
            next_stamp: 0,
            frontier: 0,
        }
    }

    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp - 1
    }

    fn bytes_of(&self, kind: Kind) -> u64 {
        self.pages
            .iter()
            .filter(|p| p.kind == kind)
            .map(|p| p.obj.size)
            .sum()
    }

    /// Where the hand for `kind` stands: the page placed at the head longest ago.
    fn hand(&self, kind: Kind) -> Option<usize> {
        (0..self.pages.len())
            .filter(|&i| self.pages[i].kind == kind)
            .min_by_key(|&i| self.pages[i].stamp)
    }

    fn in_test(&self, i: usize) -> bool {
        self.pages[i].test_started && self.pages[i].stamp >= self.frontier
    }

    fn drop_test(&mut self, i: usize) {
        let page = self.pages.remove(i);
        self.cold_target = self.cold_target.saturating_sub(page.obj.size).max(1);
    }

    fn hot_hand(&mut self) -> bool {
        let Some(i) = self.hand(Kind::Hot) else {
            return false;
        };
        self.pages[i].stamp = self.stamp();
        if self.pages[i].referenced {
            self.pages[i].referenced = false;
        } else {
            self.pages[i].kind = Kind::Cold;
            self.pages[i].test_started = false;
        }
        self.frontier = match self.hand(Kind::Hot) {
            Some(h) => self.pages[h].stamp,
            None => self.next_stamp,
        };
        while let Some(t) = (0..self.pages.len())
            .find(|&t| self.pages[t].kind == Kind::Test && self.pages[t].stamp < self.frontier)
        {
            self.drop_test(t);
        }
        true
    }

    fn balance(&mut self) {
        while self.bytes_of(Kind::Hot) > self.capacity - self.cold_target {
            if !self.hot_hand() {
                break;
            }
        }
    }

    fn cold_hand(&mut self, evicted: &mut Vec<Evicted>) -> bool {
        let Some(i) = self.hand(Kind::Cold) else {
            return self.hot_hand();
        };
        if self.pages[i].referenced {
            let promote = self.in_test(i);
            self.pages[i].referenced = false;
            self.pages[i].stamp = self.stamp();
            if promote {
                self.pages[i].kind = Kind::Hot;
                self.balance();
            } else {
                self.pages[i].test_started = true;
            }
            return true;
        }
        evicted.push(self.pages[i].obj.report());
        if !self.in_test(i) {
            self.pages.remove(i);
            return true;
        }
        self.pages[i].kind = Kind::Test;
        while self.bytes_of(Kind::Test) > self.capacity {
            let oldest = self.hand(Kind::Test).expect("test bytes > 0");
            self.drop_test(oldest);
        }
        true
    }
}

impl Model for ClockProModel {
    fn access(&mut self, id: u64, size: u64, evicted: &mut Vec<Evicted>) -> Access {
        let found = self.pages.iter().position(|p| p.obj.id == id);
        if let Some(i) = found {
            if self.pages[i].kind != Kind::Test {
                self.pages[i].referenced = true;
                self.pages[i].obj.hits += 1;
                return Access::Hit;
            }
        }
        if size > self.capacity {
            return Access::Miss { admitted: false };
        }
        let was_test = match found {
            Some(i) => {
                let page = self.pages.remove(i);
                self.cold_target = (self.cold_target + page.obj.size).min(self.capacity);
                true
            }
            None => false,
        };
        while self.used() + size > self.capacity {
            if !self.cold_hand(evicted) {
                break;
            }
        }
        let stamp = self.stamp();
        self.pages.push(ModelPage {
            obj: Obj::new(id, size),
            kind: if was_test { Kind::Hot } else { Kind::Cold },
            referenced: false,
            test_started: !was_test,
            stamp,
        });
        if was_test {
            self.balance();
        }
        Access::Miss { admitted: true }
    }

    fn used(&self) -> u64 {
        self.bytes_of(Kind::Hot) + self.bytes_of(Kind::Cold)
    }
}

// ---------------------------------------------------------------- W-TinyLFU

/// Vectors hold the most recently used object first.
struct WTinyLfuModel {
    capacity: u64,
    window_limit: u64,
    protected_limit: u64,
    window: Vec<Obj>,
    probation: Vec<Obj>,
    protected: Vec<Obj>,
    sketch: CountMinSketch,
}

impl WTinyLfuModel {
    fn new(capacity: u64, c: &WTinyLfuConfig) -> WTinyLfuModel {
        let window_limit = ((capacity as f64 * c.window_ratio) as u64).clamp(1, capacity);
        let main = capacity - window_limit;
        WTinyLfuModel {
            capacity,
            window_limit,
            protected_limit: ((main as f64 * c.protected_ratio) as u64).min(main),
            window: Vec::new(),
            probation: Vec::new(),
            protected: Vec::new(),
            sketch: CountMinSketch::new(c.cms_width, c.cms_depth, c.seed)
                .with_reset(capacity, c.reset_factor),
        }
    }

    fn total(&self) -> u64 {
        bytes(&self.window) + bytes(&self.probation) + bytes(&self.protected)
    }

    fn forget(obj: Obj, new_id: u64, evicted: &mut Vec<Evicted>) {
        if obj.id != new_id {
            evicted.push(obj.report());
        }
    }

    fn hit(&mut self, id: u64) -> bool {
        if let Some(i) = self.window.iter().position(|o| o.id == id) {
            let mut o = self.window.remove(i);
            o.hits += 1;
            self.window.insert(0, o);
        } else if let Some(i) = self.protected.iter().position(|o| o.id == id) {
            let mut o = self.protected.remove(i);
            o.hits += 1;
            self.protected.insert(0, o);
        } else if let Some(i) = self.probation.iter().position(|o| o.id == id) {
            let mut o = self.probation.remove(i);
            o.hits += 1;
            self.protected.insert(0, o);
            while bytes(&self.protected) > self.protected_limit {
                let Some(demoted) = self.protected.pop() else {
                    break;
                };
                self.probation.insert(0, demoted);
            }
        } else {
            return false;
        }
        true
    }

    fn compete(&mut self, candidate: Obj, new_id: u64, evicted: &mut Vec<Evicted>) {
        loop {
            if self.total() + candidate.size <= self.capacity {
                self.probation.insert(0, candidate);
                return;
            }
            let victim = self.probation.last().or(self.protected.last()).copied();
            let Some(victim) = victim else {
                Self::forget(candidate, new_id, evicted);
                return;
            };
            if self.sketch.estimate(candidate.id) <= self.sketch.estimate(victim.id) {
                Self::forget(candidate, new_id, evicted);
                return;
            }
            let gone = match self.probation.pop() {
                Some(o) => o,
                None => self.protected.pop().expect("the victim came from here"),
            };
            Self::forget(gone, new_id, evicted);
        }
    }
}

impl Model for WTinyLfuModel {
    fn access(&mut self, id: u64, size: u64, evicted: &mut Vec<Evicted>) -> Access {
        self.sketch.observe_size(size);
        self.sketch.increment(id);
        if self.hit(id) {
            return Access::Hit;
        }
        if size > self.capacity {
            return Access::Miss { admitted: false };
        }
        self.window.insert(0, Obj::new(id, size));
        while bytes(&self.window) > self.window_limit {
            let candidate = self.window.pop().expect("window bytes > 0");
            self.compete(candidate, id, evicted);
        }
        while self.total() > self.capacity {
            let gone = match (self.probation.pop(), self.protected.is_empty()) {
                (Some(o), _) => o,
                (None, false) => self.protected.pop().expect("not empty"),
                (None, true) => self.window.pop().expect("total > 0"),
            };
            Self::forget(gone, id, evicted);
        }
        let resident = self
            .window
            .iter()
            .chain(&self.probation)
            .chain(&self.protected)
            .any(|o| o.id == id);
        Access::Miss { admitted: resident }
    }

    fn used(&self) -> u64 {
        self.total()
    }
}

// ---------------------------------------------------------------- comparison

fn agree(
    fast: &mut dyn Policy,
    model: &mut dyn Model,
    trace: &[(u64, u64)],
) -> Result<(), TestCaseError> {
    let (mut fast_ev, mut model_ev) = (Vec::new(), Vec::new());
    for (i, &(id, size)) in trace.iter().enumerate() {
        fast_ev.clear();
        model_ev.clear();
        let got = fast.access(&Request::new(id, size), &mut fast_ev);
        let want = model.access(id, size, &mut model_ev);
        prop_assert_eq!(got, want, "request {} for {} ({} bytes)", i, id, size);
        prop_assert_eq!(&fast_ev, &model_ev, "evictions at request {}", i);
        prop_assert_eq!(fast.used(), model.used(), "used after request {}", i);
    }
    Ok(())
}

/// Capacity and trace: unit sizes or 1..=12 bytes, ids from a small range
/// (skewed toward a few hot ids half the time).
fn case() -> impl Strategy<Value = (u64, Vec<(u64, u64)>)> {
    let id = prop_oneof![0..6u64, 0..40u64];
    let unit = prop::collection::vec((id.clone(), Just(1u64)), 1..400);
    let sized = prop::collection::vec((id, 1..=12u64), 1..400);
    let capacity = prop_oneof![1..=8u64, 1..=32u64, 32..=128u64];
    (capacity, prop_oneof![unit, sized])
}

fn w_tinylfu_config() -> impl Strategy<Value = WTinyLfuConfig> {
    (
        0.01..0.6f64,
        prop_oneof![Just(16usize), Just(64), Just(1024)],
        1..=4usize,
        1..=10u64,
        0.05..0.95f64,
        any::<u64>(),
    )
        .prop_map(
            |(window_ratio, cms_width, cms_depth, reset_factor, protected_ratio, seed)| {
                WTinyLfuConfig {
                    window_ratio,
                    cms_width,
                    cms_depth,
                    reset_factor,
                    protected_ratio,
                    seed,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn clock_pro_matches_its_model(
        (capacity, trace) in case(),
        initial_cold_ratio in 0.01..0.99f64,
    ) {
        let mut fast = ClockPro::new(capacity, ClockProConfig { initial_cold_ratio });
        let mut model = ClockProModel::new(capacity, initial_cold_ratio);
        agree(&mut fast, &mut model, &trace)?;
        prop_assert_eq!(fast.cold_target(), model.cold_target);
    }

    #[test]
    fn w_tinylfu_matches_its_model(
        (capacity, trace) in case(),
        config in w_tinylfu_config(),
    ) {
        let mut fast = WTinyLfu::new(capacity, config.clone());
        let mut model = WTinyLfuModel::new(capacity, &config);
        agree(&mut fast, &mut model, &trace)?;
    }
}

/// A long trace of mostly new objects: CLOCK-Pro must keep admitting and
/// evicting rather than stall at its cold target (libCacheSim's plateau).
#[test]
fn clock_pro_fills_the_cache() {
    for (capacity, max_size) in [(1_000u64, 1u64), (5_000, 64)] {
        let mut p = ClockPro::new(capacity, ClockProConfig::default());
        let mut evicted = Vec::new();
        let mut lowest_after_warmup = u64::MAX;
        for i in 0..50_000u64 {
            // Every fourth request re-reads a small hot set, the rest are new.
            let id = if i % 4 == 0 { i % 97 } else { 1_000 + i };
            let size = 1 + (i * 2_654_435_761) % max_size;
            p.access(&Request::new(id, size), &mut evicted);
            assert!(p.used() <= capacity);
            if i >= 20_000 {
                lowest_after_warmup = lowest_after_warmup.min(p.used());
            }
        }
        assert!(
            lowest_after_warmup >= capacity - max_size,
            "capacity {capacity}: used fell to {lowest_after_warmup}"
        );
    }
}
