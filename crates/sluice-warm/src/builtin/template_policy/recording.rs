//! Recording a template: each worker's accesses, merged, in order.
//!
//! Exact read ranges (pre-content events) are recorded as they come. A
//! mapping records nothing at once: the progress samples of its reader
//! record what it faulted in, and whatever no sample covered is recorded
//! whole at exit.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::policy::{AccessEvent, AccessKind};
use crate::template::{Recorder, TemplateStore};

pub(super) struct Recording {
    pub(super) recorder: Recorder,
    pub(super) store: TemplateStore,
    /// Relative path → file index in the recorder.
    pub(super) files: HashMap<PathBuf, u32>,
    /// (worker, file) → mapped range not yet covered by progress events.
    pub(super) mapped: HashMap<(u32, u32), (u64, u64)>,
    /// (worker, file) → last progress offset.
    pub(super) progress: HashMap<(u32, u32), u64>,
}

impl Recording {
    pub(super) fn record(&mut self, worker: u32, rel: &Path, event: &AccessEvent) {
        let Some(&file) = self.files.get(rel) else {
            return;
        };
        match event.kind {
            AccessKind::Read | AccessKind::Explicit => {
                self.recorder.access(worker, file, event.offset, event.len);
            }
            AccessKind::Mmap => {
                self.mapped
                    .insert((worker, file), (event.offset, event.len));
            }
            AccessKind::Progress => {
                // Progress through a mapping: what lies between the last
                // sample and this one was read, in order.
                let key = (worker, file);
                let from = match self.progress.get(&key) {
                    Some(&last) => last,
                    None => self.mapped.get(&key).map_or(0, |&(offset, _)| offset),
                };
                if event.offset > from {
                    self.recorder
                        .access(worker, file, from, event.offset - from);
                }
                self.progress.insert(key, event.offset.max(from));
                if let Some(&(offset, len)) = self.mapped.get(&key) {
                    if event.offset >= offset + len {
                        self.mapped.remove(&key);
                    } else if event.offset > offset {
                        let end = offset + len;
                        self.mapped.insert(key, (event.offset, end - event.offset));
                    }
                }
            }
            AccessKind::Open => {}
        }
    }
}
