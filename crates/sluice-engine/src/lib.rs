//! Sluice engine layer: moving bytes from files into memory at the speed of
//! the device.
//!
//! - [`AlignedBuf`] and [`BufferPool`]: page-aligned memory under a byte
//!   budget with backpressure.
//! - [`SourceFile`]: a file with its direct-I/O decision and fallback.
//! - [`IoEngine`] with three readers: [`UringEngine`] (io_uring),
//!   [`ThreadEngine`] (blocking `pread` on a pool) and [`SyncEngine`] (the
//!   plain reference), plus `FaultyEngine` for reliability tests (the `testing`
//!   feature: never in a release build).
//! - [`page_cache`]: residency (cachestat, mincore), prefetch (WILLNEED,
//!   POPULATE_READ), eviction (DONTNEED, PAGEOUT), DIO alignment (statx).
//! - [`cgroup`]: memory cgroups, the limit that applies and a watermark.
//! - [`numa`]: accelerator → NUMA node, binding threads to nodes.
//! - [`atomic_write`]: replace a file, whole or not at all; [`FileLock`]: the
//!   `flock` every store directory is locked with.
//! - [`gpu`]: the GPU data path's host side: a pinned pool registered once,
//!   stream-ordered staged copies, the CUDA runtime opened at run time.
//! - [`Mapping`]: the one owner of every memory mapping; [`SharedMemory`]:
//!   sealed memfds shared with another process over a Unix socket.
//!
//! Every OS-facing call fails with an [`OsError`] naming the file, process
//! or value at fault. [`select_engine`] probes the platform and picks a
//! reader, logging why.

mod aligned_buf;
mod atomic_write;
mod buffer_pool;
pub mod cgroup;
mod engine_choice;
mod error;
mod error_class;
#[cfg(any(test, feature = "testing"))]
mod faulty_engine;
mod file_lock;
mod file_mapping;
pub mod gpu;
mod io_engine;
mod mapping;
pub mod numa;
mod os_error;
pub mod page_cache;
mod pread;
mod regular_file;
mod ring_batch;
mod shared_memory;
mod source_file;
mod sync_engine;
mod thread_engine;
mod unique_id;
mod uring_engine;

pub use aligned_buf::{populate_write, AlignedBuf};
pub use atomic_write::{
    atomic_write, atomic_write_steps, atomic_write_with, AtomicSteps, Fill, RealSteps,
};
pub use buffer_pool::{BufferPool, BufferPoolConfig, PinWith, PoolStats, PooledBuf, Reservation};
pub use engine_choice::{select_engine, EngineChoice, EngineError};
pub use error::{OpenError, PoolError};
pub use error_class::{
    Classify, ConfigError, ErrorClass, EXIT_FAILED, EXIT_INVALID, EXIT_NOT_FOUND, EXIT_USAGE,
};
#[cfg(any(test, feature = "testing"))]
pub use faulty_engine::{Fault, FaultyEngine};
pub use file_lock::{FileLock, LockError, LockMode, LockOpen};
pub use file_mapping::FileMapping;
pub use io_engine::{
    EngineKind, IoEngine, LentMemory, Next, OpSource, ReadOp, ReadTarget, Sink, WritableRanges,
};
pub use mapping::{page_size, Mapping};
pub use os_error::{retry_eintr, OsError};
pub use pread::pread_full;
pub use regular_file::{
    clear_nonblocking, is_not_regular, kind_name, open_regular, open_regular_rw, wrong_kind,
    wrong_kind_of_error,
};
pub use ring_batch::{read_in_order, with_ring, Part, RingBatch, MAX_PARTS};
pub use shared_memory::{recv_with_fd, send_with_fd, SharedMemory};
pub use source_file::{DirectMode, RangeRead, SourceFile};
pub use sync_engine::SyncEngine;
pub use thread_engine::{drive, ThreadEngine};
pub use unique_id::unique_hex;
pub use uring_engine::{probe_io_uring, UringEngine};
