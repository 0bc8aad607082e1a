//! A pool of aligned buffers under a byte budget, with backpressure.
//!
//! Every byte the pool has mapped counts against the budget, whether a
//! caller holds it or it waits on the free list for reuse. `acquire` hands
//! out a buffer when the budget allows; otherwise it first unmaps idle
//! buffers, and only when everything is in use does it block until a holder
//! drops a [`PooledBuf`]. That blocking is the backpressure: a reader can
//! never run further ahead of its consumer than the budget.
//!
//! Reuse keeps page faults off the hot path: a streaming load cycles a few
//! windows' worth of memory instead of faulting in the whole model. Requests
//! are rounded up to [`REUSE_GRANULE_BYTES`] so windows of slightly different
//! sizes can share buffers.
//!
//! A pool built [`pinned_by`](BufferPoolConfig::pinned_by) a GPU runtime
//! registers each buffer for DMA when it maps it and unregisters it when it
//! unmaps it, so a recycling pool registers each buffer once per load and the
//! budget bounds the pinned bytes (seed 002: registration per I/O costs more
//! than a small transfer). A failed registration is logged once and the buffer
//! is used unpinned.

use std::collections::HashSet;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Once};
use std::time::Duration;

use crate::aligned_buf::AlignedBuf;
use crate::error::PoolError;
use crate::gpu::GpuRuntime;

static PIN_FAILURE_LOGGED: Once = Once::new();

/// Rounding for large reusable buffers: 1 MiB keeps the slack under 2% for
/// the 64 MiB windows the loader uses while letting near-equal windows share.
const REUSE_GRANULE_BYTES: usize = 1 << 20;
/// Below this, buffers round to a page only, so that small memory limits are
/// not eaten by rounding (16 × 1 MiB granules would be 12% of a 128 MiB window).
const GRANULE_MIN_BYTES: usize = 16 << 20;

/// How a pool treats released buffers and how much it may hold.
#[derive(Clone, Debug)]
pub struct BufferPoolConfig {
    /// Upper bound on bytes mapped by this pool (held plus idle). `None`
    /// means unbounded, for callers that keep every byte anyway (a full
    /// `load_file` returns all of its buffers to the user).
    pub budget_bytes: Option<u64>,
    /// Keep released buffers for reuse instead of unmapping them.
    pub reuse: bool,
    /// Register every buffer with this runtime while it is mapped.
    pub pin: Option<PinWith>,
}

/// The runtime a pool registers its buffers with ([`BufferPoolConfig::pinned_by`]).
#[derive(Clone)]
pub struct PinWith(pub Arc<dyn GpuRuntime>);

impl PartialEq for PinWith {
    /// The same runtime object.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::fmt::Debug for PinWith {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.describe())
    }
}

impl BufferPoolConfig {
    /// A bounded pool that recycles its buffers.
    pub fn bounded(budget_bytes: u64) -> Self {
        BufferPoolConfig {
            budget_bytes: Some(budget_bytes),
            reuse: true,
            pin: None,
        }
    }

    /// An unbounded pool that unmaps buffers on release.
    pub fn unbounded() -> Self {
        BufferPoolConfig {
            budget_bytes: None,
            reuse: false,
            pin: None,
        }
    }

    /// The same pool with every buffer registered with `runtime` (page-locked for DMA)
    /// from the moment it is mapped until it is unmapped. A runtime that cannot pin
    /// ([`crate::gpu::HostRuntime`]) leaves the pool as it was.
    pub fn pinned_by(mut self, runtime: Arc<dyn GpuRuntime>) -> Self {
        self.pin = runtime.pins_memory().then_some(PinWith(runtime));
        self
    }
}

/// Counters describing the pool's own accounting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes currently mapped (held plus idle).
    pub mapped_bytes: u64,
    /// Bytes currently held by callers.
    pub held_bytes: u64,
    /// Highest `mapped_bytes` ever seen.
    pub peak_mapped_bytes: u64,
    /// Buffers handed out from the free list instead of freshly mapped.
    pub reused: u64,
    /// Buffers freshly mapped.
    pub allocated: u64,
    /// Times `acquire` had to wait for a holder to release memory.
    pub waits: u64,
    /// Bytes of mapped buffers registered with the pool's GPU runtime now.
    pub pinned_bytes: u64,
    /// Buffers whose registration failed (used unpinned).
    pub pin_failures: u64,
}

/// A byte-budgeted pool of [`AlignedBuf`]s. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct BufferPool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    config: BufferPoolConfig,
    state: Mutex<PoolState>,
    released: Condvar,
}

