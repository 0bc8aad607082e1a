//! [`Commit`]: how the ranks of a grouped save agree that a checkpoint is complete.
//!
//! The ranks meet through files in the store, so nothing of the commit runs as a
//! collective in the background, where it would contend with training's own. Under
//! `<store>/.pending/<token>/` (the token is the save's, so two saves never mix, and any
//! checkpoint name fits beside it):
//! - `alive-R`: rank R holds an exclusive `flock` on it from before its share is written
//!   until it is done with the save. A rank that can lock it knows R's process is gone:
//!   the kernel drops the lock when a process dies, however it dies.
//! - `rank-R.json`: rank R's share is durable (its write report), written atomically.
//!   With `replicate`, R's successor writes it for R if R died holding only a staged
//!   share (the successor holds a copy).
//! - `failed`: why the save failed; a rank that gives up writes it, so no other waits.
//! - `created-R`: after a failure, the chunks rank R created (32 bytes each), for whichever
//!   rank can take the store alone to remove ([`crate::CkptStore::collect_failed`]).
//!
//! The publisher (rank 0; rank 1 if rank 0 died and its share was stood in for) waits for
//! every `rank-R.json`, then publishes the manifest, whose `extra.save_id` is the token.
//! The other ranks wait for that manifest. Every wait ends early on a `failed` file, on a
//! rank that is gone with its share not durable (found within one poll, not at the
//! timeout), on [`Commit::abort`], and at the deadline.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use sluice_engine::{atomic_write, FileLock, LockError, LockMode, LockOpen};

use crate::error::CkptError;
use crate::manifest::Manifest;
use crate::path::PENDING_DIR;

/// Where save `token`'s commit files are.
pub(crate) fn pending_dir(root: &Path, token: &str) -> PathBuf {
    root.join(PENDING_DIR).join(token)
}

/// How often the files are looked at while waiting: a rank that died is noticed this
/// long after, and 64 ranks' markers cost a few hundred `stat`s a second.
const POLL: Duration = Duration::from_millis(10);

/// One rank's part in a grouped save's commit.
pub struct Commit {
    /// The checkpoint's directory (`<store>/<name>`), for messages and the manifest.
    ckpt_dir: PathBuf,
    dir: PathBuf,
    token: String,
    rank: usize,
    world: usize,
    replicate: bool,
    timeout: Duration,
    /// This rank's liveness lock; `None` where the file system has no `flock` (then a
    /// dead rank is noticed only at the timeout, as the log says).
    alive: Option<FileLock>,
    aborted: Arc<(Mutex<Option<String>>, Condvar)>,
}

/// What a failed wait saw, in the order it is looked for.
enum Seen {
    Failed(String),
    Gone(usize),
}

impl Commit {
    /// Joins the commit of save `token` of checkpoint `name` in the store at `root` as
    /// `rank` of `world`: creates the pending directory and takes this rank's liveness
    /// lock. Every rank joins before any waits (the front end's start barrier).
    pub fn join(
        root: &Path,
        name: &str,
        token: &str,
        rank: usize,
        world: usize,
        replicate: bool,
        timeout: Duration,
    ) -> Result<Commit, CkptError> {
        if rank >= world {
            return Err(CkptError::arg(
                "rank",
                format!("{rank} of a group of {world}"),
            ));
        }
        let dir = pending_dir(root, token);
        std::fs::create_dir_all(&dir).map_err(CkptError::io(&dir))?;
        let path = dir.join(format!("alive-{rank}"));
        let alive = match FileLock::acquire(&path, LockMode::Exclusive, LockOpen::Create) {
            Ok(l) => Some(l),
            Err(e) if e.is_unsupported() => {
                tracing::warn!(
                    "{}: no flock on this file system; a rank that dies mid-save is noticed \
                     only after the timeout ({} s)",
                    dir.display(),
                    timeout.as_secs()
                );
                None
            }
            Err(LockError::Busy { .. }) => {
                return Err(CkptError::arg(
                    format!("rank {rank}"),
                    format!("another process is already rank {rank} of save {token}"),
                ))
            }
            Err(LockError::Io { path, source }) => return Err(CkptError::io(path)(source)),
        };
        Ok(Commit {
            ckpt_dir: root.join(name),
            dir,
            token: token.to_string(),
            rank,
            world,
            replicate,
            timeout,
            alive,
            aborted: Arc::new((Mutex::new(None), Condvar::new())),
        })
    }

