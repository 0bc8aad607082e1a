//! `sluice kv fsck`: read every record of a closed store and verify it.
//!
//! Recovery at open trusts the payloads of sealed segments (a read verifies them later);
//! fsck reads all of them. With `repair`, a record that fails verification has its header
//! slot zeroed, so later opens skip it, and a segment whose header is damaged is removed.
//! It takes the store's lock, so it never runs beside an engine using the store.

use std::collections::HashMap;
use std::io::IoSliceMut;
use std::path::{Path, PathBuf};

use serde::Serialize;
use sluice_engine::AlignedBuf;
use sluice_formats::kv::{
    payload_checksum, slot_bytes, RecordHeader, SegmentHeader, KV_ALIGN, RECORD_HEADER_BYTES,
};
use sluice_formats::kv_summary::SegmentSummary;

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
    /// How the store was held while it was checked: "exclusive" (repair), "shared
    /// (read-only)", or "none: <why>" where the lock file could not be read.
    pub lock: String,
    pub problems: Vec<FsckProblem>,
}

/// Verifies every block of the store at `root`; with `repair`, drops the bad ones.
///
/// Besides every record's own checks, each segment is held to what it says it holds: its
/// header must name the segment its file is named for (a segment overwritten by a copy of
/// another names that other one), a record must not be a copy of one seen elsewhere (same
/// key and sequence number), and every record its summary lists must still be there. A
/// listed record that is gone (past the end of a truncated file, an empty slot, another
/// record in its place) is a lost block, counted as bad.
///
/// Without `repair` nothing is written: the store's lock is taken shared on a read-only
/// descriptor ([`manifest::lock_shared`]) and every segment is opened read-only, so a
/// read-only file system or a user who may only read the store can check it. `repair`
/// takes the owner's lock and writes.
pub fn fsck(root: &Path, repair: bool) -> Result<FsckReport, KvError> {
    let m = read_manifest(root)?;
    let (_exclusive, lock) = match repair {
        true => (Some(manifest::lock(root)?), "exclusive".to_string()),
        false => (None, manifest::lock_shared(root)?.describe()),
    };
    let (dir, ids, slot) = segments(root, &m, repair)?;
    let mut report = FsckReport {
        repaired: repair,
        lock,
        ..FsckReport::default()
    };
    let mut check = Checker {
        manifest: &m,
        slot,
        repair,
        buf: AlignedBuf::new(slot as usize).map_err(KvError::io(root))?,
        seen: HashMap::new(),
    };
    for id in ids {
        report.segments += 1;
        check.segment(&dir, id, &mut report)?;
    }
    Ok(report)
}

/// What one fsck run carries from segment to segment.
struct Checker<'a> {
    manifest: &'a manifest::Manifest,
    slot: u64,
    repair: bool,
    buf: AlignedBuf,
    /// Every verified record so far, by (fingerprint of namespace and key, sequence
    /// number): a second record with both is a copy, not a block of its own.
    seen: HashMap<(u64, u64), (u64, u64)>,
}

/// What one slot of a segment holds.
enum SlotCheck {
    Empty,
    Good(RecordHeader),
    Bad,
}

impl Checker<'_> {
    fn segment(
        &mut self,
        dir: &FsSegmentDir,
        id: u64,
        report: &mut FsckReport,
    ) -> Result<(), KvError> {
        let path = dir.path_of(id);
        let file = dir.open(id).map_err(KvError::io(&path))?;
        let len = dir.len(id).map_err(KvError::io(&path))?;
        let m = self.manifest;
        let store_id = m.store_id_bytes().unwrap_or_default();
        let summary =
            crate::ssd_tier::read_summary(&path, store_id, id, m.block_bytes).and_then(Result::ok);
        if let Err(detail) = check_segment_header(&*file, m, id, &mut self.buf) {
            report.bad_segments += 1;
            report.problems.push(problem(&path, None, detail));
            if let Some(s) = summary.filter(|s| !s.entries.is_empty()) {
                let n = s.entries.len() as u64;
                report.bad_blocks += n;
                let detail = format!("{n} blocks its summary lists are lost with it");
                report.problems.push(problem(&path, None, detail));
            }
            if self.repair {
                drop(file);
                dir.remove(id).map_err(KvError::io(&path))?;
                remove_companions(&path);
            }
            return Ok(());
        }
        let mut good = HashMap::new();
        let mut bad_slots = std::collections::HashSet::new();
        for s in 1..len.div_ceil(self.slot) {
            match self.slot_check(&*file, &path, id, s, report)? {
                SlotCheck::Good(h) => {
                    good.insert(s, h);
                }
                SlotCheck::Bad => {
                    bad_slots.insert(s);
                }
                SlotCheck::Empty => {}
            }
        }
        let lost = summary.map_or(0, |summary| {
            self.lost(&path, len, &summary, &good, &bad_slots, report)
        });
        if self.repair && (lost > 0 || !bad_slots.is_empty()) {
            // The summary lists what is gone: without it, the next open scans the segment.
            let _ = std::fs::remove_file(crate::ssd_tier::summary_path(&path));
        }
        Ok(())
    }

    /// Checks slot `s`; a bad record is reported (and, with repair, its header zeroed).
    fn slot_check(
        &mut self,
        file: &dyn SegmentFile,
        path: &Path,
        id: u64,
        s: u64,
        report: &mut FsckReport,
    ) -> Result<SlotCheck, KvError> {
        let detail = match read_record(file, s * self.slot, &mut self.buf) {
            Ok(None) => return Ok(SlotCheck::Empty),
            Ok(Some(h)) => {
                let fp = crate::namespace::Fingerprint::of(&h.namespace_id, &h.key).0;
                match self.seen.get(&(fp, h.seq)) {
                    None => {
                        self.seen.insert((fp, h.seq), (id, s));
                        report.good_blocks += 1;
                        report.bytes_verified += h.payload_len;
                        return Ok(SlotCheck::Good(h));
                    }
                    Some((seg, slot)) => format!(
                        "a copy of the record in segment {seg} slot {slot} (same key and sequence number)"
                    ),
                }
            }
            Err(detail) => detail,
        };
        report.bad_blocks += 1;
        report.problems.push(problem(path, Some(s), detail));
        if self.repair {
            zero_header(file, path, s * self.slot)?;
        }
        Ok(SlotCheck::Bad)
    }

    /// Reports every record the summary lists that the file no longer holds; returns how
    /// many. A slot already reported bad is not counted twice.
    fn lost(
        &self,
        path: &Path,
        len: u64,
        summary: &SegmentSummary,
        good: &HashMap<u64, RecordHeader>,
        bad_slots: &std::collections::HashSet<u64>,
        report: &mut FsckReport,
    ) -> u64 {
        let mut lost = 0;
        for e in &summary.entries {
            let s = e.slot as u64;
            if bad_slots.contains(&s) {
                continue;
            }
            let why = match good.get(&s) {
                Some(h) if h.key == e.key && h.namespace_id == e.namespace_id && h.seq == e.seq => {
                    continue
                }
                Some(_) => "another record is in its place".to_string(),
                None if s * self.slot >= len => {
                    format!("the file ends at {len} bytes, before this slot")
                }
                None => "the slot is empty".to_string(),
            };
            lost += 1;
            report.bad_blocks += 1;
            let detail = format!("lost: the segment's summary lists a block here, but {why}");
            report.problems.push(problem(path, Some(s), detail));
        }
        lost
    }
}

