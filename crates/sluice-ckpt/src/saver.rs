//! [`Saver`]: what one process keeps across its saves (the write planner's cache, its
//! measured write bandwidth), and [`SavePlan`], what rank 0 decides for every rank.
//!
//! A grouped save plans once, on rank 0: which chunks the store already holds, and which
//! rank writes each new unique chunk ([`crate::planner`]), given every rank's table and
//! write bandwidth. The plan, with the save's token, travels to every rank as bytes
//! ([`SavePlan::encode`]); each rank's share is indices into its own
//! [`ShareTable::holdings`](crate::ShareTable::holdings).

use std::collections::HashSet;
use std::sync::Mutex;

use crate::chunking::{Digest, DigestBuild};
use crate::error::CkptError;
use crate::planner::{PlanInput, WritePlanner};
use crate::share::ShareTable;
use crate::store::CkptStore;
use crate::writer::JobReport;

/// A rank's write bandwidth before it has measured one: 1 GB/s, a local NVMe or a fast
/// network file system; the first save measures the real one.
pub const DEFAULT_BANDWIDTH: f64 = 1e9;

/// Who writes what in one save, and the save's token.
#[derive(Clone, Debug, PartialEq)]
pub struct SavePlan {
    /// Names this save's commit files and is recorded in its manifest.
    pub token: String,
    /// Per rank, indices into its holdings of the chunks it writes.
    pub indices: Vec<Vec<u32>>,
    /// The planned finish time of the writes.
    pub makespan_s: f64,
    /// The quotas came from the planner's cache.
    pub cached: bool,
}

/// One process's planning state, shared by its saves.
pub struct Saver {
    planner: Mutex<WritePlanner>,
    measured: Mutex<Option<f64>>,
}

impl Default for Saver {
    fn default() -> Saver {
        Saver::new()
    }
}

impl Saver {
    /// This process's saver: its plan cache and measured bandwidth span the saves of a
    /// training run, whichever front starts them.
    pub fn process() -> &'static Saver {
        static SAVER: std::sync::LazyLock<Saver> = std::sync::LazyLock::new(Saver::new);
        &SAVER
    }

    pub fn new() -> Saver {
        Saver {
            planner: Mutex::new(WritePlanner::new()),
            measured: Mutex::new(None),
        }
    }

    /// This rank's write bandwidth for the next plan: the last save's, else the default.
    pub fn bandwidth(&self) -> f64 {
        self.measured
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .unwrap_or(DEFAULT_BANDWIDTH)
    }

    /// Remembers the bandwidth a finished share measured.
    pub fn record(&self, report: &JobReport) {
        if report.write_bytes_per_s > 0.0 {
            *self.measured.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(report.write_bytes_per_s);
        }
    }

    /// Plans a save (rank 0): every chunk the store's newest checkpoint lacks is written
    /// once, by one of the ranks holding it, balancing `bandwidth` (bytes/s per rank).
    pub fn plan(
        &self,
        store: &CkptStore,
        tables: &[ShareTable],
        bandwidth: &[f64],
    ) -> Result<SavePlan, CkptError> {
        check_keys(tables)?;
        let stored: HashSet<Digest> = store.known()?.into_iter().collect();
        let held: Vec<Vec<crate::ChunkRef>> = tables.iter().map(ShareTable::holdings).collect();
        let plan = self
            .planner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .plan(&PlanInput {
                ranks: &held,
                bandwidth,
                stored: &stored,
            })?;
        // Each assigned chunk as its first index in the rank's own holdings.
        let indices = plan
            .assignments
            .iter()
            .zip(&held)
            .map(|(mine, holdings)| {
                let mut want: HashSet<Digest, DigestBuild> =
                    mine.iter().map(|c| c.digest).collect();
                let mut out = Vec::with_capacity(mine.len());
                for (i, c) in holdings.iter().enumerate() {
                    if want.remove(&c.digest) {
                        out.push(i as u32);
                    }
                }
                out
            })
            .collect();
        Ok(SavePlan {
            token: new_token(),
            indices,
            makespan_s: plan.makespan_s,
            cached: plan.cached,
        })
    }
}

/// Refuses a save whose entries collide (two ranks, or one rank twice, under one key)
/// before anything is written.
fn check_keys(tables: &[ShareTable]) -> Result<(), CkptError> {
    let mut seen: std::collections::HashMap<&str, usize> = Default::default();
    for (rank, t) in tables.iter().enumerate() {
        for h in &t.heads {
            if let Some(first) = seen.insert(h.key.as_str(), rank) {
                return Err(CkptError::arg(
                    format!("entry {:?}", h.key),
                    format!("is saved twice (by rank {first} and rank {rank})"),
                ));
            }
        }
    }
    Ok(())
}

/// 16 hex digits, unique across processes and time.
fn new_token() -> String {
    sluice_engine::unique_hex(16)
}

impl SavePlan {
    /// The plan as bytes, for rank 0 to broadcast.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(PLAN_MAGIC);
        out.extend_from_slice(&(self.token.len() as u32).to_le_bytes());
        out.extend_from_slice(self.token.as_bytes());
        out.extend_from_slice(&self.makespan_s.to_le_bytes());
        out.push(self.cached as u8);
        out.extend_from_slice(&(self.indices.len() as u32).to_le_bytes());
        for rank in &self.indices {
            out.extend_from_slice(&(rank.len() as u32).to_le_bytes());
            for i in rank {
                out.extend_from_slice(&i.to_le_bytes());
            }
        }
        out
    }

    /// Decodes [`SavePlan::encode`]'s bytes.
    pub fn decode(bytes: &[u8]) -> Result<SavePlan, CkptError> {
        let bad = || {
            CkptError::arg(
                "save plan",
                "is damaged (it did not come from rank 0's plan)",
            )
        };
        let mut at = 0usize;
        let mut take = |n: usize| -> Result<&[u8], CkptError> {
            let out = bytes.get(at..at + n).ok_or_else(bad)?;
            at += n;
            Ok(out)
        };
        if take(PLAN_MAGIC.len())? != PLAN_MAGIC {
            return Err(bad());
        }
        let u32_of = |b: &[u8]| u32::from_le_bytes(b.try_into().expect("4 bytes"));
        let n = u32_of(take(4)?) as usize;
        let token = String::from_utf8(take(n)?.to_vec()).map_err(|_| bad())?;
        let makespan_s = f64::from_le_bytes(take(8)?.try_into().expect("8 bytes"));
        let cached = take(1)?[0] != 0;
        let ranks = u32_of(take(4)?) as usize;
        let mut indices = Vec::with_capacity(ranks.min(1 << 16));
        for _ in 0..ranks {
            let k = u32_of(take(4)?) as usize;
            let raw = take(k.checked_mul(4).ok_or_else(bad)?)?;
            indices.push(raw.chunks_exact(4).map(u32_of).collect());
        }
        if at != bytes.len() {
            return Err(bad());
        }
        Ok(SavePlan {
            token,
            indices,
            makespan_s,
            cached,
        })
    }
}

const PLAN_MAGIC: &[u8] = b"SLCKPLN1";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_round_trips_and_damage_is_refused() {
        let p = SavePlan {
            token: "0123456789abcdef".into(),
            indices: vec![vec![0, 2, 5], vec![], vec![1]],
            makespan_s: 1.5,
            cached: true,
        };
        let b = p.encode();
        assert_eq!(SavePlan::decode(&b).unwrap(), p);
        for cut in [0, 5, b.len() - 1] {
            assert!(SavePlan::decode(&b[..cut]).is_err());
        }
        assert_ne!(new_token(), new_token());
    }
}
