//! A get batch: locations and policy hits in key order, reads (verified) and copies in
//! parallel, then prefix semantics.

use std::io::IoSliceMut;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use sluice_formats::kv::{payload_checksum, RecordHeader, RECORD_HEADER_BYTES};

use crate::dram_tier::Demoted;
use crate::load_model::GetTiers;
use crate::namespace::Fingerprint;
use crate::segment_io::SegmentFile;
use crate::ssd_tier::{Reservation, SsdPut};
use crate::state::View;
use crate::sync::{add, lock};
use crate::tiers::{Lower, RecordLoc};

use super::{
    demote, dram_put, fill_slot, is_aligned, parallel, reserve_demotions, staging,
    write_record_with, Demotion,
};

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
    v: View<'_>,
    keys: &[&[u8]],
    bufs: &mut [&mut [u8]],
) -> (Vec<bool>, GetTiers) {
    let started = Instant::now();
    let plans = plan_gets(v, keys);
    let planned = plans.len();
    let cells: Vec<Mutex<Option<GetPlan>>> =
        plans.into_iter().map(|p| Mutex::new(Some(p))).collect();
    let bufs_cells: Vec<Mutex<&mut [u8]>> = bufs.iter_mut().map(|b| Mutex::new(&mut **b)).collect();
    let fetched = parallel(planned, v.state.config().io_threads, |i| {
        let plan = lock(&cells[i]).take().expect("each plan runs once");
        let mut buf = lock(&bufs_cells[i]);
        fetch_one(v, plan, keys[i], &mut buf)
    });
    let (fetched, promoted): (Vec<Fetched>, Vec<Option<(Reservation, bool)>>) =
        fetched.into_iter().unzip();
    publish_promoted(v, promoted.into_iter().flatten().collect());
    let mut ok = Vec::with_capacity(keys.len());
    let mut tiers = GetTiers::default();
    let mut prefix = true;
    for got in fetched {
        prefix &= got != Fetched::Miss;
        ok.push(prefix);
        match got {
            Fetched::Dram if prefix => tiers.dram += 1,
            Fetched::Ssd if prefix => tiers.ssd += 1,
            Fetched::Shared if prefix => tiers.shared += 1,
            _ => {}
        }
    }
    ok.resize(keys.len(), false);
    v.state.record_load(&tiers, started.elapsed());
    add(&v.state.counters().hits_dram, tiers.dram);
    add(&v.state.counters().hits_ssd, tiers.ssd);
    add(&v.state.counters().hits_shared, tiers.shared);
    add(&v.state.counters().gets, keys.len() as u64);
    add(
        &v.state.counters().misses,
        ok.iter().filter(|o| !**o).count() as u64,
    );
    (ok, tiers)
}

/// Where step 2 of a get took a key's bytes from (now in the caller's buffer), if anywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fetched {
    Dram,
    Ssd,
    Shared,
    Miss,
}

/// Where step 1 of a get found a block, and what it decided for it.
enum GetPlan {
    /// A pinned DRAM slot.
    Dram(Fingerprint, u32),
    /// A write-back block on its way to SSD (its bytes are in memory).
    Demoting(Fingerprint, Arc<Demoted>),
    /// A record to read; with a DRAM slot to promote it into, what making room there
    /// evicted for write-back, and (for a block from the shared directory) a slot in the
    /// local SSD tier to copy it into.
    Lower {
        fp: Fingerprint,
        at: RecordLoc,
        promote: Option<u32>,
        demoted: Vec<Demotion>,
        to_ssd: Option<Reservation>,
    },
}

/// Step 1 of a get: each key located and its hit counted with its tier's policy, in key
/// order, up to the first key found nowhere.
fn plan_gets(v: View<'_>, keys: &[&[u8]]) -> Vec<GetPlan> {
    let mut plans = Vec::with_capacity(keys.len());
    for key in keys {
        let fp = v.fingerprint(key);
        let Some(source) = find(v, fp, key) else {
            v.state.release_lease(fp);
            break;
        };
        let plan = match source {
            Source::Dram(slot) => {
                let d = v
                    .state
                    .tiers()
                    .dram()
                    .expect("a DRAM source implies the tier");
                lock(d).touch(fp);
                GetPlan::Dram(fp, slot)
            }
            Source::Demoting(d) => GetPlan::Demoting(fp, d),
            Source::Lower(at) => {
                v.state.tiers().touch_lower(fp, at.tier);
                let mut demoted = Vec::new();
                let promote = match v.state.tiers().dram().is_some() {
                    true => dram_put(v, fp, key, true, &mut demoted).slot(),
                    false => None,
                };
                let to_ssd = match (at.tier, v.state.tiers().ssd()) {
                    (Lower::Shared | Lower::Foreign, Some(ssd)) => {
                        match lock(ssd).put(fp, &v.namespace_id, key) {
                            SsdPut::Reserved(r) => Some(r),
                            _ => None,
                        }
                    }
                    _ => None,
                };
                GetPlan::Lower {
                    fp,
                    at,
                    promote,
                    demoted,
                    to_ssd,
                }
            }
        };
        plans.push(plan);
    }
    for plan in &mut plans {
        if let GetPlan::Lower { demoted, .. } = plan {
            reserve_demotions(v, demoted);
        }
    }
    plans
}

