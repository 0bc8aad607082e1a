//! A put batch: decisions in key order, copies and record writes in parallel, one sync
//! per segment, then publication and the acknowledgements.
//!
//! Every tier takes the block as its policy decides: DRAM (a slot), the local SSD tier
//! (write-through, or when DRAM declined), and this store's segments in the shared
//! directory (always offered, so other nodes can read it once the segment is sealed).
//!
//! `true` for a key means the block is in the store at the end of the batch; where puts
//! write through to a segment tier (write-through, or no DRAM tier), also that its record
//! is there, written and, in `batch` durability, synced. A block whose record did not land
//! (the SSD declined it, had no room, its write failed) is `false`, and does not stay in
//! DRAM either ([`acknowledge`]). In write-back, a block only DRAM holds is `true` and
//! survives a crash once it is demoted, or once `sync()` wrote it.
//!
//! A batch larger than a tier: each tier takes the batch's first new keys up to its
//! capacity in blocks and declines the rest without asking its policy. Lookups are prefix
//! lookups, so the first keys of a chain are the valuable ones; offering the rest would
//! only evict those (an LRU keeps a batch's last keys, not its first).

use std::sync::Mutex;

use crate::config::Durability;
use crate::dram_tier::DramPut;
use crate::namespace::{fp_map, Fingerprint, FpMap};
use crate::ssd_tier::{sync_written, Reservation, SsdPut, SsdTier};
use crate::state::View;
use crate::sync::{add, lock};

use super::{demote, dram_put, fill_slot, parallel, reserve_demotions, write_record, Demotion};

/// What the policies decided for one key of a put batch (taken in key order).
struct PutPlan {
    fp: Fingerprint,
    /// An earlier key of the same batch with the same fingerprint: this one shares its fate.
    dup_of: Option<usize>,
    /// A DRAM slot to fill.
    dram_slot: Option<u32>,
    /// Write-back: blocks DRAM evicted to make room, to be written to SSD.
    demoted: Vec<Demotion>,
    /// What the segment tiers do: the local SSD tier, then our shared segments.
    lower: [SsdStep; 2],
}

/// What one put does in a segment tier.
enum SsdStep {
    None,
    Present,
    /// A slot to write the record into.
    Reserved(Reservation),
    /// A record written to its reserved slot (`true`) or a write that failed (`false`).
    Written(Reservation, bool),
    /// No slot: a segment could not be created (an I/O error).
    Failed,
}

/// New blocks each tier may still take from this batch ([`plan_puts`]).
struct Room {
    dram: u64,
    lower: [u64; 2],
}

/// Puts a batch in three steps:
/// 1. the policies decide for every key, **in key order**, so a single stream of batches
///    drives them exactly as `sluice sim` drives the same policy with the same key
///    sequence (up to each tier's capacity per batch, above);
/// 2. copies into DRAM slots and record writes run in parallel, outside every lock;
/// 3. the written segments are synced once each, then the records published, then each
///    key acknowledged as the module header says.
pub(crate) fn put_batch(v: View<'_>, keys: &[&[u8]], blocks: &[&[u8]]) -> Vec<bool> {
    let plans = plan_puts(v, keys);
    let outline: Vec<(Fingerprint, Option<usize>, bool)> = plans
        .iter()
        .map(|p| (p.fp, p.dup_of, p.dram_slot.is_some()))
        .collect();
    let cells: Vec<Mutex<Option<PutPlan>>> =
        plans.into_iter().map(|p| Mutex::new(Some(p))).collect();
    let steps = parallel(keys.len(), v.state.config().io_threads, |i| {
        let plan = lock(&cells[i]).take().expect("each plan runs once");
        execute_put(v, plan, keys[i], blocks[i])
    });
    // Per key: a write, a sync or a segment creation failed (a real failure).
    let mut failed = vec![false; keys.len()];
    let mut written: [Vec<(Reservation, bool)>; 2] = Default::default();
    let mut written_key: [Vec<usize>; 2] = Default::default();
    for (i, lower) in steps.into_iter().enumerate() {
        for (t, step) in lower.into_iter().enumerate() {
            match step {
                SsdStep::Written(r, w) => {
                    written[t].push((r, w));
                    written_key[t].push(i);
                }
                SsdStep::Failed => failed[i] = true,
                SsdStep::None | SsdStep::Present | SsdStep::Reserved(_) => {}
            }
        }
    }
    for (t, tier) in v.state.tiers().segment_tiers().into_iter().enumerate() {
        let Some(tier) = tier else { continue };
        let mut w = std::mem::take(&mut written[t]);
        if v.state.config().durability == Durability::Batch {
            sync_written(&mut w);
        }
        for ((_, ok), i) in w.iter().zip(&written_key[t]) {
            failed[*i] |= !ok;
        }
        lock(tier).publish(w);
    }
    let ok = acknowledge(v, &outline, &mut failed);
    add(&v.state.counters().puts, keys.len() as u64);
    let not_ok = |f: bool| {
        ok.iter()
            .zip(&failed)
            .filter(|(o, x)| !**o && **x == f)
            .count()
    };
    add(&v.state.counters().put_failures, not_ok(true) as u64);
    add(&v.state.counters().put_declined, not_ok(false) as u64);
    ok
}

