//! The shared tier in an object store (`remote = "s3://bucket/prefix"`): what the shared
//! directory does over NFS or Lustre, over S3, GCS or Azure Blob.
//!
//! The layout is the directory's: every store keeps its segments under
//! `<prefix>/<store id>/` as `seg-<id>.skv`, each with its `seg-<id>.summary`. An object
//! store has no appends and no writes at an offset, so a store writes its own shared
//! segments locally (a segment store like the SSD tier's, under `<store>/remote/`, with
//! the shared budget and policy) and the remote thread ([`Uploader`]) puts each sealed
//! one up whole, then its summary. A summary is what makes a segment visible to others,
//! and it goes up only once the segment is there. A segment the local store dropped
//! (evicted or compacted) is deleted remotely, summary first, so readers stop looking
//! before its bytes go.
//!
//! Other stores' segments are found by listing the prefix (`foreign::refresh`, on the
//! same thread), and each record is read by a ranged GET ([`RemoteSegmentFile`]) under
//! `remote_timeout_ms` with no retry: a block that does not come in time, that is gone or
//! that does not verify is a miss. Lookups consult the index in memory only.

use std::collections::{HashMap, HashSet};
use std::io::{self, IoSliceMut};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use sluice_formats::kv_summary::SegmentSummary;
use sluice_remote::{Listed, ObjectInfo, ObjectUrl, RemoteError, RemoteOptions, RemoteStore};

use crate::error::KvError;
use crate::segment_io::SegmentFile;
use crate::ssd_tier::{sealed_marker, summary_path};
use crate::stats::RemoteStats;
use crate::sync::lock;

/// One object-store prefix of the shared tier.
pub(crate) struct Remote {
    /// Record reads: `remote_timeout_ms` per GET, no retry.
    reads: RemoteStore,
    /// Listings, summaries, uploads and deletes: the environment's settings.
    writes: RemoteStore,
    /// The prefix, without a trailing `/`.
    prefix: ObjectUrl,
}

impl Remote {
    /// The prefix `url`, its stores configured from the environment as the loaders' are
    /// (`AWS_*`, `GOOGLE_*`, `AZURE_*`, `SLUICE_REMOTE_*`).
    pub(crate) fn open(url: &str, timeout_ms: u64) -> Result<Remote, KvError> {
        let remote = |source| KvError::Remote { source };
        let parsed = ObjectUrl::parse(url).map_err(remote)?;
        // Every record carries a BLAKE3 of its bytes and is verified on every read.
        let opts = RemoteOptions::from_env_self_verified().map_err(remote)?;
        let writes = RemoteStore::open(&parsed, &opts).map_err(remote)?;
        let read_opts = RemoteOptions {
            retries: 0,
            timeout: Duration::from_millis(timeout_ms),
            ..opts
        };
        let reads = RemoteStore::open(&parsed, &read_opts).map_err(remote)?;
        Ok(Remote::with_stores(parsed, reads, writes))
    }

    /// The prefix `url` over any object store (an in-memory one in tests).
    #[cfg(test)]
    fn with_store(url: &str, store: Arc<dyn object_store::ObjectStore>) -> Remote {
        let parsed = ObjectUrl::parse(url).expect("a test URL");
        let opts = RemoteOptions::default();
        let reads = RemoteStore::with_store(&parsed, Arc::clone(&store), &opts);
        let writes = RemoteStore::with_store(&parsed, store, &opts);
        Remote::with_stores(parsed, reads, writes)
    }

    fn with_stores(url: ObjectUrl, reads: RemoteStore, writes: RemoteStore) -> Remote {
        let key = url.key.trim_end_matches('/').to_string();
        Remote {
            reads,
            writes,
            prefix: ObjectUrl { key, ..url },
        }
    }

    /// The URL of `key`, an object of the prefix's bucket.
    fn url(&self, key: &str) -> ObjectUrl {
        ObjectUrl {
            key: key.to_string(),
            ..self.prefix.clone()
        }
    }

    /// Every object under the prefix, in key order.
    pub(crate) fn list(&self) -> Result<Vec<Listed>, RemoteError> {
        self.writes.list_dated(&self.prefix.join(""))
    }

    /// A summary's bytes (`None`: it is gone).
    pub(crate) fn get(&self, key: &str) -> Result<Option<Bytes>, RemoteError> {
        Ok(self.writes.get(&self.url(key))?.map(|(b, _)| b))
    }

