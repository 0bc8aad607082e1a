//! [`Tiers`]: the tiers of one store, and what the data path asks of them together.
//!
//! - DRAM: a slot arena ([`DramTier`]); in write-back, the blocks it evicted on their way
//!   to SSD wait in `demoting`, so a get that checks DRAM, then `demoting`, then SSD
//!   always finds a block that is moving.
//! - Below DRAM: the local SSD tier, this store's own segments in the shared directory,
//!   and the segments other stores sealed there. All three hold the same records
//!   (`sluice_formats::kv`), so a get reads and verifies a block the same way wherever it
//!   lies; what differs is who may evict it (our policies, or another store) and what a
//!   failed read drops (an index entry of ours, or of the foreign index). A hit in the
//!   shared directory is promoted into DRAM and the local SSD as their policies decide,
//!   so a block read from a network file system once is local the next time.
//!
//! Locks are taken in one order everywhere: the lease table (the store's), DRAM, SSD, our
//! shared segments, the foreign index.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::config::KvConfig;
use crate::dram_tier::{Demoted, DramTier};
use crate::error::KvError;
use crate::foreign::{self, ForeignIndex};
use crate::manifest::create_dir;
use crate::namespace::{fp_map, Fingerprint, FpMap};
use crate::reclaimer::Tended;
use crate::remote_tier::{Remote, Uploader};
use crate::segment_io::{FsSegmentDir, SegmentDir, SegmentFile};
use crate::ssd_tier::{SsdLoc, SsdTier};
use crate::stats::{ForeignStats, RemoteStats, TierStats};
use crate::sync::lock;

/// A tier below DRAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lower {
    /// The local SSD tier.
    Ssd,
    /// This store's segments in the shared directory.
    Shared,
    /// Another store's segments in the shared directory (read-only).
    Foreign,
}

/// Where a record lies, with the file to read it from.
#[derive(Clone)]
pub(crate) struct RecordLoc {
    pub tier: Lower,
    pub loc: SsdLoc,
    pub file: Arc<dyn SegmentFile>,
}

/// Which tier holds a block.
pub(crate) enum Tier {
    Dram,
    Ssd,
    /// The shared directory: our segments there, or another store's.
    Shared,
}

/// The tiers of one store.
pub(crate) struct Tiers {
    dram: Option<Mutex<DramTier>>,
    /// Shared with the reclaim thread (which holds nothing else of the store).
    ssd: Option<Arc<Mutex<SsdTier>>>,
    /// This store's own segments in the shared directory.
    shared: Option<Arc<Mutex<SsdTier>>>,
    /// Other stores' segments in the shared directory.
    foreign: Option<Arc<Mutex<ForeignIndex>>>,
    /// With the shared tier in an object store: what puts our shared segments up (they
    /// are written locally first) and deletes those we dropped.
    uploader: Option<Arc<Uploader>>,
    /// Write-back: blocks DRAM evicted whose SSD copy is not published yet. Entered under
    /// the DRAM lock in the same step as the eviction, left after the SSD publish.
    demoting: Mutex<FpMap<Arc<Demoted>>>,
}

impl Tiers {
    /// Opens every tier `config` sizes: the SSD tier over `dir` (recovering its blocks),
    /// and the shared tier under `config.shared_dir` or `config.remote` (the store at
    /// `root` keeps its own remote segments in `root/remote` until they are up).
    pub(crate) fn open(
        config: &KvConfig,
        root: &Path,
        dir: Arc<dyn SegmentDir>,
        seg_root: PathBuf,
        store_id: [u8; 16],
    ) -> Result<Tiers, KvError> {
        let dram = match config.dram_bytes {
            0 => None,
            b => Some(Mutex::new(DramTier::new(
                b,
                config.block_bytes,
                &config.dram_policy,
            )?)),
        };
        let ssd = match config.ssd_bytes {
            0 => None,
            _ => Some(Arc::new(Mutex::new(SsdTier::open(
                dir, seg_root, store_id, config,
            )?))),
        };
        let (shared, foreign, uploader) = match &config.remote {
            None => {
                let (shared, foreign) = open_shared(config, store_id)?;
                (shared, foreign, None)
            }
            Some(url) => open_remote(config, url, root, store_id)?,
        };
        Ok(Tiers {
            dram,
            ssd,
            shared,
            foreign,
            uploader,
            demoting: Mutex::new(fp_map(0)),
        })
    }

    pub(crate) fn dram(&self) -> Option<&Mutex<DramTier>> {
        self.dram.as_ref()
    }

    pub(crate) fn ssd(&self) -> Option<&Arc<Mutex<SsdTier>>> {
        self.ssd.as_ref()
    }

