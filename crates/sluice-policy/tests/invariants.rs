//! The `Policy` contract, checked for every policy on random traces.
//!
//! The test keeps its own account of what is resident, built only from what
//! the policy answers: an admitted miss adds the object with the size it was
//! requested with, an `Evicted` report removes it, a hit adds one to its hit
//! count. After every request the policy must agree with that account:
//! - `used() <= capacity()`, and `used()` / `len()` are the sums over
//!   `for_each_resident`, which lists exactly the accounted objects with
//!   their admitted sizes and the hits counted since admission;
//! - `contains` is true exactly for accounted objects;
//! - a hit is only ever for an accounted object, a miss never is;
//! - every eviction is of an accounted object (so it is reported once),
//!   with its admitted size and the hits counted since admission;
//! - objects larger than the capacity are never admitted;
//! - `victim()`, when named, is resident.
//!
//! Oracles (Belady) get `next_access` filled in from the trace itself.

use std::collections::HashMap;

use proptest::prelude::*;
use sluice_policy::{Access, Evicted, Policy, PolicyConfig, PolicyKind, Request, NEVER};

/// Ids 0..IDS appear in traces; `contains` is checked for all of them.
const IDS: u64 = 24;

/// The test's account of one resident object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    size: u64,
    hits: u32,
}

/// Requests with `next_access` set to the index of the next request for the
/// same id, or `NEVER`.
fn with_next_access(trace: &[(u64, u64)]) -> Vec<Request> {
    let mut next_seen: HashMap<u64, u64> = HashMap::new();
    let mut out = vec![Request::new(0, 0); trace.len()];
    for (i, &(id, size)) in trace.iter().enumerate().rev() {
        let next_access = next_seen.insert(id, i as u64).unwrap_or(NEVER);
        out[i] = Request {
            id,
            size,
            next_access,
        };
    }
    out
}

/// Applies one answer to the account, checking it.
fn account(
    held: &mut HashMap<u64, Held>,
    req: &Request,
    capacity: u64,
    access: Access,
    evicted: &[Evicted],
) -> Result<(), TestCaseError> {
    let was_resident = held.contains_key(&req.id);
    match access {
        Access::Hit => {
            prop_assert!(was_resident, "hit for {} which is not resident", req.id);
            if let Some(h) = held.get_mut(&req.id) {
                h.hits += 1;
            }
        }
        Access::Miss { .. } => prop_assert!(!was_resident, "miss for resident {}", req.id),
    }
    for e in evicted {
        let Some(h) = held.remove(&e.id) else {
            return Err(TestCaseError::fail(format!(
                "evicted {} which is not resident (or reported twice)",
                e.id
            )));
        };
        prop_assert_eq!(
            (e.size, e.hits),
            (h.size, h.hits),
            "eviction report of {}",
            e.id
        );
    }
    if access == (Access::Miss { admitted: true }) {
        prop_assert!(
            req.size <= capacity,
            "admitted {} bytes into {}",
            req.size,
            capacity
        );
        held.insert(
            req.id,
            Held {
                size: req.size,
                hits: 0,
            },
        );
    }
    Ok(())
}

/// Compares the policy's view of its contents with the account.
fn agrees_with_account(p: &dyn Policy, held: &HashMap<u64, Held>) -> Result<(), TestCaseError> {
    prop_assert!(
        p.used() <= p.capacity(),
        "used {} > capacity {}",
        p.used(),
        p.capacity()
    );
    let mut listed: HashMap<u64, Held> = HashMap::new();
    let mut duplicate = None;
    p.for_each_resident(&mut |e| {
        let prev = listed.insert(
            e.id,
            Held {
                size: e.size,
                hits: e.hits,
            },
        );
        if prev.is_some() {
            duplicate = Some(e.id);
        }
    });
    prop_assert_eq!(duplicate, None, "for_each_resident lists an object twice");
    prop_assert_eq!(&listed, held, "for_each_resident vs the account");
    let bytes: u64 = listed.values().map(|h| h.size).sum();
    prop_assert_eq!((p.used(), p.len()), (bytes, listed.len()));
    prop_assert_eq!(p.is_empty(), listed.is_empty());
    for id in 0..IDS {
        prop_assert_eq!(p.contains(id), held.contains_key(&id), "contains({})", id);
    }
    if let Some(victim) = p.victim() {
        prop_assert!(
            held.contains_key(&victim),
            "victim {} is not resident",
            victim
        );
    }
    Ok(())
}