    /// `key` relative to the prefix: (store directory, file name), for keys one level
    /// below a store's directory.
    pub(crate) fn split<'k>(&self, key: &'k str) -> Option<(&'k str, &'k str)> {
        let rest = match self.prefix.key.is_empty() {
            true => key,
            false => key
                .strip_prefix(self.prefix.key.as_str())?
                .strip_prefix('/')?,
        };
        let (store, name) = rest.split_once('/')?;
        (!store.is_empty() && !name.is_empty() && !name.contains('/')).then_some((store, name))
    }

    /// The object `key`, `size` bytes long, as a segment file to read records from.
    pub(crate) fn segment(self: &Arc<Self>, key: &str, size: u64) -> Arc<dyn SegmentFile> {
        Arc::new(RemoteSegmentFile {
            remote: Arc::clone(self),
            info: ObjectInfo {
                url: self.url(key),
                size,
                etag: None,
            },
        })
    }
}

/// Another store's segment in the object store: each read is ranged GETs (one per 8 MiB,
/// in flight together; a record's header rides with its payload's first piece) under the
/// tier's timeout. Read-only.
struct RemoteSegmentFile {
    remote: Arc<Remote>,
    info: ObjectInfo,
}

impl SegmentFile for RemoteSegmentFile {
    fn write_vectored_at(&self, _: &[&[u8]], _: u64) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{}: another store's segment is read-only", self.info.url),
        ))
    }

    fn read_vectored_at(&self, bufs: &mut [IoSliceMut<'_>], offset: u64) -> io::Result<usize> {
        // Short only at the end of the object, as a file's read is.
        let mut parts = Vec::with_capacity(bufs.len());
        let mut at = offset;
        for buf in bufs.iter_mut() {
            let n = (buf.len() as u64).min(self.info.size.saturating_sub(at)) as usize;
            if n == 0 {
                break;
            }
            parts.push(&mut buf[..n]);
            at += n as u64;
        }
        self.remote
            .reads
            .read_vectored(&self.info, offset, parts)
            .map(|r| r.bytes as usize)
            .map_err(RemoteError::into_io)
    }

    fn sync(&self) -> io::Result<()> {
        Ok(())
    }

    fn is_direct(&self) -> bool {
        false
    }
}

/// Puts this store's sealed shared segments up and deletes those it dropped: one pass
/// per `shared_refresh_ms` on the remote thread, and one when the store closes.
pub(crate) struct Uploader {
    remote: Arc<Remote>,
    /// This store's directory under the prefix.
    own: ObjectUrl,
    /// Where the local store keeps its shared segments.
    outbox: PathBuf,
    slot_bytes: u64,
    stats: Mutex<RemoteStats>,
    /// Grows with every part handed on, segment up or deleted, and pass: see
    /// [`Uploader::progress`].
    progress: AtomicU64,
    /// Local segments that could not be read for an upload (each logged once).
    unreadable: Mutex<HashSet<String>>,
}

/// A sealed local segment, ready to go up.
struct Sealed {
    stem: String,
    summary: Bytes,
    /// Bytes of the segment up to its last record (one sealed early by age leaves the
    /// rest of its file unused).
    used: u64,
}

impl Uploader {
    pub(crate) fn new(
        remote: Arc<Remote>,
        own: &str,
        outbox: PathBuf,
        slot_bytes: u64,
    ) -> Uploader {
        let own = remote.prefix.join(own);
        Uploader {
            remote,
            own,
            outbox,
            slot_bytes,
            stats: Mutex::new(RemoteStats::default()),
            progress: AtomicU64::new(0),
            unreadable: Mutex::new(HashSet::new()),
        }
    }

    /// A count that grows while the uploader's work moves: closing waits for the last
    /// pass as long as it does.
    pub(crate) fn progress(&self) -> u64 {
        self.progress.load(Ordering::Relaxed)
    }

