//! The template model: per worker, the ranges it read in order, over a table of files.
//!
//! A worker is a loader process, numbered from 0 by accelerator binding or spawn order.
//! Each range names its file by index into the template's file table, which lists every
//! model file once with the size and mtime it had when the template was recorded, so a
//! replay can tell that the model changed. [`Template::validate`] states the invariants a
//! replay relies on; decoding enforces them on every template it returns.

use super::error::InvalidTemplate;
use super::path::check_relative_path;
use super::service_id::ServiceId;

/// A file of the model as it was when the template was recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateFile {
    /// Path relative to the model directory, `/`-separated, without `.`, `..` or empty
    /// components (see [`check_relative_path`]).
    pub path: String,
    /// Size in bytes at record time; every range lies inside it.
    pub size: u64,
    /// Modification time at record time, in ns since the epoch.
    pub mtime_ns: i64,
}

/// One contiguous range a worker read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TemplateRange {
    /// Index into [`Template::files`].
    pub file: u32,
    /// First byte.
    pub offset: u64,
    /// Length in bytes, never 0.
    pub len: u64,
}

impl TemplateRange {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.len)
    }

    /// Whether byte `offset` of `file` lies in this range.
    pub fn contains(&self, file: u32, offset: u64) -> bool {
        self.file == file && offset >= self.offset && offset - self.offset < self.len
    }
}

/// The ranges one worker read, in the order it read them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSequence {
    /// Logical worker number (0, 1, ...): the accelerator it is bound to, or its spawn
    /// order.
    pub worker: u32,
    /// Ranges in access order.
    pub ranges: Vec<TemplateRange>,
}

/// The I/O template of one service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// The service this template belongs to.
    pub service: ServiceId,
    /// The spec string the service id was derived from, for people reading a template
    /// directory.
    pub spec: String,
    /// The model's files, referenced by index from the ranges.
    pub files: Vec<TemplateFile>,
    /// One sequence per worker, sorted by worker number, numbers unique.
    pub workers: Vec<WorkerSequence>,
}

impl Template {
    /// Bytes the template covers: the sum of all range lengths.
    pub fn total_bytes(&self) -> u64 {
        self.ranges().fold(0u64, |sum, r| sum.saturating_add(r.len))
    }

    /// Ranges in all workers.
    pub fn range_count(&self) -> usize {
        self.workers.iter().map(|w| w.ranges.len()).sum()
    }

    fn ranges(&self) -> impl Iterator<Item = &TemplateRange> {
        self.workers.iter().flat_map(|w| w.ranges.iter())
    }

    /// The sequence of worker number `worker`, if it read anything.
    pub fn worker(&self, worker: u32) -> Option<&WorkerSequence> {
        self.workers.iter().find(|w| w.worker == worker)
    }

    /// Index of the first range of `worker`'s sequence that contains byte `offset` of
    /// `file`. O(ranges); see [`Template::position_from`] for the usual case of a reader
    /// moving forward.
    pub fn position_of(&self, worker: u32, file: u32, offset: u64) -> Option<usize> {
        self.position_from(worker, file, offset, 0)
    }

    /// Like [`Template::position_of`], but the search starts at range `hint` (the last
    /// position found) and wraps around, so a reader that moves forward is found in a step
    /// or two.
    pub fn position_from(&self, worker: u32, file: u32, offset: u64, hint: usize) -> Option<usize> {
        let ranges = &self.worker(worker)?.ranges;
        let (before, after) = ranges.split_at(hint.min(ranges.len()));
        let hit = |r: &TemplateRange| r.contains(file, offset);
        match after.iter().position(hit) {
            Some(i) => Some(before.len() + i),
            None => before.iter().position(hit),
        }
    }