#[derive(Default)]
struct PoolState {
    free: Vec<AlignedBuf>,
    stats: PoolStats,
    /// Number of threads blocked in `acquire` waiting for memory.
    waiting: usize,
    closed: bool,
    /// Base addresses of the mapped buffers registered with the pin runtime.
    pinned: HashSet<usize>,
}

impl BufferPool {
    pub fn new(config: BufferPoolConfig) -> Self {
        BufferPool {
            inner: Arc::new(PoolInner {
                config,
                state: Mutex::new(PoolState::default()),
                released: Condvar::new(),
            }),
        }
    }

    pub fn config(&self) -> &BufferPoolConfig {
        &self.inner.config
    }

    /// A buffer of at least `len` bytes, blocking while the budget is spent.
    ///
    /// Fails at once if `len` alone exceeds the budget (waiting could never
    /// help) or if the pool was closed, which also wakes blocked callers.
    pub fn acquire(&self, len: usize) -> Result<PooledBuf, PoolError> {
        self.wait_until(|pool, state| pool.try_take(state, len))
    }

    /// Counts `bytes` against the budget without mapping memory, blocking
    /// like [`acquire`](Self::acquire). For memory that lives elsewhere but
    /// must still respect the limit: a window served from a file mapping.
    pub fn reserve(&self, bytes: u64) -> Result<Reservation, PoolError> {
        self.wait_until(|pool, state| pool.try_reserve_locked(state, bytes))
    }

    /// A reservation if it fits in the budget now, without blocking.
    pub fn try_reserve(&self, bytes: u64) -> Result<Option<Reservation>, PoolError> {
        let mut state = self.lock();
        self.try_reserve_locked(&mut state, bytes)
    }

    fn wait_until<T>(
        &self,
        mut attempt: impl FnMut(&Self, &mut PoolState) -> Result<Option<T>, PoolError>,
    ) -> Result<T, PoolError> {
        let mut state = self.lock();
        loop {
            if let Some(got) = attempt(self, &mut state)? {
                return Ok(got);
            }
            state.stats.waits += 1;
            state.waiting += 1;
            state = self
                .inner
                .released
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
            state.waiting -= 1;
        }
    }

    /// Like [`acquire`](Self::acquire) but gives up after `timeout`,
    /// returning `Ok(None)`.
    pub fn acquire_timeout(
        &self,
        len: usize,
        timeout: Duration,
    ) -> Result<Option<PooledBuf>, PoolError> {
        let mut state = self.lock();
        if let Some(buf) = self.try_take(&mut state, len)? {
            return Ok(Some(buf));
        }
        state.stats.waits += 1;
        state.waiting += 1;
        let (mut state, _) = self
            .inner
            .released
            .wait_timeout(state, timeout)
            .unwrap_or_else(|p| p.into_inner());
        state.waiting -= 1;
        self.try_take(&mut state, len)
    }

    /// A buffer if one fits in the budget now, without blocking.
    pub fn try_acquire(&self, len: usize) -> Result<Option<PooledBuf>, PoolError> {
        let mut state = self.lock();
        self.try_take(&mut state, len)
    }

    /// Wakes every waiter with [`PoolError::Closed`]; later calls fail too.
    pub fn close(&self) {
        self.lock().closed = true;
        self.inner.released.notify_all();
    }

