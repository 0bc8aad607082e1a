//! [`SaveJob`]: one rank's save from its start to a published checkpoint.
//!
//! The front end hashes the rank's state ([`crate::Share`]), pools the tables, lets rank 0
//! plan ([`crate::Saver::plan`]), and starts a `SaveJob` on every rank with the plan. The
//! job then runs the rest:
//! 1. stage and write this rank's chunks ([`crate::WriteJob`]; chunks of streamed entries
//!    are pushed by the front end through a window);
//! 2. once they are durable, the commit ([`crate::Commit`]): mark the share durable; with
//!    `replicate`, write the previous rank's share from this rank's copy if that rank
//!    died; the publisher waits for every share and publishes the manifest, the others
//!    wait for it. A single process publishes at once.
//!
//! A save that fails at any point publishes nothing, tells the other ranks (`failed`), and
//! removes the chunks it created that nothing references ([`CkptStore::remove_created`]),
//! so a full disk does not stay full until `gc`.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::chunking::{ChunkRef, Digest};
use crate::commit::Commit;
use crate::error::CkptError;
use crate::saver::{SavePlan, Saver};
use crate::share::{Share, ShareTable, StreamedTask};
use crate::store::CkptStore;
use crate::writer::{JobReport, StagingPool, WriteJob, WriteTask};

/// Writer threads per job: two keep a disk's queue busy while a third stages.
const WRITERS: usize = 2;

/// How a rank's save runs.
#[derive(Clone, Debug)]
pub struct SaveOptions {
    pub name: String,
    pub rank: usize,
    pub world: usize,
    pub chunk_bytes: u64,
    /// The staging pool's budget: host memory the save holds at most.
    pub staging_bytes: u64,
    /// How long the commit waits for the other ranks.
    pub timeout: Duration,
    /// Every rank holds its predecessor's share, to write it should that rank die.
    pub replicate: bool,
    /// Front-end data recorded in the manifest (beside the save's token).
    pub extra: serde_json::Value,
    /// Commit and publish once durable; `false` stops at durable (DCP's coordinator
    /// publishes the checkpoint itself, with its metadata).
    pub publish: bool,
}

/// What a finished save did, as this rank saw it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SaveSummary {
    pub path: String,
    pub rank: usize,
    pub world_size: usize,
    pub entries: usize,
    /// Bytes of every entry of every rank (duplicates counted).
    pub logical_bytes: u64,
    /// Bytes of the checkpoint's distinct chunks.
    pub unique_bytes: u64,
    /// Bytes of this rank's entries.
    pub logical_bytes_rank: u64,
    pub written_bytes_rank: u64,
    /// Every rank's written bytes (the publisher knows them; absent elsewhere).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub written_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub written_bytes_per_rank: Vec<u64>,
    pub planned_makespan_s: f64,
    pub plan_cached: bool,
    /// The rank whose share this one wrote from its copy (`replicate`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stood_in_for: Option<usize>,
    pub rank_report: JobReport,
    pub save_id: String,
}

/// The previous rank's share, held in this rank's memory (`replicate`).
pub struct Replica {
    /// Its bytes, the chunks of [`SaveJob::replica_chunks`] back to back.
    pub addr: usize,
    pub len: u64,
}

/// One rank's save in flight.
pub struct SaveJob {
    store: Arc<CkptStore>,
    opts: SaveOptions,
    tables: Vec<ShareTable>,
    plan: SavePlan,
    write: WriteJob,
    commit: Option<Commit>,
    streamed: Vec<StreamedTask>,
    sends: Vec<(ChunkRef, usize)>,
    /// The share, whose packs' bytes the replica sends read after the write job has let
    /// go of them (once staged): held for as long as the job.
    _share: Arc<Share>,
}

