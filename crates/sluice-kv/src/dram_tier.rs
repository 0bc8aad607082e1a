//! The DRAM tier: a fixed arena of block-sized slots, allocated once.
//!
//! The arena is one page-aligned anonymous mapping of `slots * block_bytes` bytes, made at
//! open and never grown, so the tier can never exceed its budget and the memory can be
//! registered (pinned for GPU copies) once. Which blocks live here is the policy's
//! decision; the tier keeps the map from fingerprint to slot and a free list.
//!
//! Slots are never reused under a reader. A get pins the slot for the length of its copy,
//! and a lookup's lease pins it until the get or the lease timeout. When the policy evicts
//! a pinned block its index entry goes at once (no new reader finds it) but the slot only
//! returns to the free list when the last pin drops.

use sluice_engine::Mapping;
use sluice_policy::{Access, Evicted, Policy, PolicyConfig, Request};

use crate::config::{arena_slots, KvConfig};
use crate::error::KvError;
use crate::namespace::{fp_map, Fingerprint, FpMap};
use crate::stats::TierStats;

/// A block resident in DRAM.
struct Slot {
    /// The full key and namespace, compared on every hit (fingerprints can collide).
    key: Box<[u8]>,
    namespace_id: [u8; 16],
    pins: u32,
    /// The bytes are in place (a slot being filled is invisible to lookups and gets).
    ready: bool,
    /// Evicted while pinned: free the slot when `pins` reaches 0.
    evicted: bool,
}

/// The tier's bookkeeping; the store holds it under a mutex and copies outside it.
pub struct DramTier {
    arena: Mapping,
    block_bytes: usize,
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    index: FpMap<u32>,
    policy: Box<dyn Policy + Send>,
    evicted: Vec<Evicted>,
}

/// A block DRAM evicted, copied out for a write-back store to demote to SSD.
pub struct Demoted {
    pub fp: Fingerprint,
    pub key: Box<[u8]>,
    pub namespace_id: [u8; 16],
    pub bytes: Vec<u8>,
}

/// A filled block [`DramTier::pin_where`] pinned: its slot stays as it is until unpinned.
pub struct PinnedBlock {
    pub fp: Fingerprint,
    pub slot: u32,
    pub key: Box<[u8]>,
    pub namespace_id: [u8; 16],
}

/// What a put into DRAM decided.
pub enum DramPut {
    /// Already resident (a put of a known key only counts as an access).
    Present,
    /// Admitted into `slot`, pinned: copy the bytes in, then [`DramTier::filled`].
    Admitted { slot: u32 },
    /// The policy declined, or every free slot is pinned by readers.
    Declined,
}

impl DramPut {
    /// The slot to fill, when the block was admitted.
    pub fn slot(&self) -> Option<u32> {
        match self {
            DramPut::Admitted { slot } => Some(*slot),
            DramPut::Present | DramPut::Declined => None,
        }
    }
}

