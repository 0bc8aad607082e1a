//! The SSD tier: a log-structured store of fixed-size slots in segment files.
//!
//! Moving parts:
//! - **Segments** ([`crate::segment_io`]): files of `slots_per_segment` slots; slot 0 is
//!   the segment header, every other slot one block record (sluice-formats `kv`). One
//!   segment is open for appends at a time; a put reserves the next slot under the lock and
//!   writes it outside, so writes of one batch run in parallel. A full segment is sealed
//!   (synced, then a `.sealed` marker written) once its last write is done.
//! - **The index**: fingerprint → (segment, slot), 8 bytes of value per block. An entry is
//!   published only after its record is written (and synced, in batch durability), so a
//!   lookup never finds a block whose bytes are not there yet.
//! - **The policy** (`sluice-policy`, by name) sees one access per put and per hit, the
//!   same sequence `sluice sim` would feed it. A block it evicts leaves the index at once;
//!   its slot becomes dead space.
//! - **Reclamation**: when segment files pass the high watermark of the budget, whole dead
//!   segments are dropped and the segment with the least live data is compacted (its live
//!   records re-appended, then the file removed), until usage is under the low watermark.
//!   Readers hold the segment's file handle, so a segment removed under a read still reads
//!   its old bytes: a read can be late, never torn.
//! - **Recovery**: at open every segment's records are scanned slot by slot. A slot whose
//!   header does not verify (a write that never finished, a torn tail) is skipped, not the
//!   end of the segment, since concurrent appends can leave holes. Segments without a
//!   `.sealed` marker were being written at the crash, so their payloads are verified too.

use std::collections::HashMap;
use std::io::IoSliceMut;
use std::path::PathBuf;
use std::sync::Arc;

use sluice_engine::AlignedBuf;
use sluice_formats::kv::{
    payload_checksum, RecordHeader, SegmentHeader, KV_ALIGN, RECORD_HEADER_BYTES,
};
use sluice_formats::kv_summary::{SegmentSummary, SummaryEntry};
use sluice_policy::{Access, Evicted, Policy, PolicyConfig, Request};

use crate::config::KvConfig;
use crate::error::KvError;
use crate::namespace::{fp_map, Fingerprint, FpMap};
use crate::segment_io::{SegmentDir, SegmentFile};
pub use crate::stats::SsdCounters;
use crate::stats::TierStats;

mod compaction;
mod delete;
mod recovery;
pub(crate) use compaction::reclaim_unlocked;

/// Where a block's record lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SsdLoc {
    pub segment: u32,
    pub slot: u32,
}

/// One segment file and its occupancy.
pub(crate) struct Segment {
    file: Arc<dyn SegmentFile>,
    /// Next free slot (slot 0 is the header).
    next_slot: u32,
    /// Slots whose writes are reserved but not finished.
    pending: u32,
    /// Index entries pointing here.
    live: u32,
    sealed: bool,
    /// Records written here so far (until sealed): the segment's summary.
    records: Vec<SummaryEntry>,
    /// Its records are being moved out (by a compaction running without the lock).
    compacting: bool,
    /// When the segment was created (an open shared segment is sealed after a while, so
    /// that other stores see its blocks).
    opened: std::time::Instant,
}

/// A reserved slot: write the record, then [`SsdTier::publish`] or [`SsdTier::abandon`].
pub struct Reservation {
    pub fp: Fingerprint,
    pub loc: SsdLoc,
    pub file: Arc<dyn SegmentFile>,
    pub seq: u64,
    /// The block's namespace and key, for the segment's summary.
    pub namespace_id: [u8; 16],
    pub key: Vec<u8>,
}

/// What a put into the SSD tier decided.
pub enum SsdPut {
    Present,
    Reserved(Reservation),
    Declined,
    /// No space even after reclaiming (the budget is all live or pinned data).
    Full,
    /// A new segment was needed and could not be created (ENOSPC, EIO): a write error.
    Failed,
}

/// Why no slot could be reserved.
enum NoSlot {
    Full,
    Failed,
}