impl SaveJob {
    /// Starts this rank's share of a save planned by `plan` over every rank's `tables`.
    /// `keep` keeps the share's source memory alive; the job drops it once staged.
    ///
    /// # Safety
    /// The share's host sources must stay readable and unchanged until the job is staged
    /// (or dropped); see [`Share::hash`].
    pub unsafe fn start(
        store: Arc<CkptStore>,
        share: Arc<Share>,
        tables: Vec<ShareTable>,
        plan: SavePlan,
        opts: SaveOptions,
        keep: Box<dyn Send>,
    ) -> Result<SaveJob, CkptError> {
        let (rank, world) = (opts.rank, opts.world);
        if tables.len() != world || plan.indices.len() != world || rank >= world {
            return Err(CkptError::arg(
                "save",
                format!(
                    "rank {rank} of {world} with {} tables and a plan for {} ranks",
                    tables.len(),
                    plan.indices.len()
                ),
            ));
        }
        store.prepare(&opts.name)?;
        if opts.replicate && world > 1 {
            check_replica_budget(&tables, &plan, opts.staging_bytes, &store, &opts.name)?;
        }
        let (host, streamed) = share.tasks(&plan.indices[rank])?;
        if store.object().is_some() && opts.replicate && world > 1 {
            // A stand-in needs to know its predecessor's process is gone: a file lock
            // tells, an object store has none.
            return Err(CkptError::arg(
                format!("{}/{}: replicate=True", store.root().display(), opts.name),
                "needs a file-system store (a rank's death is noticed by its file lock); an \
                 object store has no locks",
            ));
        }
        let commit = match world {
            _ if !opts.publish => None,
            1 => None,
            _ if store.object().is_some() => Some(Commit::join_object(
                store.object().expect("checked"),
                &opts.name,
                &plan.token,
                rank,
                world,
                opts.timeout,
            )?),
            _ => Some(Commit::join(
                store.root(),
                &opts.name,
                &plan.token,
                rank,
                world,
                opts.replicate,
                opts.timeout,
            )?),
        };
        let tasks: Vec<WriteTask> = host
            .iter()
            .map(|&(chunk, src)| WriteTask { chunk, src })
            .collect();
        let pool = StagingPool::new(opts.staging_bytes, opts.chunk_bytes)?;
        let keep: Box<dyn Send> = Box::new((keep, Arc::clone(&share)));
        // SAFETY: the caller's contract; the share (owning the packs) is in `keep`.
        let write = unsafe {
            WriteJob::start_with_pushes(
                store.chunks().clone(),
                tasks,
                pool,
                store.chunks().io_threads(WRITERS),
                keep,
                !streamed.is_empty(),
            )?
        };
        Ok(SaveJob {
            store,
            opts,
            tables,
            plan,
            write,
            commit,
            streamed,
            sends: host,
            _share: share,
        })
    }

    /// The chunks of streamed entries this rank writes: the front end copies each into a
    /// window and [`SaveJob::push`]es it, then calls [`SaveJob::end_pushes`].
    pub fn streamed(&self) -> &[StreamedTask] {
        &self.streamed
    }

    /// See [`WriteJob::push`].
    ///
    /// # Safety
    /// As for [`WriteJob::push`].
    pub unsafe fn push(&self, chunks: &[(ChunkRef, usize)]) -> Result<(), CkptError> {
        // SAFETY: the caller's contract.
        unsafe { self.write.push(chunks) }
    }

    pub fn end_pushes(&self) {
        self.write.end_pushes();
    }

    /// Waits until this rank's share is staged (the live state may change again).
    pub fn wait_staged(&self, timeout: Option<Duration>) -> Option<Result<f64, CkptError>> {
        self.write.wait_staged(timeout)
    }

    /// The save's token: its commit directory's name and the manifest's `save_id`.
    pub fn token(&self) -> &str {
        &self.plan.token
    }

    /// Stops the save; its waits report `why`.
    pub fn cancel(&self, why: &str) {
        self.write.cancel(why);
        if let Some(c) = &self.commit {
            c.abort(why);
        }
    }

    /// This rank's share, (address, bytes) of each chunk in plan order: what a replicated
    /// save sends to the next rank.
    pub fn replica_sends(&self) -> Vec<(usize, u64)> {
        self.sends.iter().map(|(c, a)| (*a, c.len)).collect()
    }

    /// The previous rank's share, in its plan order: what this rank receives and holds.
    pub fn replica_chunks(&self) -> Result<Vec<ChunkRef>, CkptError> {
        let pred = (self.opts.rank + self.opts.world - 1) % self.opts.world;
        self.tables[pred].assigned(&self.plan.indices[pred])
    }