impl DramTier {
    /// An arena holding `budget_bytes / block_bytes` blocks, plus its spare slots.
    pub fn new(
        budget_bytes: u64,
        block_bytes: u64,
        policy: &PolicyConfig,
    ) -> Result<Self, KvError> {
        let blocks = budget_bytes / block_bytes;
        let slots = arena_slots(blocks);
        let len = usize::try_from(slots * block_bytes).map_err(|_| {
            KvError::config("dram_bytes", budget_bytes, "too large for this machine")
        })?;
        let arena = Mapping::anonymous(len).map_err(|e| {
            KvError::config(
                "dram_bytes",
                budget_bytes,
                format!("cannot map the arena: {e}"),
            )
        })?;
        let policy = policy
            .build(blocks * block_bytes)
            .map_err(|e| KvError::config("dram_policy", policy.kind().name(), e.to_string()))?;
        Ok(DramTier {
            arena,
            block_bytes: block_bytes as usize,
            slots: (0..slots).map(|_| None).collect(),
            free: (0..slots as u32).rev().collect(),
            index: fp_map(slots as usize),
            policy,
            evicted: Vec::new(),
        })
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn contains(&self, fp: Fingerprint) -> bool {
        self.index
            .get(&fp)
            .and_then(|slot| self.slots[*slot as usize].as_ref())
            .is_some_and(|s| s.ready)
    }

    /// Pins the slot of `fp` if it holds exactly (`namespace_id`, `key`).
    pub fn pin(&mut self, fp: Fingerprint, namespace_id: &[u8; 16], key: &[u8]) -> Option<u32> {
        let slot = *self.index.get(&fp)?;
        let s = self.slots[slot as usize].as_mut()?;
        if !s.ready || &*s.key != key || &s.namespace_id != namespace_id {
            return None;
        }
        s.pins += 1;
        Some(slot)
    }

    /// One more pin on a slot the caller already holds pinned (a lease).
    pub fn pin_slot(&mut self, slot: u32) {
        if let Some(s) = self.slots[slot as usize].as_mut() {
            s.pins += 1;
        }
    }

    /// The bytes of a slot returned by [`DramTier::put`] are in place: publish it and drop
    /// the filler's pin.
    pub fn filled(&mut self, slot: u32) {
        if let Some(s) = self.slots[slot as usize].as_mut() {
            s.ready = true;
        }
        self.unpin(slot);
    }

    /// Gives up a slot [`DramTier::put`] returned whose bytes never came (the read that
    /// was to fill it failed): the block leaves the index at once, the slot is freed.
    /// The policy still counts the block until it evicts it (it has no removal).
    pub fn abandon(&mut self, fp: Fingerprint, slot: u32) {
        if self.index.get(&fp) == Some(&slot) {
            self.index.remove(&fp);
        }
        if let Some(s) = self.slots[slot as usize].as_mut() {
            s.evicted = true;
        }
        self.unpin(slot);
    }

    /// Pins every filled block for which `want` holds and returns them (for a write-back
    /// flush to read them outside the lock); each pin is dropped with [`DramTier::unpin`].
    pub fn pin_where(&mut self, want: impl Fn(Fingerprint) -> bool) -> Vec<PinnedBlock> {
        let mut out = Vec::new();
        for (fp, slot) in &self.index {
            let Some(s) = self.slots[*slot as usize].as_mut() else {
                continue;
            };
            if s.ready && want(*fp) {
                s.pins += 1;
                out.push(PinnedBlock {
                    fp: *fp,
                    slot: *slot,
                    key: s.key.clone(),
                    namespace_id: s.namespace_id,
                });
            }
        }
        out
    }

    /// Takes a block out of the tier (its write-through record failed): it leaves the
    /// index at once, its slot when no pin holds it. The policy still counts it until it
    /// evicts it (it has no removal).
    pub fn drop_block(&mut self, fp: Fingerprint) {
        self.evict(fp);
    }

    /// Deletes a block: it leaves the index and the policy's books at once, its slot
    /// when no pin holds it. Returns whether the tier held it.
    pub fn delete(&mut self, fp: Fingerprint) -> bool {
        self.policy.remove(fp.0);
        let held = self.contains(fp);
        self.evict(fp);
        held
    }

    /// Drops one pin; frees the slot if it was evicted meanwhile.
    pub fn unpin(&mut self, slot: u32) {
        let Some(s) = self.slots[slot as usize].as_mut() else {
            return;
        };
        s.pins = s.pins.saturating_sub(1);
        if s.pins == 0 && s.evicted {
            self.slots[slot as usize] = None;
            self.free.push(slot);
        }
    }

    /// Counts a hit with the policy (a get served from here, or a put of a resident key).
    pub fn touch(&mut self, fp: Fingerprint) {
        if !self.index.contains_key(&fp) {
            return; // evicted since it was served: a touch must not re-admit it
        }
        self.policy.access(
            &Request::new(fp.0, self.block_bytes as u64),
            &mut self.evicted,
        );
        self.apply_evictions();
    }

    /// Offers a block to the policy. With `demoted`, the blocks it evicts are copied out
    /// (key and bytes) for a write-back store to write to SSD; their slots are free at once.
    pub fn put(
        &mut self,
        fp: Fingerprint,
        namespace_id: &[u8; 16],
        key: &[u8],
        mut demoted: Option<&mut Vec<Demoted>>,
    ) -> DramPut {
        if self.index.contains_key(&fp) {
            self.touch(fp);
            return DramPut::Present;
        }
        let access = self.policy.access(
            &Request::new(fp.0, self.block_bytes as u64),
            &mut self.evicted,
        );
        for e in std::mem::take(&mut self.evicted) {
            let fp = Fingerprint(e.id);
            if let (Some(out), Some(d)) = (demoted.as_deref_mut(), self.copy_out(fp)) {
                out.push(d);
            }
            self.evict(fp);
        }
        let admitted = matches!(access, Access::Miss { admitted: true } | Access::Hit);
        let Some(slot) = admitted.then(|| self.free.pop()).flatten() else {
            return DramPut::Declined;
        };
        self.slots[slot as usize] = Some(Slot {
            key: key.into(),
            namespace_id: *namespace_id,
            pins: 1,
            ready: false,
            evicted: false,
        });
        self.index.insert(fp, slot);
        DramPut::Admitted { slot }
    }

    fn apply_evictions(&mut self) {
        for e in std::mem::take(&mut self.evicted) {
            self.evict(Fingerprint(e.id));
        }
    }

    /// A copy of a resident, filled block (for a write-back demotion).
    fn copy_out(&self, fp: Fingerprint) -> Option<Demoted> {
        let slot = *self.index.get(&fp)?;
        let s = self.slots[slot as usize].as_ref().filter(|s| s.ready)?;
        let ptr = self.slot_ptr(slot);
        // SAFETY: a ready slot's bytes are written only before it became ready, and we hold
        // the tier (the caller's `&mut self`), so no filler runs on it.
        let bytes = unsafe { std::slice::from_raw_parts(ptr, self.block_bytes) }.to_vec();
        Some(Demoted {
            fp,
            key: s.key.clone(),
            namespace_id: s.namespace_id,
            bytes,
        })
    }

    /// Removes `fp` from the index; frees its slot now, or when its last pin drops.
    fn evict(&mut self, fp: Fingerprint) {
        let Some(slot) = self.index.remove(&fp) else {
            return;
        };
        let Some(s) = self.slots[slot as usize].as_mut() else {
            return;
        };
        s.evicted = true;
        if s.pins == 0 {
            self.slots[slot as usize] = None;
            self.free.push(slot);
        }
    }

    /// The bytes of `slot`. The caller holds a pin, so nobody reuses the slot meanwhile.
    pub fn slot_ptr(&self, slot: u32) -> *mut u8 {
        // SAFETY: `slot < slots.len()` and the arena holds `slots.len() * block_bytes`
        // bytes, so the offset stays inside the mapping.
        unsafe { self.arena.as_ptr().add(slot as usize * self.block_bytes) }
    }

    /// Bytes the policy holds resident (never above the budget).
    pub fn used_bytes(&self) -> u64 {
        self.policy.used()
    }

    pub fn arena_bytes(&self) -> usize {
        self.arena.len()
    }

    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// What `stats()` shows of this tier.
    pub(crate) fn tier_stats(&self, config: &KvConfig) -> TierStats {
        TierStats {
            policy: self.policy_name().into(),
            blocks: self.len() as u64,
            used_bytes: self.used_bytes(),
            budget_bytes: config.dram_bytes,
            capacity_blocks: config.dram_policy_blocks(),
            allocated_bytes: self.arena_bytes() as u64,
            disk_bytes_limit: None,
            index_bytes: self.index_bytes() as u64,
        }
    }

    /// Approximate bytes of the index and slot table.
    pub fn index_bytes(&self) -> usize {
        crate::namespace::fp_map_bytes(&self.index)
            + self.slots.capacity() * std::mem::size_of::<Option<Slot>>()
            + self.index.len() * 32
    }
}
