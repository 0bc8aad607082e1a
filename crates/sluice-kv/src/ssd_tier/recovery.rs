//! Rebuilding the SSD tier's index from its segment files at open.
//!
//! There is no separate index file to lose or corrupt: the records are the index. Each
//! segment's header must name this store and its block size; a segment whose header does
//! not decode is removed with a warning (it holds no block anyone can verify). Then every
//! slot's record header is read and checked. A slot that does not verify is skipped and
//! counted, and the scan goes on: appends run in parallel, so a crash can leave a hole
//! before records that were acknowledged. In segments without a `.sealed` marker (written
//! while the process died) each payload's checksum is verified as well, so a torn tail is
//! discarded here instead of being found by a read. Blocks are then offered to the policy
//! in write order (sequence numbers), newest last, as if they had just been put.
//!
//! A sealed segment with a summary (`seg-<id>.summary`, written at seal) is not scanned:
//! its record list comes from the summary in one read. A segment that had to be scanned
//! gets a summary (and, if it was left unsealed, is synced and sealed) so the next open
//! reads that instead. Every later read still verifies its record, so a wrong summary
//! costs a miss, never bytes.

use std::io::IoSliceMut;
use std::sync::Arc;

use sluice_engine::AlignedBuf;
use sluice_formats::kv::{
    payload_checksum, RecordHeader, SegmentHeader, KV_ALIGN, RECORD_HEADER_BYTES,
};
use sluice_formats::kv_summary::{SegmentSummary, SummaryEntry};

use super::{sealed_marker, summary_path, write_summary, SsdLoc, SsdTier};
use crate::error::KvError;
use crate::namespace::Fingerprint;
use crate::segment_io::SegmentFile;

/// A record found in a segment.
struct Found {
    loc: SsdLoc,
    entry: SummaryEntry,
}

pub(crate) fn recover(tier: &mut SsdTier) -> Result<(), KvError> {
    let dir = Arc::clone(tier.dir());
    let mut ids = dir.list().map_err(KvError::io(tier.root().clone()))?;
    ids.sort_unstable();
    let mut found = Vec::new();
    for id in ids {
        let path = dir.path_of(id);
        let Ok(id32) = u32::try_from(id) else {
            tracing::warn!("{}: segment id out of range, ignored", path.display());
            continue;
        };
        let file = match dir.open(id) {
            Ok(f) => f,
            Err(e) if sluice_engine::is_not_regular(&e) => {
                tracing::warn!("{}: {e}; ignored (not a segment)", path.display());
                continue;
            }
            Err(e) => return Err(KvError::Io { path, source: e }),
        };
        let len = dir.len(id).map_err(KvError::io(&path))?;
        let damage = match read_segment_header(&*file) {
            Ok(h) if h.segment_id != id => Some(format!(
                "its header names segment {} (a copy of another segment's file)",
                h.segment_id
            )),
            Ok(h) => {
                check_header(tier, &h, &path)?;
                None
            }
            Err(reason) => Some(reason),
        };
        if let Some(reason) = damage {
            tracing::warn!("{}: {reason}; removing the segment", path.display());
            drop(file);
            let _ = dir.remove(id);
            let _ = std::fs::remove_file(sealed_marker(&path));
            let _ = std::fs::remove_file(summary_path(&path));
            continue;
        }
        let sealed = sealed_marker(&path).exists();
        let used = match sealed.then(|| read_summary(tier, &path, id)).flatten() {
            Some(summary) => {
                tier.counters.summaries_read += 1;
                from_summary(tier, summary, id32, len, &path, &mut found)
            }
            None => {
                let mut here = Vec::new();
                let used = scan_segment(tier, &*file, id32, len, sealed, &mut here)?;
                summarize_scanned(tier, &*file, &path, id, sealed, &here);
                found.extend(here);
                used
            }
        };
        tier.add_recovered_segment(id32, file, used);
    }
    found.sort_unstable_by_key(|f| f.entry.seq);
    for f in found {
        let fp = Fingerprint::of(&f.entry.namespace_id, &f.entry.key);
        tier.add_recovered_block(fp, f.loc, f.entry.seq);
    }
    if tier.counters.torn_slots_skipped > 0 {
        tracing::warn!(
            "{}: {} slot(s) held no valid record (torn or unfinished writes) and were skipped",
            tier.root().display(),
            tier.counters.torn_slots_skipped
        );
    }
    Ok(())
}

fn read_segment_header(file: &dyn SegmentFile) -> Result<SegmentHeader, String> {
    let mut buf = AlignedBuf::new(KV_ALIGN).map_err(|e| e.to_string())?;
    let n = file
        .read_vectored_at(&mut [IoSliceMut::new(buf.as_mut_slice())], 0)
        .map_err(|e| format!("cannot read its header: {e}"))?;
    if n < KV_ALIGN {
        return Err(format!("header is {n} bytes long"));
    }
    SegmentHeader::decode(buf.as_slice()).map_err(|e| e.to_string())
}

