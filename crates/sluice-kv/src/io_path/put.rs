//! A put batch: decisions in key order, copies and record writes in parallel, one sync
//! per segment, then publication.
//!
//! Every tier takes the block as its policy decides: DRAM (a slot), the local SSD tier
//! (write-through, or when DRAM declined), and this store's segments in the shared
//! directory (always offered, so other nodes can read it once the segment is sealed).

use std::sync::{Arc, Mutex};

use crate::config::Durability;
use crate::dram_tier::{Demoted, DramPut};
use crate::namespace::{fp_map, Fingerprint, FpMap};
use crate::ssd_tier::{sync_written, Reservation, SsdPut, SsdTier};
use crate::store::{add, lock, writes_through, KvStore};

use super::{demote, dram_put, fill_slot, parallel, write_record};

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
    let mut written: [Vec<(Reservation, bool)>; 2] = Default::default();
    let mut written_key: [Vec<usize>; 2] = Default::default();
    for (i, (in_dram, lower, dup_of)) in steps.into_iter().enumerate() {
        ok.push(in_dram || lower.iter().any(|s| matches!(s, SsdStep::Present)));
        if let Some(j) = dup_of {
            dups.push((i, j));
        }
        for (t, step) in lower.into_iter().enumerate() {
            if let SsdStep::Written(r, w) = step {
                written[t].push((r, w));
                written_key[t].push(i);
            }
        }
    }
    for (t, tier) in segment_tiers(store).into_iter().enumerate() {
        let Some(tier) = tier else { continue };
        let mut w = std::mem::take(&mut written[t]);
        if inner.config.durability == Durability::Batch {
            sync_written(&mut w);
        }
        let visible = lock(tier).publish(w);
        for (i, v) in written_key[t].iter().zip(visible) {
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

/// The segment tiers a put offers blocks to, in `PutPlan::lower` order.
fn segment_tiers(store: &KvStore) -> [Option<&Arc<Mutex<SsdTier>>>; 2] {
    [store.inner.ssd.as_ref(), store.inner.shared.as_ref()]
}

/// Step 1 of a put: each key offered to DRAM, then (write-through, or DRAM declined) to
/// SSD, then to our shared segments, one key after the other.
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
            lower: [SsdStep::None, SsdStep::None],
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
            plan.lower[0] = offer(store, ssd, fp, key);
            if matches!(plan.lower[0], SsdStep::Present) {
                add(&inner.counters.put_hits_ssd, 1);
            }
        }
        if let Some(shared) = &inner.shared {
            plan.lower[1] = offer(store, shared, fp, key);
        }
        plans.push(plan);
    }
    plans
}

/// Offers a block to a segment tier's policy.
fn offer(store: &KvStore, tier: &Mutex<SsdTier>, fp: Fingerprint, key: &[u8]) -> SsdStep {
    match lock(tier).put(fp, &store.namespace_id, key) {
        SsdPut::Present => SsdStep::Present,
        SsdPut::Declined | SsdPut::Full => SsdStep::None,
        SsdPut::Reserved(r) => SsdStep::Reserved(r),
    }
}

/// Step 2 of a put for one key: the DRAM copy, write-back demotions, the records.
fn execute_put(
    store: &KvStore,
    plan: PutPlan,
    key: &[u8],
    block: &[u8],
) -> (bool, [SsdStep; 2], Option<usize>) {
    let inner = &store.inner;
    if plan.dup_of.is_some() {
        return (false, [SsdStep::None, SsdStep::None], plan.dup_of);
    }
    if let (Some(slot), Some(d)) = (plan.dram_slot, &inner.dram) {
        fill_slot(d, slot, block);
    }
    demote(store, plan.demoted);
    let in_dram = plan.dram_present || plan.dram_slot.is_some();
    let lower = plan.lower.map(|step| match step {
        SsdStep::Reserved(r) => {
            let ok = write_record(store, &r, key, block)
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
    });
    (in_dram, lower, None)
}
