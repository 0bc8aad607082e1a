//! [`FaultyDir`]: a [`SegmentDir`] double that injects [`KvFault`]s (failed, torn and
//! lost writes, failed and short reads, flipped bits, failed syncs, a full disk, slow or
//! stalled I/O) into the directory it wraps. Compiled for tests and the `testing` feature
//! only, never into a release build.

use std::io::{self, IoSliceMut};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::{SegmentDir, SegmentFile};
use crate::sync::lock;

/// A fault [`FaultyDir`] injects. Counters are per kind and count from 1 over the life of
/// the double (the segment header write is write 1 of each segment created).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvFault {
    /// Write number `nth` fails with EIO and writes nothing.
    FailWrite { nth: u64 },
    /// Write number `nth` writes only its first `keep` bytes, then fails (a torn write).
    TornWrite { nth: u64, keep: usize },
    /// Write number `nth` reports success but writes only its first `keep` bytes (a lost
    /// write the device acknowledged).
    SilentTornWrite { nth: u64, keep: usize },
    /// Read number `nth` fails with EIO.
    FailRead { nth: u64 },
    /// Read number `nth` returns only half of what was asked.
    ShortRead { nth: u64 },
    /// Read number `nth` comes back with byte `at` (of the whole read) flipped.
    FlipBit { nth: u64, at: usize },
    /// Sync number `nth` fails with EIO.
    FailSync { nth: u64 },
    /// Creating a segment, or writing, fails with ENOSPC once `bytes` have been written.
    NoSpaceAfter { bytes: u64 },
    /// Every write takes `millis` longer (a slow or stalled disk).
    SlowWrite { millis: u64 },
    /// Removing a segment takes `millis` longer (a slow file system under reclamation).
    SlowRemove { millis: u64 },
    /// Reads made by the store's reclaim thread wait until [`FaultyDir::release_reads`]
    /// (a compaction stalled in the middle of its copies).
    HoldReclaimReads,
    /// Every write waits until [`FaultyDir::release_writes`] (a put stalled in the middle
    /// of its I/O).
    HoldWrites,
}

#[derive(Default)]
struct FaultState {
    faults: Vec<KvFault>,
    writes: u64,
    reads: u64,
    syncs: u64,
    written_bytes: u64,
    /// Reads waiting under `HoldReclaimReads`.
    held: u64,
    /// Writes waiting under `HoldWrites`.
    held_writes: u64,
    /// Removals sleeping under `SlowRemove` now.
    removing: u64,
}

/// A [`SegmentDir`] over another that injects [`KvFault`]s.
pub struct FaultyDir {
    inner: Arc<dyn SegmentDir>,
    state: Arc<Mutex<FaultState>>,
    released: Arc<std::sync::Condvar>,
}

impl FaultyDir {
    pub fn new(inner: Arc<dyn SegmentDir>, faults: Vec<KvFault>) -> FaultyDir {
        FaultyDir {
            inner,
            state: Arc::new(Mutex::new(FaultState {
                faults,
                ..FaultState::default()
            })),
            released: Arc::new(std::sync::Condvar::new()),
        }
    }

    /// Replaces the fault list (counters keep running).
    pub fn set_faults(&self, faults: Vec<KvFault>) {
        lock(&self.state).faults = faults;
        self.released.notify_all();
    }

    /// Reads waiting under [`KvFault::HoldReclaimReads`] now.
    pub fn held_reads(&self) -> u64 {
        lock(&self.state).held
    }

    /// Writes waiting under [`KvFault::HoldWrites`] now.
    pub fn held_writes(&self) -> u64 {
        lock(&self.state).held_writes
    }

    /// Lets held writes go on (and stops holding new ones).
    pub fn release_writes(&self) {
        lock(&self.state)
            .faults
            .retain(|f| *f != KvFault::HoldWrites);
        self.released.notify_all();
    }

    /// Removals slowed by [`KvFault::SlowRemove`] in progress now (a reclaim pass that is
    /// dropping a segment).
    pub fn removes_in_progress(&self) -> u64 {
        lock(&self.state).removing
    }

    /// Lets held reads go on (and stops holding new ones).
    pub fn release_reads(&self) {
        let mut st = lock(&self.state);
        st.faults.retain(|f| *f != KvFault::HoldReclaimReads);
        drop(st);
        self.released.notify_all();
    }
}

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("injected fault: {what}"))
}

fn no_space() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOSPC)
}

impl SegmentDir for FaultyDir {
    fn create(&self, id: u64, len: u64) -> io::Result<Arc<dyn SegmentFile>> {
        {
            let st = lock(&self.state);
            let full = st.faults.iter().any(
                |f| matches!(f, KvFault::NoSpaceAfter { bytes } if st.written_bytes >= *bytes),
            );
            if full {
                return Err(no_space());
            }
        }
        let inner = self.inner.create(id, len)?;
        Ok(Arc::new(FaultySegment {
            inner,
            state: Arc::clone(&self.state),
            released: Arc::clone(&self.released),
        }))
    }

