//! Traces in memory, and the formats they are read from and written to.
//!
//! A [`Trace`] is a list of [`Record`]s in request order. Readers fill
//! `next_access` when the format carries it (oracleGeneral) and otherwise
//! leave it for [`Trace::fill_next_access`], which the simulator calls before
//! an oracle policy runs. KV traces also keep where each inference request's
//! blocks start, so the simulator can score prefix hits.

pub mod csv;
pub mod mooncake;
pub mod oracle_general;

use sluice_policy::NEVER;

/// One request of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// Timestamp in the trace's unit (seconds for oracleGeneral,
    /// milliseconds for Mooncake); carried through, not used by policies.
    pub time: u64,
    pub id: u64,
    /// Object size in bytes; readers skip zero-size records, as libCacheSim
    /// does.
    pub size: u64,
    /// 0-based index of the next record with the same id, or [`NEVER`].
    pub next_access: u64,
}

/// A whole trace.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// Where it came from (a path or a generator description), for reports.
    pub name: String,
    pub records: Vec<Record>,
    /// For KV traces: index of the first record of each inference request,
    /// ascending. Empty for traces without request structure.
    pub request_starts: Vec<usize>,
    /// Whether every `next_access` is filled in.
    pub has_next_access: bool,
}

impl Trace {
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Computes every record's `next_access` by one backward pass.
    pub fn fill_next_access(&mut self) {
        let mut next_seen = sluice_policy::id_map::id_map_with_capacity::<u64>(1024);
        for (i, record) in self.records.iter_mut().enumerate().rev() {
            record.next_access = next_seen.insert(record.id, i as u64).unwrap_or(NEVER);
        }
        self.has_next_access = true;
    }

    /// Distinct objects and their bytes (each object counted once, at the
    /// size of its first request): the working set cache fractions refer to.
    pub fn working_set(&self) -> WorkingSet {
        let mut seen = sluice_policy::id_map::id_map_with_capacity::<()>(1024);
        let mut ws = WorkingSet::default();
        for r in &self.records {
            if seen.insert(r.id, ()).is_none() {
                ws.objects += 1;
                ws.bytes = ws.bytes.saturating_add(r.size);
            }
        }
        ws
    }
}

/// Size of a trace's working set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct WorkingSet {
    pub objects: u64,
    pub bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(ids: &[u64]) -> Trace {
        Trace {
            records: ids
                .iter()
                .map(|&id| Record {
                    time: 0,
                    id,
                    size: id * 10,
                    next_access: 0,
                })
                .collect(),
            ..Trace::default()
        }
    }

    #[test]
    fn next_access_points_at_the_next_request_of_the_same_object() {
        let mut t = trace(&[1, 2, 1, 3, 2, 1]);
        t.fill_next_access();
        let next: Vec<u64> = t.records.iter().map(|r| r.next_access).collect();
        assert_eq!(next, [2, 4, 5, NEVER, NEVER, NEVER]);
    }

    #[test]
    fn working_set_counts_each_object_once() {
        let ws = trace(&[1, 2, 1, 3, 2, 1]).working_set();
        assert_eq!(
            ws,
            WorkingSet {
                objects: 3,
                bytes: 60
            }
        );
    }
}