/// Where a block was found.
enum Source {
    Dram(u32),
    Demoting(Arc<Demoted>),
    Lower(RecordLoc),
}

/// Step 2 of a get for one key: copy or read its bytes into `buf`, fill its promotion
/// slot, end its lease. A block from the shared tier also comes back with the record it
/// was copied into in the local SSD tier (written, not yet synced or published).
fn fetch_one(
    v: View<'_>,
    plan: GetPlan,
    key: &[u8],
    buf: &mut [u8],
) -> (Fetched, Option<(Reservation, bool)>) {
    let mut promoted = None;
    let (fp, got) = match plan {
        GetPlan::Dram(fp, slot) => {
            let d = v
                .state
                .tiers()
                .dram()
                .expect("a DRAM plan implies the tier");
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
        GetPlan::Lower {
            fp,
            at,
            promote,
            demoted,
            to_ssd,
        } => {
            let checksum = read_from_lower(v, fp, key, &at, buf);
            let read = checksum.is_some();
            if let (Some(slot), Some(d)) = (promote, v.state.tiers().dram()) {
                if read {
                    fill_slot(d, slot, buf);
                } else {
                    lock(d).abandon(fp, slot);
                }
            }
            if let Some(r) = to_ssd {
                promoted = copy_to_ssd(v, r, key, buf, checksum);
            }
            demote(v, demoted);
            let got = match (read, at.tier) {
                (false, _) => Fetched::Miss,
                (true, Lower::Ssd) => Fetched::Ssd,
                (true, _) => Fetched::Shared,
            };
            (fp, got)
        }
    };
    v.state.release_lease(fp);
    (got, promoted)
}

/// Locates `fp`: DRAM (pinned), then SSD, then a lease taken by an earlier lookup.
fn find(v: View<'_>, fp: Fingerprint, key: &[u8]) -> Option<Source> {
    if let Some(d) = v.state.tiers().dram() {
        if let Some(slot) = lock(d).pin(fp, &v.namespace_id, key) {
            return Some(Source::Dram(slot));
        }
    }
    let demoting = lock(v.state.tiers().demoting()).get(&fp).cloned();
    if let Some(d) = demoting.filter(|d| &*d.key == key && d.namespace_id == v.namespace_id) {
        return Some(Source::Demoting(d));
    }
    if let Some(at) = v.state.tiers().locate_lower(fp) {
        return Some(Source::Lower(at));
    }
    match v.state.leased(fp)? {
        (Some(slot), _) => Some(Source::Dram(slot)),
        (None, lower) => lower.map(Source::Lower),
    }
}

/// A block read from the shared tier goes into the local SSD tier too (its policy
/// admitted it at planning): written here with the checksum its read verified (not hashed
/// again), then synced and published with the rest of the batch's
/// ([`publish_promoted`]), so the next get of it is local.
fn copy_to_ssd(
    v: View<'_>,
    r: Reservation,
    key: &[u8],
    bytes: &[u8],
    checksum: Option<[u8; 32]>,
) -> Option<(Reservation, bool)> {
    let ssd = v.state.tiers().ssd()?;
    let Some(checksum) = checksum else {
        lock(ssd).abandon(r);
        return None;
    };
    let ok = write_record_with(v, &r, key, bytes, Some(checksum)).is_ok();
    Some((r, ok))
}

/// Syncs the batch's promoted records, one `fdatasync` per segment they went to (not one
/// per block), then publishes those that made it.
fn publish_promoted(v: View<'_>, mut written: Vec<(Reservation, bool)>) {
    let Some(ssd) = v.state.tiers().ssd() else {
        return;
    };
    if written.is_empty() {
        return;
    }
    crate::ssd_tier::sync_written(&mut written);
    let _ = lock(ssd).publish(written);
}

/// Reads one record into `buf` and returns its verified payload checksum; a record that
/// fails verification or cannot be read is dropped from the index that pointed to it and
/// counted, and the key is a miss (`None`).
fn read_from_lower(
    v: View<'_>,
    fp: Fingerprint,
    key: &[u8],
    at: &RecordLoc,
    buf: &mut [u8],
) -> Option<[u8; 32]> {
    let (why, corrupt) = match read_record(v, key, at.loc.slot, &*at.file, buf) {
        Ok(sum) => return Some(sum),
        Err(ReadFailure::Corrupt(why)) => (why, true),
        Err(ReadFailure::Io(e)) => (format!("read failed: {e}"), false),
    };
    tracing::warn!(
        "kv {:?} segment {} slot {}: {why}; dropped, served as a miss",
        at.tier,
        at.loc.segment,
        at.loc.slot
    );
    v.state.tiers().drop_lower(fp, at, corrupt);
    None
}

enum ReadFailure {
    Corrupt(String),
    Io(std::io::Error),
}

/// Reads and verifies one record into `buf`: O_DIRECT straight into `buf` when it is
/// aligned, else through a pooled aligned bounce buffer (copied out once verified).
fn read_record(
    v: View<'_>,
    key: &[u8],
    slot: u32,
    file: &dyn SegmentFile,
    buf: &mut [u8],
) -> Result<[u8; 32], ReadFailure> {
    let slot_bytes = v.state.config().slot_bytes();
    let at = slot as u64 * slot_bytes;
    let want = RECORD_HEADER_BYTES + buf.len();
    let short = |n: usize| ReadFailure::Corrupt(format!("short read: {n} of {want} bytes"));
    let direct_ok = !file.is_direct() || is_aligned(buf);
    if direct_ok {
        let mut head = staging(v, RECORD_HEADER_BYTES).map_err(ReadFailure::Io)?;
        let head = &mut head.as_mut_slice()[..RECORD_HEADER_BYTES];
        // The payload is hashed piece by piece as it lands, so the checksum costs little
        // more than the read itself.
        let mut hasher = blake3::Hasher::new();
        let n = file
            .read_streamed(at, head, buf, HASH_PIECE_BYTES, &mut |piece| {
                hasher.update(piece);
            })
            .map_err(ReadFailure::Io)?;
        if n < want {
            return Err(short(n));
        }
        let sum = *hasher.finalize().as_bytes();
        return verify_hashed(v, key, head, buf.len(), &sum).map(|()| sum);
    }
    let mut bounce = staging(v, slot_bytes as usize).map_err(ReadFailure::Io)?;
    let bounce = &mut bounce.as_mut_slice()[..slot_bytes as usize];
    let n = file
        .read_vectored_at(&mut [IoSliceMut::new(bounce)], at)
        .map_err(ReadFailure::Io)?;
    if n < want {
        return Err(short(n));
    }
    let (head, payload) = bounce[..want].split_at(RECORD_HEADER_BYTES);
    let sum = payload_checksum(payload);
    verify_hashed(v, key, head, payload.len(), &sum)?;
    buf.copy_from_slice(payload);
    Ok(sum)
}

/// Bytes of payload per piece of a streamed read: 256 KiB, large enough that the device
/// sees few requests per block and BLAKE3 runs at full speed on each, small enough that
/// hashing the last piece adds little to a block's latency.
const HASH_PIECE_BYTES: usize = 256 << 10;

/// Checks a record's header against the key asked for, and against the payload's length
/// and hash.
fn verify_hashed(
    v: View<'_>,
    key: &[u8],
    head: &[u8],
    payload_len: usize,
    payload_hash: &[u8; 32],
) -> Result<(), ReadFailure> {
    let h = RecordHeader::decode(head).map_err(|e| ReadFailure::Corrupt(e.to_string()))?;
    if h.key != key || h.namespace_id != v.namespace_id {
        return Err(ReadFailure::Corrupt("the record holds another key".into()));
    }
    if h.payload_len != payload_len as u64 {
        return Err(ReadFailure::Corrupt(format!(
            "payload is {} bytes",
            h.payload_len
        )));
    }
    if *payload_hash != h.payload_checksum {
        return Err(ReadFailure::Corrupt(
            "payload checksum does not match".into(),
        ));
    }
    Ok(())
}
