//! The data path of a batch: puts into the tiers, gets out of them, in parallel.
//!
//! Each key of a batch is one task; `io_threads` scoped threads take tasks in order. A
//! task holds a tier lock only to decide (policy, slot, reservation) and never during a
//! copy or an I/O. SSD writes of one batch are synced once per segment before any of
//! them is published, so an acknowledged put is durable (in batch durability) and a
//! lookup never sees a block whose bytes are not on disk.

use std::io::IoSliceMut;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use sluice_engine::PooledBuf;
use sluice_formats::kv::{payload_checksum, RecordHeader, KV_ALIGN, RECORD_HEADER_BYTES};

use crate::config::Durability;
use crate::dram_tier::{Demoted, DramPut};
use crate::namespace::Fingerprint;
use crate::segment_io::SegmentFile;
use crate::ssd_tier::{sync_written, Reservation, SsdLoc, SsdPut};
use crate::store::{add, lock, writes_through, KvStore};

/// Runs `f(i)` for every `i < n` on up to `threads` threads; results in order.
pub(crate) fn parallel<T: Send>(n: usize, threads: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    if n <= 1 || threads <= 1 {
        return (0..n).map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let out: Vec<Mutex<Option<T>>> = (0..n).map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..threads.min(n) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return;
                }
                let v = f(i);
                *lock(&out[i]) = Some(v);
            });
        }
    });
    out.into_iter()
        .map(|m| {
            m.into_inner()
                .unwrap_or_else(|p| p.into_inner())
                .expect("every task ran")
        })
        .collect()
}

/// What one put task did in the SSD tier.
enum SsdStep {
    None,
    Present,
    /// A record written to a reserved slot (`true`) or a write that failed (`false`).
    Written(Reservation, bool),
}

pub(crate) fn put_batch(store: &KvStore, keys: &[&[u8]], blocks: &[&[u8]]) -> Vec<bool> {
    let inner = &store.inner;
    let steps = parallel(keys.len(), inner.config.io_threads, |i| {
        put_one(store, keys[i], blocks[i])
    });
    let mut ok = Vec::with_capacity(steps.len());
    let mut written: Vec<(Reservation, bool)> = Vec::new();
    let mut written_key = Vec::new();
    for (i, (in_dram, step)) in steps.into_iter().enumerate() {
        ok.push(in_dram || matches!(step, SsdStep::Present));
        if let SsdStep::Written(r, w) = step {
            written.push((r, w));
            written_key.push(i);
        }
    }
    if inner.config.durability == Durability::Batch {
        sync_written(&mut written);
    }
    for (i, (_, w)) in written_key.iter().zip(&written) {
        ok[*i] |= *w;
    }
    if let Some(ssd) = &inner.ssd {
        lock(ssd).publish(written);
    }
    add(&inner.counters.puts, keys.len() as u64);
    add(
        &inner.counters.put_failures,
        ok.iter().filter(|o| !**o).count() as u64,
    );
    ok
}

/// Puts one block: DRAM first, then SSD when writing through (or DRAM declined).
fn put_one(store: &KvStore, key: &[u8], block: &[u8]) -> (bool, SsdStep) {
    let inner = &store.inner;
    let fp = store.fingerprint(key);
    let mut in_dram = false;
    if let Some(d) = &inner.dram {
        let mut demoted = Vec::new();
        let decision = dram_put(store, fp, key, &mut demoted);
        match decision {
            DramPut::Present => in_dram = true,
            DramPut::Admitted { slot } => {
                let dst = lock(d).slot_ptr(slot);
                // SAFETY: the slot is pinned for us (no one else writes or reuses it) and
                // holds exactly block_bytes == block.len() bytes (checked by the store).
                unsafe { std::ptr::copy_nonoverlapping(block.as_ptr(), dst, block.len()) };
                lock(d).filled(slot);
                in_dram = true;
            }
            DramPut::Declined => {}
        }
        demote(store, demoted);
    }
    let to_ssd =
        inner.ssd.is_some() && (writes_through(&inner.config, inner.dram.is_some()) || !in_dram);
    if !to_ssd {
        return (in_dram, SsdStep::None);
    }
    let ssd = inner.ssd.as_ref().expect("checked above");
    let decision = lock(ssd).put(fp);
    let step = match decision {
        SsdPut::Present => SsdStep::Present,
        SsdPut::Declined | SsdPut::Full => SsdStep::None,
        SsdPut::Reserved(r) => match write_record(store, &r, key, block) {
            Ok(()) => SsdStep::Written(r, true),
            Err(e) => {
                tracing::warn!(
                    "kv segment {} slot {}: write failed: {e}",
                    r.loc.segment,
                    r.loc.slot
                );
                SsdStep::Written(r, false)
            }
        },
    };
    (in_dram, step)
}