    /// Finishes the save: waits until this rank's share is durable, then commits (see the
    /// module notes). `replica` is the previous rank's share when `replicate`.
    pub fn finish(
        &self,
        saver: &Saver,
        replica: Option<Replica>,
    ) -> Result<SaveSummary, CkptError> {
        let mut created: Vec<Digest> = Vec::new();
        let outcome = self.commit_after_durable(saver, replica, &mut created);
        if let Err(e) = &outcome {
            created.extend(self.write.created());
            if let Some(c) = &self.commit {
                c.mark_failed(&e.to_string());
                // The other ranks hold the store too: whichever can take it alone once all
                // are done removes every rank's chunks (`CkptStore::collect_failed`).
                c.record_created(&created);
            }
            self.store.remove_created(&created);
        }
        outcome
    }

    fn commit_after_durable(
        &self,
        saver: &Saver,
        replica: Option<Replica>,
        created: &mut Vec<Digest>,
    ) -> Result<SaveSummary, CkptError> {
        let report = match self.write.wait_durable(None) {
            Some(r) => r?,
            None => unreachable!("a wait without a timeout always ends with an outcome"),
        };
        saver.record(&report);
        let mut summary = self.summary(&report);
        if !self.opts.publish {
            return Ok(summary);
        }
        let Some(commit) = &self.commit else {
            self.publish()?;
            summary.written_bytes = Some(report.bytes_written);
            summary.written_bytes_per_rank = vec![report.bytes_written];
            return Ok(summary);
        };
        let value = serde_json::to_value(&report).expect("a report always serializes");
        commit.mark_durable(self.opts.rank, &value)?;
        if let Some(replica) = replica {
            if commit.must_stand_in()? {
                let pred = (self.opts.rank + self.opts.world - 1) % self.opts.world;
                tracing::warn!(
                    "{}/{}: rank {pred} is gone before its share was durable; writing it from \
                     this rank's copy",
                    self.store.root().display(),
                    self.opts.name
                );
                let mut stood = self.write_replica(&replica, created)?;
                stood["written_by"] = serde_json::json!(self.opts.rank);
                commit.mark_durable(pred, &stood)?;
                summary.stood_in_for = Some(pred);
            }
        }
        let publisher = self.opts.rank == 0 || summary.stood_in_for == Some(0);
        if !publisher {
            commit.wait_published()?;
            return Ok(summary);
        }
        let reports = commit.wait_marks()?;
        self.publish()?;
        commit.clean_up();
        let per_rank: Vec<u64> = reports
            .iter()
            .map(|r| r.get("bytes_written").and_then(|b| b.as_u64()).unwrap_or(0))
            .collect();
        summary.written_bytes = Some(per_rank.iter().sum());
        summary.written_bytes_per_rank = per_rank;
        Ok(summary)
    }

    /// Writes the previous rank's share from `replica` (durable when this returns).
    fn write_replica(
        &self,
        replica: &Replica,
        created: &mut Vec<Digest>,
    ) -> Result<serde_json::Value, CkptError> {
        let chunks = self.replica_chunks()?;
        let total: u64 = chunks.iter().map(|c| c.len).sum();
        if total != replica.len {
            return Err(CkptError::arg(
                "replica",
                format!("{} bytes held for a {total}-byte share", replica.len),
            ));
        }
        // The copy came over the network: each chunk is checked against its name before it
        // is written under it (a wrong byte here would become a durable, "verified" lie).
        let mut at = replica.addr;
        for c in &chunks {
            // SAFETY: the front end holds `replica.len` bytes at `replica.addr` until
            // `finish` returns; `total == replica.len` was checked above.
            let bytes = unsafe { std::slice::from_raw_parts(at as *const u8, c.len as usize) };
            let got = Digest::of(bytes);
            if got != c.digest {
                return Err(CkptError::CorruptChunk {
                    digest: c.digest,
                    found: crate::ChunkDamage::Hashes(got),
                    entry: format!("rank {}'s replicated share", self.opts.rank),
                    path: self.store.root().to_path_buf(),
                });
            }
            at += c.len as usize;
        }
        let mut at = replica.addr;
        let tasks: Vec<WriteTask> = chunks
            .iter()
            .map(|&chunk| {
                let t = WriteTask { chunk, src: at };
                at += chunk.len as usize;
                t
            })
            .collect();
        let pool = StagingPool::new(self.opts.staging_bytes, self.opts.chunk_bytes)?;
        // SAFETY: the front end holds the replica's memory until `finish` returns.
        let job = unsafe {
            WriteJob::start(
                self.store.chunks().clone(),
                tasks,
                pool,
                self.store.chunks().io_threads(WRITERS),
                Box::new(()),
            )?
        };
        let outcome = job.wait_durable(None).expect("no timeout");
        created.extend(job.created());
        Ok(serde_json::to_value(outcome?).expect("a report always serializes"))
    }