pub struct SsdTier {
    dir: Arc<dyn SegmentDir>,
    root: PathBuf,
    store_id: [u8; 16],
    block_bytes: u64,
    slot_bytes: u64,
    slots_per_segment: u32,
    /// The budget the store was given (`ssd_bytes`): `capacity_blocks` blocks.
    budget_bytes: u64,
    capacity_blocks: u64,
    /// The most bytes of segment files: the budget plus the on-disk overhead
    /// ([`KvConfig::ssd_disk_bytes_limit`]). Every space check below is against this.
    disk_limit: u64,
    high_bytes: u64,
    low_bytes: u64,
    segments: HashMap<u32, Segment>,
    active: Option<u32>,
    next_segment: u32,
    next_seq: u64,
    index: FpMap<SsdLoc>,
    policy: Box<dyn Policy + Send>,
    evicted: Vec<Evicted>,
    counters: SsdCounters,
    /// Segment creations failed in a row (a full disk fails every put's try: logged at
    /// the first, then every [`CREATE_FAILURES_LOGGED_EVERY`]th, then when it works again).
    create_failures: u64,
    /// Why the last segment creation failed (errno), for a write-back `sync()` to report.
    create_errno: Option<i32>,
}

/// See [`SsdTier::create_failures`].
const CREATE_FAILURES_LOGGED_EVERY: u64 = 1000;

impl SsdTier {
    /// Opens the tier over `dir`, recovering every block its segments hold.
    pub fn open(
        dir: Arc<dyn SegmentDir>,
        root: PathBuf,
        store_id: [u8; 16],
        config: &KvConfig,
    ) -> Result<SsdTier, KvError> {
        let slot_bytes = config.slot_bytes();
        let spp = config.slots_per_segment();
        let seg_bytes = spp * slot_bytes;
        let capacity = config.ssd_policy_capacity();
        if capacity < slot_bytes {
            return Err(KvError::config(
                "ssd_bytes",
                config.ssd_bytes,
                format!("must hold a block of {} bytes", config.block_bytes),
            ));
        }
        let policy = build_policy(&config.ssd_policy, capacity)?;
        let max_blocks = (capacity / slot_bytes) as usize;
        let disk_limit = config.ssd_disk_bytes_limit();
        debug_assert_eq!(disk_limit % seg_bytes, 0);
        let mut tier = SsdTier {
            dir,
            root,
            store_id,
            block_bytes: config.block_bytes,
            slot_bytes,
            slots_per_segment: spp as u32,
            budget_bytes: config.ssd_bytes,
            disk_limit,
            capacity_blocks: config.ssd_blocks(),
            high_bytes: (disk_limit as f64 * config.high_watermark) as u64,
            low_bytes: (disk_limit as f64 * config.low_watermark) as u64,
            segments: HashMap::new(),
            active: None,
            next_segment: 1,
            next_seq: 1,
            index: fp_map(max_blocks),
            policy,
            evicted: Vec::new(),
            counters: SsdCounters::default(),
            create_failures: 0,
            create_errno: None,
        };
        recovery::recover(&mut tier)?;
        Ok(tier)
    }

    pub(crate) fn dir(&self) -> &Arc<dyn SegmentDir> {
        &self.dir
    }
    pub(crate) fn store_id(&self) -> [u8; 16] {
        self.store_id
    }
    pub fn block_bytes(&self) -> u64 {
        self.block_bytes
    }
    pub fn slot_bytes(&self) -> u64 {
        self.slot_bytes
    }
    pub(crate) fn slots_per_segment(&self) -> u32 {
        self.slots_per_segment
    }

    /// Adds a recovered segment (not appendable: new writes go to a fresh segment).
    pub(crate) fn add_recovered_segment(&mut self, id: u32, file: Arc<dyn SegmentFile>, used: u32) {
        self.segments.insert(
            id,
            Segment {
                file,
                next_slot: used,
                pending: 0,
                live: 0,
                sealed: true,
                records: Vec::new(),
                compacting: false,
                opened: std::time::Instant::now(),
            },
        );
        self.next_segment = self.next_segment.max(id + 1);
    }

