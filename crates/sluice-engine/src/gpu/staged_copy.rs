//! Byte ranges moved between host I/O and device memory through a [`PinnedPool`], window by
//! window, every copy queued on the caller's stream.

use std::collections::VecDeque;
use std::io;

use super::pinned_pool::{PinnedPool, PinnedSlot};
use super::runtime::{CopyKind, GpuError, StreamHandle};

/// What a staged copy moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StagedCopyReport {
    pub bytes: u64,
    pub windows: u64,
}

/// A staged copy failed. Copies queued before the failure still run; the destination holds
/// part of the range and must be taken as unwritten.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StagedCopyError {
    #[error("reading bytes {start}..{end} for the device failed: {source}")]
    Read {
        start: u64,
        end: u64,
        source: io::Error,
    },
    #[error("writing bytes {start}..{end} copied from the device failed: {source}")]
    Write {
        start: u64,
        end: u64,
        source: io::Error,
    },
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

/// Copies `len` bytes to device memory at `dst` through `pool`'s slots: `fill(offset, buf)`
/// fills each window (`buf` is the window's part of a slot, `offset` its place in the
/// range), its host-to-device copy is queued on `stream`, and the slot is fenced there.
///
/// **Ordering.** Returns once every copy is queued, without waiting for any of them and
/// without synchronising `stream`: work queued on `stream` after this call returns (a
/// kernel reading `dst`) runs after the copies and sees the bytes. Other streams and the
/// host must wait on an event recorded on `stream` after the call. While the pool has a free
/// slot, filling one window overlaps the copy of the one before; when the range needs more
/// windows than the pool has slots, each fill waits for the copy out of the slot it reuses
/// (the pool's backpressure), never for the others.
pub fn to_device(
    pool: &PinnedPool,
    stream: StreamHandle,
    dst: usize,
    len: u64,
    mut fill: impl FnMut(u64, &mut [u8]) -> io::Result<()>,
) -> Result<StagedCopyReport, StagedCopyError> {
    let window = pool.slot_bytes() as u64;
    let mut report = StagedCopyReport::default();
    let mut offset = 0;
    while offset < len {
        let n = window.min(len - offset) as usize;
        let mut slot = pool.acquire()?;
        fill(offset, &mut slot.as_mut_slice()[..n]).map_err(|source| StagedCopyError::Read {
            start: offset,
            end: offset + n as u64,
            source,
        })?;
        // SAFETY: the slot stays out of the pool until its fence completes, after the copy;
        // `dst + offset` is the caller's device range.
        unsafe {
            pool.runtime().copy_async(
                dst + offset as usize,
                slot.addr(),
                n,
                CopyKind::HostToDevice,
                stream,
            )?
        };
        slot.fence(stream)?;
        offset += n as u64;
        report.bytes += n as u64;
        report.windows += 1;
    }
    Ok(report)
}

