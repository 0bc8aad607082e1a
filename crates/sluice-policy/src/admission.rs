//! Admission: a door in front of an eviction policy that decides, on a miss,
//! whether the object is worth a place at all.
//!
//! [`Admitted`] composes any [`Admission`] with any [`Policy`]: every request
//! is first shown to the door ([`Admission::record`]); hits go straight to
//! the policy; on a miss the door sees the candidate and the policy's next
//! victim and says yes or no. A rejected object is a miss that leaves the
//! cache untouched.

use crate::policy::{Access, Evicted, Policy, Request};

/// An admission filter.
pub trait Admission {
    /// Observes one request (hits and misses alike), before any decision.
    fn record(&mut self, id: u64);

    /// Whether to admit `candidate` on a miss. `victim` is the object the
    /// policy would evict first to make room, or `None` when the object fits
    /// without evicting (or the policy cannot name its victim).
    fn admit(&mut self, candidate: &Request, victim: Option<u64>) -> bool;

    /// A short stable name.
    fn name(&self) -> &'static str;
}

/// A policy behind an admission door.
pub struct Admitted<P, A> {
    policy: P,
    door: A,
    name: &'static str,
}

impl<P: Policy, A: Admission> Admitted<P, A> {
    /// `name` is the composite's name (for example "tinylfu").
    pub fn new(policy: P, door: A, name: &'static str) -> Admitted<P, A> {
        Admitted { policy, door, name }
    }

    pub fn policy(&self) -> &P {
        &self.policy
    }

    pub fn door(&self) -> &A {
        &self.door
    }
}

impl<P: Policy, A: Admission> Policy for Admitted<P, A> {
    fn access(&mut self, req: &Request, evicted: &mut Vec<Evicted>) -> Access {
        self.door.record(req.id);
        if self.policy.contains(req.id) {
            return self.policy.access(req, evicted);
        }
        let needs_room = self.policy.used() + req.size > self.policy.capacity();
        let victim = if needs_room {
            self.policy.victim()
        } else {
            None
        };
        if req.size > self.policy.capacity() || !self.door.admit(req, victim) {
            return Access::Miss { admitted: false };
        }
        self.policy.access(req, evicted)
    }

    fn contains(&self, id: u64) -> bool {
        self.policy.contains(id)
    }

    fn victim(&self) -> Option<u64> {
        self.policy.victim()
    }

    fn capacity(&self) -> u64 {
        self.policy.capacity()
    }

    fn used(&self) -> u64 {
        self.policy.used()
    }

    fn len(&self) -> usize {
        self.policy.len()
    }

    fn for_each_resident(&self, f: &mut dyn FnMut(Evicted)) {
        self.policy.for_each_resident(f)
    }

    fn name(&self) -> &'static str {
        self.name
    }

    fn remove(&mut self, id: u64) -> bool {
        self.policy.remove(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lru::Lru;

    /// Admits only even ids.
    struct EvenOnly(u32);

    impl Admission for EvenOnly {
        fn record(&mut self, _id: u64) {
            self.0 += 1;
        }
        fn admit(&mut self, candidate: &Request, _victim: Option<u64>) -> bool {
            candidate.id % 2 == 0
        }
        fn name(&self) -> &'static str {
            "even"
        }
    }

    #[test]
    fn rejected_objects_miss_and_leave_the_cache_alone() {
        let mut cache = Admitted::new(Lru::new(4), EvenOnly(0), "even-lru");
        let mut ev = Vec::new();
        assert_eq!(
            cache.access(&Request::new(1, 1), &mut ev),
            Access::Miss { admitted: false }
        );
        assert_eq!(
            cache.access(&Request::new(2, 1), &mut ev),
            Access::Miss { admitted: true }
        );
        assert_eq!(cache.access(&Request::new(2, 1), &mut ev), Access::Hit);
        assert_eq!(
            cache.access(&Request::new(1, 1), &mut ev),
            Access::Miss { admitted: false }
        );
        assert_eq!((cache.len(), cache.door().0), (1, 4));
    }
}