    /// Re-admits a recovered block through the policy, newest records last.
    pub(crate) fn add_recovered_block(&mut self, fp: Fingerprint, loc: SsdLoc, seq: u64) {
        self.next_seq = self.next_seq.max(seq + 1);
        if let Some(old) = self.index.get(&fp).copied() {
            // A key written twice (re-put after eviction): the newer record wins.
            self.dec_live(old);
            self.index.insert(fp, loc);
            self.inc_live(loc);
            return;
        }
        let access = self.policy.access(&self.request(fp), &mut self.evicted);
        self.apply_evictions();
        if matches!(access, Access::Miss { admitted: true } | Access::Hit) {
            self.index.insert(fp, loc);
            self.inc_live(loc);
            self.counters.recovered_blocks += 1;
        }
    }

    fn request(&self, fp: Fingerprint) -> Request {
        Request::new(fp.0, self.slot_bytes)
    }

    pub fn contains(&self, fp: Fingerprint) -> bool {
        self.index.contains_key(&fp)
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// The location and file of `fp`, for a read outside the lock.
    pub fn locate(&self, fp: Fingerprint) -> Option<(SsdLoc, Arc<dyn SegmentFile>)> {
        let loc = *self.index.get(&fp)?;
        let seg = self.segments.get(&loc.segment)?;
        Some((loc, Arc::clone(&seg.file)))
    }

    /// Counts a hit with the policy.
    pub fn touch(&mut self, fp: Fingerprint) {
        if !self.index.contains_key(&fp) {
            return; // evicted or dropped since it was read: a touch must not re-admit it
        }
        let req = self.request(fp);
        self.policy.access(&req, &mut self.evicted);
        self.apply_evictions();
    }

    /// Offers a new block to the policy and reserves a slot for it when admitted.
    pub fn put(&mut self, fp: Fingerprint, namespace_id: &[u8; 16], key: &[u8]) -> SsdPut {
        if self.index.contains_key(&fp) {
            self.touch(fp);
            return SsdPut::Present;
        }
        let access = self.policy.access(&self.request(fp), &mut self.evicted);
        self.apply_evictions();
        if !matches!(access, Access::Miss { admitted: true } | Access::Hit) {
            return SsdPut::Declined;
        }
        match self.reserve(fp) {
            Ok(mut r) => {
                r.namespace_id = *namespace_id;
                r.key = key.to_vec();
                SsdPut::Reserved(r)
            }
            Err(NoSlot::Full) => SsdPut::Full,
            Err(NoSlot::Failed) => SsdPut::Failed,
        }
    }

    fn reserve(&mut self, fp: Fingerprint) -> Result<Reservation, NoSlot> {
        let id = match self.active {
            Some(id) if self.segments[&id].next_slot < self.slots_per_segment => id,
            _ => self.new_segment()?,
        };
        Ok(self.take_slot(id, fp))
    }

    /// Takes the next slot of segment `id` for `fp` (namespace and key filled by the
    /// caller).
    fn take_slot(&mut self, id: u32, fp: Fingerprint) -> Reservation {
        let seg = self
            .segments
            .get_mut(&id)
            .expect("reservations are only taken in live segments");
        let slot = seg.next_slot;
        seg.next_slot += 1;
        seg.pending += 1;
        let seq = self.next_seq;
        self.next_seq += 1;
        Reservation {
            fp,
            loc: SsdLoc { segment: id, slot },
            file: Arc::clone(&seg.file),
            seq,
            namespace_id: [0; 16],
            key: Vec::new(),
        }
    }

    fn segment_file_bytes(&self) -> u64 {
        self.slots_per_segment as u64 * self.slot_bytes
    }

    /// Bytes of segment files on disk.
    pub fn allocated_bytes(&self) -> u64 {
        self.segments.len() as u64 * self.segment_file_bytes()
    }

    fn new_segment(&mut self) -> Result<u32, NoSlot> {
        if let Some(old) = self.active.take() {
            self.seal_if_done(old);
        }
        // Puts may fill the budget less one spare segment, which only compaction writes
        // into: with it, reclaiming can always move a segment's live blocks and drop it.
        let limit = self.disk_limit - self.segment_file_bytes();
        if self.allocated_bytes() + self.segment_file_bytes() > limit {
            self.reclaim(limit - self.segment_file_bytes());
        }
        if let Some(a) = self.active {
            // Compaction left a segment with room: append there.
            if self.segments[&a].next_slot < self.slots_per_segment {
                return Ok(a);
            }
            // Compaction filled it: seal it, or it could never be reclaimed.
            self.active = None;
            self.seal_if_done(a);
        }
        if self.allocated_bytes() + self.segment_file_bytes() > limit {
            return Err(NoSlot::Full);
        }
        self.open_segment().ok_or(NoSlot::Failed)
    }

    /// Creates the next segment and makes it the active one; `None` (counted as a write
    /// error) when the file cannot be created.
    fn open_segment(&mut self) -> Option<u32> {
        let id = self.next_segment;
        self.next_segment += 1;
        let file = match self.create_segment(id) {
            Ok(f) => f,
            Err(e) => {
                if self.create_failures % CREATE_FAILURES_LOGGED_EVERY == 0 {
                    let path = self.dir.path_of(id.into());
                    tracing::warn!(
                        "{}: cannot create segment: {e} ({} failed in a row; puts that need \
                         a new segment are refused until one can be created)",
                        path.display(),
                        self.create_failures + 1
                    );
                }
                self.create_failures += 1;
                self.create_errno = e.raw_os_error();
                self.counters.write_errors += 1;
                return None;
            }
        };
        if self.create_failures > 0 {
            tracing::info!(
                "{}: segments can be created again, after {} failures",
                self.root.display(),
                self.create_failures
            );
            self.create_failures = 0;
        }
        let seg = Segment {
            file,
            next_slot: 1,
            pending: 0,
            live: 0,
            sealed: false,
            records: Vec::new(),
            compacting: false,
            opened: std::time::Instant::now(),
        };
        self.segments.insert(id, seg);
        self.active = Some(id);
        Some(id)
    }

    fn create_segment(&self, id: u32) -> std::io::Result<Arc<dyn SegmentFile>> {
        let file = self.dir.create(id.into(), self.segment_file_bytes())?;
        let header = SegmentHeader {
            store_id: self.store_id,
            segment_id: id.into(),
            block_bytes: self.block_bytes,
            created_unix: unix_now(),
        };
        let mut buf = AlignedBuf::new(KV_ALIGN)?;
        buf.as_mut_slice().copy_from_slice(&header.encode());
        let written = file
            .write_all_at(buf.as_slice(), 0)
            .and_then(|()| file.sync());
        if let Err(e) = written {
            let _ = self.dir.remove(id.into());
            return Err(e);
        }
        Ok(file)
    }

    /// Makes reserved writes visible. `ok[i]` says whether reservation `i` was written
    /// (and synced, where the durability mode asks).
    ///
    /// Returns, per reservation, whether its block is in the index now: a write that
    /// failed is not, nor is a block the policy evicted (by a later key of the same batch)
    /// before its write finished.
    pub fn publish(&mut self, done: Vec<(Reservation, bool)>) -> Vec<bool> {
        let mut visible = Vec::with_capacity(done.len());
        for (r, ok) in done {
            if let Some(seg) = self.segments.get_mut(&r.loc.segment) {
                seg.pending = seg.pending.saturating_sub(1);
                if ok {
                    seg.records.push(SummaryEntry {
                        slot: r.loc.slot,
                        seq: r.seq,
                        namespace_id: r.namespace_id,
                        key: r.key.clone(),
                    });
                }
            }
            let live = ok && self.policy.contains(r.fp.0);
            visible.push(live);
            if live {
                if let Some(old) = self.index.insert(r.fp, r.loc) {
                    self.dec_live(old);
                }
                self.inc_live(r.loc);
            } else if !ok {
                self.counters.write_errors += 1;
            }
            if self.active != Some(r.loc.segment) {
                self.seal_if_done(r.loc.segment);
            }
        }
        visible
    }
    /// Gives back a reservation that will not be written (the block it was for could not be
    /// read), without counting a write error.
    pub fn abandon(&mut self, r: Reservation) {
        if let Some(seg) = self.segments.get_mut(&r.loc.segment) {
            seg.pending = seg.pending.saturating_sub(1);
        }
        if self.active != Some(r.loc.segment) {
            self.seal_if_done(r.loc.segment);
        }
    }

    /// Drops a block that read back corrupt or unreadable.
    pub fn drop_block(&mut self, fp: Fingerprint, loc: SsdLoc, corrupt: bool) {
        if self.index.get(&fp) == Some(&loc) {
            self.index.remove(&fp);
            self.dec_live(loc);
        }
        if corrupt {
            self.counters.corrupt_blocks += 1;
        } else {
            self.counters.read_errors += 1;
        }
    }

    fn apply_evictions(&mut self) {
        for e in std::mem::take(&mut self.evicted) {
            if let Some(loc) = self.index.remove(&Fingerprint(e.id)) {
                self.dec_live(loc);
            }
        }
    }

    fn inc_live(&mut self, loc: SsdLoc) {
        if let Some(s) = self.segments.get_mut(&loc.segment) {
            s.live += 1;
        }
    }

    fn dec_live(&mut self, loc: SsdLoc) {
        if let Some(s) = self.segments.get_mut(&loc.segment) {
            s.live = s.live.saturating_sub(1);
        }
    }

    /// Seals a full segment whose writes have all finished: sync, then the marker.
    fn seal_if_done(&mut self, id: u32) {
        let Some(seg) = self.segments.get_mut(&id) else {
            return;
        };
        if seg.sealed || seg.pending > 0 || Some(id) == self.active {
            return;
        }
        if let Err(e) = seg.file.sync() {
            tracing::warn!("segment {id}: sync before sealing failed: {e}");
            return;
        }
        seg.sealed = true;
        let summary = SegmentSummary {
            store_id: self.store_id,
            segment_id: id.into(),
            block_bytes: self.block_bytes,
            entries: std::mem::take(&mut seg.records),
        };
        let path = self.dir.path_of(id.into());
        write_summary(&path, &summary);
        let marker = sealed_marker(&path);
        if let Err(e) = std::fs::write(&marker, b"") {
            tracing::debug!("{}: cannot write seal marker: {e}", marker.display());
        }
    }

    /// Seals the segment being appended to if it holds records and is older than `age`
    /// (the next put opens a new one). For the shared tier: other stores only see sealed
    /// segments, so a slowly filled segment would hide its blocks. Its unused slots stay
    /// allocated until the segment is dropped or compacted.
    pub fn seal_active_if_older(&mut self, age: std::time::Duration) {
        let Some(id) = self.active else { return };
        let seg = &self.segments[&id];
        if seg.next_slot > 1 && seg.opened.elapsed() >= age {
            self.active = None;
            self.seal_if_done(id);
        }
    }

    /// Whether segment files are over the high watermark (the store then reclaims in the
    /// background).
    pub fn needs_reclaim(&self) -> bool {
        self.allocated_bytes() > self.high_bytes
    }

    fn free_slots_outside(&self, id: u32) -> u64 {
        let in_active = self
            .active
            .filter(|a| *a != id)
            .map(|a| (self.slots_per_segment - self.segments[&a].next_slot) as u64)
            .unwrap_or(0);
        let spare_segments =
            self.disk_limit.saturating_sub(self.allocated_bytes()) / self.segment_file_bytes();
        in_active + spare_segments * (self.slots_per_segment as u64 - 1)
    }

    /// A slot for a record compaction moves: the active segment, or a new one anywhere
    /// in the budget (compaction may use the spare segment puts leave alone).
    fn reserve_for_compaction(&mut self, fp: Fingerprint) -> Option<Reservation> {
        let id = match self.active {
            Some(a) if self.segments[&a].next_slot < self.slots_per_segment => a,
            _ => {
                if self.allocated_bytes() + self.segment_file_bytes() > self.disk_limit {
                    return None;
                }
                if let Some(old) = self.active.take() {
                    self.seal_if_done(old);
                }
                self.open_segment()?
            }
        };
        Some(self.take_slot(id, fp))
    }

    fn drop_segment(&mut self, id: u32) {
        self.index.retain(|_, loc| loc.segment != id);
        self.remove_segment_file(id);
    }

    /// Removes segment `id` and its files; no index entry may point there any more.
    fn remove_segment_file(&mut self, id: u32) {
        self.segments.remove(&id);
        let path = self.dir.path_of(id.into());
        if let Err(e) = self.dir.remove(id.into()) {
            tracing::warn!("{}: cannot remove segment: {e}", path.display());
        }
        let _ = std::fs::remove_file(sealed_marker(&path));
        let _ = std::fs::remove_file(summary_path(&path));
        self.counters.segments_dropped += 1;
    }

    /// Syncs every segment that may hold unsynced writes.
    /// Closes every segment file (the store is closed: nothing reads or writes here
    /// again), so that the directory's file system can be unmounted or removed while the
    /// closed store object is still referenced.
    pub fn release_files(&mut self) {
        self.segments.clear();
        self.index.clear();
        self.active = None;
    }

    pub fn sync_all(&self) -> std::io::Result<()> {
        for seg in self.segments.values().filter(|s| !s.sealed) {
            seg.file.sync()?;
        }
        Ok(())
    }

    /// Bytes the policy holds resident.
    pub fn used_bytes(&self) -> u64 {
        self.policy.used()
    }

    pub fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }

