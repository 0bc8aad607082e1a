//! The tiers below DRAM, as the data path sees them: the local SSD tier, this store's
//! own segments in the shared directory, and the segments other stores sealed there.
//!
//! All three hold the same records (`sluice_formats::kv`), so a get reads and verifies a
//! block the same way wherever it lies; what differs is who may evict it (our policies,
//! or another store) and what a failed read drops (an index entry of ours, or of the
//! foreign index). A hit in the shared directory is promoted into DRAM and the local SSD
//! as their policies decide, so a block read from a network file system once is local
//! the next time.

use std::sync::{Arc, Mutex};

use crate::config::KvConfig;
use crate::error::KvError;
use crate::foreign::{self, ForeignIndex};
use crate::namespace::Fingerprint;
use crate::segment_io::{FsSegmentDir, SegmentFile};
use crate::ssd_tier::{SsdLoc, SsdTier};
use crate::store::{lock, KvStore};

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

/// The shared tier of a store: its own segments under `<shared_dir>/<store id>/` (when it
/// has a shared budget) and the index of other stores' segments beside them.
pub(crate) type SharedTiers = (
    Option<Arc<Mutex<SsdTier>>>,
    Option<Arc<Mutex<ForeignIndex>>>,
);

/// Opens the shared tier `config` asks for (none without `shared_dir`). The directory is
/// created if absent; one that cannot be created or listed is an error naming it.
pub(crate) fn open_shared(config: &KvConfig, store_id: [u8; 16]) -> Result<SharedTiers, KvError> {
    let Some(root) = &config.shared_dir else {
        return Ok((None, None));
    };
    let own_name: String = store_id.iter().map(|b| format!("{b:02x}")).collect();
    let own_dir = root.join(&own_name);
    std::fs::create_dir_all(root).map_err(KvError::io(root))?;
    std::fs::read_dir(root).map_err(KvError::io(root))?;
    let own = match config.shared_bytes {
        0 => None, // a reader: nothing of ours in the directory
        _ => {
            std::fs::create_dir_all(&own_dir).map_err(KvError::io(&own_dir))?;
            let dir =
                FsSegmentDir::new(&own_dir, config.direct).with_io_uring(config.use_io_uring()?);
            let dir = Arc::new(dir);
            let tier = SsdTier::open(dir, own_dir, store_id, &config.shared_tier_config())?;
            Some(Arc::new(Mutex::new(tier)))
        }
    };
    let index = ForeignIndex::new(root, own_name.into(), config.block_bytes, config.direct);
    let index = Arc::new(Mutex::new(index));
    foreign::refresh(&index);
    Ok((own, Some(index)))
}

impl KvStore {
    /// The first lower tier holding `fp`: SSD, then our shared segments, then another
    /// store's.
    pub(crate) fn locate_lower(&self, fp: Fingerprint) -> Option<RecordLoc> {
        let inner = &self.inner;
        let segment_tiers = [(Lower::Ssd, &inner.ssd), (Lower::Shared, &inner.shared)];
        for (tier, t) in segment_tiers {
            if let Some((loc, file)) = t.as_ref().and_then(|t| lock(t).locate(fp)) {
                return Some(RecordLoc { tier, loc, file });
            }
        }
        let (slot, file) = lock(inner.foreign.as_ref()?).locate(fp)?;
        Some(RecordLoc {
            tier: Lower::Foreign,
            loc: SsdLoc { segment: 0, slot },
            file,
        })
    }

    /// A read from `at` failed (`corrupt`: it did not verify): the block is dropped from
    /// the index that pointed there.
    pub(crate) fn drop_lower(&self, fp: Fingerprint, at: &RecordLoc, corrupt: bool) {
        let inner = &self.inner;
        let tier = match at.tier {
            Lower::Ssd => &inner.ssd,
            Lower::Shared => &inner.shared,
            Lower::Foreign => {
                if let Some(f) = &inner.foreign {
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
            Lower::Ssd => &self.inner.ssd,
            Lower::Shared => &self.inner.shared,
            Lower::Foreign => return,
        };
        if let Some(t) = t {
            lock(t).touch(fp);
        }
    }
}
