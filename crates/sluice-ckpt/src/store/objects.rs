//! The parts of [`CkptStore`] that differ in an object store (see `crate::object` for the
//! layout and why): opening without a lock, a create-only publish, listing by prefix, and
//! garbage collection by age instead of under a lock.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{check_marker, Access, CkptStore};
use crate::chunk_store::ChunkStore;
use crate::chunking::{parallel_map, ChunkRef, Digest};
use crate::error::CkptError;
use crate::manifest::{Manifest, MANIFEST_FILE};
use crate::object::{age, ObjectRoot};
use crate::path::{check_name, MARKER_FILE};
use crate::steps::StoreSteps;

/// How long `gc` leaves an unreferenced chunk of an object store by default: a save in
/// flight may have written it and not yet published the manifest that names it.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3600);

impl CkptStore {
    /// Opens the store under object-store prefix `url`. No lock: an object store has
    /// none (see [`CkptStore::gc_with`] for how collection stays safe without one).
    pub(super) fn open_object(
        url: &str,
        access: Access,
        steps: Arc<dyn StoreSteps>,
    ) -> Result<CkptStore, CkptError> {
        CkptStore::with_object(ObjectRoot::open(url)?, access == Access::Create, steps)
    }

    /// The store in `root` (created there when `create` and absent).
    pub fn with_object(
        root: ObjectRoot,
        create: bool,
        steps: Arc<dyn StoreSteps>,
    ) -> Result<CkptStore, CkptError> {
        let marker = root.path(MARKER_FILE);
        match root.get(MARKER_FILE)? {
            Some((bytes, _)) => check_marker(&marker, &bytes)?,
            None if create => create_object_store(&root)?,
            None => {
                return Err(CkptError::NoStore {
                    path: root.display(),
                })
            }
        }
        Ok(CkptStore {
            root: root.display(),
            chunks: ChunkStore::in_object(root.clone(), steps),
            lock: Mutex::new(None),
            object: Some(root),
        })
    }

    /// Objects under `name/` other than its manifest are another writer's: refused, as a
    /// foreign directory is. A published manifest is refused too, before any chunk is
    /// written: an object store's checkpoints are published once and never replaced.
    pub(super) fn prepare_object(&self, o: &ObjectRoot, name: &str) -> Result<PathBuf, CkptError> {
        self.check_object_dir(o, name, true)
    }

    /// Refuses objects under `name/` that are not its manifest; and the manifest too when
    /// `refuse_published`.
    fn check_object_dir(
        &self,
        o: &ObjectRoot,
        name: &str,
        refuse_published: bool,
    ) -> Result<PathBuf, CkptError> {
        let dir = o.path(name);
        let (files, dirs) = o.list_dir(name)?;
        let manifest = format!("{name}/{MANIFEST_FILE}");
        let mut found: Vec<String> = files
            .iter()
            .filter(|f| f.key != manifest)
            .map(|f| f.key.rsplit('/').next().unwrap_or(&f.key).to_string())
            .collect();
        found.extend(dirs.into_iter().map(|d| format!("{d}/")));
        if !found.is_empty() {
            return Err(CkptError::ForeignDirectory {
                path: dir,
                role: "is no checkpoint of this store and",
                found,
            });
        }
        if refuse_published && files.iter().any(|f| f.key == manifest) {
            return Err(exists(&dir));
        }
        Ok(dir)
    }

    /// Checks every chunk the manifest names is stored (HEADs in parallel), but for those in
    /// `fresh` (put by this save), then puts the manifest create-only: the checkpoint
    /// appears whole at that moment, or not at all.
    pub(super) fn publish_object(
        &self,
        o: &ObjectRoot,
        name: &str,
        manifest: &Manifest,
        fresh: &BTreeSet<Digest>,
    ) -> Result<(), CkptError> {
        // A manifest there already is found by the create-only put itself, which also
        // catches one another save put after this look.
        let dir = self.check_object_dir(o, name, false)?;
        let key = format!("{name}/{MANIFEST_FILE}");
        manifest.check().map_err(|detail| CkptError::BadManifest {
            path: o.path(&key),
            detail,
        })?;
        // Chunks this save saw put need no look: nothing deletes a chunk younger than gc's
        // grace (failed saves leave theirs), so only those it reused are checked.
        let owners: Vec<(Digest, u64, String)> = manifest
            .chunk_owners()
            .into_iter()
            .filter(|(d, _)| !fresh.contains(d))
            .map(|(d, (len, e))| (d, len, e.to_string()))
            .collect();
        let threads = self.chunks.io_threads(1);
        let present = parallel_map(&owners, threads, |(d, len, _)| {
            self.chunks.contains(&ChunkRef {
                digest: *d,
                len: *len,
            })
        });
        if let Some(((d, _, entry), _)) = owners.iter().zip(&present).find(|(_, p)| !**p) {
            return Err(CkptError::MissingChunk {
                digest: *d,
                entry: entry.clone(),
                path: self.chunks.path_of(d),
            });
        }
        match o.put_new(&key, manifest.to_bytes().into())? {
            true => Ok(()),
            false => Err(exists(&dir)),
        }
    }