    /// Blocks the tier holds (its budget over the block size).
    pub fn capacity_blocks(&self) -> u64 {
        self.capacity_blocks
    }

    /// The most bytes its segment files take on disk.
    pub fn disk_bytes_limit(&self) -> u64 {
        self.disk_limit
    }

    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// Approximate bytes of the index (table slots, control bytes included).
    pub fn index_bytes(&self) -> usize {
        crate::namespace::fp_map_bytes(&self.index)
    }

    /// Why the last put answered [`SsdPut::Failed`]: a new segment could not be created.
    pub(crate) fn create_error(&self) -> std::io::Error {
        match self.create_errno {
            Some(errno) => std::io::Error::from_raw_os_error(errno),
            None => std::io::Error::other("a new segment could not be created"),
        }
    }

    pub fn root(&self) -> &PathBuf {
        &self.root
    }

    /// What the tier counted: errors, recovery, reclamation.
    pub(crate) fn counters(&self) -> SsdCounters {
        self.counters
    }

    /// What `stats()` shows of this tier.
    pub(crate) fn tier_stats(&self) -> TierStats {
        TierStats {
            policy: self.policy_name().into(),
            blocks: self.len() as u64,
            used_bytes: self.used_bytes(),
            budget_bytes: self.budget_bytes(),
            capacity_blocks: self.capacity_blocks(),
            allocated_bytes: self.allocated_bytes(),
            disk_bytes_limit: Some(self.disk_bytes_limit()),
            index_bytes: self.index_bytes() as u64,
        }
    }
}

