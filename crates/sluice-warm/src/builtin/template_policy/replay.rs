//! Replaying a template: where each worker's reader is in its sequence,
//! the plan from there to the end, and what lies far enough behind every
//! reader to be burned.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::{merge_ranges, per_file_stream, subtract, REPLAN_BYTES};
use crate::policy::{AccessEvent, AccessKind, FileRange, Prefetch, Target};
use crate::template::Template;

pub(super) struct Replay {
    pub(super) template: Template,
    /// Relative path → file index in the template.
    pub(super) files: HashMap<PathBuf, u32>,
    pub(super) workers: Vec<WorkerState>,
}

/// One worker's sequence and cursors, in bytes along the sequence.
pub(super) struct WorkerState {
    pub(super) worker: u32,
    /// Sequence offset where each range starts; one extra entry: the total.
    pub(super) starts: Vec<u64>,
    /// Where the reader is (latest access).
    pub(super) reader: u64,
    /// Everything before this was evicted (or judged evictable).
    pub(super) evicted_to: u64,
    /// The range index the reader was last found in.
    pub(super) at: usize,
    /// The reader position the last plan started from.
    pub(super) planned_from: Option<u64>,
}

impl Replay {
    pub(super) fn new(template: Template) -> Replay {
        let files = template
            .files
            .iter()
            .enumerate()
            .map(|(i, f)| (PathBuf::from(&f.path), i as u32))
            .collect();
        let workers = template
            .workers
            .iter()
            .map(|w| {
                let mut starts = Vec::with_capacity(w.ranges.len() + 1);
                let mut total = 0u64;
                for r in &w.ranges {
                    starts.push(total);
                    total = total.saturating_add(r.len);
                }
                starts.push(total);
                WorkerState {
                    worker: w.worker,
                    starts,
                    reader: 0,
                    evicted_to: 0,
                    at: 0,
                    planned_from: None,
                }
            })
            .collect();
        Replay {
            template,
            files,
            workers,
        }
    }

    /// Finds the worker's reader for `event` and moves its cursor there;
    /// returns the worker's state index, or `None` when the access is not
    /// in the worker's sequence.
    pub(super) fn locate(&mut self, worker: u32, rel: &Path, event: &AccessEvent) -> Option<usize> {
        let state = self.workers.iter().position(|w| w.worker == worker)?;
        let file = *self.files.get(rel)?;
        let ranges = &self.template.workers[state].ranges;
        let ws = &mut self.workers[state];
        let contains = |i: usize| {
            let r = &ranges[i];
            r.file == file && event.offset >= r.offset && event.offset < r.offset + r.len.max(1)
        };
        // Readers move forward: look from the last position on, then from
        // the start (a worker that re-reads). An open or a mapping says
        // where the reader is headed, not what it read: it never moves the
        // reader back.
        let announce = matches!(event.kind, AccessKind::Open | AccessKind::Mmap);
        let index = (ws.at..ranges.len()).find(|&i| contains(i)).or_else(|| {
            (!announce)
                .then(|| (0..ws.at).find(|&i| contains(i)))
                .flatten()
        })?;
        let r = &ranges[index];
        let position = ws.starts[index] + (event.offset - r.offset).min(r.len);
        if announce && position < ws.reader {
            return Some(state);
        }
        ws.at = index;
        ws.reader = position;
        Some(state)
    }

    /// The worker's remaining sequence, from its reader to the end; empty
    /// when the last plan still stands (see [`REPLAN_BYTES`]). One stream
    /// per worker, or with `per_file` one per (worker, file), so the
    /// manager's round robin keeps several files in flight.
    pub(super) fn plan_from_reader(
        &mut self,
        state: usize,
        model_dir: &Path,
        target: Target,
        per_file: bool,
    ) -> Vec<Prefetch> {
        let ws = &mut self.workers[state];
        if let Some(from) = ws.planned_from {
            if ws.reader >= from && ws.reader - from < REPLAN_BYTES {
                return Vec::new();
            }
        }
        ws.planned_from = Some(ws.reader);
        let ws = &self.workers[state];
        let ranges = &self.template.workers[state].ranges;
        let mut plan = Vec::with_capacity(ranges.len() - ws.at);
        for (i, r) in ranges.iter().enumerate().skip(ws.at) {
            let skip = ws.reader.saturating_sub(ws.starts[i]).min(r.len);
            if skip == r.len {
                continue;
            }
            let path = model_dir.join(&self.template.files[r.file as usize].path);
            let stream = match per_file {
                true => per_file_stream(ws.worker, r.file),
                false => ws.worker,
            };
            plan.push(Prefetch {
                stream,
                range: FileRange::new(path, r.offset + skip, r.len - skip).with_target(target),
            });
        }
        plan
    }

    /// Ranges every worker's reader passed more than `distance` ago and no
    /// worker still has ahead of its reader.
    pub(super) fn burn(&mut self, distance: u64, model_dir: &Path) -> Vec<FileRange> {
        // Per file: intervals some worker still needs (at or after its reader).
        let mut needed: HashMap<u32, Vec<(u64, u64)>> = HashMap::new();
        for (ws, seq) in self.workers.iter().zip(&self.template.workers) {
            for (i, r) in seq.ranges.iter().enumerate() {
                let end_seq = ws.starts[i + 1];
                if end_seq <= ws.reader {
                    continue;
                }
                let skip = ws.reader.saturating_sub(ws.starts[i]);
                needed
                    .entry(r.file)
                    .or_default()
                    .push((r.offset + skip, r.offset + r.len));
            }
        }
        let mut out = Vec::new();
        for (ws, seq) in self.workers.iter_mut().zip(&self.template.workers) {
            let limit = ws.reader.saturating_sub(distance);
            if limit <= ws.evicted_to {
                continue;
            }
            for (i, r) in seq.ranges.iter().enumerate() {
                let (start, end) = (ws.starts[i], ws.starts[i + 1]);
                let from = start.max(ws.evicted_to);
                let to = end.min(limit);
                if from >= to {
                    continue;
                }
                let lo = r.offset + (from - start);
                let hi = r.offset + (to - start);
                let path = model_dir.join(&self.template.files[r.file as usize].path);
                let keep = needed.get(&r.file).map_or(&[][..], Vec::as_slice);
                for (a, b) in subtract((lo, hi), keep) {
                    out.push(FileRange::new(&path, a, b - a));
                }
            }
            ws.evicted_to = limit;
        }
        merge_ranges(out)
    }
}
