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
//!
//! In an object store the same markers are objects under `<prefix>/.pending/<token>/`,
//! each one PUT (seen whole or not at all), looked at every 100 ms. An object store has
//! no lock, so `alive-R` is a heartbeat instead: rank R puts it again every second, and a
//! rank whose heartbeat is [`STALE`] older than this rank's own (both dated by the
//! server's clock) is gone. `replicate` is refused there: a stand-in must not write a
//! share its owner, only slow, may still be writing.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use sluice_engine::{atomic_write, FileLock, LockError, LockMode, LockOpen};

use crate::error::CkptError;
use crate::manifest::{Manifest, MANIFEST_FILE};
use crate::object::ObjectRoot;
use crate::path::PENDING_DIR;

/// Where save `token`'s commit files are.
pub(crate) fn pending_dir(root: &Path, token: &str) -> PathBuf {
    root.join(PENDING_DIR).join(token)
}

/// How often the files are looked at while waiting: a rank that died is noticed this
/// long after, and 64 ranks' markers cost a few hundred `stat`s a second.
const POLL: Duration = Duration::from_millis(10);
/// The same in an object store, where each look is a request.
const OBJECT_POLL: Duration = Duration::from_millis(100);
/// How often a rank re-puts its heartbeat object, and looks at the others'.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// A heartbeat this much older than one's own is a rank that is gone.
pub const STALE: Duration = Duration::from_secs(5);

/// A rank's heartbeat in an object store: a thread that re-puts `alive-R` until dropped.
struct Heartbeat {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
    root: ObjectRoot,
    key: String,
    /// Set when a test stops the heartbeat as a killed process would: nothing removed.
    killed: bool,
}

impl Heartbeat {
    fn start(root: ObjectRoot, key: String) -> Result<Heartbeat, CkptError> {
        root.put(&key, b"alive".to_vec().into())?;
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = Arc::clone(&stop);
        let (beat_root, beat_key) = (root.clone(), key.clone());
        let thread = std::thread::Builder::new()
            .name("sluice-ckpt-heartbeat".into())
            .spawn(move || {
                let (lock, cv) = &*flag;
                let mut stopped = lock.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    // Stopped before this thread first waited: no wake-up is coming.
                    if *stopped {
                        return;
                    }
                    stopped = cv
                        .wait_timeout(stopped, HEARTBEAT)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                    if *stopped {
                        return;
                    }
                    if let Err(e) = beat_root.put(&beat_key, b"alive".to_vec().into()) {
                        tracing::debug!("{e}: a heartbeat missed");
                    }
                }
            })
            .map_err(|e| CkptError::io("heartbeat thread")(e))?;
        Ok(Heartbeat {
            stop,
            thread: Some(thread),
            root,
            key,
            killed: false,
        })
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        let (lock, cv) = &*self.stop;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Whether the save was published (its other markers gone) or not: the heartbeat
        // is this rank's to remove.
        if self.killed {
            return;
        }
        if let Err(e) = self.root.delete(&self.key) {
            tracing::debug!("{e}: a heartbeat left for gc");
        }
    }
}