    pub fn stats(&self) -> PoolStats {
        self.lock().stats
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // A poisoned lock only means a holder panicked mid-update of plain
        // counters; the numbers remain usable.
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes the pool charges against its budget for a `len`-byte request.
    pub fn capacity_for(&self, len: usize) -> usize {
        let granule = match self.inner.config.reuse {
            true if len >= GRANULE_MIN_BYTES => REUSE_GRANULE_BYTES,
            true => crate::mapping::page_size(),
            false => return len,
        };
        len.max(1).checked_next_multiple_of(granule).unwrap_or(len)
    }

    fn try_take(&self, state: &mut PoolState, len: usize) -> Result<Option<PooledBuf>, PoolError> {
        let capacity = self.capacity_for(len);
        self.check_request(state, len as u64, capacity as u64)?;
        if let Some(buf) = take_exact(&mut state.free, capacity) {
            state.stats.reused += 1;
            state.stats.held_bytes += buf.len() as u64;
            return Ok(Some(self.wrap(buf)));
        }
        if !self.make_room(state, capacity as u64) {
            return Ok(None);
        }
        let buf = AlignedBuf::new(capacity).map_err(|source| PoolError::Map {
            bytes: capacity as u64,
            source,
        })?;
        self.inner.pin(state, &buf);
        state.stats.allocated += 1;
        charge(&mut state.stats, capacity as u64);
        Ok(Some(self.wrap(buf)))
    }

    fn try_reserve_locked(
        &self,
        state: &mut PoolState,
        bytes: u64,
    ) -> Result<Option<Reservation>, PoolError> {
        self.check_request(state, bytes, bytes)?;
        if !self.make_room(state, bytes) {
            return Ok(None);
        }
        charge(&mut state.stats, bytes);
        Ok(Some(Reservation {
            bytes,
            pool: self.clone(),
        }))
    }

    /// Errors that waiting cannot cure: a closed pool, a request over budget.
    fn check_request(
        &self,
        state: &PoolState,
        requested: u64,
        capacity: u64,
    ) -> Result<(), PoolError> {
        if state.closed {
            return Err(PoolError::Closed);
        }
        match self.inner.config.budget_bytes {
            Some(budget) if capacity > budget => Err(PoolError::RequestExceedsBudget {
                requested_bytes: requested,
                budget_bytes: budget,
            }),
            _ => Ok(()),
        }
    }

    /// Unmaps idle buffers, largest first, until `capacity` more bytes fit.
    fn make_room(&self, state: &mut PoolState, capacity: u64) -> bool {
        let Some(budget) = self.inner.config.budget_bytes else {
            return true;
        };
        state.free.sort_by_key(|b| b.len());
        while state.stats.mapped_bytes + capacity > budget {
            let Some(idle) = state.free.pop() else {
                return false;
            };
            state.stats.mapped_bytes -= idle.len() as u64;
            self.inner.unmap(state, idle);
        }
        true
    }

    fn wrap(&self, buf: AlignedBuf) -> PooledBuf {
        PooledBuf {
            buf: Some(buf),
            pool: self.clone(),
        }
    }

    fn release(&self, buf: AlignedBuf) {
        let mut state = self.lock();
        let bytes = buf.len() as u64;
        state.stats.held_bytes -= bytes;
        if self.inner.config.reuse && !state.closed {
            state.free.push(buf);
        } else {
            state.stats.mapped_bytes -= bytes;
            self.inner.unmap(&mut state, buf);
        }
        let wake = state.waiting > 0;
        drop(state);
        if wake {
            self.inner.released.notify_all();
        }
    }

    fn release_reservation(&self, bytes: u64) {
        let mut state = self.lock();
        state.stats.held_bytes -= bytes;
        state.stats.mapped_bytes -= bytes;
        let wake = state.waiting > 0;
        drop(state);
        if wake {
            self.inner.released.notify_all();
        }
    }

    /// True when some caller is blocked in `acquire` right now.
    pub fn has_waiters(&self) -> bool {
        self.lock().waiting > 0
    }
}

impl PoolInner {
    /// Registers a freshly mapped buffer with the pin runtime, if the pool has one.
    fn pin(&self, state: &mut PoolState, buf: &AlignedBuf) {
        let Some(PinWith(rt)) = &self.config.pin else {
            return;
        };
        // SAFETY: the buffer stays mapped until `unmap` (or the pool's drop) unregisters it.
        match unsafe { rt.host_register(buf.as_ptr().cast_mut(), buf.len()) } {
            Ok(()) => {
                state.pinned.insert(buf.as_ptr() as usize);
                state.stats.pinned_bytes += buf.len() as u64;
            }
            Err(e) => {
                state.stats.pin_failures += 1;
                PIN_FAILURE_LOGGED.call_once(|| {
                    tracing::warn!("registering a read buffer for DMA failed ({e}): buffers run unpinned, copies to the GPU will be slower");
                });
            }
        }
    }

    /// Unregisters (if pinned) and unmaps a buffer the pool no longer keeps. The caller
    /// guarantees no copy from it is still queued (it was released by its holder).
    fn unmap(&self, state: &mut PoolState, buf: AlignedBuf) {
        unmap_with(&self.config.pin, state, buf);
    }
}

fn unmap_with(pin: &Option<PinWith>, state: &mut PoolState, buf: AlignedBuf) {
    if let (Some(PinWith(rt)), true) = (pin, state.pinned.remove(&(buf.as_ptr() as usize))) {
        state.stats.pinned_bytes -= buf.len() as u64;
        // SAFETY: registered by `pin`; its holder released it, so nothing uses it.
        if let Err(e) = unsafe { rt.host_unregister(buf.as_ptr().cast_mut()) } {
            tracing::warn!("unregistering a read buffer failed: {e}");
        }
    }
    drop(buf);
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        let pin = self.config.pin.clone();
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for buf in std::mem::take(&mut state.free) {
            unmap_with(&pin, state, buf);
        }
    }
}

