//! Differential tests: each fast policy against a naive model of it.
//!
//! The models below keep their objects in a `Vec` or `VecDeque` and search
//! it linearly: slow, but short enough to check by eye. Random traces (ids
//! from a small range so that there are hits, random sizes including sizes
//! larger than the capacity, random capacities) go through both, and every
//! answer must agree: the `Access` of each request and the objects evicted,
//! in order, with their sizes and hit counts.
//!
//! The CLOCK model is written the textbook way, with a circular buffer and a
//! hand, while the real policy is a FIFO with reinsertion, so the test also
//! checks that the two formulations evict the same objects.

use std::collections::VecDeque;

use proptest::prelude::*;
use sluice_policy::{Access, Evicted, Policy, PolicyConfig, Request};

/// One object in a model: what `Evicted` reports, plus policy state.
#[derive(Clone, Copy, Debug)]
struct Obj {
    id: u64,
    size: u64,
    hits: u32,
    /// CLOCK's reference counter; SLRU's "protected" flag as 0/1.
    state: u8,
}

impl Obj {
    fn new(id: u64, size: u64) -> Obj {
        Obj {
            id,
            size,
            hits: 0,
            state: 0,
        }
    }

    fn evicted(self) -> Evicted {
        Evicted {
            id: self.id,
            size: self.size,
            hits: self.hits,
        }
    }
}

fn bytes<'a>(objs: impl IntoIterator<Item = &'a Obj>) -> u64 {
    objs.into_iter().map(|o| o.size).sum()
}

/// A naive model: the same `access` contract, nothing else.
trait Model {
    fn access(&mut self, id: u64, size: u64, evicted: &mut Vec<Evicted>) -> Access;
}

/// LRU: a list, most recent first.
struct LruModel {
    capacity: u64,
    list: Vec<Obj>,
}

impl Model for LruModel {
    fn access(&mut self, id: u64, size: u64, evicted: &mut Vec<Evicted>) -> Access {
        if let Some(i) = self.list.iter().position(|o| o.id == id) {
            let mut obj = self.list.remove(i);
            obj.hits += 1;
            self.list.insert(0, obj);
            return Access::Hit;
        }
        if size > self.capacity {
            return Access::Miss { admitted: false };
        }
        while bytes(&self.list) + size > self.capacity {
            let oldest = self.list.pop().expect("a full cache holds something");
            evicted.push(oldest.evicted());
        }
        self.list.insert(0, Obj::new(id, size));
        Access::Miss { admitted: true }
    }
}

/// FIFO: a queue in admission order; hits change nothing but the count.
struct FifoModel {
    capacity: u64,
    queue: VecDeque<Obj>,
}

impl Model for FifoModel {
    fn access(&mut self, id: u64, size: u64, evicted: &mut Vec<Evicted>) -> Access {
        if let Some(obj) = self.queue.iter_mut().find(|o| o.id == id) {
            obj.hits += 1;
            return Access::Hit;
        }
        if size > self.capacity {
            return Access::Miss { admitted: false };
        }
        while bytes(&self.queue) + size > self.capacity {
            let oldest = self
                .queue
                .pop_front()
                .expect("a full cache holds something");
            evicted.push(oldest.evicted());
        }
        self.queue.push_back(Obj::new(id, size));
        Access::Miss { admitted: true }
    }
}

/// CLOCK the textbook way: objects on a ring, a hand pointing at the next
/// one to examine. A referenced object has its counter decremented and the
/// hand moves past it; an unreferenced one is removed where the hand is.
/// New objects are placed just behind the hand, so the hand reaches them
/// last.
struct ClockModel {
    capacity: u64,
    max_count: u8,
    ring: Vec<Obj>,
    hand: usize,
}

impl ClockModel {
    fn new(capacity: u64, bits: u8) -> ClockModel {
        ClockModel {
            capacity,
            max_count: ((1u32 << bits) - 1) as u8,
            ring: Vec::new(),
            hand: 0,
        }
    }
}

impl Model for ClockModel {
    fn access(&mut self, id: u64, size: u64, evicted: &mut Vec<Evicted>) -> Access {
        if let Some(obj) = self.ring.iter_mut().find(|o| o.id == id) {
            obj.hits += 1;
            obj.state = (obj.state + 1).min(self.max_count);
            return Access::Hit;
        }
        if size > self.capacity {
            return Access::Miss { admitted: false };
        }
        while bytes(&self.ring) + size > self.capacity {
            if self.hand >= self.ring.len() {
                self.hand = 0;
            }
            let obj = &mut self.ring[self.hand];
            if obj.state > 0 {
                obj.state -= 1;
                self.hand += 1;
            } else {
                evicted.push(self.ring.remove(self.hand).evicted());
            }
        }
        if self.hand > self.ring.len() {
            self.hand = 0;
        }
        self.ring.insert(self.hand, Obj::new(id, size));
        self.hand += 1;
        Access::Miss { admitted: true }
    }
}

/// SLRU: probation and protected lists, most recent first; `state` 1 marks
/// protected objects.
struct SlruModel {
    capacity: u64,
    protected_capacity: u64,
    probation: Vec<Obj>,
    protected: Vec<Obj>,
}

