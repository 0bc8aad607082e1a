//! [`ForeignIndex`]: the blocks other stores wrote into the shared directory.
//!
//! Stores that share a directory (nodes mounting one NFS or Lustre path) each append their
//! own segments under `<shared_dir>/<store id>/`. A store learns what the others hold from
//! their segment summaries (`sluice_formats::kv_summary`), which each owner writes when it
//! seals a segment: every `shared_refresh_ms` the directory is listed and each new summary
//! read. Only sealed segments are visible, and their records never change.
//!
//! The owner alone evicts its segments. A segment it dropped disappears from the listing,
//! and its blocks from this index at the next refresh; a read that races the drop, or a
//! record that does not verify (every read checks key, namespace and checksum), is a miss
//! and the block is dropped here. So another node can make us miss, never read wrong bytes.
//!
//! Listing and reading summaries happen outside the index's lock ([`refresh`]), so a slow
//! network file system delays discovery, not lookups.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use sluice_formats::kv_summary::SegmentSummary;

use crate::config::DirectIo;
use crate::namespace::{fp_map, Fingerprint, FpMap};
use crate::segment_io::{open_foreign_segment, SegmentFile};
use crate::stats::{ForeignCounters, ForeignStats};
use crate::sync::lock;

/// Where another store's record lives.
#[derive(Clone, Debug)]
struct ForeignLoc {
    segment: Arc<Path>,
    slot: u32,
}

/// Other stores' blocks, by fingerprint.
pub struct ForeignIndex {
    root: PathBuf,
    /// This store's own directory name under `root` (skipped).
    own: OsString,
    block_bytes: u64,
    direct: DirectIo,
    entries: FpMap<ForeignLoc>,
    /// Per summary file read: the fingerprints it added (removed when it disappears).
    summaries: HashMap<PathBuf, Vec<Fingerprint>>,
    files: HashMap<Arc<Path>, Arc<dyn SegmentFile>>,
    counters: ForeignCounters,
}

impl ForeignIndex {
    /// Closes every other store's segment file this index opened (the store is closed).
    pub fn release_files(&mut self) {
        self.entries.clear();
        self.summaries.clear();
        self.files.clear();
    }

    pub fn new(root: &Path, own: OsString, block_bytes: u64, direct: DirectIo) -> ForeignIndex {
        ForeignIndex {
            root: root.to_path_buf(),
            own,
            block_bytes,
            direct,
            entries: fp_map(0),
            summaries: HashMap::new(),
            files: HashMap::new(),
            counters: ForeignCounters::default(),
        }
    }

