//! `sluice warm`: a programmable page cache built on upstream Linux
//! interfaces only (fanotify, readahead/fadvise, cachestat, cgroups), after
//! seed 000's PPC + MAIO.
//!
//! - [`template`]: MAIO I/O templates: record, merge, encode, decode.
//! - [`fanotify`]: the event source: exact read ranges and mmap events
//!   (pre-content) or opens only, every permission event answered first.
//! - [`policy`]: the programmable part: the [`policy::WarmPolicy`] trait, its
//!   events and actions, and the fail-open guard around it.
//! - [`manager`]: the cache manager: chunked, interruptible, deduplicated
//!   prefetch under a memory watermark, over a [`manager::PageCache`].
//! - [`kernel`]: the real page cache behind the manager (WILLNEED with a
//!   bounded window or POPULATE_READ, DONTNEED + PAGEOUT, cgroup memory).
//! - [`idle_gate`]: before the service's first model access, prefetch only
//!   while the service itself is not reading from storage.
//! - [`runtime`]: `run`/`record`: the service and the runtime in one
//!   cgroup, events → policy → manager until the service exits.
//! - [`trigger`]: explicit triggers through a named pipe.
//! - [`env`]: the environment a runtime reads, once.
//! - [`status`]: the status files behind `sluice warm status`.
//! - [`builtin`]: `native`, `eager`, `precache` and `template` (MAIO).
//! - [`python`]: `module:Class` policies, run in an isolated child process.

pub mod builtin;
pub mod config;
pub mod env;
pub mod error;
pub mod fanotify;
pub mod idle_gate;
pub mod kernel;
pub mod manager;
pub mod policy;
pub mod python;
pub mod python_error;
pub mod runtime;
pub mod status;
pub mod template;
pub mod trigger;

pub use error::WarmError;

/// The size of a base page in bytes, as the `u64` file offsets are counted in.
pub(crate) fn page_size() -> u64 {
    sluice_engine::page_size() as u64
}
