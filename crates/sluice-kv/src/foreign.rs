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
//!
//! The same index serves the shared tier in an object store (`remote_tier`): the prefix
//! is listed instead of the directory, summaries are fetched whole, and a segment is read
//! by ranged GETs. A summary whose object was rewritten (a store that reused a segment id)
//! is read again.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use sluice_formats::kv_summary::SegmentSummary;
use sluice_remote::RemoteError;

use crate::config::DirectIo;
use crate::namespace::{fp_map, Fingerprint, FpMap};
use crate::remote_tier::Remote;
use crate::segment_io::{open_foreign_segment, SegmentFile};
use crate::stats::{ForeignCounters, ForeignStats};
use crate::sync::lock;

/// Where another store's record lives.
#[derive(Clone, Debug)]
struct ForeignLoc {
    /// The segment's path, or its object's key.
    segment: Arc<Path>,
    slot: u32,
}

/// Where the other stores' segments are.
#[derive(Clone)]
enum Source {
    Dir { root: PathBuf, direct: DirectIo },
    Remote(Arc<Remote>),
}

/// A summary read: its segment, the object's date (remote), the fingerprints it added
/// (removed when it disappears).
struct Known {
    segment: Arc<Path>,
    stamp: Option<SystemTime>,
    fps: Vec<Fingerprint>,
}

/// Other stores' blocks, by fingerprint.
pub struct ForeignIndex {
    source: Source,
    /// This store's own directory name under the root (skipped).
    own: OsString,
    block_bytes: u64,
    entries: FpMap<ForeignLoc>,
    summaries: HashMap<PathBuf, Known>,
    /// Remote segments' sizes, from the listing.
    sizes: HashMap<Arc<Path>, u64>,
    files: HashMap<Arc<Path>, Arc<dyn SegmentFile>>,
    counters: ForeignCounters,
}

impl ForeignIndex {
    /// Closes every other store's segment file this index opened (the store is closed).
    pub fn release_files(&mut self) {
        self.entries.clear();
        self.summaries.clear();
        self.sizes.clear();
        self.files.clear();
    }

    pub fn new(root: &Path, own: OsString, block_bytes: u64, direct: DirectIo) -> ForeignIndex {
        let source = Source::Dir {
            root: root.to_path_buf(),
            direct,
        };
        ForeignIndex::with_source(source, own, block_bytes)
    }

    /// The index of the stores under an object-store prefix.
    pub(crate) fn remote(remote: Arc<Remote>, own: String, block_bytes: u64) -> ForeignIndex {
        ForeignIndex::with_source(Source::Remote(remote), own.into(), block_bytes)
    }

