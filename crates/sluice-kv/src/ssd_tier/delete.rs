//! Deleting a block from the SSD tier (`KvStore::delete`, docs/design/kv.md "Deletes").

use crate::namespace::Fingerprint;

use super::SsdTier;

impl SsdTier {
    /// Deletes a block (its owner has no more use for it): it leaves the index and the
    /// policy's books, so its room is free for the next admission, and a put of it in
    /// flight is not published. A sealed segment left with no live record is removed at
    /// once, not at the next reclaim pass, so the files shrink with the deletes. Returns
    /// whether the tier held the block.
    pub fn delete(&mut self, fp: Fingerprint) -> bool {
        // Without a removal in the policy, the block stays in its books until evicted.
        self.policy.remove(fp.0);
        let Some(loc) = self.index.remove(&fp) else {
            return false;
        };
        self.dec_live(loc);
        let dead = self
            .segments
            .get(&loc.segment)
            .is_some_and(|s| s.live == 0 && s.pending == 0 && s.sealed && !s.compacting);
        if dead && self.active != Some(loc.segment) {
            self.remove_segment_file(loc.segment);
        }
        true
    }
}
