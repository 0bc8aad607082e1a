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
use std::time::Instant;

use sluice_engine::PooledBuf;
use sluice_formats::kv::{payload_checksum, RecordHeader, KV_ALIGN, RECORD_HEADER_BYTES};

use crate::config::Durability;
use crate::dram_tier::{Demoted, DramPut, DramTier};
use crate::namespace::{fp_map, Fingerprint, FpMap};
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

/// What the policies decided for one key of a put batch (taken in key order).
struct PutPlan {
    fp: Fingerprint,
    /// An earlier key of the same batch with the same fingerprint: this one shares its fate.
    dup_of: Option<usize>,
    /// Already in DRAM (a second put is a no-op), or a DRAM slot to fill.
    dram_present: bool,
    dram_slot: Option<u32>,
    /// Write-back: blocks DRAM evicted to make room, to be written to SSD.
    demoted: Vec<Arc<Demoted>>,
    ssd: SsdStep,
}

/// What one put does in the SSD tier.
enum SsdStep {
    None,
    Present,
    /// A slot to write the record into.
    Reserved(Reservation),
    /// A record written to its reserved slot (`true`) or a write that failed (`false`).
    Written(Reservation, bool),
}

/// Puts a batch in three steps:
/// 1. the policies decide for every key, **in key order**, so a single stream of batches
///    drives them exactly as `sluice sim` drives the same policy with the same key
///    sequence;
/// 2. copies into DRAM slots and record writes run in parallel, outside every lock;
/// 3. the written segments are synced once each, then the records published.
pub(crate) fn put_batch(store: &KvStore, keys: &[&[u8]], blocks: &[&[u8]]) -> Vec<bool> {
    let inner = &store.inner;
    let plans = plan_puts(store, keys);
    let fps: Vec<Fingerprint> = plans.iter().map(|p| p.fp).collect();
    let cells: Vec<Mutex<Option<PutPlan>>> =
        plans.into_iter().map(|p| Mutex::new(Some(p))).collect();
    let steps = parallel(keys.len(), inner.config.io_threads, |i| {
        let plan = lock(&cells[i]).take().expect("each plan runs once");
        execute_put(store, plan, keys[i], blocks[i])
    });
    let mut ok = Vec::with_capacity(steps.len());
    let mut dups = Vec::new();
    let mut written: Vec<(Reservation, bool)> = Vec::new();
    let mut written_key = Vec::new();
    for (i, (in_dram, step, dup_of)) in steps.into_iter().enumerate() {
        ok.push(in_dram || matches!(step, SsdStep::Present));
        if let Some(j) = dup_of {
            dups.push((i, j));
        }
        if let SsdStep::Written(r, w) = step {
            written.push((r, w));
            written_key.push(i);
        }
    }
    if inner.config.durability == Durability::Batch {
        sync_written(&mut written);
    }
    if let Some(ssd) = &inner.ssd {
        let visible = lock(ssd).publish(written);
        for (i, v) in written_key.iter().zip(visible) {
            ok[*i] |= v;
        }
    }
    for (i, j) in dups {
        ok[i] = ok[j];
    }
    // A later key of the batch may have made a policy evict an earlier one again (a
    // small cache, s3fifo's small queue): `true` means resident when the batch ends.
    let tiers = store.residency();
    for (o, fp) in ok.iter_mut().zip(&fps) {
        *o = *o && tiers.contains(*fp);
    }
    drop(tiers);
    add(&inner.counters.puts, keys.len() as u64);
    add(
        &inner.counters.put_failures,
        ok.iter().filter(|o| !**o).count() as u64,
    );
    ok
}