/// Copies `len` bytes of device memory at `src` out through `pool`'s slots, handing each
/// window to `drain(offset, bytes)` (a write to a file, a store's put).
///
/// **Ordering.** The copies are queued on `stream`, so they run after every kernel queued
/// there before the call: the bytes drained are what those kernels wrote. The host waits
/// for each window's copy before draining it; the next window's copy is queued first (two
/// slots at a time where the pool has them), so a drain overlaps the next copy. Returns when
/// every window has been drained.
pub fn from_device(
    pool: &PinnedPool,
    stream: StreamHandle,
    src: usize,
    len: u64,
    mut drain: impl FnMut(u64, &[u8]) -> io::Result<()>,
) -> Result<StagedCopyReport, StagedCopyError> {
    let window = pool.slot_bytes() as u64;
    let depth = pool.stats().slots.min(2);
    let mut inflight: VecDeque<(PinnedSlot, u64, usize)> = VecDeque::new();
    let mut report = StagedCopyReport::default();
    let mut offset = 0;
    let result = (|| {
        while offset < len || !inflight.is_empty() {
            if offset < len && inflight.len() < depth {
                let n = window.min(len - offset) as usize;
                let slot = pool.acquire()?;
                // SAFETY: the slot is held (not in the pool) until its copy has been waited
                // for or it is fenced; `src + offset` is the caller's device range.
                unsafe {
                    pool.runtime().copy_async(
                        slot.addr(),
                        src + offset as usize,
                        n,
                        CopyKind::DeviceToHost,
                        stream,
                    )?
                };
                inflight.push_back((slot, offset, n));
                inflight.back().expect("just pushed").0.record(stream)?;
                offset += n as u64;
                continue;
            }
            let (slot, start, n) = inflight.front().expect("a window in flight");
            slot.wait()?;
            drain(*start, &slot.as_slice()[..*n]).map_err(|source| StagedCopyError::Write {
                start: *start,
                end: *start + *n as u64,
                source,
            })?;
            report.bytes += *n as u64;
            report.windows += 1;
            inflight.pop_front();
        }
        Ok(report)
    })();
    if result.is_err() {
        // Copies into these slots may still be queued: they go back fenced, not free.
        for (slot, _, _) in inflight {
            let _ = slot.fence(stream);
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::gpu::{FakeCall, FakeOp, FakeRuntime, GpuRuntime, HostRuntime};

    const S: StreamHandle = StreamHandle(7);

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    fn pool(rt: &Arc<FakeRuntime>, slot: usize, slots: usize) -> PinnedPool {
        PinnedPool::new(Arc::clone(rt) as Arc<dyn GpuRuntime>, slot, slots).unwrap()
    }

    fn fill_from(src: &[u8]) -> impl FnMut(u64, &mut [u8]) -> io::Result<()> + '_ {
        move |off, buf| {
            buf.copy_from_slice(&src[off as usize..off as usize + buf.len()]);
            Ok(())
        }
    }

    /// `src` queued to a fresh "device" buffer (its heap memory stays put when returned).
    fn upload(pool: &PinnedPool, src: &[u8]) -> (Vec<u8>, StagedCopyReport) {
        let mut dev = vec![0u8; src.len()];
        let addr = dev.as_mut_ptr() as usize;
        let r = to_device(pool, S, addr, src.len() as u64, fill_from(src)).unwrap();
        (dev, r)
    }

    #[test]
    fn a_kernel_queued_after_to_device_sees_the_bytes_without_any_host_sync() {
        let rt = Arc::new(FakeRuntime::deferred());
        let pool = pool(&rt, 4096, 4);
        let src = pattern(3 * 4096 + 100, 1);
        let (dev, r) = upload(&pool, &src);
        assert_eq!((r.windows, r.bytes), (4, src.len() as u64));
        // Nothing ran yet: the copies are queued on the stream, the host never waited.
        assert!(dev.iter().all(|b| *b == 0));
        assert!(!rt
            .calls()
            .iter()
            .any(|c| matches!(c, FakeCall::SyncEvent(_) | FakeCall::SyncStream(_))));
        // The "kernel": a host function queued after, reading the destination when it runs.
        let (dev_addr, want) = (dev.as_ptr() as usize, src.clone());
        let saw = Arc::new(AtomicBool::new(false));
        let saw2 = Arc::clone(&saw);
        rt.launch_host_func(
            S,
            Box::new(move || {
                // SAFETY: `dev` outlives the stream run below.
                let got = unsafe { std::slice::from_raw_parts(dev_addr as *const u8, want.len()) };
                saw2.store(got == want.as_slice(), Ordering::SeqCst);
            }),
        )
        .unwrap();
        rt.run_all();
        assert!(saw.load(Ordering::SeqCst));
        assert_eq!(dev, src);
    }

    #[test]
    fn more_windows_than_slots_wait_for_the_copy_out_of_the_reused_slot() {
        // Deferred copies read their source when they run: reusing a slot before its copy
        // ran would copy the next window's bytes.
        let rt = Arc::new(FakeRuntime::deferred());
        let pool = pool(&rt, 4096, 2);
        let src = pattern(7 * 4096 + 5, 2);
        let (dev, _) = upload(&pool, &src);
        rt.run_all();
        assert_eq!(dev, src);
        let st = pool.stats();
        assert_eq!(st.waits_for_copies, 6, "{st:?}");
        assert_eq!(st.acquires, 8);
        // Registered once for all eight windows.
        let regs = rt.count(|c| matches!(c, FakeCall::Register { .. }));
        assert_eq!(regs, 1);
    }

    #[test]
    fn many_iterations_stay_bit_exact_with_copies_run_at_random_points() {
        let rt = Arc::new(FakeRuntime::deferred());
        let pool = pool(&rt, 4096, 3);
        let mut seed = 0x9e37_79b9u32;
        for round in 0..200u32 {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            let len = 1 + (seed as usize % (5 * 4096));
            let src = pattern(len, round as u8);
            let mut dev = vec![0u8; len];
            to_device(
                &pool,
                S,
                dev.as_mut_ptr() as usize,
                len as u64,
                fill_from(&src),
            )
            .unwrap();
            rt.run(S, (seed >> 8) as usize % 4);
            // A kernel after the copies: everything queued runs before it reads.
            rt.stream_synchronize(S).unwrap();
            assert_eq!(dev, src, "round {round}");
        }
    }

    #[test]
    fn from_device_drains_what_the_kernels_before_it_wrote() {
        let rt = Arc::new(FakeRuntime::deferred());
        let pool = pool(&rt, 4096, 2);
        let want = pattern(5 * 4096 + 9, 3);
        let mut dev = vec![0u8; want.len()];
        // A "kernel" queued before the store writes the device memory.
        let (addr, bytes) = (dev.as_mut_ptr() as usize, want.clone());
        rt.launch_host_func(
            S,
            Box::new(move || {
                // SAFETY: `dev` outlives the calls below.
                unsafe { std::ptr::copy(bytes.as_ptr(), addr as *mut u8, bytes.len()) }
            }),
        )
        .unwrap();
        let mut out = vec![0u8; want.len()];
        let r = from_device(
            &pool,
            S,
            dev.as_mut_ptr() as usize,
            want.len() as u64,
            |off, b| {
                out[off as usize..off as usize + b.len()].copy_from_slice(b);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(r.windows, 6);
        assert_eq!(out, want);
        // The kernel ran before the first copy.
        let calls = rt.calls();
        let kernel = calls
            .iter()
            .position(|c| *c == FakeCall::Run(S, FakeOp::HostFunc));
        let first_copy = calls.iter().position(|c| {
            matches!(
                c,
                FakeCall::Run(
                    _,
                    FakeOp::Copy {
                        kind: CopyKind::DeviceToHost,
                        ..
                    }
                )
            )
        });
        assert!(kernel.unwrap() < first_copy.unwrap());
        drop(dev);
    }

    #[test]
    fn a_failed_read_returns_the_slot_and_names_the_range() {
        let rt = Arc::new(FakeRuntime::eager());
        let pool = pool(&rt, 4096, 2);
        let mut dev = vec![0u8; 3 * 4096];
        let err = to_device(&pool, S, dev.as_mut_ptr() as usize, 3 * 4096, |off, _| {
            if off == 4096 {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
            Ok(())
        })
        .unwrap_err();
        assert!(err.to_string().contains("4096..8192"), "{err}");
        let st = pool.stats();
        assert_eq!((st.held, st.lost), (0, 0));
        assert!(pool
            .acquire_timeout(std::time::Duration::ZERO)
            .unwrap()
            .is_some());
    }

    #[test]
    fn a_failed_copy_is_a_typed_error_and_loses_no_slot() {
        let rt = Arc::new(FakeRuntime::eager());
        let pool = pool(&rt, 4096, 2);
        let src = pattern(2 * 4096, 4);
        let mut dev = vec![0u8; src.len()];
        rt.fail_next("copy_async");
        let err = to_device(
            &pool,
            S,
            dev.as_mut_ptr() as usize,
            src.len() as u64,
            fill_from(&src),
        )
        .unwrap_err();
        assert!(
            matches!(err, StagedCopyError::Gpu(GpuError::Call { code: 999, .. })),
            "{err}"
        );
        assert_eq!(pool.stats().held, 0);
        // The next copy works.
        to_device(
            &pool,
            S,
            dev.as_mut_ptr() as usize,
            src.len() as u64,
            fill_from(&src),
        )
        .unwrap();
        assert_eq!(dev, src);
    }

    #[test]
    fn a_failed_drain_fences_the_slots_still_in_flight() {
        let rt = Arc::new(FakeRuntime::deferred());
        let pool = pool(&rt, 4096, 2);
        let dev = pattern(4 * 4096, 5);
        let err = from_device(&pool, S, dev.as_ptr() as usize, dev.len() as u64, |_, _| {
            Err(io::Error::from_raw_os_error(libc::ENOSPC))
        })
        .unwrap_err();
        assert!(
            matches!(err, StagedCopyError::Write { start: 0, .. }),
            "{err}"
        );
        let st = pool.stats();
        assert_eq!((st.held, st.lost), (0, 0), "{st:?}");
        // Both windows' slots came back fenced (the second one's copy was still queued),
        // and the pool hands them out again once the copies have run.
        assert_eq!(st.fenced, 2, "{st:?}");
        assert!(pool
            .acquire_timeout(std::time::Duration::ZERO)
            .unwrap()
            .is_some());
        let copies_run = rt.count(|c| matches!(c, FakeCall::Run(_, FakeOp::Copy { .. })));
        assert_eq!(
            copies_run, 2,
            "the slot came back after both queued copies ran"
        );
    }

    #[test]
    fn host_runtime_moves_the_same_bytes_unpinned() {
        let pool = PinnedPool::new(Arc::new(HostRuntime), 4096, 2).unwrap();
        assert!(!pool.stats().pinned);
        let src = pattern(3 * 4096 + 1, 6);
        let (dev, _) = upload(&pool, &src);
        assert_eq!(dev, src);
        let mut back = vec![0u8; src.len()];
        from_device(
            &pool,
            S,
            dev.as_ptr() as usize,
            dev.len() as u64,
            |off, b| {
                back[off as usize..off as usize + b.len()].copy_from_slice(b);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(back, src);
    }
}