impl SlruModel {
    fn new(capacity: u64, protected_ratio: f64) -> SlruModel {
        SlruModel {
            capacity,
            protected_capacity: (capacity as f64 * protected_ratio) as u64,
            probation: Vec::new(),
            protected: Vec::new(),
        }
    }
}

impl Model for SlruModel {
    fn access(&mut self, id: u64, size: u64, evicted: &mut Vec<Evicted>) -> Access {
        if let Some(i) = self.protected.iter().position(|o| o.id == id) {
            let mut obj = self.protected.remove(i);
            obj.hits += 1;
            self.protected.insert(0, obj);
            return Access::Hit;
        }
        if let Some(i) = self.probation.iter().position(|o| o.id == id) {
            let mut obj = self.probation.remove(i);
            obj.hits += 1;
            self.protected.insert(0, obj);
            while bytes(&self.protected) > self.protected_capacity {
                let demoted = self.protected.pop().expect("over its share, so not empty");
                self.probation.insert(0, demoted);
            }
            return Access::Hit;
        }
        if size > self.capacity {
            return Access::Miss { admitted: false };
        }
        while bytes(&self.probation) + bytes(&self.protected) + size > self.capacity {
            let from = if self.probation.is_empty() {
                &mut self.protected
            } else {
                &mut self.probation
            };
            evicted.push(from.pop().expect("a full cache holds something").evicted());
        }
        self.probation.insert(0, Obj::new(id, size));
        Access::Miss { admitted: true }
    }
}

/// Runs `trace` through the real policy and the model, comparing every
/// answer.
fn agree(
    real: &mut dyn Policy,
    model: &mut dyn Model,
    trace: &[(u64, u64)],
) -> Result<(), TestCaseError> {
    let (mut real_ev, mut model_ev) = (Vec::new(), Vec::new());
    for (i, &(id, size)) in trace.iter().enumerate() {
        real_ev.clear();
        model_ev.clear();
        let got = real.access(&Request::new(id, size), &mut real_ev);
        let want = model.access(id, size, &mut model_ev);
        prop_assert_eq!(got, want, "request {} (id {}, size {})", i, id, size);
        prop_assert_eq!(&real_ev, &model_ev, "evictions at request {}", i);
        prop_assert!(real.used() <= real.capacity());
    }
    Ok(())
}

/// Capacity and trace: ids 0..16 (hot ids 0..4 half the time), sizes
/// either all 1 (object-count mode) or 1..=12 with some larger than the
/// capacity.
fn case() -> impl Strategy<Value = (u64, Vec<(u64, u64)>)> {
    let id = prop_oneof![0..4u64, 0..16u64];
    let unit = prop::collection::vec((id.clone(), Just(1u64)), 1..300);
    let sized = prop::collection::vec((id, prop_oneof![6 => 1..=12u64, 1 => 1..=60u64]), 1..300);
    (1..=40u64, prop_oneof![unit, sized])
}

fn build(spec: &str, capacity: u64) -> Box<dyn Policy + Send> {
    PolicyConfig::parse(spec)
        .expect("a valid spec")
        .build(capacity)
        .expect("capacity is at least 1")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn lru_matches_its_model((capacity, trace) in case()) {
        let mut model = LruModel { capacity, list: Vec::new() };
        agree(&mut *build("lru", capacity), &mut model, &trace)?;
    }

    #[test]
    fn fifo_matches_its_model((capacity, trace) in case()) {
        let mut model = FifoModel { capacity, queue: VecDeque::new() };
        agree(&mut *build("fifo", capacity), &mut model, &trace)?;
    }

    #[test]
    fn one_bit_clock_matches_the_circular_hand((capacity, trace) in case()) {
        let mut model = ClockModel::new(capacity, 1);
        agree(&mut *build("clock", capacity), &mut model, &trace)?;
    }

    #[test]
    fn two_bit_clock_matches_the_circular_hand((capacity, trace) in case()) {
        let mut model = ClockModel::new(capacity, 2);
        agree(&mut *build("clock(bits=2)", capacity), &mut model, &trace)?;
    }

    #[test]
    fn slru_matches_its_model(
        (capacity, trace) in case(),
        protected_ratio in prop_oneof![Just(0.8), 0.05..0.95f64],
    ) {
        let mut model = SlruModel::new(capacity, protected_ratio);
        let spec = format!("slru(protected_ratio={protected_ratio})");
        agree(&mut *build(&spec, capacity), &mut model, &trace)?;
    }
}

#[test]
fn the_models_themselves_behave_as_textbook_examples() {
    // LRU 1 2 1 3 at capacity 2 evicts 2; FIFO evicts 1; CLOCK spares 1.
    let trace = [(1, 1), (2, 1), (1, 1), (3, 1)];
    let first_eviction = |model: &mut dyn Model| {
        let mut ev = Vec::new();
        for (id, size) in trace {
            model.access(id, size, &mut ev);
        }
        ev[0].id
    };
    let mut lru = LruModel {
        capacity: 2,
        list: Vec::new(),
    };
    let mut fifo = FifoModel {
        capacity: 2,
        queue: VecDeque::new(),
    };
    assert_eq!(first_eviction(&mut lru), 2);
    assert_eq!(first_eviction(&mut fifo), 1);
    assert_eq!(first_eviction(&mut ClockModel::new(2, 1)), 2);
    assert_eq!(first_eviction(&mut SlruModel::new(2, 0.5)), 2);
}
