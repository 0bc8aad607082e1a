//! The data path of a batch: puts into the tiers, gets out of them, in parallel.
//!
//! Each key of a batch is one task; `io_threads` scoped threads take tasks in order. A
//! task holds a tier lock only to decide (policy, slot, reservation) and never during a
//! copy or an I/O. Segment writes of one batch are synced once per segment before any of
//! them is published, so an acknowledged put is durable (in batch durability) and a
//! lookup never sees a block whose bytes are not on disk. [`put`] and [`get`] hold the
//! two halves; this file what both use.

mod get;
mod put;

pub(crate) use get::get_batch;
pub(crate) use put::put_batch;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use sluice_engine::PooledBuf;
use sluice_formats::kv::{payload_checksum, RecordHeader, KV_ALIGN, RECORD_HEADER_BYTES};

use crate::dram_tier::{Demoted, DramPut, DramTier, PinnedBlock};
use crate::namespace::Fingerprint;
use crate::ssd_tier::{sync_written, Reservation, SsdPut};
use crate::state::View;
use crate::sync::{add, lock};

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

/// Copies a block into a DRAM slot that `DramTier::put` handed out, and publishes it.
pub(crate) fn fill_slot(d: &Mutex<DramTier>, slot: u32, bytes: &[u8]) {
    let dst = lock(d).slot_ptr(slot);
    // SAFETY: the slot is pinned for us (no one else writes or reuses it) and holds
    // exactly block_bytes == bytes.len() bytes (checked by the v).
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
    lock(d).filled(slot);
}

/// Where DRAM should copy the blocks it evicts: only a write-back store with an SSD tier
/// demotes them.
fn demote_into<'a>(v: View<'_>, out: &'a mut Vec<Demoted>) -> Option<&'a mut Vec<Demoted>> {
    (!v.state.config().writes_through(true) && v.state.tiers().ssd().is_some()).then_some(out)
}

/// Offers a block to DRAM; blocks it evicts for demotion enter `demoting` before the
/// DRAM lock is released; [`reserve_demotions`] then asks the SSD policy about them.
/// With `admit` false (a put batch past DRAM's
/// capacity), a block DRAM does not hold is declined without asking its policy.
pub(crate) fn dram_put(
    v: View<'_>,
    fp: Fingerprint,
    key: &[u8],
    admit: bool,
    demoted: &mut Vec<Demotion>,
) -> DramPut {
    let d = v.state.tiers().dram().expect("callers check the DRAM tier");
    let mut out = Vec::new();
    let mut g = lock(d);
    if !admit && !g.contains(fp) {
        return DramPut::Declined;
    }
    let decision = g.put(fp, &v.namespace_id, key, demote_into(v, &mut out));
    if !out.is_empty() {
        let mut map = lock(v.state.tiers().demoting());
        for e in out {
            let e = Arc::new(e);
            map.insert(e.fp, Arc::clone(&e));
            demoted.push(Demotion {
                block: e,
                slot: None,
            });
        }
    }
    drop(g);
    decision
}

/// The SSD policy's decision on each block DRAM demoted (a slot to write it into, or
/// none): a put batch asks right after each key, so the policies see the batch in key
/// order; a get batch after planning every key, so that a demotion cannot evict a block
/// the same get is about to read.
pub(crate) fn reserve_demotions(v: View<'_>, demoted: &mut [Demotion]) {
    let Some(ssd) = v.state.tiers().ssd() else {
        return;
    };
    for dm in demoted.iter_mut().filter(|d| d.slot.is_none()) {
        let b = &dm.block;
        let mut tier = lock(ssd);
        match tier.put(b.fp, &b.namespace_id, &b.key) {
            SsdPut::Reserved(r) => dm.slot = Some(r),
            // No segment could be created: DRAM evicted an acknowledged block for nothing.
            SsdPut::Failed => {
                let e = tier.create_error();
                drop(tier);
                v.state.write_back_failed(1, e);
            }
            // Already there, or the policy's choice (declined, no room): a cache's eviction.
            SsdPut::Present | SsdPut::Declined | SsdPut::Full => {}
        }
    }
}