    fn open(&self, id: u64) -> io::Result<Arc<dyn SegmentFile>> {
        let inner = self.inner.open(id)?;
        Ok(Arc::new(FaultySegment {
            inner,
            state: Arc::clone(&self.state),
            released: Arc::clone(&self.released),
        }))
    }

    fn list(&self) -> io::Result<Vec<u64>> {
        self.inner.list()
    }

    fn remove(&self, id: u64) -> io::Result<()> {
        let slow = lock(&self.state).faults.iter().find_map(|f| match f {
            KvFault::SlowRemove { millis } => Some(*millis),
            _ => None,
        });
        let Some(ms) = slow else {
            return self.inner.remove(id);
        };
        lock(&self.state).removing += 1;
        std::thread::sleep(std::time::Duration::from_millis(ms));
        let removed = self.inner.remove(id);
        lock(&self.state).removing -= 1;
        removed
    }

    fn len(&self, id: u64) -> io::Result<u64> {
        self.inner.len(id)
    }

    fn path_of(&self, id: u64) -> PathBuf {
        self.inner.path_of(id)
    }
}

struct FaultySegment {
    inner: Arc<dyn SegmentFile>,
    state: Arc<Mutex<FaultState>>,
    released: Arc<std::sync::Condvar>,
}

impl FaultySegment {
    /// Under `HoldReclaimReads`, a read on the reclaim thread waits for the release.
    fn hold_if_reclaiming(&self) {
        if std::thread::current().name() == Some("sluice-kv-reclaim") {
            self.hold_while(KvFault::HoldReclaimReads, |st| &mut st.held);
        }
    }

    /// Under `HoldWrites`, a write waits for the release.
    fn hold_write(&self) {
        self.hold_while(KvFault::HoldWrites, |st| &mut st.held_writes);
    }

    /// Waits while `fault` is set, counted in `waiting` meanwhile (what tests wait for).
    fn hold_while(&self, fault: KvFault, waiting: fn(&mut FaultState) -> &mut u64) {
        let mut st = lock(&self.state);
        if !st.faults.contains(&fault) {
            return;
        }
        *waiting(&mut st) += 1;
        while st.faults.contains(&fault) {
            st = self.released.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        *waiting(&mut st) -= 1;
    }
}

impl SegmentFile for FaultySegment {
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        self.hold_write();
        let (n, faults, written) = {
            let mut st = lock(&self.state);
            st.writes += 1;
            (st.writes, st.faults.clone(), st.written_bytes)
        };
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        for f in &faults {
            match *f {
                KvFault::FailWrite { nth } if nth == n => return Err(eio("write failed")),
                KvFault::TornWrite { nth, keep } if nth == n => {
                    self.inner
                        .write_vectored_at(&first_bytes(bufs, keep), offset)?;
                    return Err(eio("torn write"));
                }
                KvFault::SilentTornWrite { nth, keep } if nth == n => {
                    return self
                        .inner
                        .write_vectored_at(&first_bytes(bufs, keep), offset);
                }
                KvFault::NoSpaceAfter { bytes } if written + len as u64 > bytes => {
                    return Err(no_space());
                }
                KvFault::SlowWrite { millis } => {
                    std::thread::sleep(std::time::Duration::from_millis(millis))
                }
                _ => {}
            }
        }
        self.inner.write_vectored_at(bufs, offset)?;
        lock(&self.state).written_bytes += len as u64;
        Ok(())
    }

    fn read_vectored_at(&self, bufs: &mut [IoSliceMut<'_>], offset: u64) -> io::Result<usize> {
        self.hold_if_reclaiming();
        let (n, faults) = {
            let mut st = lock(&self.state);
            st.reads += 1;
            (st.reads, st.faults.clone())
        };
        let mut got = self.inner.read_vectored_at(bufs, offset)?;
        for f in &faults {
            match *f {
                KvFault::FailRead { nth } if nth == n => return Err(eio("read failed")),
                KvFault::ShortRead { nth } if nth == n => got /= 2,
                KvFault::FlipBit { nth, at } if nth == n => flip(bufs, at),
                _ => {}
            }
        }
        Ok(got)
    }

    fn sync(&self) -> io::Result<()> {
        let (n, faults) = {
            let mut st = lock(&self.state);
            st.syncs += 1;
            (st.syncs, st.faults.clone())
        };
        if faults
            .iter()
            .any(|f| matches!(f, KvFault::FailSync { nth } if *nth == n))
        {
            return Err(eio("sync failed"));
        }
        self.inner.sync()
    }

    fn is_direct(&self) -> bool {
        self.inner.is_direct()
    }
}

/// The first `keep` bytes of `bufs` (a torn write's part that reaches the disk).
fn first_bytes<'a>(bufs: &[&'a [u8]], mut keep: usize) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    for b in bufs {
        let n = keep.min(b.len());
        if n == 0 {
            break;
        }
        out.push(&b[..n]);
        keep -= n;
    }
    out
}

fn flip(bufs: &mut [IoSliceMut<'_>], mut at: usize) {
    for b in bufs.iter_mut() {
        if at < b.len() {
            b[at] ^= 0x01;
            return;
        }
        at -= b.len();
    }
}
