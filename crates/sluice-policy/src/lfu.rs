//! LFU with aging: evict the object requested least often, where old
//! requests count for less and less.
//!
//! Every resident object has a request counter (1 on admission, +1 per hit).
//! A miss evicts the object with the lowest counter; among equal counters it
//! evicts the one that reached that counter longest ago, which is the least
//! recently used of them (see "Ties" below). Plain LFU never forgets: an
//! object that was hot yesterday keeps its high count and squats in the cache.
//! Aging fixes that: every `age_period` requests (hits, misses and rejected
//! objects alike) every counter is shifted right by `age_shift` (halved for
//! 1), so a count is roughly a decayed sum of recent request rates.
//!
//! Moving parts, all O(1) per request:
//! - Frequency buckets: one bucket per distinct count, chained in increasing
//!   count order. Each bucket is an intrusive list of its objects, newest
//!   arrival at the front. A hit moves the object from bucket `c` to bucket
//!   `c + 1` (created next to `c` when missing); an eviction takes the back of
//!   the lowest bucket; empty buckets are unlinked.
//! - Aging touches buckets, not objects. An object stores its count and the
//!   epoch (aging number) it was written in; its current count is
//!   `count >> (age_shift x epochs since)`. Aging shifts each bucket's count
//!   and splices buckets whose counts become equal, so it costs one step per
//!   bucket (at most about `2 x age_period` of them), amortized O(1).
//! - Ties: when aging merges buckets, the objects that had the lower count
//!   before aging go behind the others, so eviction order is lowest count,
//!   then lowest count before the last aging, then least recently used.
//! - Counts saturate at 65,535: only the order among rarely used objects
//!   matters for eviction, and the count-to-bucket index stays small.
//!
//! Byte capacities: eviction repeats until the new object fits.

use crate::error::PolicyError;
use crate::id_map::{id_map_with_capacity, IdMap};
use crate::params::{check, parse_value, Params};
use crate::policy::{Access, Evicted, Policy, Request};
use crate::slab::{List, Slab, Slot};

#[derive(Clone, Debug, PartialEq)]
pub struct LfuConfig {
    /// Requests (hits, misses and rejections) between agings. 10,000 as seed
    /// 003's best-performing default: shorter periods forget useful history
    /// (1,000 lost 1.2 points there), longer ones gained little.
    pub age_period: u64,
    /// Every counter is shifted right by this much at each aging (1 =
    /// halved, the classic choice; seed 003 saw no difference up to 3).
    pub age_shift: u32,
}

impl Default for LfuConfig {
    fn default() -> LfuConfig {
        LfuConfig {
            age_period: 10_000,
            age_shift: 1,
        }
    }
}

impl Params for LfuConfig {
    const KNOWN: &'static str = "age_period, age_shift";

    fn set(&mut self, key: &str, value: &str) -> Result<(), PolicyError> {
        match key {
            "age_period" => {
                let v: u64 = parse_value("lfu", "age_period", value, "at least 1")?;
                check(v >= 1, "lfu", "age_period", v, "at least 1")?;
                self.age_period = v;
            }
            "age_shift" => {
                let v: u32 = parse_value("lfu", "age_shift", value, "1 to 16")?;
                check((1..=16).contains(&v), "lfu", "age_shift", v, "1 to 16")?;
                self.age_shift = v;
            }
            _ => {
                return Err(PolicyError::UnknownParameter {
                    policy: "lfu",
                    field: key.to_string(),
                    known: Self::KNOWN,
                })
            }
        }
        Ok(())
    }
}

/// Index of a frequency bucket.
type BucketId = u32;
const NO_BUCKET: BucketId = BucketId::MAX;

/// Counts saturate here (see the module header).
const MAX_COUNT: u32 = u16::MAX as u32;

/// Per-object state: the count as of `epoch`.
#[derive(Clone, Copy, Debug)]
struct Counter {
    count: u32,
    epoch: u64,
}

/// All objects with one count, newest arrival at the front.
#[derive(Clone, Debug)]
struct Bucket {
    count: u32,
    objects: List,
    lower: BucketId,
    higher: BucketId,
}