/// A block DRAM evicted in a write-back v, and the SSD slot its policy gave it (none:
/// declined, already there, or no space).
pub(crate) struct Demotion {
    block: Arc<Demoted>,
    slot: Option<Reservation>,
}

/// Write-back: blocks DRAM evicted are written to the slots the SSD policy gave them
/// (each synced before it is visible), then leave `demoting`.
pub(crate) fn demote(v: View<'_>, demoted: Vec<Demotion>) {
    let Some(ssd) = v.state.tiers().ssd() else {
        return;
    };
    for Demotion { block: d, slot } in demoted {
        if let Some(r) = slot {
            let written = write_record(v, &r, &d.key, &d.bytes).and_then(|()| r.file.sync());
            let _ = lock(ssd).publish(vec![(r, written.is_ok())]);
            if let Err(e) = written {
                tracing::warn!("kv: a write-back block DRAM evicted could not be written: {e}");
                v.state.write_back_failed(1, e);
            }
        }
        let mut map = lock(v.state.tiers().demoting());
        if map.get(&d.fp).is_some_and(|e| Arc::ptr_eq(e, &d)) {
            map.remove(&d.fp);
        }
    }
}

/// Write-back: writes every block only DRAM holds to the SSD tier (as its policy admits
/// it), syncs, and publishes it, so that every acknowledged put survives a crash (what
/// `sync()` and `close()` promise). Runs `io_threads` records at a time; the blocks stay
/// pinned in DRAM meanwhile, so their bytes are read in place. Returns how many blocks
/// the SSD policy declined (or had no room for): those are still only in DRAM.
pub(crate) fn flush_dram(v: View<'_>) -> usize {
    let (Some(d), Some(ssd)) = (v.state.tiers().dram(), v.state.tiers().ssd()) else {
        return 0;
    };
    if v.state.config().writes_through(true) {
        return 0; // every block DRAM holds had its record written with its put
    }
    let pinned = {
        let mut dg = lock(d);
        let sg = lock(ssd);
        dg.pin_where(|fp| !sg.contains(fp))
    };
    let mut declined = 0;
    for chunk in pinned.chunks(v.state.config().io_threads.max(1) * 4) {
        let mut planned = Vec::with_capacity(chunk.len());
        for p in chunk {
            let mut tier = lock(ssd);
            match tier.put(p.fp, &p.namespace_id, &p.key) {
                SsdPut::Reserved(r) => planned.push((p, r)),
                SsdPut::Present => {}
                SsdPut::Failed => {
                    let e = tier.create_error();
                    drop(tier);
                    v.state.write_back_failed(1, e);
                }
                SsdPut::Declined | SsdPut::Full => declined += 1,
            }
        }
        write_flushed(v, d, planned);
        let mut dg = lock(d);
        for p in chunk {
            dg.unpin(p.slot);
        }
    }
    declined
}

/// Writes pinned DRAM blocks into the SSD slots reserved for them, `io_threads` at a time,
/// syncs and publishes them; counts those whose write or sync failed (they stay only in
/// DRAM, and the next `sync()` reports them).
fn write_flushed(v: View<'_>, d: &Mutex<DramTier>, planned: Vec<(&PinnedBlock, Reservation)>) {
    let Some(ssd) = v.state.tiers().ssd() else {
        return;
    };
    let failure: Mutex<Option<std::io::Error>> = Mutex::new(None);
    let cells: Vec<Mutex<Option<(&PinnedBlock, Reservation)>>> =
        planned.into_iter().map(|x| Mutex::new(Some(x))).collect();
    let mut written = parallel(cells.len(), v.state.config().io_threads, |i| {
        let (p, r) = lock(&cells[i]).take().expect("each record is written once");
        let ptr = lock(d).slot_ptr(p.slot);
        // SAFETY: the slot is pinned (pin_where), so it is neither reused nor written
        // while we read it, and it holds block_bytes filled bytes.
        let bytes =
            unsafe { std::slice::from_raw_parts(ptr, v.state.config().block_bytes as usize) };
        let written = write_record(v, &r, &p.key, bytes);
        let ok = written.is_ok();
        if let Err(e) = written {
            *lock(&failure) = Some(e);
        }
        (r, ok)
    });
    sync_written(&mut written);
    let failed = written.iter().filter(|(_, ok)| !ok).count() as u64;
    lock(ssd).publish(written);
    if failed > 0 {
        let e = lock(&failure)
            .take()
            .unwrap_or_else(|| std::io::Error::other("fdatasync failed (see the log)"));
        tracing::warn!("kv sync: {failed} write-back block(s) could not be written: {e}");
        v.state.write_back_failed(failed, e);
    }
}