/// Step 1 of a put: each key offered to DRAM, then (write-through, or DRAM declined) to
/// SSD, one key after the other.
fn plan_puts(store: &KvStore, keys: &[&[u8]]) -> Vec<PutPlan> {
    let inner = &store.inner;
    let mut seen: FpMap<usize> = fp_map(keys.len());
    let mut plans = Vec::with_capacity(keys.len());
    for (i, key) in keys.iter().enumerate() {
        let fp = store.fingerprint(key);
        let mut plan = PutPlan {
            fp,
            dup_of: None,
            dram_present: false,
            dram_slot: None,
            demoted: Vec::new(),
            ssd: SsdStep::None,
        };
        if let Some(&j) = seen.get(&fp) {
            plan.dup_of = Some(j);
            plans.push(plan);
            continue;
        }
        seen.insert(fp, i);
        if inner.dram.is_some() {
            match dram_put(store, fp, key, &mut plan.demoted) {
                DramPut::Present => {
                    plan.dram_present = true;
                    add(&inner.counters.put_hits_dram, 1);
                }
                DramPut::Admitted { slot } => plan.dram_slot = Some(slot),
                DramPut::Declined => {}
            }
        }
        let in_dram = plan.dram_present || plan.dram_slot.is_some();
        let to_ssd = inner.ssd.is_some()
            && !plan.dram_present
            && (writes_through(&inner.config, inner.dram.is_some()) || !in_dram);
        if to_ssd {
            let ssd = inner.ssd.as_ref().expect("checked above");
            let decision = lock(ssd).put(fp, &store.namespace_id, key);
            plan.ssd = match decision {
                SsdPut::Present => {
                    add(&inner.counters.put_hits_ssd, 1);
                    SsdStep::Present
                }
                SsdPut::Declined | SsdPut::Full => SsdStep::None,
                SsdPut::Reserved(r) => SsdStep::Reserved(r),
            };
        }
        plans.push(plan);
    }
    plans
}

/// Step 2 of a put for one key: the DRAM copy, write-back demotions, the SSD record.
fn execute_put(
    store: &KvStore,
    plan: PutPlan,
    key: &[u8],
    block: &[u8],
) -> (bool, SsdStep, Option<usize>) {
    let inner = &store.inner;
    if plan.dup_of.is_some() {
        return (false, SsdStep::None, plan.dup_of);
    }
    if let (Some(slot), Some(d)) = (plan.dram_slot, &inner.dram) {
        fill_slot(d, slot, block);
    }
    demote(store, plan.demoted);
    let in_dram = plan.dram_present || plan.dram_slot.is_some();
    let step = match plan.ssd {
        SsdStep::Reserved(r) => match write_record(store, &r, key, block) {
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
        other => other,
    };
    (in_dram, step, None)
}

/// Copies a block into a DRAM slot that `DramTier::put` handed out, and publishes it.
fn fill_slot(d: &Mutex<DramTier>, slot: u32, bytes: &[u8]) {
    let dst = lock(d).slot_ptr(slot);
    // SAFETY: the slot is pinned for us (no one else writes or reuses it) and holds
    // exactly block_bytes == bytes.len() bytes (checked by the store).
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
    lock(d).filled(slot);
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
    let decision = g.put(fp, &store.namespace_id, key, demote_into(store, &mut out));
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
        let decision = lock(ssd).put(d.fp, &d.namespace_id, &d.key);
        if let SsdPut::Reserved(r) = decision {
            let ok = write_record(store, &r, &d.key, &d.bytes)
                .and_then(|()| r.file.sync())
                .is_ok();
            let _ = lock(ssd).publish(vec![(r, ok)]);
        }
        let mut map = lock(&inner.demoting);
        if map.get(&d.fp).is_some_and(|e| Arc::ptr_eq(e, &d)) {
            map.remove(&d.fp);
        }
    }
}

/// Writes one record into its reserved slot: the header from a pooled aligned buffer, the
/// block straight from the caller's memory in the same `pwritev` when the file takes it
/// as it is (buffered I/O, or a 4 KiB-aligned block under O_DIRECT). Otherwise header and
/// block are staged together in one pooled aligned buffer.
fn write_record(store: &KvStore, r: &Reservation, key: &[u8], block: &[u8]) -> std::io::Result<()> {
    let slot_bytes = store.inner.config.slot_bytes() as usize;
    let at = r.loc.slot as u64 * slot_bytes as u64;
    let header = RecordHeader {
        namespace_id: store.namespace_id,
        seq: r.seq,
        payload_len: block.len() as u64,
        payload_checksum: payload_checksum(block),
        key: key.to_vec(),
    };
    let encode = |into: &mut [u8]| {
        header
            .encode_into(&mut into[..RECORD_HEADER_BYTES])
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))
    };
    if !r.file.is_direct() || is_aligned(block) {
        let mut head = staging(store, RECORD_HEADER_BYTES)?;
        encode(head.as_mut_slice())?;
        let head = &head.as_slice()[..RECORD_HEADER_BYTES];
        // Padding to the slot's end is never read (reads stop at the payload's end), so
        // the slot's tail is left as the file has it.
        return r.file.write_vectored_at(&[head, block], at);
    }
    add(&store.inner.counters.staged_writes, 1);
    let mut buf = staging(store, slot_bytes)?;
    let bytes = &mut buf.as_mut_slice()[..slot_bytes];
    encode(bytes)?;
    let (payload, padding) = bytes[RECORD_HEADER_BYTES..].split_at_mut(block.len());
    payload.copy_from_slice(block);
    padding.fill(0); // a reused buffer must not carry another block's bytes to disk
    r.file.write_all_at(bytes, at)
}