/// Where DRAM should copy the blocks it evicts: only a write-back store with an SSD tier
/// demotes them.
fn demote_into<'a>(store: &KvStore, out: &'a mut Vec<Demoted>) -> Option<&'a mut Vec<Demoted>> {
    let inner = &store.inner;
    (!writes_through(&inner.config, true) && inner.ssd.is_some()).then_some(out)
}

/// Offers a block to DRAM; blocks it evicts for demotion enter `demoting` before the
/// DRAM lock is released.
fn dram_put(
    store: &KvStore,
    fp: Fingerprint,
    key: &[u8],
    demoted: &mut Vec<Arc<Demoted>>,
) -> DramPut {
    let inner = &store.inner;
    let d = inner.dram.as_ref().expect("callers check the DRAM tier");
    let mut out = Vec::new();
    let mut g = lock(d);
    let decision = g.put(fp, &inner.namespace_id, key, demote_into(store, &mut out));
    if !out.is_empty() {
        let mut map = lock(&inner.demoting);
        for e in out {
            let e = Arc::new(e);
            map.insert(e.fp, Arc::clone(&e));
            demoted.push(e);
        }
    }
    drop(g);
    decision
}

/// Write-back: blocks DRAM evicted are written to SSD (each synced before it is visible),
/// then leave `demoting`.
fn demote(store: &KvStore, demoted: Vec<Arc<Demoted>>) {
    let inner = &store.inner;
    let Some(ssd) = &inner.ssd else { return };
    for d in demoted {
        let decision = lock(ssd).put(d.fp);
        if let SsdPut::Reserved(r) = decision {
            let ok = write_record(store, &r, &d.key, &d.bytes)
                .and_then(|()| r.file.sync())
                .is_ok();
            lock(ssd).publish(vec![(r, ok)]);
        }
        let mut map = lock(&inner.demoting);
        if map.get(&d.fp).is_some_and(|e| Arc::ptr_eq(e, &d)) {
            map.remove(&d.fp);
        }
    }
}

/// Stages header and block in a pooled aligned buffer and writes the slot in one call.
fn write_record(store: &KvStore, r: &Reservation, key: &[u8], block: &[u8]) -> std::io::Result<()> {
    let slot_bytes = store.inner.config.slot_bytes() as usize;
    let mut buf = staging(store, slot_bytes)?;
    let header = RecordHeader {
        namespace_id: store.inner.namespace_id,
        seq: r.seq,
        payload_len: block.len() as u64,
        payload_checksum: payload_checksum(block),
        key: key.to_vec(),
    };
    let bytes = &mut buf.as_mut_slice()[..slot_bytes];
    header
        .encode_into(&mut bytes[..RECORD_HEADER_BYTES])
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
    let (payload, padding) = bytes[RECORD_HEADER_BYTES..].split_at_mut(block.len());
    payload.copy_from_slice(block);
    padding.fill(0); // a reused buffer must not carry another block's bytes to disk
    r.file
        .write_all_at(bytes, r.loc.slot as u64 * slot_bytes as u64)
}

/// An aligned buffer from the store's staging pool (reused, so no mapping or page faults
/// per block; its budget is one slot per I/O thread).
fn staging(store: &KvStore, len: usize) -> std::io::Result<PooledBuf> {
    store
        .inner
        .staging
        .acquire(len)
        .map_err(|e| std::io::Error::other(e.to_string()))
}