pub struct LfuAging {
    capacity: u64,
    config: LfuConfig,
    slab: Slab<Counter>,
    map: IdMap<Slot>,
    buckets: Vec<Bucket>,
    free_buckets: Vec<BucketId>,
    /// `by_count[c]` is the bucket holding count `c`, or `NO_BUCKET`.
    by_count: Vec<BucketId>,
    lowest: BucketId,
    used: u64,
    len: usize,
    /// Agings so far.
    epoch: u64,
    requests: u64,
}

impl LfuAging {
    pub fn new(capacity: u64, config: LfuConfig) -> LfuAging {
        LfuAging {
            capacity,
            config,
            slab: Slab::with_capacity(1024),
            map: id_map_with_capacity(1024),
            buckets: Vec::new(),
            free_buckets: Vec::new(),
            by_count: Vec::new(),
            lowest: NO_BUCKET,
            used: 0,
            len: 0,
            epoch: 0,
            requests: 0,
        }
    }

    /// The current (aged) count of `id`, or `None` when not resident.
    pub fn count(&self, id: u64) -> Option<u32> {
        let &slot = self.map.get(&id)?;
        Some(self.current(self.slab.get(slot).meta))
    }

    fn current(&self, counter: Counter) -> u32 {
        let agings = self.epoch - counter.epoch;
        let shift = agings.saturating_mul(u64::from(self.config.age_shift));
        if shift >= 32 {
            0
        } else {
            counter.count >> shift
        }
    }

    fn bucket_of(&self, count: u32) -> BucketId {
        self.by_count
            .get(count as usize)
            .copied()
            .unwrap_or(NO_BUCKET)
    }

    /// The bucket for `count`, created right above `below` (or as the lowest
    /// bucket when `below` is `NO_BUCKET`) if there is none yet. `below`
    /// must be the highest bucket with a smaller count.
    fn bucket_for(&mut self, count: u32, below: BucketId) -> BucketId {
        let existing = self.bucket_of(count);
        if existing != NO_BUCKET {
            return existing;
        }
        let above = if below == NO_BUCKET {
            self.lowest
        } else {
            self.buckets[below as usize].higher
        };
        let bucket = Bucket {
            count,
            objects: List::default(),
            lower: below,
            higher: above,
        };
        let id = match self.free_buckets.pop() {
            Some(id) => {
                self.buckets[id as usize] = bucket;
                id
            }
            None => {
                self.buckets.push(bucket);
                BucketId::try_from(self.buckets.len() - 1).expect("buckets <= MAX_COUNT + 1")
            }
        };
        match below {
            NO_BUCKET => self.lowest = id,
            b => self.buckets[b as usize].higher = id,
        }
        if above != NO_BUCKET {
            self.buckets[above as usize].lower = id;
        }
        if self.by_count.len() <= count as usize {
            self.by_count.resize(count as usize + 1, NO_BUCKET);
        }
        self.by_count[count as usize] = id;
        id
    }

    /// Unlinks `id` from the bucket chain (it must be empty or emptied).
    fn unlink_bucket(&mut self, id: BucketId) {
        let Bucket { lower, higher, .. } = self.buckets[id as usize];
        match lower {
            NO_BUCKET => self.lowest = higher,
            b => self.buckets[b as usize].higher = higher,
        }
        if higher != NO_BUCKET {
            self.buckets[higher as usize].lower = lower;
        }
        self.free_buckets.push(id);
    }

    fn drop_bucket_if_empty(&mut self, id: BucketId) {
        let bucket = &self.buckets[id as usize];
        if bucket.objects.is_empty() {
            self.by_count[bucket.count as usize] = NO_BUCKET;
            self.unlink_bucket(id);
        }
    }

    fn hit(&mut self, slot: Slot) {
        let count = self.current(self.slab.get(slot).meta);
        let from = self.bucket_of(count);
        let next = (count + 1).min(MAX_COUNT);
        let to = self.bucket_for(next, from);
        self.slab
            .unlink(&mut self.buckets[from as usize].objects, slot);
        self.slab
            .push_front(&mut self.buckets[to as usize].objects, slot);
        let entry = self.slab.get_mut(slot);
        entry.hits += 1;
        entry.meta = Counter {
            count: next,
            epoch: self.epoch,
        };
        if from != to {
            self.drop_bucket_if_empty(from);
        }
    }