/// Checks a rank of `world` joining save `token` (a plain name: it names a directory).
fn check_member(token: &str, rank: usize, world: usize) -> Result<(), CkptError> {
    if rank >= world {
        return Err(CkptError::arg(
            "rank",
            format!("{rank} of a group of {world}"),
        ));
    }
    crate::path::check_name(token)
}

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
    /// The object store and the commit's and checkpoint's keys in it, where the store is
    /// one (then `dir` and `ckpt_dir` are URLs, for messages).
    object: Option<(ObjectRoot, String, String)>,
    /// This rank's heartbeat (object stores), and when the others' were last looked at.
    heartbeat: Option<Heartbeat>,
    gone: Mutex<(Option<Instant>, Vec<bool>)>,
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
        check_member(token, rank, world)?;
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
            object: None,
            heartbeat: None,
            gone: Mutex::new((None, vec![false; world])),
        })
    }

    /// [`Commit::join`] in an object store: the markers are objects (no liveness locks).
    pub fn join_object(
        root: &ObjectRoot,
        name: &str,
        token: &str,
        rank: usize,
        world: usize,
        timeout: Duration,
    ) -> Result<Commit, CkptError> {
        check_member(token, rank, world)?;
        let key = format!("{PENDING_DIR}/{token}");
        let heartbeat = Heartbeat::start(root.clone(), format!("{key}/alive-{rank}"))?;
        Ok(Commit {
            ckpt_dir: root.path(name),
            dir: root.path(&key),
            token: token.to_string(),
            rank,
            world,
            replicate: false,
            timeout,
            alive: None,
            aborted: Arc::new((Mutex::new(None), Condvar::new())),
            object: Some((root.clone(), key, name.to_string())),
            heartbeat: Some(heartbeat),
            gone: Mutex::new((None, vec![false; world])),
        })
    }

    /// Writes marker `file` whole (an atomic file write, or one PUT).
    fn put(&self, file: &str, bytes: &[u8]) -> Result<(), CkptError> {
        match &self.object {
            Some((o, key, _)) => o.put(&format!("{key}/{file}"), bytes.to_vec().into()),
            None => Ok(atomic_write(&self.dir.join(file), bytes)?),
        }
    }

    /// Marker `file`'s bytes, `None` where it is not (yet).
    fn get(&self, file: &str) -> Result<Option<Vec<u8>>, CkptError> {
        match &self.object {
            Some((o, key, _)) => Ok(o.get(&format!("{key}/{file}"))?.map(|(b, _)| b.to_vec())),
            None => {
                let path = self.dir.join(file);
                match std::fs::read(&path) {
                    Ok(b) => Ok(Some(b)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(CkptError::io(path)(e)),
                }
            }
        }
    }

    fn poll(&self) -> Duration {
        match self.object {
            Some(_) => OBJECT_POLL,
            None => POLL,
        }
    }

    /// The save's commit directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stops this rank's heartbeat as a SIGKILL would (tests): the object stays, and ages.
    #[cfg(any(test, feature = "testing"))]
    pub fn kill_heartbeat(&mut self) {
        if let Some(mut h) = self.heartbeat.take() {
            h.killed = true;
        }
    }

    /// Records, after a failure, the chunks this rank created (best effort).
    pub fn record_created(&self, created: &[crate::Digest]) {
        let bytes: Vec<u8> = created.iter().flat_map(|d| d.0).collect();
        if let Err(e) = self.put(&format!("created-{}", self.rank), &bytes) {
            tracing::debug!("{}: {e}", self.dir.display());
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

    fn marker(rank: usize) -> String {
        format!("rank-{rank}.json")
    }

    /// Records that `rank`'s share is durable (this rank's, or a predecessor's it stood in
    /// for), with its report.
    pub fn mark_durable(&self, rank: usize, report: &serde_json::Value) -> Result<(), CkptError> {
        let bytes = serde_json::to_vec(report).expect("a report always serializes");
        self.put(&Commit::marker(rank), &bytes)
    }

    /// Tells every rank the save failed, and why (best effort: a rank that cannot write
    /// it is reported by its lock or at the deadline).
    pub fn mark_failed(&self, why: &str) {
        let body = serde_json::json!({"rank": self.rank, "why": why}).to_string();
        if let Err(e) = self.put("failed", body.as_bytes()) {
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
        if rank == self.rank {
            return false;
        }
        if self.heartbeat.is_some() {
            return self.heartbeat_gone(rank);
        }
        if self.alive.is_none() {
            return false;
        }
        FileLock::is_free(&self.dir.join(format!("alive-{rank}"))).unwrap_or(false)
    }

    /// Object stores: whether `rank`'s heartbeat is [`STALE`] older than this rank's own.
    /// The heartbeats are looked at once per [`HEARTBEAT`] at most (each look is a HEAD per
    /// rank); between looks the last verdict stands. A heartbeat not there (not yet put, or
    /// removed by a publish) is no death.
    fn heartbeat_gone(&self, rank: usize) -> bool {
        let Some((o, key, _)) = &self.object else {
            return false;
        };
        let mut g = self.gone.lock().unwrap_or_else(|p| p.into_inner());
        if g.0.is_none_or(|at| at.elapsed() >= HEARTBEAT) {
            g.0 = Some(Instant::now());
            let date = |r: usize| {
                o.head(&format!("{key}/alive-{r}"))
                    .ok()
                    .flatten()
                    .map(|l| l.modified)
            };
            if let Some(mine) = date(self.rank) {
                for r in (0..self.world).filter(|&r| r != self.rank) {
                    g.1[r] = date(r)
                        .is_some_and(|t| mine.duration_since(t).unwrap_or_default() >= STALE);
                }
            }
        }
        g.1[rank]
    }

    fn is_marked(&self, rank: usize) -> bool {
        match &self.object {
            Some((o, key, _)) => o
                .head(&format!("{key}/{}", Commit::marker(rank)))
                .is_ok_and(|h| h.is_some()),
            None => self.dir.join(Commit::marker(rank)).is_file(),
        }
    }

    /// What ended the save, if something did: a `failed` file, or a rank gone whose share
    /// no one will make durable.
    fn trouble(&self, pending: &[usize]) -> Option<Seen> {
        if let Ok(Some(body)) = self.get("failed") {
            let body = String::from_utf8_lossy(&body).into_owned();
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
                cv.wait_timeout(g, self.poll())
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
                let path = self.dir.join(Commit::marker(r));
                let bytes = self
                    .get(&Commit::marker(r))?
                    .ok_or_else(|| CkptError::NoCheckpoint { path: path.clone() })?;
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
        let manifest = match &self.object {
            Some((o, _, name)) => o
                .get(&format!("{name}/{MANIFEST_FILE}"))
                .ok()
                .flatten()
                .and_then(|(b, _)| Manifest::from_bytes(&b, self.ckpt_dir.clone()).ok()),
            None => Manifest::read(&self.ckpt_dir).ok(),
        };
        manifest
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
            let stamp = match &self.object {
                Some((o, _, name)) => o
                    .head(&format!("{name}/{MANIFEST_FILE}"))
                    .ok()
                    .flatten()
                    .map(|h| h.modified),
                None => std::fs::metadata(&manifest).and_then(|m| m.modified()).ok(),
            };
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
        if let Some((o, key, _)) = &self.object {
            for l in o.list(key).unwrap_or_default() {
                let _ = o.delete(&l.key);
            }
            return;
        }
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::debug!("{}: {e}", self.dir.display());
        }
    }
}