pub(crate) fn get_batch(store: &KvStore, keys: &[&[u8]], bufs: &mut [&mut [u8]]) -> Vec<bool> {
    let inner = &store.inner;
    let cells: Vec<Mutex<&mut [u8]>> = bufs.iter_mut().map(|b| Mutex::new(&mut **b)).collect();
    let got = parallel(keys.len(), inner.config.io_threads, |i| {
        let mut buf = lock(&cells[i]);
        get_one(store, keys[i], &mut buf)
    });
    let mut ok = Vec::with_capacity(got.len());
    let mut prefix = true;
    for g in got {
        prefix &= g;
        ok.push(prefix);
    }
    add(&inner.counters.gets, keys.len() as u64);
    add(
        &inner.counters.misses,
        ok.iter().filter(|o| !**o).count() as u64,
    );
    ok
}

/// Where a get found its block.
enum Source {
    Dram(u32),
    Demoting(Arc<Demoted>),
    Ssd(SsdLoc, Arc<dyn SegmentFile>),
}

fn get_one(store: &KvStore, key: &[u8], buf: &mut [u8]) -> bool {
    let inner = &store.inner;
    let fp = store.fingerprint(key);
    let ok = match find(store, fp, key) {
        None => false,
        Some(Source::Dram(slot)) => {
            let d = inner.dram.as_ref().expect("a DRAM source implies the tier");
            let src = lock(d).slot_ptr(slot);
            // SAFETY: `find` pinned the slot, so nobody writes or reuses it during the copy.
            unsafe { std::ptr::copy_nonoverlapping(src, buf.as_mut_ptr(), buf.len()) };
            let mut g = lock(d);
            g.unpin(slot);
            g.touch(fp);
            add(&inner.counters.hits_dram, 1);
            true
        }
        Some(Source::Demoting(d)) => {
            buf.copy_from_slice(&d.bytes);
            add(&inner.counters.hits_dram, 1);
            true
        }
        Some(Source::Ssd(loc, file)) => get_from_ssd(store, fp, key, loc, &*file, buf),
    };
    store.release_lease(fp);
    ok
}

/// Locates `fp`: DRAM (pinned), then SSD, then a lease taken by an earlier lookup.
fn find(store: &KvStore, fp: Fingerprint, key: &[u8]) -> Option<Source> {
    let inner = &store.inner;
    if let Some(d) = &inner.dram {
        if let Some(slot) = lock(d).pin(fp, &inner.namespace_id, key) {
            return Some(Source::Dram(slot));
        }
    }
    let demoting = lock(&inner.demoting).get(&fp).cloned();
    if let Some(d) = demoting.filter(|d| &*d.key == key && d.namespace_id == inner.namespace_id) {
        return Some(Source::Demoting(d));
    }
    if let Some(s) = &inner.ssd {
        if let Some((loc, file)) = lock(s).locate(fp) {
            return Some(Source::Ssd(loc, file));
        }
    }
    let leases = lock(&inner.leases);
    let lease = leases.get(&fp)?;
    if let (Some(slot), Some(d)) = (lease.dram_slot, &inner.dram) {
        lock(d).pin_slot(slot);
        return Some(Source::Dram(slot));
    }
    let (loc, file) = lease.ssd.as_ref()?;
    Some(Source::Ssd(*loc, Arc::clone(file)))
}