fn check_header(tier: &SsdTier, h: &SegmentHeader, path: &std::path::Path) -> Result<(), KvError> {
    if h.store_id != tier.store_id() {
        return Err(KvError::Incompatible {
            path: path.to_path_buf(),
            detail: "segment belongs to another store (its store id differs)".into(),
        });
    }
    if h.block_bytes != tier.block_bytes() {
        return Err(KvError::Incompatible {
            path: path.to_path_buf(),
            detail: format!(
                "segment holds {}-byte blocks, the store {}",
                h.block_bytes,
                tier.block_bytes()
            ),
        });
    }
    Ok(())
}

/// Scans the record slots of one segment; returns the number of slots in use (header
/// included).
fn scan_segment(
    tier: &mut SsdTier,
    file: &dyn SegmentFile,
    id: u32,
    len: u64,
    sealed: bool,
    found: &mut Vec<Found>,
) -> Result<u32, KvError> {
    let slot_bytes = tier.slot_bytes();
    let slots = len
        .div_ceil(slot_bytes)
        .min(tier.slots_per_segment() as u64) as u32;
    let read_len = if sealed {
        RECORD_HEADER_BYTES as u64
    } else {
        slot_bytes
    };
    let mut buf = AlignedBuf::new(read_len as usize).map_err(KvError::io(tier.root().clone()))?;
    let mut used = 1;
    for slot in 1..slots {
        let at = slot as u64 * slot_bytes;
        let ok = file.read_vectored_at(&mut [IoSliceMut::new(buf.as_mut_slice())], at);
        let Ok(n) = ok else {
            tier.counters.torn_slots_skipped += 1;
            continue;
        };
        let bytes = &buf.as_slice()[..n];
        let Ok(h) = RecordHeader::decode(bytes) else {
            if bytes.iter().any(|b| *b != 0) {
                tier.counters.torn_slots_skipped += 1;
            }
            continue;
        };
        used = slot + 1;
        if h.payload_len != tier.block_bytes() || (!sealed && !payload_ok(bytes, &h)) {
            tier.counters.torn_slots_skipped += 1;
            continue;
        }
        found.push(Found {
            loc: SsdLoc { segment: id, slot },
            entry: SummaryEntry {
                slot,
                seq: h.seq,
                namespace_id: h.namespace_id,
                key: h.key,
            },
        });
    }
    Ok(used)
}

/// The summary of segment `id` at `path`, if it is there and describes this segment.
fn read_summary(tier: &SsdTier, path: &std::path::Path, id: u64) -> Option<SegmentSummary> {
    let read = super::read_summary(path, tier.store_id(), id, tier.block_bytes())?;
    let slots = tier.slots_per_segment();
    let why = match read {
        Ok(s) if s.entries.iter().all(|e| e.slot >= 1 && e.slot < slots) => return Some(s),
        Ok(_) => "describes another segment".to_string(),
        Err(why) => why,
    };
    let file = summary_path(path);
    tracing::warn!("{}: {why}; scanning the segment instead", file.display());
    None
}

/// A summary's records that the segment file still holds; the slots in use (header
/// included). A record the summary lists past the end of a truncated file is gone: it is
/// counted as a skipped slot, so lookups never count it.
fn from_summary(
    tier: &mut SsdTier,
    summary: SegmentSummary,
    id: u32,
    len: u64,
    path: &std::path::Path,
    found: &mut Vec<Found>,
) -> u32 {
    let mut used = 1;
    let (slot_bytes, block_bytes) = (tier.slot_bytes(), tier.block_bytes());
    let listed = summary.entries.len();
    let mut lost = 0;
    for entry in summary.entries {
        used = used.max(entry.slot + 1);
        if !super::record_fits(entry.slot, slot_bytes, block_bytes, len) {
            lost += 1;
            continue;
        }
        found.push(Found {
            loc: SsdLoc {
                segment: id,
                slot: entry.slot,
            },
            entry,
        });
    }
    if lost > 0 {
        tracing::warn!(
            "{}: the file ends at {len} bytes, before {lost} of the {listed} records its summary lists; those blocks are gone",
            path.display()
        );
        tier.counters.torn_slots_skipped += lost;
    }
    used
}

/// After a scan, writes the segment's summary; a segment left unsealed by a crash is
/// synced and sealed first (nothing appends to a recovered segment).
fn summarize_scanned(
    tier: &SsdTier,
    file: &dyn SegmentFile,
    path: &std::path::Path,
    id: u64,
    sealed: bool,
    found: &[Found],
) {
    if !sealed {
        if let Err(e) = file.sync() {
            tracing::debug!("{}: cannot sync a recovered segment: {e}", path.display());
            return;
        }
    }
    let summary = SegmentSummary {
        store_id: tier.store_id(),
        segment_id: id,
        block_bytes: tier.block_bytes(),
        entries: found.iter().map(|f| f.entry.clone()).collect(),
    };
    write_summary(path, &summary);
    if !sealed {
        let _ = std::fs::write(sealed_marker(path), b"");
    }
}

fn payload_ok(slot: &[u8], h: &RecordHeader) -> bool {
    let end = RECORD_HEADER_BYTES as u64 + h.payload_len;
    slot.get(RECORD_HEADER_BYTES..end as usize)
        .is_some_and(|p| payload_checksum(p) == h.payload_checksum)
}