    /// This store's own segments in the shared directory.
    pub(crate) fn shared(&self) -> Option<&Arc<Mutex<SsdTier>>> {
        self.shared.as_ref()
    }

    /// Write-back: blocks on their way from DRAM to SSD.
    pub(crate) fn demoting(&self) -> &Mutex<FpMap<Arc<Demoted>>> {
        &self.demoting
    }

    /// The tiers of segment files this store writes: the SSD, then our shared segments.
    pub(crate) fn segment_tiers(&self) -> [Option<&Arc<Mutex<SsdTier>>>; 2] {
        [self.ssd.as_ref(), self.shared.as_ref()]
    }

    /// What the reclaim thread looks after, or `None` when there is nothing for it to do.
    /// With the shared tier in an object store, it keeps the local files under their
    /// watermarks and leaves the network to [`Tiers::remote_tended`]'s thread.
    pub(crate) fn tended(&self, refresh: Duration) -> Option<Tended> {
        let local = self.uploader.is_none();
        let tended = Tended {
            tiers: self.ssd.iter().chain(self.shared.iter()).cloned().collect(),
            shared: self.shared.clone().filter(|_| local),
            foreign: self.foreign.clone().filter(|_| local),
            uploader: None,
            refresh,
        };
        (!tended.tiers.is_empty() || tended.foreign.is_some()).then_some(tended)
    }

    /// What the remote thread looks after (the shared tier in an object store): sealing
    /// our open shared segment when old, uploads and deletes, and other stores' listing.
    pub(crate) fn remote_tended(&self, refresh: Duration) -> Option<Tended> {
        let uploader = self.uploader.clone()?;
        Some(Tended {
            tiers: Vec::new(),
            shared: self.shared.clone(),
            foreign: self.foreign.clone(),
            uploader: Some(uploader),
            refresh,
        })
    }

    /// A count that grows while the remote thread's work moves (parts handed on, segments
    /// up or deleted, passes), for closing without waiting out a server that stopped
    /// answering.
    pub(crate) fn remote_progress(&self) -> u64 {
        self.uploader.as_ref().map_or(0, |u| u.progress())
    }

    /// The remote thread's work, for `stats()["remote"]`.
    pub(crate) fn remote_stats(&self) -> Option<RemoteStats> {
        self.uploader.as_ref().map(|u| u.stats())
    }

    /// Whether a segment tier is over its high watermark (the reclaimer should run).
    pub(crate) fn needs_reclaim(&self) -> bool {
        let mut tiers = self.ssd.iter().chain(self.shared.iter());
        tiers.any(|s| lock(s).needs_reclaim())
    }

    /// Closes every segment file the tiers hold (the store is closed and synced).
    pub(crate) fn release_files(&self) {
        for t in self.ssd.iter().chain(self.shared.iter()) {
            lock(t).release_files();
        }
        if let Some(f) = &self.foreign {
            lock(f).release_files();
        }
    }

    /// Syncs every segment tier's unsealed segments.
    pub(crate) fn sync_segments(&self) -> Result<(), KvError> {
        for t in self.ssd.iter().chain(self.shared.iter()) {
            let t = lock(t);
            t.sync_all().map_err(KvError::io(t.root()))?;
        }
        Ok(())
    }