    fn moved(&self) {
        self.progress.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn stats(&self) -> RemoteStats {
        lock(&self.stats).clone()
    }

    /// One pass; a failure is logged and counted, and the next pass tries again.
    /// Returns whether it went through.
    pub(crate) fn run_once(&self) -> bool {
        let done = self.pass();
        self.moved();
        let mut s = lock(&self.stats);
        s.passes += 1;
        match done {
            Ok(()) => {
                s.last_error = None;
                true
            }
            Err(e) => {
                if s.last_error.is_none() {
                    tracing::warn!("kv remote tier: {e}; trying again in the next pass");
                }
                s.failed_passes += 1;
                s.last_error = Some(e.to_string());
                false
            }
        }
    }

    fn pass(&self) -> Result<(), RemoteError> {
        let listed = self.remote.writes.list_dated(&self.own.join(""))?;
        let up: HashSet<&str> = listed
            .iter()
            .filter_map(|l| l.key.rsplit('/').next())
            .collect();
        let (sealed, local) = self.local_segments();
        let to_upload: Vec<&Sealed> = sealed
            .iter()
            .filter(|s| !up.contains(format!("{}.summary", s.stem).as_str()))
            .collect();
        lock(&self.stats).pending_segments = to_upload.len() as u64;
        for seg in to_upload {
            let summary = format!("{}.summary", seg.stem);
            let skv = format!("{}.skv", seg.stem);
            let path = self.outbox.join(&skv);
            let part = |_| self.moved();
            let put = self
                .remote
                .writes
                .put_file(&self.own.join(&skv), &path, seg.used, &part);
            match put {
                Ok(()) => {}
                // Dropped while we looked: nothing to publish.
                Err(RemoteError::Local { .. }) if !path.exists() => continue,
                // A local file that cannot be read (damaged, truncated under us) holds up
                // only itself: the others still go up, and it is tried again next pass.
                Err(e @ RemoteError::Local { .. }) => {
                    if lock(&self.unreadable).insert(seg.stem.clone()) {
                        tracing::warn!("kv remote tier: {e}; not uploaded");
                    }
                    continue;
                }
                Err(e) => return Err(e),
            }
            self.remote
                .writes
                .put(&self.own.join(&summary), seg.summary.clone())?;
            let mut s = lock(&self.stats);
            s.uploaded_segments += 1;
            s.uploaded_bytes += seg.used + seg.summary.len() as u64;
            s.pending_segments = s.pending_segments.saturating_sub(1);
            drop(s);
            self.moved();
        }
        // What the local store dropped goes: the summary first (readers stop looking),
        // then the segment; a segment left without its summary by an interrupted pass too.
        let mut stems: HashMap<&str, (bool, bool)> = HashMap::new();
        for name in &up {
            if let Some(stem) = name.strip_suffix(".summary") {
                stems.entry(stem).or_default().0 = true;
            } else if let Some(stem) = name.strip_suffix(".skv") {
                stems.entry(stem).or_default().1 = true;
            }
        }
        for (stem, (summary, skv)) in stems {
            if local.contains(stem) {
                continue;
            }
            if summary {
                self.remote
                    .writes
                    .delete(&self.own.join(&format!("{stem}.summary")))?;
            }
            if skv {
                self.remote
                    .writes
                    .delete(&self.own.join(&format!("{stem}.skv")))?;
            }
            lock(&self.stats).deleted_segments += 1;
            self.moved();
        }
        Ok(())
    }

    /// The local shared segments: those sealed (with a summary), and every segment's stem.
    fn local_segments(&self) -> (Vec<Sealed>, HashSet<String>) {
        let mut sealed = Vec::new();
        let mut all = HashSet::new();
        let Ok(dir) = std::fs::read_dir(&self.outbox) else {
            return (sealed, all);
        };
        for entry in dir.flatten() {
            let name = entry.file_name();
            let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".skv")) else {
                continue;
            };
            all.insert(stem.to_string());
            let path = entry.path();
            if !sealed_marker(&path).exists() {
                continue;
            }
            if let Some(s) = self.sealed(stem, &path) {
                sealed.push(s);
            }
        }
        sealed.sort_by(|a, b| a.stem.cmp(&b.stem));
        (sealed, all)
    }

    fn sealed(&self, stem: &str, path: &Path) -> Option<Sealed> {
        let summary = std::fs::read(summary_path(path)).ok()?;
        let decoded = match SegmentSummary::decode(&summary) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("{}: {e}; not uploaded", path.display());
                return None;
            }
        };
        let last = decoded.entries.iter().map(|e| e.slot).max().unwrap_or(0);
        let len = std::fs::metadata(path).ok()?.len();
        Some(Sealed {
            stem: stem.to_string(),
            summary: Bytes::from(summary),
            used: ((last as u64 + 1) * self.slot_bytes).min(len),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;
    use sluice_formats::kv_summary::SummaryEntry;

    const SLOT: u64 = 8192;

    /// A sealed segment `id` in `dir` with records in slots 1..=`records`, its file
    /// `file_slots` slots long.
    fn sealed(dir: &Path, id: u64, records: u32, file_slots: u64) {
        let stem = dir.join(format!("seg-{id:016x}"));
        std::fs::write(
            stem.with_extension("skv"),
            vec![id as u8; (file_slots * SLOT) as usize],
        )
        .unwrap();
        std::fs::write(stem.with_extension("sealed"), b"").unwrap();
        let summary = SegmentSummary {
            store_id: [1; 16],
            segment_id: id,
            block_bytes: 4096,
            entries: (1..=records)
                .map(|slot| SummaryEntry {
                    slot,
                    seq: slot.into(),
                    namespace_id: [2; 16],
                    key: vec![slot as u8],
                })
                .collect(),
        };
        std::fs::write(stem.with_extension("summary"), summary.encode()).unwrap();
    }

    fn listing(remote: &Remote) -> Vec<(String, u64)> {
        let mut out: Vec<_> = remote
            .list()
            .unwrap()
            .into_iter()
            .map(|l| (l.key, l.size))
            .collect();
        out.sort();
        out
    }

    #[test]
    fn a_pass_uploads_sealed_segments_skips_an_unreadable_one_and_deletes_what_went() {
        let outbox = tempfile::tempdir().unwrap();
        let remote = Arc::new(Remote::with_store("s3://b/kv", Arc::new(InMemory::new())));
        let up = Uploader::new(Arc::clone(&remote), "own", outbox.path().into(), SLOT);
        // Segment 1: 3 records in a file of 32 slots (sealed early): 4 slots go up.
        sealed(outbox.path(), 1, 3, 32);
        // Segment 2 cannot be read (its file is a directory); segment 3 is not sealed.
        sealed(outbox.path(), 2, 1, 4);
        let skv2 = outbox.path().join(format!("seg-{:016x}.skv", 2));
        std::fs::remove_file(&skv2).unwrap();
        std::fs::create_dir(&skv2).unwrap();
        std::fs::write(outbox.path().join(format!("seg-{:016x}.skv", 3)), b"open").unwrap();
        assert!(up.run_once(), "{:?}", up.stats());
        let seg1 = format!("kv/own/seg-{:016x}", 1);
        let got = listing(&remote);
        let summary1 = std::fs::metadata(outbox.path().join(format!("seg-{:016x}.summary", 1)))
            .unwrap()
            .len();
        assert_eq!(
            got,
            [
                (format!("{seg1}.skv"), 4 * SLOT),
                (format!("{seg1}.summary"), summary1)
            ]
        );
        let s = up.stats();
        assert_eq!((s.uploaded_segments, s.failed_passes), (1, 0), "{s:?}");
        assert!(lock(&up.unreadable).contains(&format!("seg-{:016x}", 2)));

        // Expired from the bucket (a lifecycle rule) while the store holds it: it goes up
        // again.
        for ext in ["summary", "skv"] {
            let url = ObjectUrl::parse(&format!("s3://b/{seg1}.{ext}")).unwrap();
            remote.writes.delete(&url).unwrap();
        }
        assert!(up.run_once());
        assert_eq!(listing(&remote), got);
        assert_eq!(up.stats().uploaded_segments, 2);

        // Segment 1 dropped locally, and an orphan segment object without its summary (a
        // pass cut short) that no local segment backs: both go.
        for ext in ["skv", "sealed", "summary"] {
            let f = outbox.path().join(format!("seg-{:016x}.{ext}", 1));
            std::fs::remove_file(f).unwrap();
        }
        let orphan = ObjectUrl::parse(&format!("s3://b/kv/own/seg-{:016x}.skv", 9)).unwrap();
        remote
            .writes
            .put(&orphan, Bytes::from_static(b"x"))
            .unwrap();
        assert!(up.run_once());
        assert!(listing(&remote).is_empty(), "{:?}", listing(&remote));
        assert_eq!(up.stats().deleted_segments, 2);
        assert!(up.progress() > 0);
    }

    #[test]
    fn keys_split_into_store_and_name_only_one_level_below_the_prefix() {
        let remote = Remote::with_store("s3://b/kv/", Arc::new(InMemory::new()));
        assert_eq!(
            remote.split("kv/abc/seg-1.summary"),
            Some(("abc", "seg-1.summary"))
        );
        assert_eq!(remote.split("kv/abc/deeper/seg-1.summary"), None);
        assert_eq!(remote.split("kvx/abc/seg-1.summary"), None);
        assert_eq!(remote.split("kv/seg-1.summary"), None);
        let root = Remote::with_store("s3://b", Arc::new(InMemory::new()));
        assert_eq!(root.split("abc/x.skv"), Some(("abc", "x.skv")));
    }
}