    fn evict_one(&mut self, evicted: &mut Vec<Evicted>) -> bool {
        let bucket = self.lowest;
        if bucket == NO_BUCKET {
            return false;
        }
        let Some(slot) = self
            .slab
            .pop_back(&mut self.buckets[bucket as usize].objects)
        else {
            return false;
        };
        let gone = self.slab.get(slot).evicted();
        self.slab.free(slot);
        self.map.remove(&gone.id);
        self.used -= gone.size;
        self.len -= 1;
        evicted.push(gone);
        self.drop_bucket_if_empty(bucket);
        true
    }

    fn insert(&mut self, req: &Request) {
        let zero = self.bucket_of(0);
        let bucket = self.bucket_for(1, zero);
        let slot = self.slab.alloc(
            req.id,
            req.size,
            Counter {
                count: 1,
                epoch: self.epoch,
            },
        );
        self.slab
            .push_front(&mut self.buckets[bucket as usize].objects, slot);
        self.map.insert(req.id, slot);
        self.used += req.size;
        self.len += 1;
    }

    /// Shifts every bucket's count and merges buckets that become equal;
    /// objects pick the shift up lazily through `epoch`.
    fn age(&mut self) {
        self.epoch += 1;
        let shift = self.config.age_shift.min(31);
        let mut kept = NO_BUCKET;
        let mut cur = self.lowest;
        while cur != NO_BUCKET {
            let next = self.buckets[cur as usize].higher;
            let old = self.buckets[cur as usize].count;
            self.by_count[old as usize] = NO_BUCKET;
            let aged = old >> shift;
            self.buckets[cur as usize].count = aged;
            if kept != NO_BUCKET && self.buckets[kept as usize].count == aged {
                self.merge_into_lower(kept, cur);
            } else {
                kept = cur;
            }
            cur = next;
        }
        let mut cur = self.lowest;
        while cur != NO_BUCKET {
            let bucket = &self.buckets[cur as usize];
            self.by_count[bucket.count as usize] = cur;
            cur = bucket.higher;
        }
    }

    /// Moves `upper`'s objects in front of `lower`'s (lower counts before
    /// aging are evicted first) and drops `upper`.
    fn merge_into_lower(&mut self, lower: BucketId, upper: BucketId) {
        let mut front = std::mem::take(&mut self.buckets[upper as usize].objects);
        let mut back = std::mem::take(&mut self.buckets[lower as usize].objects);
        self.slab.append_back(&mut front, &mut back);
        self.buckets[lower as usize].objects = front;
        self.unlink_bucket(upper);
    }

    fn tick(&mut self) {
        self.requests += 1;
        if self.requests % self.config.age_period.max(1) == 0 {
            self.age();
        }
    }

    fn serve(&mut self, req: &Request, evicted: &mut Vec<Evicted>) -> Access {
        if let Some(&slot) = self.map.get(&req.id) {
            self.hit(slot);
            return Access::Hit;
        }
        if req.size > self.capacity {
            return Access::Miss { admitted: false };
        }
        while self.used + req.size > self.capacity {
            if !self.evict_one(evicted) {
                break;
            }
        }
        self.insert(req);
        Access::Miss { admitted: true }
    }
}

impl Policy for LfuAging {
    fn access(&mut self, req: &Request, evicted: &mut Vec<Evicted>) -> Access {
        let access = self.serve(req, evicted);
        self.tick();
        access
    }

    fn contains(&self, id: u64) -> bool {
        self.map.contains_key(&id)
    }