    /// Every tier's index, locked (DRAM first) for a run of residency checks.
    pub(crate) fn residency(&self) -> Residency<'_> {
        Residency {
            dram: self.dram.as_ref().map(lock),
            ssd: self.ssd.as_deref().map(lock),
            shared: self.shared.as_deref().map(lock),
            foreign: self.foreign.as_deref().map(lock),
        }
    }

    /// The first lower tier holding `fp`: SSD, then our shared segments, then another
    /// store's.
    pub(crate) fn locate_lower(&self, fp: Fingerprint) -> Option<RecordLoc> {
        let segment_tiers = [(Lower::Ssd, &self.ssd), (Lower::Shared, &self.shared)];
        for (tier, t) in segment_tiers {
            if let Some((loc, file)) = t.as_ref().and_then(|t| lock(t).locate(fp)) {
                return Some(RecordLoc { tier, loc, file });
            }
        }
        let (slot, file) = lock(self.foreign.as_ref()?).locate(fp)?;
        Some(RecordLoc {
            tier: Lower::Foreign,
            loc: SsdLoc { segment: 0, slot },
            file,
        })
    }

    /// Deletes blocks from every tier this store writes: DRAM (with a write-back block on
    /// its way to SSD), the SSD and our shared segments; other stores' blocks are theirs.
    /// Each tier is locked once for all of them, in the store's lock order. Returns how
    /// many of `fps` some tier held.
    pub(crate) fn delete(&self, fps: &[Fingerprint]) -> usize {
        let mut held = vec![false; fps.len()];
        if let Some(d) = &self.dram {
            let mut d = lock(d);
            for (h, fp) in held.iter_mut().zip(fps) {
                *h |= d.delete(*fp);
            }
        }
        {
            // A demotion in flight then finds its block gone from the SSD policy too, and
            // does not publish it.
            let mut moving = lock(&self.demoting);
            for (h, fp) in held.iter_mut().zip(fps) {
                *h |= moving.remove(fp).is_some();
            }
        }
        for t in self.ssd.iter().chain(self.shared.iter()) {
            let mut t = lock(t);
            for (h, fp) in held.iter_mut().zip(fps) {
                *h |= t.delete(*fp);
            }
        }
        held.into_iter().filter(|h| *h).count()
    }

    /// A read from `at` failed (`corrupt`: it did not verify): the block is dropped from
    /// the index that pointed there.
    pub(crate) fn drop_lower(&self, fp: Fingerprint, at: &RecordLoc, corrupt: bool) {
        let tier = match at.tier {
            Lower::Ssd => &self.ssd,
            Lower::Shared => &self.shared,
            Lower::Foreign => {
                if let Some(f) = &self.foreign {
                    lock(f).drop_block(fp);
                }
                return;
            }
        };
        if let Some(t) = tier {
            lock(t).drop_block(fp, at.loc, corrupt);
        }
    }

    /// Counts a hit with the policy of the tier it came from (other stores' tiers have
    /// no policy of ours).
    pub(crate) fn touch_lower(&self, fp: Fingerprint, tier: Lower) {
        let t = match tier {
            Lower::Ssd => &self.ssd,
            Lower::Shared => &self.shared,
            Lower::Foreign => return,
        };
        if let Some(t) = t {
            lock(t).touch(fp);
        }
    }

    /// Each tier's occupancy, for `stats()`: DRAM, SSD, our shared segments, other
    /// stores' blocks.
    pub(crate) fn stats(
        &self,
        config: &KvConfig,
    ) -> (
        Option<TierStats>,
        Option<TierStats>,
        Option<TierStats>,
        Option<ForeignStats>,
    ) {
        let dram = self.dram.as_ref().map(|d| lock(d).tier_stats(config));
        let ssd = self.ssd.as_ref().map(|s| lock(s).tier_stats());
        let shared = self.shared.as_ref().map(|s| lock(s).tier_stats());
        let foreign = self.foreign.as_ref().map(|f| lock(f).stats());
        (dram, ssd, shared, foreign)
    }

    /// The SSD tier's counters (zero without one), and its segment count.
    pub(crate) fn ssd_counters(&self) -> (crate::ssd_tier::SsdCounters, u64) {
        match &self.ssd {
            Some(s) => {
                let s = lock(s);
                (s.counters(), s.segment_count() as u64)
            }
            None => Default::default(),
        }
    }
}

/// Opens the shared tier `config` asks for (none without `shared_dir`): this store's own
/// segments under `<shared_dir>/<store id>/` (when it has a shared budget) and the index of
/// other stores' segments beside them. The directory is created if absent; one that
/// cannot be created or listed is an error naming it.
#[allow(clippy::type_complexity)]
fn open_shared(
    config: &KvConfig,
    store_id: [u8; 16],
) -> Result<
    (
        Option<Arc<Mutex<SsdTier>>>,
        Option<Arc<Mutex<ForeignIndex>>>,
    ),
    KvError,
> {
    let Some(root) = &config.shared_dir else {
        return Ok((None, None));
    };
    let own_name = store_dir_name(store_id);
    create_dir(root)?;
    std::fs::read_dir(root).map_err(KvError::io(root))?;
    let own = open_own_segments(config, &root.join(&own_name), store_id)?;
    let index = ForeignIndex::new(root, own_name.into(), config.block_bytes, config.direct);
    let index = Arc::new(Mutex::new(index));
    // A directory's listing does not fail: one that cannot be read is logged.
    let _ = foreign::refresh(&index);
    Ok((own, Some(index)))
}

/// Opens the shared tier in the object store at `url`: this store's own segments (with a
/// shared budget) under `root/remote`, the uploader that puts them up under
/// `<url>/<store id>/`, and the index of other stores' segments there. The prefix is
/// listed once here, so a wrong bucket, endpoint or credentials fail the open with an
/// error naming the URL; after that the tier fails open (a failed pass or read is logged
/// and counted, a read that fails is a miss).
#[allow(clippy::type_complexity)]
fn open_remote(
    config: &KvConfig,
    url: &str,
    root: &Path,
    store_id: [u8; 16],
) -> Result<
    (
        Option<Arc<Mutex<SsdTier>>>,
        Option<Arc<Mutex<ForeignIndex>>>,
        Option<Arc<Uploader>>,
    ),
    KvError,