/// Which keys of a finished batch are acknowledged: those resident at its end, checked
/// then because a later key of the batch may have made a policy evict an earlier one
/// again (a small cache, s3fifo's small queue). Writing through, a block this batch put
/// into DRAM whose record did not land in a segment tier (declined, no space, the write
/// failed, evicted again) leaves DRAM as well: so DRAM only holds blocks that had a
/// record, and a later put of such a block is not taken for a DRAM hit that skips the
/// write. A duplicate key shares its first occurrence's fate.
fn acknowledge(
    v: View<'_>,
    plans: &[(Fingerprint, Option<usize>, bool)],
    failed: &mut [bool],
) -> Vec<bool> {
    let through = acknowledges_durability(v);
    let mut unwritten = Vec::new();
    let mut ok = Vec::with_capacity(plans.len());
    let tiers = v.state.tiers().residency();
    for (i, (fp, dup_of, to_dram)) in plans.iter().enumerate() {
        let held = match dup_of {
            Some(j) => {
                failed[i] = failed[*j];
                ok[*j]
            }
            None if through && *to_dram && !tiers.in_segment_tier(*fp) => {
                unwritten.push(*fp);
                false
            }
            None => tiers.contains(*fp),
        };
        ok.push(held);
    }
    drop(tiers);
    if let (Some(d), false) = (v.state.tiers().dram(), unwritten.is_empty()) {
        let mut d = lock(d);
        for fp in unwritten {
            d.drop_block(fp);
        }
    }
    ok
}

/// Whether puts write through to a segment tier (the SSD, our shared segments): then a
/// put's `true` means a record there as well. Otherwise (write-back, DRAM alone) it means
/// residency.
fn acknowledges_durability(v: View<'_>) -> bool {
    let has_segments = v.state.tiers().ssd().is_some() || v.state.tiers().shared().is_some();
    has_segments
        && v.state
            .config()
            .writes_through(v.state.tiers().dram().is_some())
}

/// Step 1 of a put: each key offered to DRAM, then (write-through, or DRAM declined) to
/// SSD, then to our shared segments, one key after the other; each tier up to its
/// capacity of new blocks.
fn plan_puts(v: View<'_>, keys: &[&[u8]]) -> Vec<PutPlan> {
    let mut room = Room {
        dram: v.state.config().dram_policy_blocks(),
        lower: v
            .state
            .tiers()
            .segment_tiers()
            .map(|t| t.map_or(0, |t| lock(t).capacity_blocks())),
    };
    let through = v
        .state
        .config()
        .writes_through(v.state.tiers().dram().is_some());
    let mut seen: FpMap<usize> = fp_map(keys.len());
    let mut plans = Vec::with_capacity(keys.len());
    for (i, key) in keys.iter().enumerate() {
        let fp = v.fingerprint(key);
        let mut plan = PutPlan {
            fp,
            dup_of: None,
            dram_slot: None,
            demoted: Vec::new(),
            lower: [SsdStep::None, SsdStep::None],
        };
        if let Some(&j) = seen.get(&fp) {
            plan.dup_of = Some(j);
            plans.push(plan);
            continue;
        }
        seen.insert(fp, i);
        let mut dram_present = false;
        if v.state.tiers().dram().is_some() {
            let decision = dram_put(v, fp, key, room.dram > 0, &mut plan.demoted);
            reserve_demotions(v, &mut plan.demoted);
            match decision {
                DramPut::Present => {
                    dram_present = true;
                    add(&v.state.counters().put_hits_dram, 1);
                }
                DramPut::Admitted { slot } => {
                    room.dram -= 1;
                    plan.dram_slot = Some(slot);
                }
                DramPut::Declined => {}
            }
        }
        let in_dram = dram_present || plan.dram_slot.is_some();
        if let Some(ssd) = v.state.tiers().ssd() {
            // A DRAM hit does not go on to the SSD policy (as in `sluice sim`'s tiers):
            // writing through, it is acknowledged only if the SSD holds it too.
            if !dram_present && (through || !in_dram) {
                plan.lower[0] = offer(v, ssd, fp, key, &mut room.lower[0]);
                if matches!(plan.lower[0], SsdStep::Present) {
                    add(&v.state.counters().put_hits_ssd, 1);
                }
            }
        }
        if let Some(shared) = v.state.tiers().shared() {
            plan.lower[1] = offer(v, shared, fp, key, &mut room.lower[1]);
        }
        plans.push(plan);
    }
    plans
}

/// Offers a block to a segment tier's policy; once the batch has taken `room` new blocks
/// there, a block the tier does not hold is declined without asking the policy.
fn offer(
    v: View<'_>,
    tier: &Mutex<SsdTier>,
    fp: Fingerprint,
    key: &[u8],
    room: &mut u64,
) -> SsdStep {
    let mut t = lock(tier);
    if *room == 0 && !t.contains(fp) {
        return SsdStep::None;
    }
    match t.put(fp, &v.namespace_id, key) {
        SsdPut::Present => SsdStep::Present,
        SsdPut::Declined | SsdPut::Full => SsdStep::None,
        SsdPut::Failed => SsdStep::Failed,
        SsdPut::Reserved(r) => {
            *room -= 1;
            SsdStep::Reserved(r)
        }
    }
}

/// Step 2 of a put for one key: the DRAM copy, write-back demotions, the records.
fn execute_put(v: View<'_>, plan: PutPlan, key: &[u8], block: &[u8]) -> [SsdStep; 2] {
    if plan.dup_of.is_some() {
        return [SsdStep::None, SsdStep::None];
    }
    if let (Some(slot), Some(d)) = (plan.dram_slot, v.state.tiers().dram()) {
        fill_slot(d, slot, block);
    }
    demote(v, plan.demoted);
    plan.lower.map(|step| match step {
        SsdStep::Reserved(r) => {
            let ok = write_record(v, &r, key, block)
                .inspect_err(|e| {
                    tracing::warn!(
                        "kv segment {} slot {}: write failed: {e}",
                        r.loc.segment,
                        r.loc.slot
                    )
                })
                .is_ok();
            SsdStep::Written(r, ok)
        }
        other => other,
    })
}