    fn with_source(source: Source, own: OsString, block_bytes: u64) -> ForeignIndex {
        ForeignIndex {
            source,
            own,
            block_bytes,
            entries: fp_map(0),
            summaries: HashMap::new(),
            sizes: HashMap::new(),
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

    /// The slot of `fp` and its segment file (opened on first use; an object's is a
    /// handle, no request). A segment that can no longer be opened (its owner dropped it)
    /// loses its blocks here.
    pub fn locate(&mut self, fp: Fingerprint) -> Option<(u32, Arc<dyn SegmentFile>)> {
        let loc = self.entries.get(&fp)?.clone();
        if let Some(f) = self.files.get(&loc.segment) {
            return Some((loc.slot, Arc::clone(f)));
        }
        let opened = match &self.source {
            Source::Dir { direct, .. } => open_foreign_segment(&loc.segment, *direct),
            Source::Remote(r) => {
                let size = self.sizes.get(&loc.segment).copied().unwrap_or(0);
                let key = loc.segment.to_str().unwrap_or_default();
                Ok(r.segment(key, size))
            }
        };
        match opened {
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
            .iter()
            .filter(|(p, k)| scan.listed.get(*p) != Some(&k.stamp))
            .map(|(p, _)| p.clone())
            .collect();
        for summary in gone {
            self.forget(&summary);
        }
        for found in scan.read {
            let fps = match found.summary {
                Some(s) => self.add(&found.segment, s),
                None => {
                    self.counters.skipped_summaries += 1;
                    Vec::new()
                }
            };
            if let Some(size) = found.size {
                self.sizes.insert(Arc::clone(&found.segment), size);
            }
            let known = Known {
                segment: found.segment,
                stamp: found.stamp,
                fps,
            };
            self.summaries.insert(found.id, known);
        }
        self.counters.stores = scan.stores;
        self.counters.segments = self
            .summaries
            .values()
            .filter(|k| !k.fps.is_empty())
            .count() as u64;
        self.counters.refreshes += 1;
    }

    fn add(&mut self, segment: &Arc<Path>, s: SegmentSummary) -> Vec<Fingerprint> {
        let mut fps = Vec::with_capacity(s.entries.len());
        for e in s.entries {
            let fp = Fingerprint::of(&e.namespace_id, &e.key);
            // Two stores holding one block: the first found serves it.
            if let std::collections::hash_map::Entry::Vacant(v) = self.entries.entry(fp) {
                v.insert(ForeignLoc {
                    segment: Arc::clone(segment),
                    slot: e.slot,
                });
                fps.push(fp);
            }
        }
        fps
    }

    fn forget(&mut self, summary: &Path) {
        let Some(known) = self.summaries.remove(summary) else {
            return;
        };
        for fp in known.fps {
            if self
                .entries
                .get(&fp)
                .is_some_and(|l| l.segment == known.segment)
            {
                self.entries.remove(&fp);
            }
        }
        self.files.remove(&known.segment);
        self.sizes.remove(&known.segment);
    }
}

/// A summary a scan read.
struct Found {
    id: PathBuf,
    segment: Arc<Path>,
    stamp: Option<SystemTime>,
    /// The segment object's size (remote).
    size: Option<u64>,
    /// Decoded (`None`: unusable, remembered as such).
    summary: Option<SegmentSummary>,
}

/// What one listing of the shared directory found.
struct Scan {
    /// Every summary listed, with its object's date (remote).
    listed: HashMap<PathBuf, Option<SystemTime>>,
    /// The summaries not known before (or rewritten since).
    read: Vec<Found>,
    stores: u64,
}

/// Lists the shared directory (or prefix) and reads the summaries `index` does not know
/// yet, without holding its lock, then applies what changed. A listing of an object store
/// that fails leaves the index as it was and returns the error.
pub(crate) fn refresh(index: &Mutex<ForeignIndex>) -> Result<(), RemoteError> {
    let (source, own, block_bytes, known) = {
        let g = lock(index);
        let known: HashMap<PathBuf, Option<SystemTime>> = g
            .summaries
            .iter()
            .map(|(p, k)| (p.clone(), k.stamp))
            .collect();
        (g.source.clone(), g.own.clone(), g.block_bytes, known)
    };
    let scan = match &source {
        Source::Dir { root, .. } => scan_dir(root, &own, block_bytes, &known),
        Source::Remote(r) => match scan_remote(r, &own, block_bytes, &known) {
            Ok(scan) => scan,
            Err(e) => {
                lock(index).counters.refresh_failures += 1;
                return Err(e);
            }
        },
    };
    lock(index).apply(scan);
    Ok(())
}

fn scan_dir(
    root: &Path,
    own: &OsString,
    block_bytes: u64,
    known: &HashMap<PathBuf, Option<SystemTime>>,
) -> Scan {
    let mut out = Scan {
        listed: HashMap::new(),
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
            if !known.contains_key(&path) {
                let bytes = sluice_engine::open_regular(&path, 0).and_then(|mut f| {
                    let mut v = Vec::new();
                    std::io::Read::read_to_end(&mut f, &mut v).map(|_| v)
                });
                out.read.push(Found {
                    id: path.clone(),
                    segment: path.with_extension("skv").into(),
                    stamp: None,
                    size: None,
                    summary: decode_summary(&path, bytes.ok(), block_bytes),
                });
            }
            out.listed.insert(path, None);
        }
    }
    out
}

fn scan_remote(
    remote: &Remote,
    own: &OsString,
    block_bytes: u64,
    known: &HashMap<PathBuf, Option<SystemTime>>,
) -> Result<Scan, RemoteError> {
    let mut out = Scan {
        listed: HashMap::new(),
        read: Vec::new(),
        stores: 0,
    };
    let listed = remote.list()?;
    let sizes: HashMap<&str, u64> = listed
        .iter()
        .filter(|l| l.key.ends_with(".skv"))
        .map(|l| (l.key.as_str(), l.size))
        .collect();
    let mut stores = HashSet::new();
    for l in &listed {
        let Some((store, _)) = remote.split(&l.key) else {
            continue;
        };
        if own.to_str() == Some(store) {
            continue;
        }
        stores.insert(store);
        let Some(base) = l.key.strip_suffix(".summary") else {
            continue;
        };
        let seg_key = format!("{base}.skv");
        // A summary goes up after its segment: one without is a pass cut short.
        let Some(size) = sizes.get(seg_key.as_str()) else {
            continue;
        };
        let id = PathBuf::from(&l.key);
        let stamp = Some(l.modified);
        if known.get(&id) != Some(&stamp) {
            let bytes = remote.get(&l.key)?;
            out.read.push(Found {
                id: id.clone(),
                segment: Path::new(&seg_key).into(),
                stamp,
                size: Some(*size),
                summary: decode_summary(&id, bytes.map(|b| b.to_vec()), block_bytes),
            });
        }
        out.listed.insert(id, stamp);
    }
    out.stores = stores.len() as u64;
    Ok(out)
}

/// A summary worth indexing: it decodes and its blocks are ours in size.
fn decode_summary(path: &Path, bytes: Option<Vec<u8>>, block_bytes: u64) -> Option<SegmentSummary> {
    let bytes = bytes?;
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