> {
    let own_name = store_dir_name(store_id);
    let remote = Arc::new(Remote::open(url, config.remote_timeout_ms)?);
    let index = ForeignIndex::remote(Arc::clone(&remote), own_name.clone(), config.block_bytes);
    let index = Arc::new(Mutex::new(index));
    foreign::refresh(&index).map_err(|source| KvError::Remote { source })?;
    let outbox = root.join("remote");
    let own = open_own_segments(config, &outbox, store_id)?;
    let uploader = Uploader::new(remote, &own_name, outbox, config.slot_bytes());
    Ok((own, Some(index), Some(Arc::new(uploader))))
}

/// The name of a store's own directory in a shared tier: its id in hex.
fn store_dir_name(store_id: [u8; 16]) -> String {
    store_id.iter().map(|b| format!("{b:02x}")).collect()
}

/// This store's own shared segments in `dir` (created if absent), with the shared budget
/// and policy; `None` for a reader (`shared_bytes` 0), which writes nothing there.
fn open_own_segments(
    config: &KvConfig,
    dir: &Path,
    store_id: [u8; 16],
) -> Result<Option<Arc<Mutex<SsdTier>>>, KvError> {
    if config.shared_bytes == 0 {
        return Ok(None);
    }
    create_dir(dir)?;
    let segments = FsSegmentDir::new(dir, config.direct).with_io_uring(config.use_io_uring()?);
    let tier = SsdTier::open(
        Arc::new(segments),
        dir.to_path_buf(),
        store_id,
        &config.shared_tier_config(),
    )?;
    Ok(Some(Arc::new(Mutex::new(tier))))
}

/// Every tier's lock, held for a run of residency checks (see [`Tiers::residency`]).
pub(crate) struct Residency<'a> {
    dram: Option<MutexGuard<'a, DramTier>>,
    ssd: Option<MutexGuard<'a, SsdTier>>,
    shared: Option<MutexGuard<'a, SsdTier>>,
    foreign: Option<MutexGuard<'a, ForeignIndex>>,
}

impl Residency<'_> {
    pub(crate) fn tier_of(&self, fp: Fingerprint) -> Option<Tier> {
        if self.dram.as_ref().is_some_and(|d| d.contains(fp)) {
            return Some(Tier::Dram);
        }
        if self.ssd.as_ref().is_some_and(|s| s.contains(fp)) {
            return Some(Tier::Ssd);
        }
        let shared = self.shared.as_ref().is_some_and(|s| s.contains(fp));
        if shared || self.foreign.as_ref().is_some_and(|f| f.contains(fp)) {
            return Some(Tier::Shared);
        }
        None
    }

    pub(crate) fn contains(&self, fp: Fingerprint) -> bool {
        self.tier_of(fp).is_some()
    }

    /// Whether one of this store's segment tiers (the SSD, our shared segments) holds a
    /// record of `fp`.
    pub(crate) fn in_segment_tier(&self, fp: Fingerprint) -> bool {
        self.ssd.as_ref().is_some_and(|s| s.contains(fp))
            || self.shared.as_ref().is_some_and(|s| s.contains(fp))
    }

    /// With the locks held: pins `fp`'s DRAM slot if DRAM holds exactly (`namespace_id`,
    /// `key`), else finds its record in a lower tier (for a lease).
    pub(crate) fn pin_or_locate(
        &mut self,
        fp: Fingerprint,
        namespace_id: &[u8; 16],
        key: &[u8],
    ) -> (Option<u32>, Option<RecordLoc>) {
        let dram_slot = self
            .dram
            .as_mut()
            .and_then(|d| d.pin(fp, namespace_id, key));
        if dram_slot.is_some() {
            return (dram_slot, None);
        }
        let at = |tier, t: Option<(SsdLoc, _)>| t.map(|(loc, file)| RecordLoc { tier, loc, file });
        let lower = at(Lower::Ssd, self.ssd.as_ref().and_then(|s| s.locate(fp)))
            .or_else(|| {
                at(
                    Lower::Shared,
                    self.shared.as_ref().and_then(|s| s.locate(fp)),
                )
            })
            .or_else(|| {
                let (slot, file) = self.foreign.as_mut()?.locate(fp)?;
                at(Lower::Foreign, Some((SsdLoc { segment: 0, slot }, file)))
            });
        (None, lower)
    }
}