/// One `fdatasync` per segment written; a failed sync fails every write it covered.
pub(crate) fn sync_written<R: std::borrow::Borrow<Reservation>>(written: &mut [(R, bool)]) {
    let mut files: HashMap<u32, (Arc<dyn SegmentFile>, bool)> = HashMap::new();
    for (r, ok) in written.iter() {
        let r = r.borrow();
        if *ok {
            files
                .entry(r.loc.segment)
                .or_insert_with(|| (Arc::clone(&r.file), true));
        }
    }
    for (seg, (file, synced)) in files.iter_mut() {
        if let Err(e) = file.sync() {
            tracing::warn!(
                "kv segment {seg}: fdatasync failed: {e}; the writes it covered are not acknowledged"
            );
            *synced = false;
        }
    }
    for (r, ok) in written.iter_mut() {
        if files.get(&r.borrow().loc.segment).is_some_and(|(_, s)| !s) {
            *ok = false;
        }
    }
}

fn build_policy(cfg: &PolicyConfig, capacity: u64) -> Result<Box<dyn Policy + Send>, KvError> {
    cfg.build(capacity)
        .map_err(|e| KvError::config("ssd_policy", cfg.kind().name(), e.to_string()))
}

pub(crate) fn sealed_marker(segment_path: &std::path::Path) -> PathBuf {
    segment_path.with_extension("sealed")
}

