//! [`PinnedPool`]: host memory registered with CUDA once, handed out in equal slots under
//! its byte budget, each slot back only when the stream copies that used it have run.
//!
//! Registering memory costs more than a small transfer (seed 002: 1.3-5.7x for KV-sized
//! blocks), so the arena is mapped and registered once, when the pool is built, and every
//! transfer reuses it. Its bytes are the budget: `slots x slot_bytes`, nothing grows.
//!
//! A slot goes back in one of two ways. Dropped, it is free at once (nothing was queued from
//! it). Fenced on a stream ([`PinnedSlot::fence`]), the pool records the slot's own event
//! after the caller's copies and keeps the slot until that event completes: so a read into
//! the slot can never overwrite bytes a queued copy has yet to move. `acquire` takes a free
//! slot, else the oldest fenced one whose event has completed, else waits for it (the
//! backpressure: I/O never runs more than `slots` windows ahead of the copies), else, when
//! callers hold every slot, waits for one to be dropped or fenced.
//!
//! Where the runtime cannot pin (no CUDA: [`crate::gpu::HostRuntime`]) or registration
//! fails, the same pool runs on plain host memory, and says so once in the log.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};

use crate::aligned_buf::AlignedBuf;
use crate::mapping::page_size;

use super::runtime::{EventHandle, GpuError, GpuRuntime, StreamHandle};

static UNPINNED_LOGGED: Once = Once::new();

/// What the pool holds and has done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PinnedPoolStats {
    pub slots: usize,
    pub slot_bytes: usize,
    /// The arena is registered with the runtime (page-locked for DMA).
    pub pinned: bool,
    /// Slots held by callers now.
    pub held: usize,
    /// Slots waiting for their copies' event.
    pub fenced: usize,
    pub acquires: u64,
    /// Acquires that had to wait for a copy to finish.
    pub waits_for_copies: u64,
    /// Acquires that had to wait for a caller to give a slot back.
    pub waits_for_holders: u64,
    /// Slots taken out of use because the runtime could not say whether a copy from them had
    /// finished (a failed event record and stream synchronisation).
    pub lost: usize,
}

struct State {
    free: Vec<usize>,
    fenced: VecDeque<usize>,
    stats: PinnedPoolStats,
}

struct Inner {
    arena: AlignedBuf,
    slot_bytes: usize,
    runtime: Arc<dyn GpuRuntime>,
    events: Vec<EventHandle>,
    state: Mutex<State>,
    returned: Condvar,
}

/// See the module documentation. Cheap to clone; clones share the arena.
#[derive(Clone)]
pub struct PinnedPool {
    inner: Arc<Inner>,
}

impl PinnedPool {
    /// Maps `slots` slots of `slot_bytes` (rounded up to a page) and registers them with
    /// `runtime` once. Fails only when the memory or the slots' events cannot be had; a
    /// failed registration is logged once and the pool runs unpinned.
    pub fn new(
        runtime: Arc<dyn GpuRuntime>,
        slot_bytes: usize,
        slots: usize,
    ) -> Result<PinnedPool, GpuError> {
        if slot_bytes == 0 || slots == 0 {
            return Err(GpuError::Invalid {
                what: format!("pinned pool of {slots} slots of {slot_bytes} bytes"),
                problem: "needs at least one slot of at least one byte".into(),
            });
        }
        let page = page_size();
        let slot_bytes = slot_bytes.div_ceil(page) * page;
        let total = slot_bytes
            .checked_mul(slots)
            .ok_or_else(|| GpuError::Invalid {
                what: format!("pinned pool of {slots} slots of {slot_bytes} bytes"),
                problem: "overflows the address space".into(),
            })?;
        let arena = AlignedBuf::new(total).map_err(|source| GpuError::Alloc {
            bytes: total as u64,
            source,
        })?;
        let pinned = runtime.pins_memory() && register(&*runtime, &arena, total);
        if !pinned {
            UNPINNED_LOGGED.call_once(|| {
                tracing::info!(
                    "GPU staging runs on unpinned host memory ({})",
                    runtime.describe()
                )
            });
        }
        let mut events = Vec::with_capacity(slots);
        for _ in 0..slots {
            match runtime.event_create() {
                Ok(ev) => events.push(ev),
                Err(e) => {
                    for ev in events {
                        runtime.event_destroy(ev);
                    }
                    if pinned {
                        // SAFETY: registered above; nothing was queued from it.
                        let _ = unsafe { runtime.host_unregister(arena.as_ptr().cast_mut()) };
                    }
                    return Err(e);
                }
            }
        }
        let stats = PinnedPoolStats {
            slots,
            slot_bytes,
            pinned,
            ..PinnedPoolStats::default()
        };
        Ok(PinnedPool {
            inner: Arc::new(Inner {
                arena,
                slot_bytes,
                runtime,
                events,
                state: Mutex::new(State {
                    free: (0..slots).rev().collect(),
                    fenced: VecDeque::new(),
                    stats,
                }),
                returned: Condvar::new(),
            }),
        })
    }