    /// Checks what [`Template::decode`] checks of a decoded template's meaning: safe
    /// relative paths, worker numbers increasing, every range non-empty, on a listed file
    /// and inside its recorded size. The first problem found is returned, in that order.
    pub fn validate(&self) -> Result<(), InvalidTemplate> {
        for (file, entry) in self.files.iter().enumerate() {
            check_relative_path(&entry.path).map_err(|reason| InvalidTemplate::UnsafePath {
                file,
                path: entry.path.clone(),
                reason,
            })?;
        }
        for (i, pair) in self.workers.windows(2).enumerate() {
            if pair[0].worker >= pair[1].worker {
                return Err(InvalidTemplate::WorkersOutOfOrder {
                    entry: i + 1,
                    previous: pair[0].worker,
                    worker: pair[1].worker,
                });
            }
        }
        for seq in &self.workers {
            for (index, range) in seq.ranges.iter().enumerate() {
                self.check_range(seq.worker, index, range)?;
            }
        }
        Ok(())
    }

    fn check_range(
        &self,
        worker: u32,
        index: usize,
        range: &TemplateRange,
    ) -> Result<(), InvalidTemplate> {
        let Some(file) = self.files.get(range.file as usize) else {
            return Err(InvalidTemplate::FileIndexOutOfRange {
                worker,
                range: index,
                file: u64::from(range.file),
                files: self.files.len(),
            });
        };
        if range.len == 0 {
            return Err(InvalidTemplate::EmptyRange {
                worker,
                range: index,
            });
        }
        match range.offset.checked_add(range.len) {
            Some(end) if end <= file.size => Ok(()),
            _ => Err(InvalidTemplate::RangeBeyondFile {
                worker,
                range: index,
                offset: range.offset,
                len: range.len,
                file_size: file.size,
                path: file.path.clone(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{range, sample, MIB};
    use super::super::path::UnsafePathReason;
    use super::*;

    #[test]
    fn totals_count_every_range_of_every_worker() {
        let t = sample();
        assert_eq!(t.total_bytes(), 4096 + MIB + 900 + 10 + 1 + 1000);
        assert_eq!(t.range_count(), 6);
    }

    #[test]
    fn position_of_finds_the_range_holding_a_byte() {
        let t = sample();
        assert_eq!(t.position_of(0, 0, 8192), Some(1));
        assert_eq!(t.position_of(0, 0, 8192 + MIB - 1), Some(1));
        assert_eq!(t.position_of(0, 0, 8192 + MIB), None, "ends are exclusive");
        assert_eq!(t.position_of(0, 1, 100), Some(2));
        assert_eq!(t.position_of(0, 1, 99), None);
        assert_eq!(t.position_of(0, 0, 4100), Some(3));
        assert_eq!(t.position_of(3, 1, 4999), Some(0));
        assert_eq!(t.position_of(3, 0, 0), None, "other file");
        assert_eq!(t.position_of(1, 0, 0), None, "unknown worker");
    }

    #[test]
    fn position_from_starts_at_the_hint_and_wraps_around() {
        let mut t = sample();
        t.workers[0].ranges = vec![range(0, 0, 10), range(1, 0, 10), range(0, 0, 10)];
        assert_eq!(t.position_of(0, 0, 5), Some(0));
        assert_eq!(t.position_from(0, 0, 5, 1), Some(2));
        assert_eq!(t.position_from(0, 1, 5, 2), Some(1), "wraps");
        assert_eq!(t.position_from(0, 0, 5, 99), Some(0), "hint past the end");
    }

    #[test]
    fn validate_accepts_the_sample_and_names_each_problem() {
        assert_eq!(sample().validate(), Ok(()));

        let mut t = sample();
        t.files[1].path = "a/../b".into();
        assert_eq!(
            t.validate(),
            Err(InvalidTemplate::UnsafePath {
                file: 1,
                path: "a/../b".into(),
                reason: UnsafePathReason::ParentDir
            })
        );

        let mut t = sample();
        t.workers[1].worker = 0;
        assert!(matches!(
            t.validate(),
            Err(InvalidTemplate::WorkersOutOfOrder {
                entry: 1,
                previous: 0,
                worker: 0
            })
        ));

        let mut t = sample();
        t.workers[1].ranges[0] = range(1, 4000, 1001);
        assert_eq!(
            t.validate(),
            Err(InvalidTemplate::RangeBeyondFile {
                worker: 3,
                range: 0,
                offset: 4000,
                len: 1001,
                file_size: 5000,
                path: "sub/model-00002-of-00002.safetensors".into()
            })
        );
    }
}