    /// The checkpoints under the prefix, oldest first by when each manifest was put.
    pub(super) fn list_object(&self, o: &ObjectRoot) -> Result<Vec<(String, Manifest)>, CkptError> {
        let (_, names) = o.list_dir("")?;
        let mut out = Vec::new();
        for name in names {
            if check_name(&name).is_err() {
                continue;
            }
            let key = format!("{name}/{MANIFEST_FILE}");
            let Some((bytes, meta)) = o.get(&key)? else {
                continue; // a save that never published
            };
            match Manifest::from_bytes(&bytes, o.path(&key)) {
                Ok(m) => out.push((meta.modified, name, m)),
                Err(CkptError::BadManifest { path, detail }) => {
                    return Err(CkptError::BadManifest {
                        path,
                        detail: format!(
                            "{detail}; checkpoint {name:?} is damaged: restore its manifest, \
                             or delete the object to go on without it"
                        ),
                    })
                }
                Err(e) => return Err(e),
            }
        }
        out.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        Ok(out.into_iter().map(|(_, n, m)| (n, m)).collect())
    }

    pub(super) fn manifest_object(
        &self,
        o: &ObjectRoot,
        name: &str,
    ) -> Result<Manifest, CkptError> {
        let key = format!("{name}/{MANIFEST_FILE}");
        match o.get(&key)? {
            Some((bytes, _)) => Manifest::from_bytes(&bytes, o.path(&key)),
            None => Err(CkptError::NoCheckpoint { path: o.path(name) }),
        }
    }

    /// Removes `name`'s manifest (what makes it a checkpoint); `false` if other objects
    /// are under its prefix, which are left.
    pub(super) fn remove_object_checkpoint(
        &self,
        o: &ObjectRoot,
        name: &str,
    ) -> Result<bool, CkptError> {
        o.delete(&format!("{name}/{MANIFEST_FILE}"))?;
        let (files, dirs) = o.list_dir(name)?;
        Ok(files.is_empty() && dirs.is_empty())
    }

    /// A failed save's clean-up in an object store: nothing is deleted. Without a lock,
    /// deleting is safe only by age: another save may have put the same chunk (saves put
    /// without looking first) and count on it. `gc` removes them once they are older than
    /// its grace period; the report counts them as left.
    pub(super) fn remove_created_objects(&self, created: &[Digest]) -> super::Cleanup {
        if !created.is_empty() {
            tracing::info!(
                "{}: a failed save left {} chunks; `sluice ckpt gc` removes them once they are \
                 older than its grace period",
                self.root.display(),
                created.len()
            );
        }
        super::Cleanup {
            chunks_left: created.len(),
            ..super::Cleanup::default()
        }
    }

    /// `gc` in an object store: unreferenced chunks written more than `grace` ago go
    /// (younger ones may be a save's in flight, not yet named by its manifest).
    pub(super) fn collect_object_chunks(
        &self,
        live: &BTreeSet<Digest>,
        grace: Duration,
        report: &mut super::GcReport,
    ) -> Result<(), CkptError> {
        let doomed: Vec<(Digest, u64)> = self
            .chunks
            .list_dated()?
            .into_iter()
            .filter(|(d, _, at)| !live.contains(d) && age(*at) >= grace)
            .map(|(d, n, _)| (d, n))
            .collect();
        let threads = self.chunks.io_threads(1);
        let removed = parallel_map(&doomed, threads, |(d, _)| self.chunks.remove(d));
        for ((_, n), r) in doomed.iter().zip(removed) {
            r?;
            report.chunks_removed += 1;
            report.bytes_freed += n;
        }
        // Markers of grouped saves that were killed (a finished save removes its own).
        if let Some(o) = &self.object {
            for l in o.list(crate::path::PENDING_DIR)? {
                if age(l.modified) >= grace && o.delete(&l.key).is_ok() {
                    report.temporaries_removed += 1;
                }
            }
        }
        Ok(())
    }
}

/// Makes the prefix a store: it must hold nothing yet (or only chunks, which ranks that
/// create the store at the same moment may have begun to write), as a directory must.
fn create_object_store(root: &ObjectRoot) -> Result<(), CkptError> {
    let (files, dirs) = root.list_dir("")?;
    let marker = root.path(MARKER_FILE);
    if files.iter().any(|f| f.key == MARKER_FILE) {
        // Another rank made the store since this one looked (a group's ranks all open a
        // new store at once): a store now, if the marker says so.
        if let Some((bytes, _)) = root.get(MARKER_FILE)? {
            return check_marker(&marker, &bytes);
        }
    }
    let mut found: Vec<String> = files
        .iter()
        .map(|f| f.key.rsplit('/').next().unwrap_or(&f.key).to_string())
        .collect();
    found.extend(
        dirs.into_iter()
            .filter(|d| d != crate::path::CHUNKS_DIR)
            .map(|d| format!("{d}/")),
    );
    if !found.is_empty() {
        return Err(CkptError::ForeignDirectory {
            path: root.display(),
            role: "is not a checkpoint store and",
            found,
        });
    }
    let body = serde_json::json!({"format": "sluice-ckpt-store", "version": 1});
    if !root.put_new(MARKER_FILE, body.to_string().into_bytes().into())? {
        // Another rank made the store at the same moment: it must be one.
        match root.get(MARKER_FILE)? {
            Some((bytes, _)) => check_marker(&marker, &bytes)?,
            None => {
                return Err(CkptError::NoStore {
                    path: root.display(),
                })
            }
        }
    }
    Ok(())
}

fn exists(dir: &std::path::Path) -> CkptError {
    CkptError::arg(
        format!("checkpoint {}", dir.display()),
        "exists already: an object store's checkpoints are published once (create-only) and \
         never replaced; save under a new name",
    )
}
