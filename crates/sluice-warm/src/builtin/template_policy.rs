//! `template`: seed 000's MAIO. Without a template for the service it
//! records one (each worker's ordered, merged accesses, see
//! [`recording`]) and writes it at exit; with one it replays it (see
//! [`replay`]): each access locates the worker's reader in its sequence and
//! prefetches from there to the end (interruptible: the next access
//! supersedes it), placed near the worker's accelerator; when memory is
//! short it burns what the reader passed more than `bar_distance_bytes`
//! ago, unless some worker still has it ahead.

mod recording;
mod replay;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::BuiltinConfig;
use crate::error::WarmConfigError;
use crate::error::WarmError;
use crate::policy::{AccessEvent, FileRange, PolicyContext, Prefetch, Target, WarmPolicy};
use crate::template::{relative_path, Recorder, Template, TemplateError, TemplateStore};
use recording::Recording;
use replay::Replay;

/// MAIO: record a template, or replay one.
pub struct TemplatePolicy {
    config: BuiltinConfig,
    model_dir: PathBuf,
    mode: Mode,
    /// Loader pids in the order they were first seen → worker number.
    workers_by_pid: HashMap<i32, u32>,
    /// Replay prefetches each file of a worker's sequence as its own
    /// stream (see [`room_for_all`]).
    per_file: bool,
}

enum Mode {
    /// No template yet: record one.
    Record(Box<Recording>),
    Replay(Box<Replay>),
    /// After `exit`.
    Done,
}

/// A worker's plan is renewed when its reader moved this far past the last
/// plan's start (or went back): between renewals the queued plan is still
/// right, and renewing it on every 128 KiB read would only cost time.
const REPLAN_BYTES: u64 = 16 << 20;

impl TemplatePolicy {
    pub fn new(config: BuiltinConfig) -> Result<TemplatePolicy, WarmError> {
        if config.service.is_none() {
            return Err(missing("service", "the spec its template is recorded for"));
        }
        if config.template_dir.is_none() {
            return Err(missing("template-dir", "where its templates live"));
        }
        Ok(TemplatePolicy {
            config,
            model_dir: PathBuf::new(),
            mode: Mode::Done,
            workers_by_pid: HashMap::new(),
            per_file: false,
        })
    }

    /// Whether it is recording (no template existed at `init`).
    pub fn is_recording(&self) -> bool {
        matches!(self.mode, Mode::Record(_))
    }

    fn worker_of(&mut self, event: &AccessEvent, workers: u32) -> u32 {
        if let Some(w) = event.worker {
            return w;
        }
        let next = self.workers_by_pid.len() as u32;
        let w = *self.workers_by_pid.entry(event.pid).or_insert(next);
        if workers == 0 {
            w
        } else {
            w % workers
        }
    }

    fn relative(&self, path: &Path) -> Option<PathBuf> {
        path.strip_prefix(&self.model_dir)
            .ok()
            .map(Path::to_path_buf)
    }
}

impl WarmPolicy for TemplatePolicy {
    fn name(&self) -> &str {
        "template"
    }

    /// Recording needs every read's exact range (pre-content events).
    /// Replay follows readers through opens and the samplers (file position,
    /// pagemap): pre-content events would make each read wait for an answer
    /// and turn the kernel's readahead off for whatever prefetch has not
    /// reached yet.
    fn needs_read_ranges(&self) -> bool {
        !matches!(self.mode, Mode::Replay(_))
    }

    fn init(&mut self, ctx: &PolicyContext) -> Result<Vec<Prefetch>, WarmError> {
        self.model_dir = ctx.model_dir.clone();
        let (Some(service), Some(dir)) = (&self.config.service, &self.config.template_dir) else {
            return Err(missing("service", "the spec its template is recorded for"));
        };
        let store = TemplateStore::new(dir.clone());
        let existing = if self.config.record {
            None
        } else {
            store.load(service)?
        };
        let mut first = Vec::new();
        self.mode = match existing {
            Some(template) => {
                check_model_matches(&template, ctx)?;
                self.per_file = !ctx.memory_limited && room_for_all(ctx.model_bytes());
                if self.per_file {
                    tracing::info!("room for the whole model: one prefetch stream per file");
                }
                let mut replay = Replay::new(template);
                if self.config.start_at_launch && self.config.prefetch {
                    for state in 0..replay.workers.len() {
                        let target = if self.config.affinity {
                            Target::Accelerator(replay.workers[state].worker)
                        } else {
                            Target::Any
                        };
                        first.extend(replay.plan_from_reader(
                            state,
                            &ctx.model_dir,
                            target,
                            self.per_file,
                        ));
                    }
                }
                Mode::Replay(Box::new(replay))
            }
            None => {
                tracing::info!(
                    service = service.to_hex(),
                    "no template yet: recording this run"
                );
                let mut recorder = Recorder::new(*service, self.config.spec.clone());
                let mut files = HashMap::new();
                for (path, size) in &ctx.files {
                    let rel = relative_path(&ctx.model_dir, path)?;
                    let index = recorder.file(rel.clone(), *size, mtime_ns(path));
                    files.insert(PathBuf::from(rel), index);
                }
                Mode::Record(Box::new(Recording {
                    recorder,
                    store,
                    files,
                    mapped: HashMap::new(),
                    progress: HashMap::new(),
                }))
            }
        };
        Ok(first)
    }