    /// The save's commit directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Records, after a failure, the chunks this rank created (best effort).
    pub fn record_created(&self, created: &[crate::Digest]) {
        let bytes: Vec<u8> = created.iter().flat_map(|d| d.0).collect();
        let path = self.dir.join(format!("created-{}", self.rank));
        if let Err(e) = atomic_write(&path, &bytes) {
            tracing::debug!("{}: {e}", path.display());
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world(&self) -> usize {
        self.world
    }

    pub fn token(&self) -> &str {
        &self.token
    }

    fn marker(&self, rank: usize) -> PathBuf {
        self.dir.join(format!("rank-{rank}.json"))
    }

    fn failed_path(&self) -> PathBuf {
        self.dir.join("failed")
    }

    /// Records that `rank`'s share is durable (this rank's, or a predecessor's it stood in
    /// for), with its report.
    pub fn mark_durable(&self, rank: usize, report: &serde_json::Value) -> Result<(), CkptError> {
        let bytes = serde_json::to_vec(report).expect("a report always serializes");
        Ok(atomic_write(&self.marker(rank), &bytes)?)
    }

    /// Tells every rank the save failed, and why (best effort: a rank that cannot write
    /// it is reported by its lock or at the deadline).
    pub fn mark_failed(&self, why: &str) {
        let body = serde_json::json!({"rank": self.rank, "why": why}).to_string();
        if let Err(e) = atomic_write(&self.failed_path(), body.as_bytes()) {
            tracing::debug!("{}: cannot record the failure: {e}", self.dir.display());
        }
    }

    /// Ends every wait of this commit with `why` (the front end's own failures: a replica
    /// exchange that broke, a cancel).
    pub fn abort(&self, why: &str) {
        let (lock, cv) = &*self.aborted;
        lock.lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(|| why.to_string());
        cv.notify_all();
    }

    /// A handle that aborts this commit from another thread.
    pub fn aborter(&self) -> impl Fn(&str) + Send + Sync + 'static {
        let aborted = Arc::clone(&self.aborted);
        move |why: &str| {
            let (lock, cv) = &*aborted;
            lock.lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert_with(|| why.to_string());
            cv.notify_all();
        }
    }

    /// Whether `rank`'s process is gone (its liveness lock is free). Always `false` where
    /// the file system has no `flock`.
    pub fn is_gone(&self, rank: usize) -> bool {
        if self.alive.is_none() || rank == self.rank {
            return false;
        }
        FileLock::is_free(&self.dir.join(format!("alive-{rank}"))).unwrap_or(false)
    }

    fn is_marked(&self, rank: usize) -> bool {
        self.marker(rank).is_file()
    }

    /// What ended the save, if something did: a `failed` file, or a rank gone whose share
    /// no one will make durable.
    fn trouble(&self, pending: &[usize]) -> Option<Seen> {
        if let Ok(body) = std::fs::read_to_string(self.failed_path()) {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let who = v.get("rank").and_then(|r| r.as_u64());
            let why = v.get("why").and_then(|w| w.as_str()).unwrap_or(&body);
            return Some(Seen::Failed(match who {
                Some(r) => format!("rank {r} failed: {why}"),
                None => why.to_string(),
            }));
        }
        for &r in pending {
            if !self.is_gone(r) || self.is_marked(r) {
                continue;
            }
            // Replicated: the successor writes the share of a rank that died, unless it
            // is gone too (or is the one asking, and stands in elsewhere).
            let successor = (r + 1) % self.world;
            if self.replicate && self.world > 1 && !self.is_gone(successor) {
                continue;
            }
            return Some(Seen::Gone(r));
        }
        None
    }

    /// Sleeps one poll, or until aborted; `Err` once aborted or past `deadline`.
    fn pause(&self, deadline: Instant, what: impl Fn() -> String) -> Result<(), CkptError> {
        let (lock, cv) = &*self.aborted;
        let g = lock.lock().unwrap_or_else(|p| p.into_inner());
        let g = match &*g {
            Some(_) => g,
            None => {
                cv.wait_timeout(g, POLL)
                    .unwrap_or_else(|p| p.into_inner())
                    .0
            }
        };
        if let Some(why) = &*g {
            return Err(CkptError::Cancelled(why.clone()));
        }
        if Instant::now() >= deadline {
            return Err(CkptError::TimedOut {
                path: self.ckpt_dir.clone(),
                what: what(),
                timeout_s: self.timeout.as_secs_f64(),
            });
        }
        Ok(())
    }

    fn failure(&self, seen: Seen) -> CkptError {
        match seen {
            Seen::Failed(why) => CkptError::RankFailed {
                path: self.ckpt_dir.clone(),
                rank: self.rank as u32,
                why: format!("stopped waiting: {why}"),
            },
            Seen::Gone(r) => CkptError::RankFailed {
                path: self.ckpt_dir.clone(),
                rank: r as u32,
                why: "is gone (its process ended before its share was durable); not \
                      published"
                    .into(),
            },
        }
    }

    /// The publisher's wait: every rank's report once all are durable.
    pub fn wait_marks(&self) -> Result<Vec<serde_json::Value>, CkptError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let pending: Vec<usize> = (0..self.world).filter(|r| !self.is_marked(*r)).collect();
            if pending.is_empty() {
                break;
            }
            if let Some(seen) = self.trouble(&pending) {
                return Err(self.failure(seen));
            }
            self.pause(deadline, || {
                format!("ranks {pending:?} did not finish their share")
            })?;
        }
        (0..self.world)
            .map(|r| {
                let path = self.marker(r);
                let bytes = std::fs::read(&path).map_err(CkptError::io(&path))?;
                serde_json::from_slice(&bytes).map_err(|e| CkptError::BadManifest {
                    path,
                    detail: e.to_string(),
                })
            })
            .collect()
    }

    /// Replicated: waits until the previous rank's share is durable (`false`), or that
    /// rank is gone without it, so this rank must write it from its copy (`true`).
    pub fn must_stand_in(&self) -> Result<bool, CkptError> {
        let pred = (self.rank + self.world - 1) % self.world;
        let deadline = Instant::now() + self.timeout;
        loop {
            // Published already: every share was durable (the publisher then removed the
            // commit files and let go of its lock, which must not read as a death).
            if self.is_marked(pred) || self.published_by_this_save() {
                return Ok(false);
            }
            if self.is_gone(pred) {
                // Its marker, or the manifest, may have landed just before it exited.
                return Ok(!self.is_marked(pred) && !self.published_by_this_save());
            }
            if let Some(Seen::Failed(why)) = self.trouble(&[]) {
                return Err(self.failure(Seen::Failed(why)));
            }
            self.pause(deadline, || format!("rank {pred} did not finish its share"))?;
        }
    }

    /// Whether the checkpoint's manifest is this save's.
    fn published_by_this_save(&self) -> bool {
        Manifest::read(&self.ckpt_dir)
            .ok()
            .and_then(|m| {
                m.extra
                    .get("save_id")
                    .and_then(|s| s.as_str())
                    .map(|s| s == self.token)
            })
            .unwrap_or(false)
    }

    /// A non-publisher's wait: until this save's manifest is published.
    pub fn wait_published(&self) -> Result<(), CkptError> {
        let deadline = Instant::now() + self.timeout;
        let manifest = Manifest::path_in(&self.ckpt_dir);
        let mut seen = None;
        loop {
            // The manifest at this path may be an older save's: this save's carries its
            // token. It is re-read only when it changes.
            let stamp = std::fs::metadata(&manifest).and_then(|m| m.modified()).ok();
            if stamp.is_some() && stamp != seen {
                seen = stamp;
                if self.published_by_this_save() {
                    return Ok(());
                }
            }
            let publishers: Vec<usize> = match self.replicate && self.world > 1 {
                true => vec![0, 1],
                false => vec![0],
            };
            let pending: Vec<usize> = (0..self.world).filter(|r| !self.is_marked(*r)).collect();
            let gone_publisher = publishers.iter().all(|p| self.is_gone(*p));
            let outcome = match self.trouble(&pending) {
                Some(seen) => Err(self.failure(seen)),
                None if gone_publisher => Err(self.failure(Seen::Gone(publishers[0]))),
                None => self.pause(deadline, || "the checkpoint was not published".to_string()),
            };
            if let Err(e) = outcome {
                // It may have been published just now (the files went with it).
                return match self.published_by_this_save() {
                    true => Ok(()),
                    false => Err(e),
                };
            }
        }
    }

    /// After publishing: the pending files go (the other ranks hold their locks by
    /// descriptor, and look at the manifest first).
    pub fn clean_up(&self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::debug!("{}: {e}", self.dir.display());
        }
    }
}