    /// Bytes in one slot (a multiple of the page size).
    pub fn slot_bytes(&self) -> usize {
        self.inner.slot_bytes
    }

    /// The runtime the pool registers with and fences on.
    pub fn runtime(&self) -> &Arc<dyn GpuRuntime> {
        &self.inner.runtime
    }

    pub fn stats(&self) -> PinnedPoolStats {
        self.inner.lock().stats
    }

    /// A slot, waiting as long as it takes (see the module documentation). An error is the
    /// runtime failing to tell when a fenced slot's copies finished; that slot is lost.
    pub fn acquire(&self) -> Result<PinnedSlot, GpuError> {
        self.acquire_until(None)
            .map(|s| s.expect("no deadline, so a slot"))
    }

    /// As [`PinnedPool::acquire`], giving up after `timeout` when callers hold every slot.
    pub fn acquire_timeout(&self, timeout: Duration) -> Result<Option<PinnedSlot>, GpuError> {
        self.acquire_until(Some(Instant::now() + timeout))
    }

    fn acquire_until(&self, deadline: Option<Instant>) -> Result<Option<PinnedSlot>, GpuError> {
        let inner = &self.inner;
        let mut st = inner.lock();
        let mut waited = false;
        loop {
            // Fenced slots whose copies have finished come back, oldest first.
            while let Some(&i) = st.fenced.front() {
                if !inner.runtime.event_query(inner.events[i]).unwrap_or(false) {
                    break;
                }
                st.fenced.pop_front();
                st.free.push(i);
            }
            if let Some(i) = st.free.pop() {
                return Ok(Some(self.hand_out(st, i)));
            }
            if let Some(i) = st.fenced.pop_front() {
                st.stats.waits_for_copies += 1;
                drop(st);
                if let Err(e) = inner.runtime.event_synchronize(inner.events[i]) {
                    let mut st = inner.lock();
                    st.stats.lost += 1;
                    tracing::error!("pinned slot {i} taken out of use: {e}");
                    return Err(e);
                }
                return Ok(Some(self.hand_out(inner.lock(), i)));
            }
            if st.stats.held == 0 {
                return Err(GpuError::Invalid {
                    what: "pinned pool".into(),
                    problem: format!("all {} slots were lost to CUDA errors", st.stats.lost),
                });
            }
            if !waited {
                st.stats.waits_for_holders += 1;
                waited = true;
            }
            st = match deadline {
                None => inner.returned.wait(st).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let Some(left) = d.checked_duration_since(Instant::now()) else {
                        return Ok(None);
                    };
                    inner
                        .returned
                        .wait_timeout(st, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
    }

    fn hand_out(&self, mut st: MutexGuard<'_, State>, index: usize) -> PinnedSlot {
        st.stats.acquires += 1;
        st.stats.held += 1;
        st.stats.fenced = st.fenced.len();
        PinnedSlot {
            pool: Arc::clone(&self.inner),
            index,
            returned: false,
        }
    }
}

fn register(runtime: &dyn GpuRuntime, arena: &AlignedBuf, total: usize) -> bool {
    // SAFETY: the arena is mapped until the pool's Inner drops, which unregisters it first.
    match unsafe { runtime.host_register(arena.as_ptr().cast_mut(), total) } {
        Ok(()) => true,
        Err(e) => {
            UNPINNED_LOGGED.call_once(|| {
                tracing::warn!("registering {total} bytes of GPU staging memory failed ({e}): staging runs unpinned, host-to-device copies will be slower");
            });
            false
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn give_back(&self, index: usize, fenced: bool) {
        let mut st = self.lock();
        st.stats.held -= 1;
        if fenced {
            st.fenced.push_back(index);
        } else {
            st.free.push(index);
        }
        st.stats.fenced = st.fenced.len();
        drop(st);
        self.returned.notify_one();
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for &i in &st.fenced {
            if let Err(e) = self.runtime.event_synchronize(self.events[i]) {
                tracing::error!("waiting for pinned slot {i}'s copies failed: {e}");
            }
        }
        for &ev in &self.events {
            self.runtime.event_destroy(ev);
        }
        if st.stats.pinned {
            // SAFETY: registered in `new`; every fenced copy has run (above) and no slot is
            // held (each holds an Arc of this).
            if let Err(e) = unsafe { self.runtime.host_unregister(self.arena.as_ptr().cast_mut()) }
            {
                tracing::warn!("unregistering the GPU staging memory failed: {e}");
            }
        }
    }
}

/// One slot of a [`PinnedPool`], held exclusively. Dropping it gives it back at once;
/// [`PinnedSlot::fence`] gives it back once the stream's queued copies from it have run.
pub struct PinnedSlot {
    pool: Arc<Inner>,
    index: usize,
    returned: bool,
}

impl PinnedSlot {
    /// The slot's host address (page-aligned, inside the registered arena).
    pub fn addr(&self) -> usize {
        self.ptr() as usize
    }

    pub fn len(&self) -> usize {
        self.pool.slot_bytes
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the slot's range is inside the arena and this value holds it exclusively.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len()) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len()) }
    }

    fn ptr(&self) -> *mut u8 {
        let start = self.index * self.pool.slot_bytes;
        self.pool
            .arena
            .ptr_range(start, self.pool.slot_bytes)
            .expect("slots lie inside the arena")
    }

    /// Records the slot's event on `stream` (after the copies queued so far), for
    /// [`PinnedSlot::wait`].
    pub fn record(&self, stream: StreamHandle) -> Result<(), GpuError> {
        self.pool
            .runtime
            .event_record(self.pool.events[self.index], stream)
    }

    /// Blocks until the event of the last [`PinnedSlot::record`] has completed: the copies
    /// queued before it have run.
    pub fn wait(&self) -> Result<(), GpuError> {
        self.pool
            .runtime
            .event_synchronize(self.pool.events[self.index])
    }

    /// Gives the slot back after everything queued on `stream` so far (the copies from or
    /// into it) has run: the slot's event is recorded on `stream`, and the pool hands the
    /// slot out again only once the event has completed. If the record fails, the stream
    /// is synchronised instead; if that fails too, the slot is taken out of use (counted in
    /// [`PinnedPoolStats::lost`]) and the error returned.
    pub fn fence(mut self, stream: StreamHandle) -> Result<(), GpuError> {
        self.returned = true;
        let pool = Arc::clone(&self.pool);
        let ev = pool.events[self.index];
        match pool.runtime.event_record(ev, stream) {
            Ok(()) => {
                pool.give_back(self.index, true);
                Ok(())
            }
            Err(e) => match pool.runtime.stream_synchronize(stream) {
                Ok(()) => {
                    pool.give_back(self.index, false);
                    Ok(())
                }
                Err(sync) => {
                    let mut st = pool.lock();
                    st.stats.held -= 1;
                    st.stats.lost += 1;
                    tracing::error!(
                        "pinned slot {} taken out of use: {e}; then {sync}",
                        self.index
                    );
                    Err(e)
                }
            },
        }
    }
}

impl Drop for PinnedSlot {
    fn drop(&mut self) {
        if !self.returned {
            self.pool.give_back(self.index, false);
        }
    }
}

impl std::fmt::Debug for PinnedPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedPool")
            .field("runtime", &self.inner.runtime.describe())
            .field("stats", &self.stats())
            .finish()
    }
}

impl std::fmt::Debug for PinnedSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedSlot")
            .field("index", &self.index)
            .field("len", &self.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::thread;

    use super::*;
    use crate::gpu::{FakeCall, FakeRuntime, HostRuntime};

    const S: StreamHandle = StreamHandle(3);

    fn fake_pool(slots: usize) -> (Arc<FakeRuntime>, PinnedPool) {
        let rt = Arc::new(FakeRuntime::deferred());
        let pool = PinnedPool::new(Arc::clone(&rt) as Arc<dyn GpuRuntime>, 1000, slots).unwrap();
        (rt, pool)
    }

    #[test]
    fn the_arena_is_registered_once_and_unregistered_when_the_last_user_goes() {
        let (rt, pool) = fake_pool(3);
        assert_eq!(pool.slot_bytes(), page_size(), "rounded up to a page");
        let st = pool.stats();
        assert!(st.pinned);
        assert_eq!(
            rt.registered(),
            vec![(pool.inner.arena.as_ptr() as usize, 3 * page_size())]
        );
        for _ in 0..10 {
            let slot = pool.acquire().unwrap();
            assert_eq!(slot.addr() % page_size(), 0);
            slot.fence(S).unwrap();
        }
        let held = pool.acquire().unwrap();
        drop(pool);
        assert_eq!(
            rt.registered().len(),
            1,
            "a held slot keeps the arena registered"
        );
        drop(held);
        assert!(rt.registered().is_empty());
        let regs = rt.count(|c| matches!(c, FakeCall::Register { .. }));
        assert_eq!(regs, 1);
    }

    #[test]
    fn a_failed_registration_runs_unpinned() {
        let rt = Arc::new(FakeRuntime::deferred());
        rt.fail_next("host_register");
        let pool = PinnedPool::new(Arc::clone(&rt) as Arc<dyn GpuRuntime>, 4096, 2).unwrap();
        assert!(!pool.stats().pinned);
        let mut slot = pool.acquire().unwrap();
        slot.as_mut_slice().fill(7);
        drop(slot);
        drop(pool);
        assert!(!rt
            .calls()
            .iter()
            .any(|c| matches!(c, FakeCall::Unregister { .. })));
    }

    #[test]
    fn host_runtime_pools_are_unpinned() {
        let pool = PinnedPool::new(Arc::new(HostRuntime), 4096, 1).unwrap();
        assert!(!pool.stats().pinned);
    }

    #[test]
    fn zero_slots_or_bytes_are_refused_naming_the_pool() {
        for (bytes, slots) in [(0, 1), (4096, 0)] {
            let err = PinnedPool::new(Arc::new(HostRuntime), bytes, slots).unwrap_err();
            assert!(err.to_string().contains(&format!("{slots} slots")), "{err}");
        }
        let err = PinnedPool::new(Arc::new(HostRuntime), usize::MAX / 2, 4).unwrap_err();
        assert!(matches!(err, GpuError::Invalid { .. }), "{err}");
    }

    #[test]
    fn holders_of_every_slot_make_acquire_wait_until_one_is_dropped() {
        let (_rt, pool) = fake_pool(2);
        let a = pool.acquire().unwrap();
        let _b = pool.acquire().unwrap();
        assert!(pool
            .acquire_timeout(Duration::from_millis(20))
            .unwrap()
            .is_none());
        let p2 = pool.clone();
        let waiter = thread::spawn(move || p2.acquire().map(|s| s.addr()));
        thread::sleep(Duration::from_millis(50));
        let a_addr = a.addr();
        drop(a);
        assert_eq!(waiter.join().unwrap().unwrap(), a_addr);
        assert!(pool.stats().waits_for_holders >= 2);
    }

    #[test]
    fn a_fenced_slot_comes_back_only_after_its_event() {
        let (rt, pool) = fake_pool(1);
        let slot = pool.acquire().unwrap();
        slot.fence(S).unwrap();
        assert_eq!(pool.stats().fenced, 1);
        assert_eq!(rt.queued(S), 1, "the record is queued, not run");
        let again = pool.acquire().unwrap();
        assert_eq!(rt.queued(S), 0, "acquire waited for the event");
        assert_eq!(pool.stats().waits_for_copies, 1);
        drop(again);
    }

    #[test]
    fn a_failed_record_synchronises_the_stream_instead() {
        let (rt, pool) = fake_pool(1);
        rt.fail_next("event_record");
        pool.acquire().unwrap().fence(S).unwrap();
        assert!(rt.calls().contains(&FakeCall::SyncStream(S)));
        assert_eq!(pool.stats().fenced, 0);
        assert!(pool.acquire_timeout(Duration::ZERO).unwrap().is_some());
    }

    #[test]
    fn a_slot_the_runtime_cannot_account_for_is_lost_and_an_empty_pool_errors_not_hangs() {
        let (rt, pool) = fake_pool(1);
        rt.fail_next("event_record");
        rt.fail_next("stream_synchronize");
        let err = pool.acquire().unwrap().fence(S).unwrap_err();
        assert!(matches!(err, GpuError::Call { code: 999, .. }), "{err}");
        assert_eq!(pool.stats().lost, 1);
        let err = pool.acquire().unwrap_err();
        assert!(err.to_string().contains("lost"), "{err}");
    }

    #[test]
    fn a_failed_event_wait_loses_that_slot_with_the_error() {
        let (rt, pool) = fake_pool(2);
        pool.acquire().unwrap().fence(S).unwrap();
        pool.acquire().unwrap().fence(S).unwrap();
        rt.fail_next("event_synchronize");
        assert!(pool.acquire().is_err());
        assert_eq!(pool.stats().lost, 1);
        assert!(pool.acquire().is_ok(), "the other slot is still usable");
    }
}
