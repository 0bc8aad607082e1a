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
    let m = manifest::read(root)?;
    let _owner = manifest::lock(root)?;
    let seg_root = root.join("segments");
    let dir = FsSegmentDir::new(&seg_root, DirectIo::Auto);
    let mut ids = dir.list().map_err(KvError::io(&seg_root))?;
    ids.sort_unstable();
    let slot = slot_bytes(m.block_bytes).ok_or_else(|| KvError::Incompatible {
        path: root.to_path_buf(),
        detail: format!("block_bytes {} is too large", m.block_bytes),
    })?;
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
        let zeros = AlignedBuf::new(RECORD_HEADER_BYTES).map_err(KvError::io(path))?;
        file.write_all_at(zeros.as_slice(), s * slot)
            .and_then(|()| file.sync())
            .map_err(KvError::io(path))?;
    }
    Ok(())
}