    fn victim(&self) -> Option<u64> {
        let bucket = self.buckets.get(self.lowest as usize)?;
        bucket.objects.back().map(|s| self.slab.get(s).id)
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn used(&self) -> u64 {
        self.used
    }

    fn len(&self) -> usize {
        self.len
    }

    fn for_each_resident(&self, f: &mut dyn FnMut(Evicted)) {
        let mut cur = self.lowest;
        while cur != NO_BUCKET {
            let bucket = &self.buckets[cur as usize];
            for e in self.slab.iter(&bucket.objects) {
                f(e.evicted());
            }
            cur = bucket.higher;
        }
    }

    fn name(&self) -> &'static str {
        "lfu"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lfu(capacity: u64, age_period: u64) -> LfuAging {
        LfuAging::new(
            capacity,
            LfuConfig {
                age_period,
                age_shift: 1,
            },
        )
    }

    fn run(p: &mut LfuAging, ids: &[u64]) -> Vec<bool> {
        let mut ev = Vec::new();
        ids.iter()
            .map(|&id| p.access(&Request::new(id, 1), &mut ev).is_hit())
            .collect()
    }

    #[test]
    fn evicts_the_least_frequent_object() {
        let mut p = lfu(2, 1_000);
        // 1 is requested three times, 2 once: 3 must displace 2, not 1.
        run(&mut p, &[1, 1, 1, 2]);
        let mut ev = Vec::new();
        p.access(&Request::new(3, 1), &mut ev);
        assert_eq!(
            ev,
            [Evicted {
                id: 2,
                size: 1,
                hits: 0
            }]
        );
        assert!(p.contains(1) && p.contains(3));
    }

    #[test]
    fn ties_go_to_the_least_recently_used() {
        let mut p = lfu(3, 1_000);
        // All three reach count 2; 2 got there first, so it goes first.
        run(&mut p, &[1, 2, 3, 2, 1, 3]);
        assert_eq!(p.victim(), Some(2));
    }

    #[test]
    fn aging_halves_counters_every_period() {
        let mut p = lfu(4, 10);
        run(&mut p, &[1; 9]);
        assert_eq!(p.count(1), Some(9));
        run(&mut p, &[1]); // the 10th request triggers aging: 10 >> 1
        assert_eq!(p.count(1), Some(5));
        run(&mut p, &[2; 10]); // 2 reaches 10, then is halved with 1
        assert_eq!((p.count(1), p.count(2)), (Some(2), Some(5)));
    }

    #[test]
    fn aging_lets_new_favourites_displace_old_ones() {
        let mut p = lfu(2, 8);
        // 1 is hot early (count 6), then 2 and 3 take over; without aging
        // 1 would stay forever.
        run(&mut p, &[1, 1, 1, 1, 1, 1]);
        for _ in 0..6 {
            run(&mut p, &[2, 3, 2, 3]);
        }
        assert!(p.contains(2) || p.contains(3));
        assert!(!p.contains(1), "1's stale count should have decayed");
    }

    #[test]
    fn merged_buckets_evict_lower_pre_aging_counts_first() {
        let mut p = lfu(3, 8);
        // Counts 3 (id 1), 2 (id 2), 2 (id 3) after 7 requests; the 8th
        // (a hit on 3) ages: 1 -> 1, 2 -> 1, 3 -> 1 all in one bucket.
        run(&mut p, &[1, 1, 1, 2, 2, 3, 3, 3]);
        assert_eq!(
            (p.count(1), p.count(2), p.count(3)),
            (Some(1), Some(1), Some(1))
        );
        // 2 had the lowest count before aging: evicted first.
        assert_eq!(p.victim(), Some(2));
    }

    #[test]
    fn byte_capacity_evicts_until_the_object_fits_and_rejects_giants() {
        let mut p = lfu(10, 1_000);
        let mut ev = Vec::new();
        for id in 0..5 {
            p.access(&Request::new(id, 2), &mut ev);
        }
        p.access(&Request::new(0, 2), &mut ev);
        // 9 needs 7 of 10 bytes: four objects go, the frequent 0 last.
        assert_eq!(
            p.access(&Request::new(9, 7), &mut ev),
            Access::Miss { admitted: true }
        );
        assert_eq!(ev.iter().map(|e| e.id).collect::<Vec<_>>(), [1, 2, 3, 4]);
        assert_eq!((p.used(), p.len()), (9, 2));
        assert_eq!(
            p.access(&Request::new(10, 11), &mut ev),
            Access::Miss { admitted: false }
        );
    }

    #[test]
    fn counts_saturate_without_breaking_order() {
        let mut p = lfu(2, u64::MAX);
        let mut ev = Vec::new();
        for _ in 0..(MAX_COUNT + 10) {
            p.access(&Request::new(1, 1), &mut ev);
        }
        assert_eq!(p.count(1), Some(MAX_COUNT));
        run(&mut p, &[2, 3]);
        assert!(p.contains(1) && p.contains(3) && !p.contains(2));
    }
}
