//! The eviction contract: what a policy is told, what it answers, and the
//! invariants every implementation keeps.

/// `next_access` of a request whose object is never requested again.
pub const NEVER: u64 = u64::MAX;

/// One request of a trace, as a policy sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Object identity. Any value; policies hash it.
    pub id: u64,
    /// Bytes the object occupies in the cache (1 in object-count mode).
    /// Policies keep the size given when the object was admitted; a later
    /// request with another size is served as a hit of the stored object.
    pub size: u64,
    /// Position (0-based index in the trace) of the next request for the same
    /// object, or [`NEVER`]. Only offline oracles read it; online policies
    /// must not.
    pub next_access: u64,
}

impl Request {
    /// A request with no future knowledge attached.
    pub fn new(id: u64, size: u64) -> Request {
        Request {
            id,
            size,
            next_access: NEVER,
        }
    }
}

/// What a policy did with one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The object was resident; the policy updated its bookkeeping.
    Hit,
    /// The object was not resident. `admitted` says whether it is resident
    /// now. Objects larger than the capacity are never admitted.
    Miss { admitted: bool },
}

impl Access {
    pub fn is_hit(self) -> bool {
        matches!(self, Access::Hit)
    }
}

/// An object a policy removed from the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Evicted {
    pub id: u64,
    /// The size it was admitted with.
    pub size: u64,
    /// Hits it received between admission and eviction; 0 marks a wasted
    /// admission.
    pub hits: u32,
}

/// An eviction policy over a byte capacity.
///
/// Invariants every implementation keeps, checked by the crate's property
/// tests for every policy:
/// - after each call, `used() <= capacity()`;
/// - `used()` is the sum of the sizes of the resident objects and `len()`
///   their number;
/// - a `Hit` is only ever returned for an object that was admitted earlier
///   and not evicted since;
/// - every object that leaves the cache is reported exactly once in
///   `evicted`, in the order it left.
pub trait Policy {
    /// Serves `req`: on a hit, updates recency/frequency state and returns
    /// [`Access::Hit`]; on a miss, decides whether to admit the object and,
    /// if it does, evicts objects (pushed onto `evicted`) until it fits.
    /// `evicted` is appended to, never cleared.
    fn access(&mut self, req: &Request, evicted: &mut Vec<Evicted>) -> Access;

    /// Whether `id` is resident. Does not count as an access.
    fn contains(&self, id: u64) -> bool;

    /// The object this policy would evict next to make room, without
    /// changing any state; `None` when empty. Admission doors compare the
    /// candidate against it. Policies that cannot name it cheaply (oracles,
    /// CLOCK-like hands that must sweep) may return `None`, which doors
    /// treat as "admit".
    fn victim(&self) -> Option<u64>;

    /// Capacity in bytes (objects in object-count mode).
    fn capacity(&self) -> u64;

    /// Bytes of resident objects.
    fn used(&self) -> u64;

    /// Number of resident objects.
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Calls `f` once for every resident object, in no particular order, as
    /// the [`Evicted`] it would become (the simulator counts end-of-trace
    /// wasted admissions this way).
    fn for_each_resident(&self, f: &mut dyn FnMut(Evicted));

    /// A short stable name, as used on the command line.
    fn name(&self) -> &'static str;

    /// Forgets `id` without counting an eviction (its owner deleted it): it is no
    /// longer resident and its bytes are free for the next admission. Returns whether
    /// the policy held it and let it go. A policy that cannot forget one object
    /// answers `false` and keeps it until it evicts it (the default).
    fn remove(&mut self, id: u64) -> bool {
        let _ = id;
        false
    }
}

impl<P: Policy + ?Sized> Policy for Box<P> {
    fn access(&mut self, req: &Request, evicted: &mut Vec<Evicted>) -> Access {
        (**self).access(req, evicted)
    }
    fn contains(&self, id: u64) -> bool {
        (**self).contains(id)
    }
    fn victim(&self) -> Option<u64> {
        (**self).victim()
    }
    fn capacity(&self) -> u64 {
        (**self).capacity()
    }
    fn used(&self) -> u64 {
        (**self).used()
    }
    fn len(&self) -> usize {
        (**self).len()
    }
    fn for_each_resident(&self, f: &mut dyn FnMut(Evicted)) {
        (**self).for_each_resident(f)
    }
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn remove(&mut self, id: u64) -> bool {
        (**self).remove(id)
    }
}
