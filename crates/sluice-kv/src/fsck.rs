//! `sluice kv fsck`: read every record of a closed store and verify it.
//!
//! Recovery at open trusts the payloads of sealed segments (a read verifies them later);
//! fsck reads all of them. With `repair`, a record that fails verification has its header
//! slot zeroed, so later opens skip it, and a segment whose header is damaged is removed.
//! It takes the store's lock, so it never runs beside an engine using the store.

use std::io::IoSliceMut;
use std::path::{Path, PathBuf};

use serde::Serialize;
use sluice_engine::AlignedBuf;
use sluice_formats::kv::{
    payload_checksum, slot_bytes, RecordHeader, SegmentHeader, KV_ALIGN, RECORD_HEADER_BYTES,
};

use crate::config::DirectIo;
use crate::error::KvError;
use crate::manifest;
use crate::segment_io::{FsSegmentDir, SegmentDir, SegmentFile};

/// One bad record or segment.
#[derive(Debug, Clone, Serialize)]
pub struct FsckProblem {
    pub segment: PathBuf,
    /// The slot (None: the segment header).
    pub slot: Option<u64>,
    pub detail: String,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct FsckReport {
    pub segments: u64,
    pub good_blocks: u64,
    pub bad_blocks: u64,
    pub bad_segments: u64,
    pub bytes_verified: u64,
    pub repaired: bool,
    pub problems: Vec<FsckProblem>,
}

/// Verifies every block of the store at `root`; with `repair`, drops the bad ones.
pub fn fsck(root: &Path, repair: bool) -> Result<FsckReport, KvError> {
    let m = read_manifest(root)?;
    let _owner = manifest::lock(root)?;
    let (dir, ids, slot) = segments(root, &m)?;
    let mut report = FsckReport {
        repaired: repair,
        ..FsckReport::default()
    };
    let mut buf = AlignedBuf::new(slot as usize).map_err(KvError::io(root))?;
    for id in ids {
        let path = dir.path_of(id);
        let file = dir.open(id).map_err(KvError::io(&path))?;
        let len = dir.len(id).map_err(KvError::io(&path))?;
        report.segments += 1;
        if let Err(detail) = check_segment_header(&*file, &m, &mut buf) {
            report.bad_segments += 1;
            report.problems.push(FsckProblem {
                segment: path.clone(),
                slot: None,
                detail,
            });
            if repair {
                drop(file);
                dir.remove(id).map_err(KvError::io(&path))?;
                let _ = std::fs::remove_file(crate::ssd_tier::summary_path(&path));
            }
            continue;
        }
        for s in 1..len / slot {
            check_slot(&*file, &path, s, slot, &mut buf, repair, &mut report)?;
        }
    }
    Ok(report)
}

fn check_segment_header(
    file: &dyn SegmentFile,
    m: &manifest::Manifest,
    buf: &mut AlignedBuf,
) -> Result<(), String> {
    let head = &mut buf.as_mut_slice()[..KV_ALIGN];
    let n = file
        .read_vectored_at(&mut [IoSliceMut::new(head)], 0)
        .map_err(|e| format!("cannot read the segment header: {e}"))?;
    let h = SegmentHeader::decode(&buf.as_slice()[..n]).map_err(|e| e.to_string())?;
    if Some(h.store_id) != m.store_id_bytes() || h.block_bytes != m.block_bytes {
        return Err("segment belongs to another store or block size".into());
    }
    Ok(())
}

fn check_slot(
    file: &dyn SegmentFile,
    path: &Path,
    s: u64,
    slot: u64,
    buf: &mut AlignedBuf,
    repair: bool,
    report: &mut FsckReport,
) -> Result<(), KvError> {
    let n = match file.read_vectored_at(&mut [IoSliceMut::new(buf.as_mut_slice())], s * slot) {
        Ok(n) => n,
        Err(e) => {
            return bad(
                file,
                path,
                s,
                slot,
                format!("read failed: {e}"),
                repair,
                report,
            );
        }
    };
    let bytes = &buf.as_slice()[..n];
    let h = match RecordHeader::decode(bytes) {
        Ok(h) => h,
        Err(_)
            if bytes
                .get(..RECORD_HEADER_BYTES)
                .is_some_and(|b| b.iter().all(|x| *x == 0)) =>
        {
            return Ok(()); // an unused slot
        }
        Err(e) => return bad(file, path, s, slot, e.to_string(), repair, report),
    };
    let end = RECORD_HEADER_BYTES as u64 + h.payload_len;
    let ok = bytes
        .get(RECORD_HEADER_BYTES..end as usize)
        .is_some_and(|p| payload_checksum(p) == h.payload_checksum);
    if !ok {
        let detail = "payload checksum does not match".to_string();
        return bad(file, path, s, slot, detail, repair, report);
    }
    report.good_blocks += 1;
    report.bytes_verified += h.payload_len;
    Ok(())
}

fn bad(
    file: &dyn SegmentFile,
    path: &Path,
    s: u64,
    slot: u64,
    detail: String,
    repair: bool,
    report: &mut FsckReport,
) -> Result<(), KvError> {
    report.bad_blocks += 1;
    report.problems.push(FsckProblem {
        segment: path.to_path_buf(),
        slot: Some(s),
        detail,
    });
    if repair {
        // The segment's summary would still list this record: without it, the next open
        // scans the segment and finds the slot empty.
        let _ = std::fs::remove_file(crate::ssd_tier::summary_path(path));
        let zeros = AlignedBuf::new(RECORD_HEADER_BYTES).map_err(KvError::io(path))?;
        file.write_all_at(zeros.as_slice(), s * slot)
            .and_then(|()| file.sync())
            .map_err(KvError::io(path))?;
    }
    Ok(())
}

/// What `sluice kv stats PATH` shows of a store on disk: its manifest and what its
/// segment files hold, from the record headers alone (no payload is read).
#[derive(Debug, Clone, Default, Serialize)]
pub struct StoreSummary {
    pub path: PathBuf,
    pub store_id: String,
    pub block_bytes: u64,
    pub slot_bytes: u64,
    pub segments: u64,
    pub sealed_segments: u64,
    /// Bytes of segment files on disk.
    pub segment_bytes: u64,
    /// Records whose header decodes.
    pub records: u64,
    /// Distinct blocks (a block compaction copied counts once).
    pub blocks: u64,
    /// Payload bytes of the distinct blocks.
    pub block_bytes_total: u64,
    /// Slots holding no record, or a torn or damaged header.
    pub empty_or_torn_slots: u64,
    /// Segments whose header is damaged or belongs to another store.
    pub bad_segments: u64,
    /// Distinct blocks per namespace id (hex): stores shared by models or TP ranks.
    pub namespaces: std::collections::BTreeMap<String, u64>,
}

/// Summarises the store at `root` from its manifest and record headers. Reads only; it
/// does not take the store's lock, so it also describes a store an engine has open
/// (as of the moment each segment is read).
pub fn summary(root: &Path) -> Result<StoreSummary, KvError> {
    let m = read_manifest(root)?;
    let (dir, ids, slot) = segments(root, &m)?;
    let mut out = StoreSummary {
        path: root.to_path_buf(),
        store_id: m.store_id.clone(),
        block_bytes: m.block_bytes,
        slot_bytes: slot,
        ..StoreSummary::default()
    };
    let mut seen = std::collections::HashSet::new();
    let mut buf = AlignedBuf::new(RECORD_HEADER_BYTES.max(KV_ALIGN)).map_err(KvError::io(root))?;
    for id in ids {
        let path = dir.path_of(id);
        let file = dir.open(id).map_err(KvError::io(&path))?;
        let len = dir.len(id).map_err(KvError::io(&path))?;
        out.segments += 1;
        out.segment_bytes += len;
        if check_segment_header(&*file, &m, &mut buf).is_err() {
            out.bad_segments += 1;
            continue;
        }
        if crate::ssd_tier::sealed_marker(&path).exists() {
            out.sealed_segments += 1;
        }
        for s in 1..len / slot {
            let head = &mut buf.as_mut_slice()[..RECORD_HEADER_BYTES];
            let n = file
                .read_vectored_at(&mut [IoSliceMut::new(head)], s * slot)
                .unwrap_or(0);
            let Ok(h) = RecordHeader::decode(&buf.as_slice()[..n]) else {
                out.empty_or_torn_slots += 1;
                continue;
            };
            out.records += 1;
            let fp = crate::namespace::Fingerprint::of(&h.namespace_id, &h.key);
            if seen.insert((fp, h.namespace_id)) {
                out.blocks += 1;
                out.block_bytes_total += h.payload_len;
                let ns: String = h.namespace_id.iter().map(|b| format!("{b:02x}")).collect();
                *out.namespaces.entry(ns).or_default() += 1;
            }
        }
    }
    Ok(out)
}

/// The manifest of an existing store: a missing directory is an I/O error naming it, a
/// directory without a manifest is not a store.
fn read_manifest(root: &Path) -> Result<manifest::Manifest, KvError> {
    std::fs::metadata(root).map_err(KvError::io(root))?;
    let path = root.join(manifest::MANIFEST_NAME);
    if !path.exists() {
        return Err(KvError::Incompatible {
            path: root.to_path_buf(),
            detail: format!("not a sluice kv store (no {})", manifest::MANIFEST_NAME),
        });
    }
    manifest::read(root)
}

/// The store's segment directory, its segment ids in order, and its slot size.
fn segments(root: &Path, m: &manifest::Manifest) -> Result<(FsSegmentDir, Vec<u64>, u64), KvError> {
    let seg_root = root.join("segments");
    let dir = FsSegmentDir::new(&seg_root, DirectIo::Auto);
    let mut ids = dir.list().map_err(KvError::io(&seg_root))?;
    ids.sort_unstable();
    let slot = slot_bytes(m.block_bytes).ok_or_else(|| KvError::Incompatible {
        path: root.to_path_buf(),
        detail: format!("block_bytes {} is too large", m.block_bytes),
    })?;
    Ok((dir, ids, slot))
}
