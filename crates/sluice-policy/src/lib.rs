//! Cache policies, each implemented once. The trace simulator (`sluice sim`,
//! crate `sluice-sim`) runs this code; the KV store (coming) will use it too.
//! No live cache runs it yet.
//!
//! A policy is a pure state machine: it sees a stream of [`Request`]s and
//! answers each with an [`Access`] (hit, or miss and whether it admitted the
//! object), reporting every object it pushes out as an [`Evicted`]. It does no
//! I/O, reads no clock and draws randomness only from a seeded generator, so
//! the same trace always gives the same answers, in a study or in any cache
//! that embeds the policy.
//!
//! Capacity is in bytes and objects have variable sizes. The object-count mode
//! of the simulator is the same code fed unit sizes ([`Request::size`] = 1).
//!
//! Moving parts:
//! - [`Policy`]: the eviction contract every policy implements.
//! - [`Admission`]: a door in front of a policy
//!   ([`TinyLfuDoor`](tinylfu_door::TinyLfuDoor), over the count-min
//!   [`sketch`]), composed with [`Admitted`].
//! - [`slab`]: the arena and intrusive lists most policies are built from,
//!   so that an access touches a few cache lines and allocates nothing.
//! - [`params`]: setting a config's parameters by name, with range checks.
//! - [`registry`]: policies by name with typed configs ([`PolicyConfig`]).
//!
//! Imports point one way (no module imports one that imports it back):
//! `error`, `policy`, `rng`, `id_map` ← `params`, `slab`, `sketch`, `admission`
//! ← the policies (`slru` ← `s3fifo`, `two_q`; `sketch` ← `tinylfu_door` ←
//! `tinylfu`) ← `registry`, which no module of the crate imports.

pub mod admission;
pub mod arc;
pub mod belady;
pub mod clock;
pub mod clock_pro;
pub mod error;
pub mod fifo;
pub mod id_map;
pub mod lfu;
pub mod list_cache;
pub mod lru;
pub mod params;
pub mod policy;
pub mod registry;
pub mod rng;
pub mod s3fifo;
pub mod sieve;
pub mod sketch;
pub mod slab;
pub mod slru;
pub mod tinylfu;
pub mod tinylfu_door;
pub mod two_q;

pub use admission::{Admission, Admitted};
pub use error::PolicyError;
pub use policy::{Access, Evicted, Policy, Request, NEVER};
pub use registry::{PolicyConfig, PolicyKind};