/// Where a sealed segment's summary lives (`seg-<id>.summary`).
pub(crate) fn summary_path(segment_path: &std::path::Path) -> PathBuf {
    segment_path.with_extension("summary")
}

/// The summary of segment `id` at `segment_path`, if there is one: `Err` says why one that
/// is there cannot be used (it does not decode, or describes another segment, store or
/// block size).
pub(crate) fn read_summary(
    segment_path: &std::path::Path,
    store_id: [u8; 16],
    id: u64,
    block_bytes: u64,
) -> Option<Result<SegmentSummary, String>> {
    let bytes = std::fs::read(summary_path(segment_path)).ok()?;
    Some(match SegmentSummary::decode(&bytes) {
        Ok(s) if s.store_id == store_id && s.segment_id == id && s.block_bytes == block_bytes => {
            Ok(s)
        }
        Ok(_) => Err("describes another segment".into()),
        Err(e) => Err(e.to_string()),
    })
}

/// Whether a record in `slot` fits in a segment file of `len` bytes: its header and its
/// payload (the padding after it need not be there). A summary entry past the end of a
/// truncated file lists a block that is gone.
pub(crate) fn record_fits(slot: u32, slot_bytes: u64, block_bytes: u64, len: u64) -> bool {
    slot as u64 * slot_bytes + RECORD_HEADER_BYTES as u64 + block_bytes <= len
}

