//! What a store reports and how it is kept: `ls`, `verify`, `diff` and garbage collection.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use super::CkptStore;
use crate::chunking::{parallel_map, ChunkRef, Digest};
use crate::error::CkptError;
use crate::manifest::Manifest;
use crate::path::PENDING_DIR;

/// A checkpoint in the store, as `ls` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointInfo {
    pub name: String,
    pub created_unix: u64,
    pub entries: usize,
    pub logical_bytes: u64,
    pub unique_bytes: u64,
    /// Of its unique bytes, those another retained checkpoint references too.
    pub shared_bytes: u64,
}

/// What `gc` did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GcReport {
    pub checkpoints_removed: Vec<String>,
    pub chunks_removed: usize,
    pub bytes_freed: u64,
    pub temporaries_removed: usize,
    /// Checkpoint directories whose manifest was removed but that hold files Sluice did
    /// not write: those files, and the directory, are left where they are.
    pub directories_left: Vec<String>,
}

/// What `verify` found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifyReport {
    pub chunks: usize,
    pub bytes: u64,
    /// (chunk, entry, why) for each bad chunk.
    pub problems: Vec<(Digest, String, String)>,
}

/// Changed, added and removed entries between two checkpoints.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DiffReport {
    /// (entry, bytes of its chunks that differ).
    pub changed: Vec<(String, u64)>,
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed_bytes: u64,
}

impl CkptStore {
    /// `ls`: each checkpoint with its sizes.
    pub fn infos(&self) -> Result<Vec<CheckpointInfo>, CkptError> {
        let all = self.list()?;
        let mut refs: BTreeMap<Digest, usize> = BTreeMap::new();
        for (_, m) in &all {
            for d in m.unique_chunks().keys() {
                *refs.entry(*d).or_default() += 1;
            }
        }
        Ok(all
            .into_iter()
            .map(|(name, m)| {
                let unique = m.unique_chunks();
                CheckpointInfo {
                    created_unix: m.created_unix,
                    entries: m.entries.len(),
                    logical_bytes: m.logical_bytes(),
                    unique_bytes: unique.values().sum(),
                    shared_bytes: unique
                        .iter()
                        .filter(|(d, _)| refs[*d] > 1)
                        .map(|(_, n)| n)
                        .sum(),
                    name,
                }
            })
            .collect())
    }

    /// The digests of the chunks the newest checkpoint references that are in place (a
    /// file of the chunk's length; kept from gc while this store is open): what a save
    /// need not write. A chunk lost or truncated since is left out, so the next save
    /// writes it again; one whose bytes changed in place is found by `verify` or a load,
    /// not here (that would mean re-reading the store).
    pub fn known(&self) -> Result<BTreeSet<Digest>, CkptError> {
        let Some((_, m)) = self.newest()? else {
            return Ok(BTreeSet::new());
        };
        // In an object store a HEAD per chunk would cost more than it saves: the publish
        // checks that every chunk is there before the manifest goes up.
        let object = self.object.is_some();
        Ok(m.unique_chunks()
            .into_iter()
            .filter(|&(digest, len)| {
                object || self.chunks.contains(&crate::ChunkRef { digest, len })
            })
            .map(|(d, _)| d)
            .collect())
    }

    /// Keeps the `keep` newest checkpoints, removes the others and every chunk no kept
    /// checkpoint references (and temporaries a crashed save left, and grouped saves'
    /// commit files). Needs the lock exclusive ([`CkptStore::open_exclusive`]). Removes
    /// only what the store wrote: a checkpoint directory that holds other files keeps them.
    pub fn gc(&self, keep: usize) -> Result<GcReport, CkptError> {
        self.gc_with(keep, super::DEFAULT_GRACE)
    }

    /// [`CkptStore::gc`]; in an object store (which has no lock) unreferenced chunks
    /// younger than `grace` are left: a save in flight may be about to reference them.
    pub fn gc_with(&self, keep: usize, grace: std::time::Duration) -> Result<GcReport, CkptError> {
        let all = self.list()?;
        let cut = all.len().saturating_sub(keep);
        let mut report = GcReport::default();
        for (name, _) in &all[..cut] {
            if !self.remove_checkpoint(name)? {
                tracing::warn!(
                    "{}: holds files Sluice did not write; removed its manifest, left them",
                    self.root.join(name).display()
                );
                report.directories_left.push(name.clone());
            }
            report.checkpoints_removed.push(name.clone());
        }
        let live: BTreeSet<Digest> = all[cut..]
            .iter()
            .flat_map(|(_, m)| m.unique_chunks().into_keys())
            .collect();
        if self.object.is_some() {
            self.collect_object_chunks(&live, grace, &mut report)?;
            return Ok(report);
        }
        for (d, len) in self.chunks.list()? {
            if !live.contains(&d) {
                self.chunks.remove(&d)?;
                report.chunks_removed += 1;
                report.bytes_freed += len;
            }
        }
        report.temporaries_removed = self.chunks.remove_temporaries();
        self.remove_pending();
        Ok(report)
    }