    fn on_access(&mut self, event: &AccessEvent) -> Result<Vec<Prefetch>, WarmError> {
        let Some(rel) = self.relative(&event.path) else {
            return Ok(Vec::new());
        };
        let workers = match &self.mode {
            Mode::Replay(r) => r.workers.len() as u32,
            _ => 0,
        };
        let worker = self.worker_of(event, workers);
        match &mut self.mode {
            Mode::Record(rec) => {
                rec.record(worker, &rel, event);
                Ok(Vec::new())
            }
            Mode::Replay(replay) => {
                let Some(state) = replay.locate(worker, &rel, event) else {
                    return Ok(Vec::new());
                };
                if !self.config.prefetch {
                    return Ok(Vec::new());
                }
                let target = if self.config.affinity {
                    Target::Accelerator(replay.workers[state].worker)
                } else {
                    Target::Any
                };
                let plan = replay.plan_from_reader(state, &self.model_dir, target, self.per_file);
                if !plan.is_empty() {
                    tracing::debug!(
                        "worker {}: {:?} by pid {} at {}:{}: reader at byte {} of the sequence, {} bytes planned",
                        replay.workers[state].worker,
                        event.kind,
                        event.pid,
                        rel.display(),
                        event.offset,
                        replay.workers[state].reader,
                        plan.iter().map(|p| p.range.len).sum::<u64>()
                    );
                }
                Ok(plan)
            }
            Mode::Done => Ok(Vec::new()),
        }
    }

    fn evict(&mut self, _event: Option<&AccessEvent>) -> Result<Vec<FileRange>, WarmError> {
        match &mut self.mode {
            Mode::Replay(replay) if self.config.burn_after_reading => {
                Ok(replay.burn(self.config.bar_distance_bytes, &self.model_dir))
            }
            _ => Ok(Vec::new()),
        }
    }

    fn discard(&mut self) -> Result<(), WarmError> {
        if matches!(self.mode, Mode::Record(_)) {
            tracing::warn!("the recorded run failed: no template written");
            self.mode = Mode::Done;
        }
        Ok(())
    }

    fn exit(&mut self) -> Result<(), WarmError> {
        if let Mode::Record(rec) = std::mem::replace(&mut self.mode, Mode::Done) {
            let rec = *rec;
            let mut recorder = rec.recorder;
            // Mappings no progress sampler covered count as read whole.
            for ((worker, file), (offset, len)) in rec.mapped {
                recorder.access(worker, file, offset, len);
            }
            let template = recorder.finish();
            if template.workers.is_empty() {
                tracing::warn!("no model reads were seen: no template written");
                return Ok(());
            }
            let path = rec.store.save(&template)?;
            tracing::info!(path = %path.display(), bytes = template.total_bytes(), "template written");
        }
        Ok(())
    }
}

/// The stream of `worker`'s reads of template file `file`: worker numbers
/// and file indices stay apart up to 65,536 files.
fn per_file_stream(worker: u32, file: u32) -> u32 {
    worker.wrapping_mul(1 << 16).wrapping_add(file)
}

/// Whether the whole model fits in half the memory free under the
/// runtime's limit (cgroup or /proc/meminfo) now. Then nothing a replay
/// prefetches will have to go before the reader gets to it, and the
/// worker's files are prefetched side by side, one stream each, as `eager`
/// does: with the reader faulting in its own file meanwhile, the disk serves
/// several regions faster than one (8 GiB model, mmap loader, 6 rotated
/// rounds: load phase 0.77 s against 0.97 s with one stream, eager 0.87 s).
/// Otherwise (or when memory cannot be read) the sequence is prefetched in
/// order, one stream per worker.
fn room_for_all(model_bytes: u64) -> bool {
    match sluice_engine::cgroup::own_cgroup_memory_limit() {
        Ok(m) if m.limit > 0 => model_bytes.saturating_mul(2) <= m.limit.saturating_sub(m.usage),
        _ => false,
    }
}

/// Sorts ranges and merges those of one file that overlap or touch, so no
/// byte is evicted twice.
fn merge_ranges(mut ranges: Vec<FileRange>) -> Vec<FileRange> {
    ranges.sort_by(|a, b| (&a.path, a.offset).cmp(&(&b.path, b.offset)));
    let mut out: Vec<FileRange> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(last) if last.path == r.path && r.offset <= last.end() => {
                last.len = last.end().max(r.end()) - last.offset;
            }
            _ => out.push(r),
        }
    }
    out
}

/// `range` minus every interval of `holes` (which may overlap, unsorted).
fn subtract(range: (u64, u64), holes: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut pieces = vec![range];
    for &(h0, h1) in holes {
        let mut next = Vec::with_capacity(pieces.len() + 1);
        for (a, b) in pieces {
            if h1 <= a || h0 >= b {
                next.push((a, b));
                continue;
            }
            if a < h0 {
                next.push((a, h0));
            }
            if h1 < b {
                next.push((h1, b));
            }
        }
        pieces = next;
    }
    pieces
}

/// Refuses a template recorded against other files: replaying it would
/// prefetch the wrong bytes.
fn check_model_matches(template: &Template, ctx: &PolicyContext) -> Result<(), WarmError> {
    for f in &template.files {
        let path = ctx.model_dir.join(&f.path);
        match ctx.files.iter().find(|(p, _)| *p == path) {
            Some((_, size)) if *size == f.size => {}
            Some((_, size)) => {
                return Err(TemplateError::ModelFileResized {
                    path,
                    recorded_bytes: f.size,
                    now_bytes: *size,
                }
                .into())
            }
            None => return Err(TemplateError::ModelFileMissing { path }.into()),
        }
    }
    Ok(())
}

/// The template policy cannot run without `--option`.
fn missing(option: &'static str, why: &'static str) -> WarmError {
    WarmConfigError::Missing {
        policy: "template",
        option,
        why,
    }
    .into()
}

fn mtime_ns(path: &Path) -> i64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .map(|m| {
            m.mtime()
                .saturating_mul(1_000_000_000)
                .saturating_add(m.mtime_nsec())
        })
        .unwrap_or(0)
}