fn problem(segment: &Path, slot: Option<u64>, detail: String) -> FsckProblem {
    FsckProblem {
        segment: segment.to_path_buf(),
        slot,
        detail,
    }
}

/// Removes a segment's marker and summary (its file is gone).
fn remove_companions(path: &Path) {
    let _ = std::fs::remove_file(crate::ssd_tier::sealed_marker(path));
    let _ = std::fs::remove_file(crate::ssd_tier::summary_path(path));
}

fn check_segment_header(
    file: &dyn SegmentFile,
    m: &manifest::Manifest,
    id: u64,
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
    if h.segment_id != id {
        return Err(format!(
            "its header names segment {} (a copy of another segment's file)",
            h.segment_id
        ));
    }
    Ok(())
}

/// Reads and verifies the record at `at`: `None` for an unused slot, `Err` with what is
/// wrong.
fn read_record(
    file: &dyn SegmentFile,
    at: u64,
    buf: &mut AlignedBuf,
) -> Result<Option<RecordHeader>, String> {
    let n = file
        .read_vectored_at(&mut [IoSliceMut::new(buf.as_mut_slice())], at)
        .map_err(|e| format!("read failed: {e}"))?;
    let bytes = &buf.as_slice()[..n];
    let h = match RecordHeader::decode(bytes) {
        Ok(h) => h,
        Err(_) if bytes.iter().take(RECORD_HEADER_BYTES).all(|x| *x == 0) => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let end = RECORD_HEADER_BYTES as u64 + h.payload_len;
    match bytes.get(RECORD_HEADER_BYTES..end as usize) {
        None => Err(format!(
            "the record is cut short: {} of its {end} bytes are in the file",
            n
        )),
        Some(p) if payload_checksum(p) != h.payload_checksum => {
            Err("payload checksum does not match".into())
        }
        Some(_) => Ok(Some(h)),
    }
}

/// Zeroes a bad record's header so that later opens skip the slot.
fn zero_header(file: &dyn SegmentFile, path: &Path, at: u64) -> Result<(), KvError> {
    // The segment's summary would still list this record: the caller removes it, so the
    // next open scans the segment and finds the slot empty.
    let zeros = AlignedBuf::new(RECORD_HEADER_BYTES).map_err(KvError::io(path))?;
    file.write_all_at(zeros.as_slice(), at)
        .and_then(|()| file.sync())
        .map_err(KvError::io(path))
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
pub fn store_summary(root: &Path) -> Result<StoreSummary, KvError> {
    let m = read_manifest(root)?;
    let (dir, ids, slot) = segments(root, &m, false)?;
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
        if check_segment_header(&*file, &m, id, &mut buf).is_err() {
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
    manifest::read_manifest(root)
}

/// The store's segment directory (opened for writing only with `write`), its segment ids
/// in order, and its slot size.
fn segments(
    root: &Path,
    m: &manifest::Manifest,
    write: bool,
) -> Result<(FsSegmentDir, Vec<u64>, u64), KvError> {
    let seg_root = root.join("segments");
    let dir = match write {
        true => FsSegmentDir::new(&seg_root, DirectIo::Auto),
        false => FsSegmentDir::read_only(&seg_root, DirectIo::Auto),
    };
    let mut ids = dir.list().map_err(KvError::io(&seg_root))?;
    ids.sort_unstable();
    let slot = slot_bytes(m.block_bytes).ok_or_else(|| KvError::Incompatible {
        path: root.to_path_buf(),
        detail: format!("block_bytes {} is too large", m.block_bytes),
    })?;
    Ok((dir, ids, slot))
}