/// An idle buffer of exactly `capacity` bytes.
///
/// Only exact matches are reused. Handing a larger idle buffer to a smaller
/// request would save a fresh mapping, but the holder would then pin more of
/// the budget than its request, and a streaming consumer that holds one
/// window while the next is read could exhaust a limit the plan proved
/// sufficient. Requests come in few sizes (a model repeats its layer
/// shapes), so exact reuse still recycles almost every buffer.
fn take_exact(free: &mut Vec<AlignedBuf>, capacity: usize) -> Option<AlignedBuf> {
    let index = free.iter().position(|b| b.len() == capacity)?;
    Some(free.swap_remove(index))
}

/// Counts `bytes` as held (and mapped) in the pool's statistics.
fn charge(stats: &mut PoolStats, bytes: u64) {
    stats.mapped_bytes += bytes;
    stats.held_bytes += bytes;
    stats.peak_mapped_bytes = stats.peak_mapped_bytes.max(stats.mapped_bytes);
}

/// Budget held by [`BufferPool::reserve`]; dropping it gives the bytes back.
#[derive(Debug)]
pub struct Reservation {
    bytes: u64,
    pool: BufferPool,
}

impl Reservation {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.pool.release_reservation(self.bytes);
    }
}

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferPool")
            .field("stats", &self.stats())
            .finish()
    }
}

/// A buffer on loan from a [`BufferPool`]; dropping it returns the bytes.
pub struct PooledBuf {
    buf: Option<AlignedBuf>,
    pool: BufferPool,
}

impl std::ops::Deref for PooledBuf {
    type Target = AlignedBuf;
    fn deref(&self) -> &AlignedBuf {
        self.buf.as_ref().expect("buffer is present until drop")
    }
}

impl std::ops::DerefMut for PooledBuf {
    fn deref_mut(&mut self) -> &mut AlignedBuf {
        self.buf.as_mut().expect("buffer is present until drop")
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.pool.release(buf);
        }
    }
}