    pub fn contains(&self, fp: Fingerprint) -> bool {
        self.entries.contains_key(&fp)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The slot of `fp` and its segment file (opened on first use). A segment that can no
    /// longer be opened (its owner dropped it) loses its blocks here.
    pub fn locate(&mut self, fp: Fingerprint) -> Option<(u32, Arc<dyn SegmentFile>)> {
        let loc = self.entries.get(&fp)?.clone();
        if let Some(f) = self.files.get(&loc.segment) {
            return Some((loc.slot, Arc::clone(f)));
        }
        match open_foreign_segment(&loc.segment, self.direct) {
            Ok(f) => {
                self.files.insert(Arc::clone(&loc.segment), Arc::clone(&f));
                Some((loc.slot, f))
            }
            Err(e) => {
                tracing::debug!("{}: {e}; its blocks are gone", loc.segment.display());
                self.entries.retain(|_, l| l.segment != loc.segment);
                None
            }
        }
    }

    /// A read of `fp` failed or did not verify: it is a miss from now on.
    pub fn drop_block(&mut self, fp: Fingerprint) {
        if self.entries.remove(&fp).is_some() {
            self.counters.read_failures += 1;
        }
    }

    /// Approximate bytes of the index.
    pub fn index_bytes(&self) -> usize {
        crate::namespace::fp_map_bytes(&self.entries)
    }

    /// What `stats()["foreign"]` shows.
    pub(crate) fn stats(&self) -> ForeignStats {
        ForeignStats {
            blocks: self.len() as u64,
            index_bytes: self.index_bytes() as u64,
            counters: self.counters,
        }
    }

    fn apply(&mut self, scan: Scan) {
        let gone: Vec<PathBuf> = self
            .summaries
            .keys()
            .filter(|p| !scan.listed.contains(*p))
            .cloned()
            .collect();
        for summary in gone {
            self.forget(&summary);
        }
        for (summary, read) in scan.read {
            let fps = match read {
                Some(s) => self.add(&summary, s),
                None => {
                    self.counters.skipped_summaries += 1;
                    Vec::new()
                }
            };
            self.summaries.insert(summary, fps);
        }
        self.counters.stores = scan.stores;
        self.counters.segments = self.summaries.values().filter(|v| !v.is_empty()).count() as u64;
        self.counters.refreshes += 1;
    }

    fn add(&mut self, summary: &Path, s: SegmentSummary) -> Vec<Fingerprint> {
        let segment: Arc<Path> = summary.with_extension("skv").into();
        let mut fps = Vec::with_capacity(s.entries.len());
        for e in s.entries {
            let fp = Fingerprint::of(&e.namespace_id, &e.key);
            // Two stores holding one block: the first found serves it.
            if let std::collections::hash_map::Entry::Vacant(v) = self.entries.entry(fp) {
                v.insert(ForeignLoc {
                    segment: Arc::clone(&segment),
                    slot: e.slot,
                });
                fps.push(fp);
            }
        }
        fps
    }

    fn forget(&mut self, summary: &Path) {
        let segment = summary.with_extension("skv");
        for fp in self.summaries.remove(summary).unwrap_or_default() {
            if self
                .entries
                .get(&fp)
                .is_some_and(|l| *l.segment == *segment)
            {
                self.entries.remove(&fp);
            }
        }
        self.files.remove(segment.as_path());
    }
}

/// What one listing of the shared directory found.
struct Scan {
    /// Every summary file listed.
    listed: HashSet<PathBuf>,
    /// The summaries not known before, decoded (`None`: unusable, remembered as such).
    read: Vec<(PathBuf, Option<SegmentSummary>)>,
    stores: u64,
}

/// Lists the shared directory and reads the summaries `index` does not know yet, without
/// holding its lock, then applies what changed.
pub(crate) fn refresh(index: &Mutex<ForeignIndex>) {
    let (root, own, block_bytes, known) = {
        let g = lock(index);
        let known: HashSet<PathBuf> = g.summaries.keys().cloned().collect();
        (g.root.clone(), g.own.clone(), g.block_bytes, known)
    };
    let scan = scan(&root, &own, block_bytes, &known);
    lock(index).apply(scan);
}

fn scan(root: &Path, own: &OsString, block_bytes: u64, known: &HashSet<PathBuf>) -> Scan {
    let mut out = Scan {
        listed: HashSet::new(),
        read: Vec::new(),
        stores: 0,
    };
    let Ok(stores) = std::fs::read_dir(root) else {
        tracing::debug!("{}: cannot list the shared directory", root.display());
        return out;
    };
    for store in stores.flatten() {
        if store.file_name() == *own || !store.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        out.stores += 1;
        let Ok(files) = std::fs::read_dir(store.path()) else {
            continue;
        };
        for f in files.flatten() {
            let path = f.path();
            if path.extension().is_none_or(|e| e != "summary") {
                continue;
            }
            if !known.contains(&path) {
                out.read
                    .push((path.clone(), read_summary(&path, block_bytes)));
            }
            out.listed.insert(path);
        }
    }
    out
}

/// A summary worth indexing: it decodes and its blocks are ours in size.
fn read_summary(path: &Path, block_bytes: u64) -> Option<SegmentSummary> {
    let bytes = sluice_engine::open_regular(path, 0)
        .and_then(|mut f| {
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut f, &mut v).map(|_| v)
        })
        .ok()?;
    match SegmentSummary::decode(&bytes) {
        Ok(s) if s.block_bytes == block_bytes => Some(s),
        Ok(s) => {
            tracing::debug!(
                "{}: {}-byte blocks, not ours ({block_bytes}); skipped",
                path.display(),
                s.block_bytes
            );
            None
        }
        Err(e) => {
            tracing::warn!("{}: {e}; skipped", path.display());
            None
        }
    }
}