fn keeps_the_contract(
    kind: PolicyKind,
    capacity: u64,
    trace: &[(u64, u64)],
) -> Result<(), TestCaseError> {
    let mut policy = PolicyConfig::default_for(kind)
        .build(capacity)
        .expect("capacity is at least 1");
    prop_assert_eq!(policy.name(), kind.name());
    let mut held = HashMap::new();
    let mut evicted = Vec::new();
    for req in with_next_access(trace) {
        evicted.clear();
        let access = policy.access(&req, &mut evicted);
        // A resident object keeps its stored size, so only a miss is refused.
        if req.size > capacity && !held.contains_key(&req.id) {
            prop_assert_eq!(access, Access::Miss { admitted: false });
        }
        account(&mut held, &req, capacity, access, &evicted)?;
        agrees_with_account(&*policy, &held)?;
    }
    Ok(())
}

/// Capacity and trace: ids below `IDS` (hot ids 0..4 half the time), sizes
/// either all 1 (object-count mode) or 1..=16 with some larger than small
/// capacities. Each id keeps one size in most traces, as in real traces;
/// some traces change an id's size between requests.
fn case() -> impl Strategy<Value = (u64, Vec<(u64, u64)>)> {
    let id = prop_oneof![0..4u64, 0..IDS];
    let size = prop_oneof![8 => 1..=16u64, 1 => 1..=80u64];
    let unit = prop::collection::vec((id.clone(), Just(1u64)), 1..300);
    let any_size = prop::collection::vec((id.clone(), size.clone()), 1..300);
    let fixed_size = (
        prop::collection::vec(size, IDS as usize),
        prop::collection::vec(id, 1..300),
    )
        .prop_map(|(sizes, ids)| ids.into_iter().map(|id| (id, sizes[id as usize])).collect());
    let capacity = prop_oneof![1..=8u64, 1..=64u64, 64..=256u64];
    (capacity, prop_oneof![unit, fixed_size, any_size])
}

macro_rules! contract_tests {
    ($($test:ident => $kind:expr,)*) => {
        proptest! {
            #![proptest_config(ProptestConfig::with_cases(200))]
            $(
                #[test]
                fn $test((capacity, trace) in case()) {
                    keeps_the_contract($kind, capacity, &trace)?;
                }
            )*
        }

        /// Guards against a policy added to `PolicyKind::ALL` without a
        /// test here.
        #[test]
        fn every_policy_kind_is_tested() {
            let tested = [$($kind),*];
            for kind in PolicyKind::ALL {
                assert!(tested.contains(&kind), "no contract test for {}", kind.name());
            }
        }
    };
}

contract_tests! {
    fifo_keeps_the_contract => PolicyKind::Fifo,
    lru_keeps_the_contract => PolicyKind::Lru,
    clock_keeps_the_contract => PolicyKind::Clock,
    slru_keeps_the_contract => PolicyKind::Slru,
    two_q_keeps_the_contract => PolicyKind::TwoQ,
    arc_keeps_the_contract => PolicyKind::Arc,
    clock_pro_keeps_the_contract => PolicyKind::ClockPro,
    lfu_keeps_the_contract => PolicyKind::LfuAging,
    tinylfu_keeps_the_contract => PolicyKind::TinyLfu,
    wtinylfu_keeps_the_contract => PolicyKind::WTinyLfu,
    s3fifo_keeps_the_contract => PolicyKind::S3Fifo,
    sieve_keeps_the_contract => PolicyKind::Sieve,
    belady_keeps_the_contract => PolicyKind::Belady,
    belady_size_keeps_the_contract => PolicyKind::BeladySize,
}

#[test]
fn next_access_points_at_the_next_request_for_the_same_id() {
    let reqs = with_next_access(&[(1, 1), (2, 1), (1, 1), (3, 1), (2, 1)]);
    let next: Vec<u64> = reqs.iter().map(|r| r.next_access).collect();
    assert_eq!(next, [2, 4, NEVER, NEVER, NEVER]);
}