    fn publish(&self) -> Result<(), CkptError> {
        let mut m =
            crate::share::manifest_of(&self.tables, self.opts.world as u32, self.opts.chunk_bytes)?;
        let mut extra = match &self.opts.extra {
            serde_json::Value::Object(o) => o.clone(),
            _ => serde_json::Map::new(),
        };
        extra.insert("save_id".into(), self.plan.token.clone().into());
        m.extra = serde_json::Value::Object(extra);
        let fresh = self.write.created().into_iter().collect();
        self.store.publish_after(&self.opts.name, &m, &fresh)
    }

    fn summary(&self, report: &JobReport) -> SaveSummary {
        let (entries, logical, unique) = totals(&self.tables);
        SaveSummary {
            path: self
                .store
                .root()
                .join(&self.opts.name)
                .display()
                .to_string(),
            rank: self.opts.rank,
            world_size: self.opts.world,
            entries,
            logical_bytes: logical,
            unique_bytes: unique,
            logical_bytes_rank: self.tables[self.opts.rank].logical_bytes(),
            written_bytes_rank: report.bytes_written,
            written_bytes: None,
            written_bytes_per_rank: Vec::new(),
            planned_makespan_s: self.plan.makespan_s,
            plan_cached: self.plan.cached,
            stood_in_for: None,
            rank_report: report.clone(),
            save_id: self.plan.token.clone(),
        }
    }
}

/// Writes every chunk of `share` the store lacks and makes them durable (a single
/// process's extra entry, such as DCP's metadata, published with the ranks' tables).
///
/// # Safety
/// As for [`Share::hash`]: the share's sources stay alive and unchanged meanwhile.
pub unsafe fn write_share(
    store: &CkptStore,
    share: &Share,
    staging_bytes: u64,
) -> Result<JobReport, CkptError> {
    let table = share.table()?;
    let mut seen = std::collections::HashSet::new();
    let holdings = table.holdings();
    let indices: Vec<u32> = (0..holdings.len() as u32)
        .filter(|&i| seen.insert(holdings[i as usize].digest))
        .collect();
    let (host, streamed) = share.tasks(&indices)?;
    if !streamed.is_empty() {
        return Err(CkptError::arg(
            "write_share",
            "a share with streamed entries",
        ));
    }
    let tasks = host
        .into_iter()
        .map(|(chunk, src)| WriteTask { chunk, src })
        .collect();
    let pool = StagingPool::new(staging_bytes, table.chunk_bytes)?;
    // SAFETY: the caller's contract; the job is waited for before `share` is released.
    let writers = store.chunks().io_threads(WRITERS);
    let job =
        unsafe { WriteJob::start(store.chunks().clone(), tasks, pool, writers, Box::new(()))? };
    let outcome = job.wait_durable(None).expect("no timeout");
    if outcome.is_err() {
        store.remove_created(&job.created());
    }
    outcome
}

/// (entries, logical bytes, content-unique bytes) of every rank's table.
pub fn totals(tables: &[ShareTable]) -> (usize, u64, u64) {
    let mut seen = std::collections::HashSet::new();
    let mut unique = 0;
    for t in tables {
        for c in t.holdings() {
            if seen.insert(c.digest) {
                unique += c.len;
            }
        }
    }
    let entries = tables.iter().map(|t| t.heads.len()).sum();
    let logical = tables.iter().map(ShareTable::logical_bytes).sum();
    (entries, logical, unique)
}

/// `replicate` holds every rank's share in its successor's memory: each must fit the
/// staging budget. Every rank reaches the same verdict from the same plan.
fn check_replica_budget(
    tables: &[ShareTable],
    plan: &SavePlan,
    staging_bytes: u64,
    store: &CkptStore,
    name: &str,
) -> Result<(), CkptError> {
    for (r, (t, idx)) in tables.iter().zip(&plan.indices).enumerate() {
        let share: u64 = t.assigned(idx)?.iter().map(|c| c.len).sum();
        if share > staging_bytes {
            return Err(CkptError::arg(
                format!("{}/{name}: replicate=True", store.root().display()),
                format!(
                    "holds a rank's share in its successor's memory; rank {r}'s is {share} \
                     bytes, over staging_bytes ({staging_bytes})"
                ),
            ));
        }
    }
    Ok(())
}
