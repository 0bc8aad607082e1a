//! The GPU data path's host side: memory registered with CUDA once and reused, and copies
//! between it and device memory ordered on CUDA streams.
//!
//! Seed 002 (Phoenix) measured what GPU storage I/O pays for buffers managed per I/O: for
//! small blocks the registration alone costs more than the transfer. Sluice keeps its rule of
//! no kernel modules, so the same effect comes from three pieces here:
//! - [`GpuRuntime`]: the few CUDA runtime calls the path needs, behind a trait. The real one,
//!   [`CudaRuntime`], is `libcudart` opened at run time (the one torch already loaded when
//!   there is one): Sluice never links CUDA at build time. [`HostRuntime`] is the same
//!   interface on plain host memory, for machines without CUDA; `FakeRuntime` (the `testing`
//!   feature) records and defers every call, for tests of the ordering.
//! - [`PinnedPool`]: one arena of equal slots, allocated and registered once, under its byte
//!   budget with backpressure. A slot handed to a stream copy comes back only when the
//!   copy's event has completed.
//! - [`to_device`] / [`from_device`]: a byte range moved between a reader or writer and
//!   device memory through the pool's slots, double buffered, each copy queued on the
//!   caller's stream. Their ordering contract is on each function.

mod cudart;
#[cfg(any(test, feature = "testing"))]
mod fake_runtime;
mod host_runtime;
mod pinned_pool;
mod runtime;
mod staged_copy;

pub use cudart::CudaRuntime;
#[cfg(any(test, feature = "testing"))]
pub use fake_runtime::{FakeCall, FakeOp, FakeRuntime};
pub use host_runtime::HostRuntime;
pub use pinned_pool::{PinnedPool, PinnedPoolStats, PinnedSlot};
pub use runtime::{CopyKind, EventHandle, GpuError, GpuRuntime, HostFn, StreamHandle};
pub use staged_copy::{from_device, to_device, StagedCopyError, StagedCopyReport};