/// Writes a segment's summary whole or not at all. Failing costs only speed: without a
/// summary the segment is scanned slot by slot at the next open.
pub(crate) fn write_summary(segment_path: &std::path::Path, summary: &SegmentSummary) {
    let path = summary_path(segment_path);
    if let Err(e) = sluice_engine::atomic_write(&path, &summary.encode()) {
        tracing::debug!("{}: cannot write the segment summary: {e}", path.display());
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Copies one record to a reserved slot through `buf` (one slot long), verifying it on
/// the way (compaction); returns its header. The caller syncs the destination.
fn copy_record(
    src: &dyn SegmentFile,
    loc: SsdLoc,
    dst: &Reservation,
    buf: &mut AlignedBuf,
) -> std::io::Result<RecordHeader> {
    let slot_bytes = buf.len() as u64;
    let n = src.read_vectored_at(
        &mut [IoSliceMut::new(buf.as_mut_slice())],
        loc.slot as u64 * slot_bytes,
    )?;
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "record does not verify");
    // A slot's padding past its payload may be missing at the end of a file that could
    // not be preallocated: only header and payload have to be there. What was not read
    // is zeroed, so no bytes of an earlier record travel with this one.
    buf.as_mut_slice()[n..].fill(0);
    let read = &buf.as_slice()[..n];
    let header = RecordHeader::decode(read).map_err(|_| bad())?;
    let end = RECORD_HEADER_BYTES + header.payload_len as usize;
    let payload = read.get(RECORD_HEADER_BYTES..end).ok_or_else(bad)?;
    if payload_checksum(payload) != header.payload_checksum {
        return Err(bad());
    }
    let moved = RecordHeader {
        seq: dst.seq,
        ..header
    };
    moved
        .encode_into(&mut buf.as_mut_slice()[..RECORD_HEADER_BYTES])
        .map_err(|_| bad())?;
    dst.file
        .write_all_at(buf.as_slice(), dst.loc.slot as u64 * slot_bytes)?;
    Ok(moved)
}
