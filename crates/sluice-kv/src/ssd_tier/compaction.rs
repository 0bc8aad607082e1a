//! Reclaiming space: dropping dead segments and compacting sparse ones, with the record
//! copies outside the tier's lock.
//!
//! Compaction moves a sealed segment's live records into free slots and then removes the
//! segment. It runs in three steps so that puts and gets do not wait for its I/O:
//! 1. [`SsdTier::plan_compaction`], under the lock: pick the records, reserve a slot for
//!    each, and mark the segment so no other pass takes it;
//! 2. [`CompactionPlan::copy`], with no lock held: read and verify each record, write it
//!    to its new slot, sync the destinations once each;
//! 3. [`SsdTier::finish_compaction`], under the lock: point the index at the new slots,
//!    but only for blocks still where the plan found them (a block evicted or dropped
//!    meanwhile stays gone), and remove the segment once nothing live is left in it.
//!
//! Readers that took a record's old location still read it: the segment's file stays
//! open in their hands after it is removed, and segments are never overwritten.
//! The background reclaimer releases the lock between the steps; a put that runs out of
//! space and reclaims inline runs all three while holding it.

use std::sync::{Arc, Mutex};

use sluice_engine::AlignedBuf;
use sluice_formats::kv::RecordHeader;
use sluice_formats::kv_summary::SummaryEntry;

use super::{copy_record, sync_written, Reservation, SsdLoc, SsdTier};
use crate::namespace::Fingerprint;
use crate::segment_io::SegmentFile;
use crate::sync::lock;

/// One record to move: where it is, and the slot reserved for it.
struct Move {
    fp: Fingerprint,
    from: SsdLoc,
    to: Reservation,
}

/// A compaction chosen under the lock, copied outside it.
pub(crate) struct CompactionPlan {
    segment: u32,
    src: Arc<dyn SegmentFile>,
    moves: Vec<Move>,
    slot_bytes: u64,
    /// Every live record got a slot (else the segment stays after the moves).
    complete: bool,
}

/// What copying did to each move.
pub(crate) struct Copied {
    plan: CompactionPlan,
    /// Per move: the header written to the new slot, or why not.
    outcome: Vec<Option<RecordHeader>>,
}

/// What one step of reclamation did.
pub(crate) enum ReclaimStep {
    /// Nothing more to do (under the target, or nothing to gain).
    Done,
    /// A segment with no live blocks was removed.
    Dropped,
    /// A sparse segment's records are to be moved.
    Compact(CompactionPlan),
}

impl CompactionPlan {
    /// Copies every record to its slot (verifying it on the way), then syncs each
    /// destination once. Takes no lock: the source segment cannot be removed meanwhile
    /// (it is marked as compacting), and the slots are reserved.
    pub(crate) fn copy(self) -> Copied {
        let Ok(mut buf) = AlignedBuf::new(self.slot_bytes as usize) else {
            let outcome = self.moves.iter().map(|_| None).collect();
            return Copied {
                plan: self,
                outcome,
            };
        };
        let mut outcome: Vec<Option<RecordHeader>> = self
            .moves
            .iter()
            .map(|m| copy_record(&*self.src, m.from, &m.to, &mut buf).ok())
            .collect();
        let mut written: Vec<(&Reservation, bool)> = self
            .moves
            .iter()
            .zip(&outcome)
            .map(|(m, h)| (&m.to, h.is_some()))
            .collect();
        sync_written(&mut written);
        for (o, (_, synced)) in outcome.iter_mut().zip(written) {
            if !synced {
                *o = None;
            }
        }
        Copied {
            plan: self,
            outcome,
        }
    }
}

impl SsdTier {
    /// Step 1 of reclaiming towards `target` bytes: drop a dead segment, plan the
    /// compaction of the sparsest one, or say there is nothing to do.
    pub(crate) fn next_reclaim_step(&mut self, target: u64) -> ReclaimStep {
        if self.allocated_bytes() <= target {
            return ReclaimStep::Done;
        }
        let victim = self
            .segments
            .iter()
            .filter(|(id, s)| {
                s.sealed && s.pending == 0 && !s.compacting && Some(**id) != self.active
            })
            .min_by_key(|(id, s)| (s.live, **id))
            .map(|(id, s)| (*id, s.live));
        let Some((id, live)) = victim else {
            return ReclaimStep::Done;
        };
        if live as u64 >= self.slots_per_segment as u64 - 1 {
            return ReclaimStep::Done; // the emptiest segment is full of live blocks
        }
        if live == 0 {
            self.drop_segment(id);
            return ReclaimStep::Dropped;
        }
        match self.plan_compaction(id) {
            Some(plan) => ReclaimStep::Compact(plan),
            None => ReclaimStep::Done,
        }
    }