fn get_from_ssd(
    store: &KvStore,
    fp: Fingerprint,
    key: &[u8],
    loc: SsdLoc,
    file: &dyn SegmentFile,
    buf: &mut [u8],
) -> bool {
    let inner = &store.inner;
    let ssd = inner.ssd.as_ref().expect("an SSD source implies the tier");
    match read_record(store, key, loc, file, buf) {
        Ok(()) => {
            lock(ssd).touch(fp);
            add(&inner.counters.hits_ssd, 1);
            promote(store, fp, key, buf);
            true
        }
        Err(ReadFailure::Corrupt(why)) => {
            tracing::warn!(
                "kv segment {} slot {}: {why}; dropped, served as a miss",
                loc.segment,
                loc.slot
            );
            lock(ssd).drop_block(fp, loc, true);
            false
        }
        Err(ReadFailure::Io(e)) => {
            tracing::warn!(
                "kv segment {} slot {}: read failed: {e}; served as a miss",
                loc.segment,
                loc.slot
            );
            lock(ssd).drop_block(fp, loc, false);
            false
        }
    }
}

enum ReadFailure {
    Corrupt(String),
    Io(std::io::Error),
}

/// Reads and verifies one record into `buf`: O_DIRECT straight into `buf` when it is
/// aligned, else through a pooled aligned bounce buffer (copied out once verified).
fn read_record(
    store: &KvStore,
    key: &[u8],
    loc: SsdLoc,
    file: &dyn SegmentFile,
    buf: &mut [u8],
) -> Result<(), ReadFailure> {
    let slot_bytes = store.inner.config.slot_bytes();
    let at = loc.slot as u64 * slot_bytes;
    let want = RECORD_HEADER_BYTES + buf.len();
    let short = |n: usize| ReadFailure::Corrupt(format!("short read: {n} of {want} bytes"));
    let direct_ok =
        !file.is_direct() || (buf.as_ptr() as usize % KV_ALIGN == 0 && buf.len() % KV_ALIGN == 0);
    if direct_ok {
        let mut head = staging(store, RECORD_HEADER_BYTES).map_err(ReadFailure::Io)?;
        let head = &mut head.as_mut_slice()[..RECORD_HEADER_BYTES];
        let n = file
            .read_vectored_at(&mut [IoSliceMut::new(head), IoSliceMut::new(buf)], at)
            .map_err(ReadFailure::Io)?;
        if n < want {
            return Err(short(n));
        }
        return verify(store, key, head, buf);
    }
    let mut bounce = staging(store, slot_bytes as usize).map_err(ReadFailure::Io)?;
    let bounce = &mut bounce.as_mut_slice()[..slot_bytes as usize];
    let n = file
        .read_vectored_at(&mut [IoSliceMut::new(bounce)], at)
        .map_err(ReadFailure::Io)?;
    if n < want {
        return Err(short(n));
    }
    let (head, payload) = bounce[..want].split_at(RECORD_HEADER_BYTES);
    verify(store, key, head, payload)?;
    buf.copy_from_slice(payload);
    Ok(())
}

/// Checks a record's header against the key asked for and its payload against the hash.
fn verify(store: &KvStore, key: &[u8], head: &[u8], payload: &[u8]) -> Result<(), ReadFailure> {
    let h = RecordHeader::decode(head).map_err(|e| ReadFailure::Corrupt(e.to_string()))?;
    if h.key != key || h.namespace_id != store.inner.namespace_id {
        return Err(ReadFailure::Corrupt("the record holds another key".into()));
    }
    if h.payload_len != payload.len() as u64 {
        return Err(ReadFailure::Corrupt(format!(
            "payload is {} bytes",
            h.payload_len
        )));
    }
    if payload_checksum(payload) != h.payload_checksum {
        return Err(ReadFailure::Corrupt(
            "payload checksum does not match".into(),
        ));
    }
    Ok(())
}

/// A block read from SSD is offered to the DRAM policy (promotion on a hit).
fn promote(store: &KvStore, fp: Fingerprint, key: &[u8], bytes: &[u8]) {
    let inner = &store.inner;
    let Some(d) = &inner.dram else { return };
    let mut demoted = Vec::new();
    let decision = dram_put(store, fp, key, &mut demoted);
    if let DramPut::Admitted { slot } = decision {
        let dst = lock(d).slot_ptr(slot);
        // SAFETY: the new slot is pinned for us and holds block_bytes == bytes.len().
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
        lock(d).filled(slot);
    }
    demote(store, demoted);
}