    /// After a grouped save failed: removes the chunks its ranks created (the `created-R`
    /// lists in its commit directory) that no published checkpoint references, and the
    /// commit directory. Needs the lock exclusive: every rank of the save, and every other
    /// save or load, must have let go of the store (each failed rank tries once it has; the
    /// last one succeeds, and `gc` collects what no one could).
    pub fn collect_failed(&self, token: &str) -> Result<super::Cleanup, CkptError> {
        crate::path::check_name(token)?;
        if self.object.is_some() {
            return Ok(super::Cleanup::default()); // grouped object saves have no commit files
        }
        let dir = crate::commit::pending_dir(&self.root, token);
        let mut created = Vec::new();
        for f in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if f.file_name().to_string_lossy().starts_with("created-") {
                let bytes = std::fs::read(f.path()).unwrap_or_default();
                created.extend(
                    bytes
                        .chunks_exact(32)
                        .map(|d| Digest(d.try_into().expect("32"))),
                );
            }
        }
        let live = self.live_chunks()?;
        let mut report = super::Cleanup::default();
        for d in created {
            if live.contains(&d) {
                continue;
            }
            let len = std::fs::metadata(self.chunks.path_of(&d)).map_or(0, |m| m.len());
            if self.chunks.remove(&d).is_ok() && len > 0 {
                report.chunks_removed += 1;
                report.bytes_freed += len;
            }
        }
        self.remove_pending_dir(&dir);
        Ok(report)
    }

    /// Grouped saves' commit files (the lock is exclusive: no save runs): the files the
    /// commit writes, then the directories if empty.
    fn remove_pending(&self) {
        let pending = self.root.join(PENDING_DIR);
        let Ok(saves) = std::fs::read_dir(&pending) else {
            return;
        };
        for save in saves.flatten() {
            self.remove_pending_dir(&save.path());
        }
        let _ = std::fs::remove_dir(&pending);
    }

    /// One save's commit files, then its directory if empty (nothing else is removed).
    fn remove_pending_dir(&self, dir: &std::path::Path) {
        for f in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = f.file_name().to_string_lossy().into_owned();
            let ours = name == "failed"
                || name.starts_with("alive-")
                || name.starts_with("created-")
                || (name.starts_with("rank-") && name.ends_with(".json"))
                || name.starts_with('.'); // atomic writes' temporaries
            if ours {
                let _ = std::fs::remove_file(f.path());
            }
        }
        let _ = std::fs::remove_dir(dir);
    }

    /// Re-hashes every chunk of checkpoint `name`.
    pub fn verify(&self, name: &str, threads: usize) -> Result<VerifyReport, CkptError> {
        self.verify_with(name, threads, &|_, _| {})
    }

    /// [`CkptStore::verify`], calling `progress(bytes done, bytes in all)` as chunks finish.
    pub fn verify_with(
        &self,
        name: &str,
        threads: usize,
        progress: &(dyn Fn(u64, u64) + Sync),
    ) -> Result<VerifyReport, CkptError> {
        let m = self.manifest(name)?;
        let threads = self.chunks.io_threads(threads);
        let chunks: Vec<(Digest, u64, String)> = m
            .chunk_owners()
            .into_iter()
            .map(|(d, (n, k))| (d, n, k.to_string()))
            .collect();
        let total: u64 = chunks.iter().map(|c| c.1).sum();
        let done = AtomicU64::new(0);
        let results = parallel_map(&chunks, threads, |(d, n, key)| {
            let mut buf = vec![0u8; *n as usize];
            let c = ChunkRef {
                digest: *d,
                len: *n,
            };
            let r = self.chunks.read_into(&c, key, &mut buf);
            progress(done.fetch_add(*n, Ordering::Relaxed) + n, total);
            r
        });
        let mut report = VerifyReport::default();
        for ((d, n, key), r) in chunks.into_iter().zip(results) {
            report.chunks += 1;
            report.bytes += n;
            if let Err(e) = r {
                report.problems.push((d, key, e.to_string()));
            }
        }
        Ok(report)
    }
}

/// What changed from checkpoint `a` to `b`: entries whose chunks differ, with the bytes of
/// the chunks that are new in `b`, and entries added or removed. A packed entry counts its
/// own bytes when its pack is new.
pub fn diff(a: &Manifest, b: &Manifest) -> DiffReport {
    let mut out = DiffReport::default();
    for (key, eb) in &b.entries {
        let Some(ea) = a.entries.get(key) else {
            out.added.push(key.clone());
            continue;
        };
        let (changed, bytes) = match eb.pack {
            // A packed entry changed when its own bytes did, whatever its pack did.
            Some(p) => {
                let same = ea.nbytes == eb.nbytes
                    && ea.pack.is_some_and(|q| q.bytes_digest == p.bytes_digest);
                (!same, if same { 0 } else { eb.nbytes })
            }
            None if ea.pack.is_none() && ea.chunks == eb.chunks => (false, 0),
            None => {
                let old: BTreeSet<Digest> = ea.chunks.iter().map(|c| c.digest).collect();
                let new = eb.chunks.iter().filter(|c| !old.contains(&c.digest));
                (true, new.map(|c| c.len).sum())
            }
        };
        if changed {
            out.changed_bytes += bytes;
            out.changed.push((key.clone(), bytes));
        }
    }
    out.removed = a
        .entries
        .keys()
        .filter(|k| !b.entries.contains_key(*k))
        .cloned()
        .collect();
    out
}