    /// Reserves a slot for every live record of segment `id` and marks it as compacting.
    /// `None` when not even one slot is free.
    fn plan_compaction(&mut self, id: u32) -> Option<CompactionPlan> {
        let live: Vec<(Fingerprint, SsdLoc)> = self
            .index
            .iter()
            .filter(|(_, loc)| loc.segment == id)
            .map(|(fp, loc)| (*fp, *loc))
            .collect();
        if (live.len() as u64) > self.free_slots_outside(id) {
            return None;
        }
        let mut moves = Vec::with_capacity(live.len());
        for (fp, from) in &live {
            match self.reserve_for_compaction(*fp) {
                Some(to) => moves.push(Move {
                    fp: *fp,
                    from: *from,
                    to,
                }),
                None => break,
            }
        }
        if moves.is_empty() {
            return None;
        }
        let seg = self
            .segments
            .get_mut(&id)
            .expect("the victim is a live segment");
        seg.compacting = true;
        Some(CompactionPlan {
            segment: id,
            src: Arc::clone(&seg.file),
            complete: moves.len() == live.len(),
            moves,
            slot_bytes: self.slot_bytes,
        })
    }

    /// Step 3: publishes the moved records of blocks still where the plan found them, and
    /// removes the segment if nothing live is left in it.
    pub(crate) fn finish_compaction(&mut self, copied: Copied) {
        let Copied { plan, outcome } = copied;
        let mut moved = 0;
        for (m, header) in plan.moves.into_iter().zip(outcome) {
            let still_there = self.index.get(&m.fp) == Some(&m.from);
            match header {
                Some(h) => {
                    self.record_written(&m.to, &h);
                    if still_there && self.policy.contains(m.fp.0) {
                        self.index.insert(m.fp, m.to.loc);
                        self.dec_live(m.from);
                        self.inc_live(m.to.loc);
                        moved += 1;
                    }
                }
                None if still_there => {
                    self.index.remove(&m.fp);
                    self.dec_live(m.from);
                    self.counters.corrupt_blocks += 1;
                }
                None => {}
            }
            self.release_slot(m.to.loc.segment);
        }
        self.counters.blocks_moved += moved;
        let left = self.segments.get(&plan.segment).map_or(0, |s| s.live);
        if left == 0 {
            self.drop_segment(plan.segment);
            if plan.complete {
                self.counters.segments_compacted += 1;
            }
        } else if let Some(s) = self.segments.get_mut(&plan.segment) {
            s.compacting = false;
        }
    }

    /// A record landed in its reserved slot: it goes into its segment's summary.
    fn record_written(&mut self, r: &Reservation, h: &RecordHeader) {
        if let Some(seg) = self.segments.get_mut(&r.loc.segment) {
            seg.records.push(SummaryEntry {
                slot: r.loc.slot,
                seq: h.seq,
                namespace_id: h.namespace_id,
                key: h.key.clone(),
            });
        }
    }

    /// A reserved slot's write is over (landed or not): the segment may now be sealed.
    fn release_slot(&mut self, segment: u32) {
        if let Some(seg) = self.segments.get_mut(&segment) {
            seg.pending = seg.pending.saturating_sub(1);
        }
        if self.active != Some(segment) {
            self.seal_if_done(segment);
        }
    }

    /// Reclaims to `target` while holding the lock (a put that ran out of space).
    pub(crate) fn reclaim(&mut self, target: u64) {
        // Each step drops or compacts one segment; the steps are bounded by the count.
        for _ in 0..=self.segments.len() {
            match self.next_reclaim_step(target) {
                ReclaimStep::Done => return,
                ReclaimStep::Dropped => {}
                ReclaimStep::Compact(plan) => self.finish_compaction(plan.copy()),
            }
        }
    }
}

/// Reclaims `tier` to its low watermark in the background: the copies run with the lock
/// released, so puts and gets go on meanwhile.
pub(crate) fn reclaim_unlocked(tier: &Mutex<SsdTier>) {
    let (target, passes) = {
        let t = lock(tier);
        (t.low_bytes, t.segments.len() + 1)
    };
    for _ in 0..passes {
        let step = lock(tier).next_reclaim_step(target);
        match step {
            ReclaimStep::Done => return,
            ReclaimStep::Dropped => {}
            ReclaimStep::Compact(plan) => {
                let copied = plan.copy();
                lock(tier).finish_compaction(copied);
            }
        }
    }
}