/// Whether O_DIRECT can take `bytes` as they are: 4 KiB-aligned start and length.
fn is_aligned(bytes: &[u8]) -> bool {
    bytes.as_ptr() as usize % KV_ALIGN == 0 && bytes.len() % KV_ALIGN == 0
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

/// Gets a batch in three steps:
/// 1. every key is located, **in key order**, and the policies see its hit then: DRAM, or
///    SSD plus the DRAM policy's promotion decision. So a single stream of batches drives
///    the policies exactly as a two-level cache model (and `sluice kv bench
///    --compare-sim`) does. Planning stops at the first key found nowhere: prefix
///    semantics make every later key a miss, so they cost no I/O;
/// 2. copies out of DRAM, record reads (verified) and copies into promoted slots run in
///    parallel, outside every lock;
/// 3. prefix semantics: after the first key that failed, every later key is a miss.
///
/// Returns per key whether it was served, and how many keys each tier served.
pub(crate) fn get_batch(
    store: &KvStore,
    keys: &[&[u8]],
    bufs: &mut [&mut [u8]],
) -> (Vec<bool>, GetTiers) {
    let inner = &store.inner;
    let started = Instant::now();
    let plans = plan_gets(store, keys);
    let planned = plans.len();
    let cells: Vec<Mutex<Option<GetPlan>>> =
        plans.into_iter().map(|p| Mutex::new(Some(p))).collect();
    let bufs_cells: Vec<Mutex<&mut [u8]>> = bufs.iter_mut().map(|b| Mutex::new(&mut **b)).collect();
    let fetched = parallel(planned, inner.config.io_threads, |i| {
        let plan = lock(&cells[i]).take().expect("each plan runs once");
        let mut buf = lock(&bufs_cells[i]);
        fetch_one(store, plan, keys[i], &mut buf)
    });
    let mut ok = Vec::with_capacity(keys.len());
    let mut tiers = GetTiers::default();
    let mut prefix = true;
    for got in fetched {
        prefix &= got != Fetched::Miss;
        ok.push(prefix);
        match got {
            Fetched::Dram if prefix => tiers.dram += 1,
            Fetched::Ssd if prefix => tiers.ssd += 1,
            _ => {}
        }
    }
    ok.resize(keys.len(), false);
    store.record_load(&tiers, started.elapsed());
    add(&inner.counters.hits_dram, tiers.dram);
    add(&inner.counters.hits_ssd, tiers.ssd);
    add(&inner.counters.gets, keys.len() as u64);
    add(
        &inner.counters.misses,
        ok.iter().filter(|o| !**o).count() as u64,
    );
    (ok, tiers)
}

/// How many keys of a get batch each tier served.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct GetTiers {
    pub dram: u64,
    pub ssd: u64,
}

/// Where step 2 of a get took a key's bytes from (now in the caller's buffer), if anywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fetched {
    Dram,
    Ssd,
    Miss,
}

/// Where step 1 of a get found a block, and what it decided for it.
enum GetPlan {
    /// A pinned DRAM slot.
    Dram(Fingerprint, u32),
    /// A write-back block on its way to SSD (its bytes are in memory).
    Demoting(Fingerprint, Arc<Demoted>),
    /// A record to read; with a DRAM slot to promote it into, and what making room there
    /// evicted for write-back.
    Ssd {
        fp: Fingerprint,
        loc: SsdLoc,
        file: Arc<dyn SegmentFile>,
        promote: Option<u32>,
        demoted: Vec<Arc<Demoted>>,
    },
}

