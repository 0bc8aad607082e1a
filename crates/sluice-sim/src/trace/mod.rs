//! Traces in memory, and the formats they are read from and written to.
//!
//! A [`Trace`] is a list of [`Record`]s in request order. KV traces also
//! keep where each inference request's blocks start, so the simulator can
//! score prefix hits.
//!
//! Next accesses (what the oracle policies read) are always computed from the
//! trace's own ids by [`Trace::fill_next_access`], one backward pass with a
//! hash map, which the grid runs before an oracle replays the trace. A format
//! that stores them (oracleGeneral's `next_access_vtime`) is not trusted: a
//! file whose fields were wrong made Belady report 0.297 where the optimum
//! was 0.44. The reader keeps what the file says ([`NextAccess::Stored`]) so
//! the pass can count the records where the file was wrong, and the grid
//! warns once per trace with that count. The pass runs only for studies with
//! an oracle, so the other policies' replays pay nothing for it.

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
    /// 0-based index of the next record with the same id, or [`NEVER`];
    /// see [`Trace::next_access`] for whether it can be trusted.
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
    /// What the records' `next_access` fields hold.
    pub next_access: NextAccess,
}

/// What a trace's `next_access` fields hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NextAccess {
    /// Nothing (CSV and KV traces carry no next accesses).
    #[default]
    Missing,
    /// What the file stored (oracleGeneral), unchecked: oracles do not read
    /// them, [`Trace::fill_next_access`] compares them with the truth.
    Stored,
    /// Computed from the trace's own ids: what oracles replay.
    Computed,
}

impl Trace {
    /// Each request's records as a range: from `request_starts`, or one request per
    /// record for traces without request structure.
    pub fn request_ranges(&self) -> Vec<std::ops::Range<usize>> {
        let n = self.records.len();
        if self.request_starts.is_empty() {
            return (0..n).map(|i| i..i + 1).collect();
        }
        let ends = self.request_starts.iter().skip(1).copied().chain([n]);
        self.request_starts
            .iter()
            .zip(ends)
            .map(|(a, b)| *a..b)
            .collect()
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Whether every record's `next_access` is computed from the ids, as
    /// oracle policies need.
    pub fn has_next_access(&self) -> bool {
        self.next_access == NextAccess::Computed
    }

    /// Computes every record's `next_access` by one backward pass. When the
    /// fields held what a file stored, the result counts the records where
    /// the file was wrong.
    pub fn fill_next_access(&mut self) -> NextAccessCheck {
        let compare = self.next_access == NextAccess::Stored;
        let mut check = NextAccessCheck {
            records: self.records.len() as u64,
            ..NextAccessCheck::default()
        };
        let mut next_seen = sluice_policy::id_map::id_map_with_capacity::<u64>(1024);
        for (i, record) in self.records.iter_mut().enumerate().rev() {
            let actual = next_seen.insert(record.id, i as u64).unwrap_or(NEVER);
            if compare && record.next_access != actual {
                check.disagreed += 1;
                // Walking backwards, the last one seen is the first in the file.
                check.first = Some(NextAccessMismatch {
                    index: i as u64,
                    stored: record.next_access,
                    actual,
                });
            }
            record.next_access = actual;
        }
        self.next_access = NextAccess::Computed;
        check
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

/// What [`Trace::fill_next_access`] found in the stored next accesses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NextAccessCheck {
    /// Records in the trace.
    pub records: u64,
    /// Records whose stored next access was not the true one (0 when
    /// nothing was stored).
    pub disagreed: u64,
    /// The first such record.
    pub first: Option<NextAccessMismatch>,
}

/// One record whose stored next access was wrong. Positions are 0-based
/// indices into the trace's records, [`NEVER`] for none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NextAccessMismatch {
    pub index: u64,
    pub stored: u64,
    pub actual: u64,
}

impl std::fmt::Display for NextAccessMismatch {
    /// In 1-based record numbers, as oracleGeneral's `next_access_vtime`
    /// counts, so the numbers can be looked up in the file.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let position = |p: u64| match p {
            NEVER => "never".to_string(),
            p => format!("record {}", p.saturating_add(1)),
        };
        write!(
            f,
            "record {} stored its next request at {}, the trace has it at {}",
            self.index + 1,
            position(self.stored),
            position(self.actual)
        )
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
        assert!(t.has_next_access());
    }

    #[test]
    fn filling_counts_the_stored_next_accesses_that_were_wrong() {
        let mut t = trace(&[1, 2, 1, 3, 2, 1]);
        t.records[0].next_access = 5; // true: 2
        t.records[3].next_access = 4; // true: never
        t.records[4].next_access = NEVER;
        for (r, right) in t.records.iter_mut().zip([2, 4, 5, NEVER, NEVER, NEVER]) {
            if r.next_access == 0 {
                r.next_access = right;
            }
        }
        t.next_access = NextAccess::Stored;
        let check = t.fill_next_access();
        assert_eq!((check.records, check.disagreed), (6, 2));
        let first = check.first.unwrap();
        assert_eq!((first.index, first.stored, first.actual), (0, 5, 2));
        assert_eq!(
            first.to_string(),
            "record 1 stored its next request at record 6, the trace has it at record 3"
        );
        assert_eq!(t.records[3].next_access, NEVER);
        // Computed ones are not compared again, nor are missing ones.
        assert_eq!(t.fill_next_access().disagreed, 0);
        let mut missing = trace(&[1, 1]);
        assert_eq!(missing.fill_next_access().disagreed, 0);
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
