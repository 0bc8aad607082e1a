//! The disk tier's bookkeeping: what it holds of each file (blocks, hashes, pins, the seal)
//! and the least-recently-used order of its blocks; the layout of a file's table of hashes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::MetadataExt;

use super::DiskStats;

pub(super) const MAGIC: &[u8; 8] = b"SLCSUM02";
/// Magic, key, file size, block size.
pub(super) const HEADER: u64 = 8 + 32 + 8 + 8;
/// One block's hash.
pub(super) const SUM: u64 = 32;
pub(super) const NO_SUM: [u8; 32] = [0; 32];

pub(super) type Name = [u8; 16];

/// A block the cache holds.
#[derive(Clone, Copy)]
pub(super) struct Held {
    pub(super) sum: [u8; 32],
    /// Its last use (its key in the LRU).
    pub(super) tick: u64,
    /// Checked (or written) by this process: what passthrough needs of every block.
    pub(super) checked: bool,
}

/// One cached file.
pub(super) struct Cached {
    pub(super) key: [u8; 32],
    pub(super) size: u64,
    pub(super) block: u64,
    /// Each block, if held.
    pub(super) blocks: Vec<Option<Held>>,
    /// Passthrough opens and reads in progress: no block of a pinned file is evicted.
    pub(super) pins: usize,
    pub(super) writing: HashSet<u64>,
    /// The data file's change time when it became whole and checked: a different one at a
    /// passthrough open means another process wrote to it.
    pub(super) sealed: Option<(i64, i64)>,
    /// Warned that it changed since it was sealed.
    pub(super) warned_changed: bool,
}

/// Bytes of block `b` of a file of `size` bytes cut in blocks of `block`.
pub(super) fn block_len(size: u64, block: u64, b: u64) -> u64 {
    size.saturating_sub(b * block).min(block)
}

/// Bytes of the table of a file of `size` bytes cut in blocks of `block`.
pub(super) fn sums_len(size: u64, block: u64) -> u64 {
    HEADER + SUM * size.div_ceil(block)
}

impl Cached {
    pub(super) fn new(key: [u8; 32], size: u64, block: u64) -> Cached {
        Cached {
            key,
            size,
            block,
            blocks: vec![None; size.div_ceil(block) as usize],
            pins: 0,
            writing: HashSet::new(),
            sealed: None,
            warned_changed: false,
        }
    }

    pub(super) fn block_len(&self, b: u64) -> u64 {
        block_len(self.size, self.block, b)
    }

    pub(super) fn sums_len(&self) -> u64 {
        sums_len(self.size, self.block)
    }

    pub(super) fn held_blocks(&self) -> u64 {
        self.blocks.iter().flatten().count() as u64
    }

    pub(super) fn complete_and_checked(&self) -> bool {
        self.blocks.iter().all(|h| h.is_some_and(|h| h.checked))
    }

    /// Notes the data file's change time once the file is whole and checked, with no write
    /// of it in flight.
    pub(super) fn seal_if_whole(&mut self, data: &File) {
        if self.sealed.is_none() && self.writing.is_empty() && self.complete_and_checked() {
            self.sealed = change_time(data);
        }
    }
}

/// A file's change time (ctime), which any write to it moves.
pub(super) fn change_time(file: &File) -> Option<(i64, i64)> {
    file.metadata().ok().map(|m| (m.ctime(), m.ctime_nsec()))
}

#[derive(Default)]
pub(super) struct Index {
    pub(super) files: HashMap<Name, Cached>,
    /// Last-use tick to block, oldest first.
    pub(super) lru: BTreeMap<u64, (Name, u64)>,
    /// Bytes of held blocks and of tables, including blocks being written.
    pub(super) held: u64,
    pub(super) tick: u64,
    pub(super) stats: DiskStats,
    pub(super) warned: bool,
}

impl Index {
    pub(super) fn touch(&mut self, name: Name, b: u64) {
        self.tick += 1;
        let tick = self.tick;
        if let Some(c) = self.files.get_mut(&name) {
            if let Some(held) = &mut c.blocks[b as usize] {
                let last = std::mem::replace(&mut held.tick, tick);
                self.lru.remove(&last);
                self.lru.insert(tick, (name, b));
            }
        }
    }
}