/// Step 1 of a get: each key located and its hit counted with its tier's policy, in key
/// order, up to the first key found nowhere.
fn plan_gets(store: &KvStore, keys: &[&[u8]]) -> Vec<GetPlan> {
    let inner = &store.inner;
    let mut plans = Vec::with_capacity(keys.len());
    for key in keys {
        let fp = store.fingerprint(key);
        let Some(source) = find(store, fp, key) else {
            store.release_lease(fp);
            break;
        };
        let plan = match source {
            Source::Dram(slot) => {
                let d = inner.dram.as_ref().expect("a DRAM source implies the tier");
                lock(d).touch(fp);
                GetPlan::Dram(fp, slot)
            }
            Source::Demoting(d) => GetPlan::Demoting(fp, d),
            Source::Ssd(loc, file) => {
                let ssd = inner.ssd.as_ref().expect("an SSD source implies the tier");
                lock(ssd).touch(fp);
                let mut demoted = Vec::new();
                let promote = match inner.dram.is_some() {
                    true => dram_put(store, fp, key, &mut demoted).slot(),
                    false => None,
                };
                GetPlan::Ssd {
                    fp,
                    loc,
                    file,
                    promote,
                    demoted,
                }
            }
        };
        plans.push(plan);
    }
    plans
}

/// Where a block was found.
enum Source {
    Dram(u32),
    Demoting(Arc<Demoted>),
    Ssd(SsdLoc, Arc<dyn SegmentFile>),
}

/// Step 2 of a get for one key: copy or read its bytes into `buf`, fill its promotion
/// slot, end its lease.
fn fetch_one(store: &KvStore, plan: GetPlan, key: &[u8], buf: &mut [u8]) -> Fetched {
    let inner = &store.inner;
    let (fp, got) = match plan {
        GetPlan::Dram(fp, slot) => {
            let d = inner.dram.as_ref().expect("a DRAM plan implies the tier");
            let src = lock(d).slot_ptr(slot);
            // SAFETY: step 1 pinned the slot, so nobody writes or reuses it during the copy.
            unsafe { std::ptr::copy_nonoverlapping(src, buf.as_mut_ptr(), buf.len()) };
            lock(d).unpin(slot);
            (fp, Fetched::Dram)
        }
        GetPlan::Demoting(fp, d) => {
            buf.copy_from_slice(&d.bytes);
            (fp, Fetched::Dram)
        }
        GetPlan::Ssd {
            fp,
            loc,
            file,
            promote,
            demoted,
        } => {
            let read = read_from_ssd(store, fp, key, loc, &*file, buf);
            if let (Some(slot), Some(d)) = (promote, &inner.dram) {
                if read {
                    fill_slot(d, slot, buf);
                } else {
                    lock(d).abandon(fp, slot);
                }
            }
            demote(store, demoted);
            (fp, if read { Fetched::Ssd } else { Fetched::Miss })
        }
    };
    store.release_lease(fp);
    got
}

/// Locates `fp`: DRAM (pinned), then SSD, then a lease taken by an earlier lookup.
fn find(store: &KvStore, fp: Fingerprint, key: &[u8]) -> Option<Source> {
    let inner = &store.inner;
    if let Some(d) = &inner.dram {
        if let Some(slot) = lock(d).pin(fp, &store.namespace_id, key) {
            return Some(Source::Dram(slot));
        }
    }
    let demoting = lock(&inner.demoting).get(&fp).cloned();
    if let Some(d) = demoting.filter(|d| &*d.key == key && d.namespace_id == store.namespace_id) {
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

/// Reads one record into `buf`; a record that fails verification or cannot be read is
/// dropped from the index and counted, and the key is a miss.
fn read_from_ssd(
    store: &KvStore,
    fp: Fingerprint,
    key: &[u8],
    loc: SsdLoc,
    file: &dyn SegmentFile,
    buf: &mut [u8],
) -> bool {
    let inner = &store.inner;
    let ssd = inner.ssd.as_ref().expect("an SSD source implies the tier");
    let (why, corrupt) = match read_record(store, key, loc, file, buf) {
        Ok(()) => return true,
        Err(ReadFailure::Corrupt(why)) => (why, true),
        Err(ReadFailure::Io(e)) => (format!("read failed: {e}"), false),
    };
    tracing::warn!(
        "kv segment {} slot {}: {why}; dropped, served as a miss",
        loc.segment,
        loc.slot
    );
    lock(ssd).drop_block(fp, loc, corrupt);
    false
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
    let direct_ok = !file.is_direct() || is_aligned(buf);
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
    if h.key != key || h.namespace_id != store.namespace_id {
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