/// Writes one record into its reserved slot: the header from a pooled aligned buffer, the
/// block straight from the caller's memory when the file takes it as it is (buffered I/O,
/// or a 4 KiB-aligned block under O_DIRECT): through io_uring with the block's pieces in
/// flight while it is hashed, else one `pwritev`. Otherwise header and block are staged
/// together in one pooled aligned buffer.
pub(crate) fn write_record(
    v: View<'_>,
    r: &Reservation,
    key: &[u8],
    block: &[u8],
) -> std::io::Result<()> {
    write_record_with(v, r, key, block, None)
}

/// [`write_record`], with the block's checksum where the caller has already verified it
/// (a block promoted from the shared tier was hashed as it was read).
pub(crate) fn write_record_with(
    v: View<'_>,
    r: &Reservation,
    key: &[u8],
    block: &[u8],
    checksum: Option<[u8; 32]>,
) -> std::io::Result<()> {
    let slot_bytes = v.state.config().slot_bytes() as usize;
    let at = r.loc.slot as u64 * slot_bytes as u64;
    let encode = |into: &mut [u8]| {
        let header = RecordHeader {
            // The reservation's namespace: a demoted or flushed block may be another
            // handle's (a sidecar serves many namespaces from one v).
            namespace_id: r.namespace_id,
            seq: r.seq,
            payload_len: block.len() as u64,
            payload_checksum: checksum.unwrap_or_else(|| payload_checksum(block)),
            key: key.to_vec(),
        };
        header
            .encode_into(&mut into[..RECORD_HEADER_BYTES])
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))
    };
    if !r.file.is_direct() || is_aligned(block) {
        let mut head = staging(v, RECORD_HEADER_BYTES)?;
        let head = &mut head.as_mut_slice()[..RECORD_HEADER_BYTES];
        // Padding to the slot's end is never read (reads stop at the payload's end), so
        // the slot's tail is left as the file has it. The block is hashed while it is
        // being written, where the file can do that (io_uring).
        return r
            .file
            .write_record(at, head, block, WRITE_PIECE_BYTES, &mut |h| encode(h));
    }
    add(&v.state.counters().staged_writes, 1);
    let mut buf = staging(v, slot_bytes)?;
    let bytes = &mut buf.as_mut_slice()[..slot_bytes];
    encode(bytes)?;
    let (payload, padding) = bytes[RECORD_HEADER_BYTES..].split_at_mut(block.len());
    payload.copy_from_slice(block);
    padding.fill(0); // a reused buffer must not carry another block's bytes to disk
    r.file.write_all_at(bytes, at)
}

/// Bytes of payload per write in flight: 256 KiB, as for streamed reads.
const WRITE_PIECE_BYTES: usize = 256 << 10;

/// Whether O_DIRECT can take `bytes` as they are: 4 KiB-aligned start and length.
pub(crate) fn is_aligned(bytes: &[u8]) -> bool {
    bytes.as_ptr() as usize % KV_ALIGN == 0 && bytes.len() % KV_ALIGN == 0
}

/// An aligned buffer from the store's staging pool (reused, so no mapping or page faults
/// per block; its budget is one slot per I/O thread).
pub(crate) fn staging(v: View<'_>, len: usize) -> std::io::Result<PooledBuf> {
    v.state
        .staging()
        .acquire(len)
        .map_err(|e| std::io::Error::other(e.to_string()))
}