impl std::fmt::Debug for PooledBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledBuf")
            .field("len", &self.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    const MIB: usize = 1 << 20;

    #[test]
    fn refuses_a_request_larger_than_the_budget() {
        let pool = BufferPool::new(BufferPoolConfig::bounded(4 * MIB as u64));
        let err = pool.acquire(5 * MIB).unwrap_err();
        assert!(
            matches!(err, PoolError::RequestExceedsBudget { .. }),
            "{err}"
        );
    }

    #[test]
    fn reuses_released_buffers_without_mapping_more() {
        let pool = BufferPool::new(BufferPoolConfig::bounded(8 * MIB as u64));
        drop(pool.acquire(3 * MIB).unwrap());
        let _again = pool.acquire(3 * MIB).unwrap();
        let stats = pool.stats();
        assert_eq!(stats.allocated, 1);
        assert_eq!(stats.reused, 1);
        assert_eq!(stats.mapped_bytes, 3 * MIB as u64);
    }

    #[test]
    fn unmaps_idle_buffers_to_fit_a_different_size() {
        let pool = BufferPool::new(BufferPoolConfig::bounded(4 * MIB as u64));
        drop(pool.acquire(MIB).unwrap());
        drop(pool.acquire(MIB).unwrap());
        let big = pool.acquire(4 * MIB).unwrap();
        assert_eq!(big.len(), 4 * MIB);
        assert!(pool.stats().mapped_bytes <= 4 * MIB as u64);
    }

    #[test]
    fn try_acquire_returns_none_when_the_budget_is_held() {
        let pool = BufferPool::new(BufferPoolConfig::bounded(2 * MIB as u64));
        let _a = pool.acquire(2 * MIB).unwrap();
        assert!(pool.try_acquire(MIB).unwrap().is_none());
    }

    #[test]
    fn acquire_blocks_until_a_holder_releases() {
        let pool = BufferPool::new(BufferPoolConfig::bounded(2 * MIB as u64));
        let held = pool.acquire(2 * MIB).unwrap();
        let waiter = {
            let pool = pool.clone();
            thread::spawn(move || pool.acquire(2 * MIB).map(|b| b.len()))
        };
        while !pool.has_waiters() {
            thread::yield_now();
        }
        drop(held);
        assert_eq!(waiter.join().unwrap().unwrap(), 2 * MIB);
        assert!(pool.stats().waits >= 1);
    }

    #[test]
    fn close_wakes_blocked_callers_with_an_error() {
        let pool = BufferPool::new(BufferPoolConfig::bounded(MIB as u64));
        let _held = pool.acquire(MIB).unwrap();
        let waiter = {
            let pool = pool.clone();
            thread::spawn(move || pool.acquire(MIB).map(|_| ()))
        };
        while !pool.has_waiters() {
            thread::yield_now();
        }
        pool.close();
        assert!(matches!(waiter.join().unwrap(), Err(PoolError::Closed)));
    }

    #[test]
    fn mapped_bytes_never_exceed_the_budget_under_contention() {
        let budget = 6 * MIB as u64;
        let pool = BufferPool::new(BufferPoolConfig::bounded(budget));
        let workers: Vec<_> = (0..4)
            .map(|i| {
                let pool = pool.clone();
                thread::spawn(move || {
                    for round in 0..50 {
                        let len = MIB * (1 + (i + round) % 3);
                        let buf = pool.acquire(len).unwrap();
                        assert!(pool.stats().mapped_bytes <= budget);
                        drop(buf);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        let stats = pool.stats();
        assert!(stats.peak_mapped_bytes <= budget, "{stats:?}");
        assert_eq!(stats.held_bytes, 0);
    }

    #[test]
    fn reservations_count_against_the_budget_and_return_on_drop() {
        let pool = BufferPool::new(BufferPoolConfig::bounded(4 * MIB as u64));
        let r = pool.reserve(3 * MIB as u64).unwrap();
        assert!(pool.try_acquire(2 * MIB).unwrap().is_none());
        assert_eq!(pool.stats().held_bytes, 3 * MIB as u64);
        drop(r);
        assert_eq!(pool.stats().held_bytes, 0);
        assert!(pool.try_acquire(2 * MIB).unwrap().is_some());
        assert!(pool.try_reserve(5 * MIB as u64).is_err());
    }

    #[test]
    fn unbounded_pool_unmaps_on_release() {
        let pool = BufferPool::new(BufferPoolConfig::unbounded());
        drop(pool.acquire(3 * MIB + 5).unwrap());
        assert_eq!(pool.stats().mapped_bytes, 0);
    }

    #[test]
    fn a_pinned_pool_registers_each_buffer_once_and_unregisters_what_it_unmaps() {
        use crate::gpu::{FakeCall, FakeRuntime};
        let rt = Arc::new(FakeRuntime::deferred());
        let pool = BufferPool::new(
            BufferPoolConfig::bounded(8 * MIB as u64).pinned_by(rt.clone() as Arc<dyn GpuRuntime>),
        );
        for _ in 0..5 {
            drop(pool.acquire(3 * MIB).unwrap()); // recycled: registered once
        }
        assert_eq!(rt.count(|c| matches!(c, FakeCall::Register { .. })), 1);
        assert_eq!(pool.stats().pinned_bytes, 3 * MIB as u64);
        // A 6 MiB request unmaps the idle 3 MiB buffer (unregistered) and maps a new one.
        let big = pool.acquire(6 * MIB).unwrap();
        assert_eq!(rt.count(|c| matches!(c, FakeCall::Unregister { .. })), 1);
        assert_eq!(rt.registered(), vec![(big.as_ptr() as usize, 6 * MIB)]);
        drop(big);
        drop(pool);
        assert!(
            rt.registered().is_empty(),
            "the pool's drop unregisters idle buffers"
        );
    }

    #[test]
    fn a_failed_registration_leaves_the_buffer_usable_and_counted() {
        use crate::gpu::FakeRuntime;
        let rt = Arc::new(FakeRuntime::deferred());
        rt.fail_next("host_register");
        let pool = BufferPool::new(
            BufferPoolConfig::unbounded().pinned_by(rt.clone() as Arc<dyn GpuRuntime>),
        );
        let mut buf = pool.acquire(MIB).unwrap();
        buf.as_mut_slice().fill(1);
        let st = pool.stats();
        assert_eq!((st.pin_failures, st.pinned_bytes), (1, 0));
        drop(buf); // not reused: unmapped, and not unregistered (never registered)
        assert!(rt.registered().is_empty());
    }

    #[test]
    fn a_runtime_that_cannot_pin_leaves_the_pool_unpinned() {
        let config = BufferPoolConfig::bounded(MIB as u64)
            .pinned_by(Arc::new(crate::gpu::HostRuntime) as Arc<dyn GpuRuntime>);
        assert!(config.pin.is_none());
    }
}
