//! The built-in policies, chosen by name:
//!
//! - `native`: does nothing; the kernel's own readahead and LRU (baseline).
//! - `eager`: on the first access, prefetch every model file at full
//!   concurrency (one stream per file); never evict.
//! - `precache`: prefetch every model file before the service starts.
//! - `template`: seed 000's MAIO. Without a template for the service it
//!   records one (each worker's ordered, merged accesses) and writes it at
//!   exit; with one it replays it: each access locates the worker's reader
//!   in its sequence and prefetches from there to the end (interruptible:
//!   the next access supersedes it), placed near the worker's accelerator;
//!   when memory is short it burns what the reader passed more than
//!   `bar_distance` ago, unless some worker still has it ahead.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::WarmError;
use crate::policy::{AccessEvent, AccessKind, FileRange, Policy, PolicyContext, Prefetch, Target};
use crate::template::{relative_path, Recorder, ServiceId, Template, TemplateStore};

/// Names [`by_name`] accepts.
pub const BUILTIN_NAMES: [&str; 4] = ["native", "eager", "precache", "template"];

/// Knobs of the built-ins (only `template` reads most of them).
#[derive(Clone, Debug)]
pub struct BuiltinConfig {
    /// The service whose template to record or replay.
    pub service: Option<ServiceId>,
    /// The spec the service id was hashed from, kept in new templates.
    pub spec: String,
    /// Where templates live (may be shared storage).
    pub template_dir: Option<PathBuf>,
    /// Prefetch along the template (off: the "no prefetch" breakdown).
    pub prefetch: bool,
    /// Place prefetched pages near each worker's accelerator.
    pub affinity: bool,
    /// Evict what readers passed, when memory is limited.
    pub burn_after_reading: bool,
    /// Record a new template even when one exists (`sluice warm record`).
    pub record: bool,
    /// Replay from the start of every worker's sequence as soon as the
    /// runtime starts, without waiting for a first access. Right for `run`,
    /// which launches the service itself (the launch is the first event); a
    /// daemon does not know when a service starts and waits for one.
    pub start_at_launch: bool,
    /// How far behind the reader eviction stops. 1 GiB, seed 000's default:
    /// data just read may not have reached the accelerator yet.
    pub bar_distance: u64,
}

impl Default for BuiltinConfig {
    fn default() -> BuiltinConfig {
        BuiltinConfig {
            service: None,
            spec: String::new(),
            template_dir: None,
            prefetch: true,
            affinity: true,
            burn_after_reading: true,
            record: false,
            start_at_launch: false,
            bar_distance: 1 << 30,
        }
    }
}

/// A built-in policy by name, or a Python policy for a `module:Class`
/// name (started now, see [`crate::python::spawn`]); the error lists the
/// names.
pub fn by_name(name: &str, config: &BuiltinConfig) -> Result<Box<dyn Policy>, WarmError> {
    if name.contains(':') {
        return Ok(Box::new(crate::python::spawn(name, None)?));
    }
    Ok(match name {
        "native" => Box::new(Native),
        "eager" => Box::new(Eager::default()),
        "precache" => Box::new(Precache),
        "template" => Box::new(TemplatePolicy::new(config.clone())?),
        other => {
            return Err(WarmError::Config(format!(
                "unknown policy {other:?}: use one of {}, or module:Class for a Python policy",
                BUILTIN_NAMES.join(", ")
            )))
        }
    })
}

/// Every model file, whole, one stream each.
fn whole_model(ctx: &PolicyContext) -> Vec<Prefetch> {
    ctx.files
        .iter()
        .enumerate()
        .map(|(i, (path, size))| Prefetch {
            stream: i as u32,
            range: FileRange::new(path, 0, *size),
        })
        .collect()
}

/// The baseline: no prefetch, no eviction.
pub struct Native;

impl Policy for Native {
    fn name(&self) -> &str {
        "native"
    }

    fn needs_read_ranges(&self) -> bool {
        false
    }
}

/// Everything, at the first sign of a reader.
#[derive(Default)]
pub struct Eager {
    plan: Vec<Prefetch>,
    started: bool,
}

impl Policy for Eager {
    fn name(&self) -> &str {
        "eager"
    }

    fn needs_read_ranges(&self) -> bool {
        false
    }

    fn init(&mut self, ctx: &PolicyContext) -> Result<Vec<Prefetch>, WarmError> {
        self.plan = whole_model(ctx);
        Ok(Vec::new())
    }

    fn on_access(&mut self, _event: &AccessEvent) -> Result<Vec<Prefetch>, WarmError> {
        if self.started {
            return Ok(Vec::new());
        }
        self.started = true;
        Ok(std::mem::take(&mut self.plan))
    }
}

/// Everything, before the service starts.
pub struct Precache;

impl Policy for Precache {
    fn name(&self) -> &str {
        "precache"
    }

    fn needs_read_ranges(&self) -> bool {
        false
    }

    fn init(&mut self, ctx: &PolicyContext) -> Result<Vec<Prefetch>, WarmError> {
        Ok(whole_model(ctx))
    }

    fn wait_for_init(&self) -> bool {
        true
    }
}

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

struct Recording {
    recorder: Recorder,
    store: TemplateStore,
    /// Relative path → file index in the recorder.
    files: HashMap<PathBuf, u32>,
    /// (worker, file) → mapped range not yet covered by progress events.
    mapped: HashMap<(u32, u32), (u64, u64)>,
    /// (worker, file) → last progress offset.
    progress: HashMap<(u32, u32), u64>,
}

struct Replay {
    template: Template,
    /// Relative path → file index in the template.
    files: HashMap<PathBuf, u32>,
    workers: Vec<WorkerState>,
}

/// One worker's sequence and cursors, in bytes along the sequence.
struct WorkerState {
    worker: u32,
    /// Sequence offset where each range starts; one extra entry: the total.
    starts: Vec<u64>,
    /// Where the reader is (latest access).
    reader: u64,
    /// Everything before this was evicted (or judged evictable).
    evicted_to: u64,
    /// The range index the reader was last found in.
    at: usize,
    /// The reader position the last plan started from.
    planned_from: Option<u64>,
}

/// A worker's plan is renewed when its reader moved this far past the last
/// plan's start (or went back): between renewals the queued plan is still
/// right, and renewing it on every 128 KiB read would only cost time.
const REPLAN_BYTES: u64 = 16 << 20;

impl TemplatePolicy {
    pub fn new(config: BuiltinConfig) -> Result<TemplatePolicy, WarmError> {
        if config.service.is_none() {
            return Err(WarmError::Config(
                "the template policy needs a service id (--service)".into(),
            ));
        }
        if config.template_dir.is_none() {
            return Err(WarmError::Config(
                "the template policy needs a template directory".into(),
            ));
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

impl Policy for TemplatePolicy {
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
            return Err(WarmError::Config(
                "template policy without a service".into(),
            ));
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
                Ok(replay.burn(self.config.bar_distance, &self.model_dir))
            }
            _ => Ok(Vec::new()),
        }
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

impl Recording {
    fn record(&mut self, worker: u32, rel: &Path, event: &AccessEvent) {
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

impl Replay {
    fn new(template: Template) -> Replay {
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
    fn locate(&mut self, worker: u32, rel: &Path, event: &AccessEvent) -> Option<usize> {
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
    fn plan_from_reader(
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
    fn burn(&mut self, distance: u64, model_dir: &Path) -> Vec<FileRange> {
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
                return Err(WarmError::Config(format!(
                    "{}: {size} bytes now, {} when the template was recorded; \
                     record the service again",
                    path.display(),
                    f.size
                )))
            }
            None => {
                return Err(WarmError::Config(format!(
                    "{}: in the template but not in the model directory",
                    path.display()
                )))
            }
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn ctx(dir: &Path, files: &[(&str, u64)]) -> PolicyContext {
        PolicyContext {
            model_dir: dir.to_path_buf(),
            files: files.iter().map(|(n, s)| (dir.join(n), *s)).collect(),
            memory_limited: true,
        }
    }

    fn event(
        dir: &Path,
        pid: i32,
        file: &str,
        offset: u64,
        len: u64,
        kind: AccessKind,
    ) -> AccessEvent {
        AccessEvent {
            pid,
            worker: None,
            path: dir.join(file),
            offset,
            len,
            kind,
        }
    }

    fn config(store: &Path, spec: &str) -> BuiltinConfig {
        BuiltinConfig {
            service: Some(ServiceId::from_spec(spec)),
            spec: spec.into(),
            template_dir: Some(store.to_path_buf()),
            bar_distance: 4 * MIB,
            ..BuiltinConfig::default()
        }
    }

    /// Records two workers reading interleaved halves of two files in 1 MiB
    /// reads, then returns the store directory.
    fn record(dir: &Path, store: &Path, ctx: &PolicyContext) {
        let mut p = TemplatePolicy::new(config(store, "svc")).unwrap();
        assert!(p.init(ctx).unwrap().is_empty());
        assert!(p.is_recording());
        for file in ["a.safetensors", "b.safetensors"] {
            for pid in [100, 200] {
                // Worker 0 (pid 100, seen first) reads the first half.
                let base = if pid == 100 { 0 } else { 16 * MIB };
                for i in 0..16 {
                    let e = event(dir, pid, file, base + i * MIB, MIB, AccessKind::Read);
                    assert!(
                        p.on_access(&e).unwrap().is_empty(),
                        "recording prefetches nothing"
                    );
                }
            }
        }
        p.exit().unwrap();
    }

    #[test]
    fn with_room_for_the_model_each_file_of_a_worker_is_its_own_stream() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("templates");
        let files = [("a.safetensors", 32 * MIB), ("b.safetensors", 32 * MIB)];
        let mut c = ctx(dir.path(), &files);
        record(dir.path(), &store, &c);
        let t = TemplateStore::new(store.clone())
            .load(&ServiceId::from_spec("svc"))
            .unwrap()
            .unwrap();
        let index = |name: &str| t.files.iter().position(|f| f.path == name).unwrap() as u32;
        let (a, b) = (index("a.safetensors"), index("b.safetensors"));
        for per_file in [false, true] {
            let mut replay = Replay::new(t.clone());
            let e = event(
                dir.path(),
                1,
                "a.safetensors",
                16 * MIB,
                MIB,
                AccessKind::Read,
            );
            let state = replay.locate(1, Path::new("a.safetensors"), &e).unwrap();
            let plan = replay.plan_from_reader(state, dir.path(), Target::Any, per_file);
            let streams: Vec<(u32, String)> = plan
                .iter()
                .map(|p| {
                    let name = p.range.path.file_name().unwrap().to_string_lossy();
                    (p.stream, name.into_owned())
                })
                .collect();
            let want = match per_file {
                true => vec![
                    (per_file_stream(1, a), "a.safetensors".to_string()),
                    (per_file_stream(1, b), "b.safetensors".to_string()),
                ],
                false => vec![
                    (1, "a.safetensors".to_string()),
                    (1, "b.safetensors".to_string()),
                ],
            };
            assert_eq!(streams, want, "per_file {per_file}");
        }
        // Worker and file numbers never meet in one stream number.
        assert_ne!(per_file_stream(0, 1), per_file_stream(1, 0));
        assert_ne!(
            per_file_stream(1, 0),
            1,
            "worker 1's file 0 is not worker 1's plain stream"
        );
        // Under a memory limit a replay always keeps to its order.
        let mut p = TemplatePolicy::new(config(&store, "svc")).unwrap();
        p.init(&c).unwrap();
        assert!(!p.per_file);
        c.memory_limited = false;
        let mut p = TemplatePolicy::new(config(&store, "svc")).unwrap();
        p.init(&c).unwrap();
        assert_eq!(p.per_file, room_for_all(64 * MIB));
    }

    #[test]
    fn template_records_then_replays_each_workers_sequence_from_its_reader() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("templates");
        let files = [("a.safetensors", 32 * MIB), ("b.safetensors", 32 * MIB)];
        let c = ctx(dir.path(), &files);
        record(dir.path(), &store, &c);
        let saved = TemplateStore::new(store.clone())
            .load(&ServiceId::from_spec("svc"))
            .unwrap()
            .expect("template written at exit");
        assert_eq!(saved.workers.len(), 2);
        assert_eq!(
            saved.workers[0].ranges.len(),
            2,
            "1 MiB reads merged per file"
        );

        let mut p = TemplatePolicy::new(config(&store, "svc")).unwrap();
        p.init(&c).unwrap();
        assert!(!p.is_recording());
        // Worker 1 (the second pid seen) is 3 MiB into its half of a.
        let first = event(dir.path(), 300, "a.safetensors", 0, MIB, AccessKind::Read);
        let plan0 = p.on_access(&first).unwrap();
        assert_eq!(plan0[0].stream, 0);
        let e = event(
            dir.path(),
            400,
            "a.safetensors",
            19 * MIB,
            MIB,
            AccessKind::Read,
        );
        let plan = p.on_access(&e).unwrap();
        let got: Vec<(String, u64, u64)> = plan
            .iter()
            .map(|x| {
                let name = x
                    .range
                    .path
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                (name, x.range.offset / MIB, x.range.len / MIB)
            })
            .collect();
        assert_eq!(
            got,
            [
                ("a.safetensors".into(), 19, 13),
                ("b.safetensors".into(), 16, 16)
            ],
            "from the reader to the end of worker 1's sequence"
        );
        assert!(plan
            .iter()
            .all(|x| x.stream == 1 && x.range.target == Target::Accelerator(1)));
    }

    #[test]
    fn burn_after_reading_stays_behind_every_reader_and_spares_shared_data() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("templates");
        let c = ctx(
            dir.path(),
            &[("a.safetensors", 32 * MIB), ("b.safetensors", 32 * MIB)],
        );
        record(dir.path(), &store, &c);
        let mut p = TemplatePolicy::new(config(&store, "svc")).unwrap();
        p.init(&c).unwrap();
        let mut evicted: Vec<FileRange> = Vec::new();
        // Worker 0 walks its whole sequence: a[0,16), b[0,16).
        for (file, off) in (0..16)
            .map(|i| ("a.safetensors", i))
            .chain((0..16).map(|i| ("b.safetensors", i)))
        {
            let e = event(dir.path(), 1, file, off * MIB, MIB, AccessKind::Read);
            p.on_access(&e).unwrap();
            let reader_seq = if file == "a.safetensors" {
                off
            } else {
                16 + off
            } * MIB;
            for r in p.evict(Some(&e)).unwrap() {
                // Never at or ahead of the reader, and at least bar_distance behind.
                let r_seq = if r.path.ends_with("a.safetensors") {
                    r.offset
                } else {
                    16 * MIB + r.offset
                };
                assert!(
                    r_seq + r.len + 4 * MIB <= reader_seq,
                    "{r:?} vs reader {reader_seq}"
                );
                evicted.push(r);
            }
        }
        let total: u64 = evicted.iter().map(|r| r.len).sum();
        // The reader ends at 31 MiB (the start of the last read): all but the last
        // bar_distance before it.
        assert_eq!(total, 27 * MIB);
        // Worker 1 never read: its halves were never in worker 0's sequence, so
        // nothing of it was evicted.
        assert!(evicted.iter().all(|r| r.offset + r.len <= 16 * MIB));
    }

    #[test]
    fn eviction_spares_bytes_another_worker_still_needs() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("t");
        let c = ctx(dir.path(), &[("e.bin", 8 * MIB)]);
        // Both workers read the same shared file (an embedding) whole.
        let mut p = TemplatePolicy::new(config(&store, "shared")).unwrap();
        p.init(&c).unwrap();
        for pid in [1, 2] {
            for i in 0..8 {
                p.on_access(&event(
                    dir.path(),
                    pid,
                    "e.bin",
                    i * MIB,
                    MIB,
                    AccessKind::Read,
                ))
                .unwrap();
            }
        }
        p.exit().unwrap();
        let mut cfg = config(&store, "shared");
        cfg.bar_distance = MIB;
        let mut p = TemplatePolicy::new(cfg).unwrap();
        p.init(&c).unwrap();
        // Worker 0 finishes; worker 1 is at 2 MiB.
        p.on_access(&event(
            dir.path(),
            10,
            "e.bin",
            7 * MIB,
            MIB,
            AccessKind::Read,
        ))
        .unwrap();
        p.on_access(&event(
            dir.path(),
            11,
            "e.bin",
            2 * MIB,
            MIB,
            AccessKind::Read,
        ))
        .unwrap();
        let ev = p.evict(None).unwrap();
        // Worker 0 may burn [0, 6 MiB) but worker 1 still needs [2, 8): only [0, 2) goes;
        // worker 1's own limit is 1 MiB and [0, 1) is already in.
        let got: Vec<(u64, u64)> = ev.iter().map(|r| (r.offset / MIB, r.end() / MIB)).collect();
        assert_eq!(got, [(0, 2)]);
    }

    #[test]
    fn a_changed_model_refuses_replay_and_unknown_names_are_listed() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("templates");
        let c = ctx(
            dir.path(),
            &[("a.safetensors", 32 * MIB), ("b.safetensors", 32 * MIB)],
        );
        record(dir.path(), &store, &c);
        let grown = ctx(
            dir.path(),
            &[("a.safetensors", 33 * MIB), ("b.safetensors", 32 * MIB)],
        );
        let mut p = TemplatePolicy::new(config(&store, "svc")).unwrap();
        let err = p.init(&grown).unwrap_err().to_string();
        assert!(
            err.contains("a.safetensors") && err.contains("record"),
            "{err}"
        );
        let gone = ctx(dir.path(), &[("a.safetensors", 32 * MIB)]);
        let err = TemplatePolicy::new(config(&store, "svc"))
            .unwrap()
            .init(&gone)
            .unwrap_err();
        assert!(err.to_string().contains("b.safetensors"), "{err}");
        let err = by_name("lru", &BuiltinConfig::default())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("native, eager, precache, template"), "{err}");
        assert!(
            by_name("template", &BuiltinConfig::default()).is_err(),
            "needs a service"
        );
    }

    #[test]
    fn eager_prefetches_everything_once_and_precache_at_init() {
        let dir = tempfile::tempdir().unwrap();
        let c = ctx(dir.path(), &[("a", 10), ("b", 20)]);
        let mut eager = by_name("eager", &BuiltinConfig::default()).unwrap();
        assert!(eager.init(&c).unwrap().is_empty());
        let e = event(dir.path(), 1, "a", 0, 1, AccessKind::Open);
        let plan = eager.on_access(&e).unwrap();
        assert_eq!(plan.len(), 2);
        assert_eq!((plan[1].stream, plan[1].range.len), (1, 20));
        assert!(eager.on_access(&e).unwrap().is_empty());
        assert!(eager.evict(None).unwrap().is_empty());
        let mut pre = by_name("precache", &BuiltinConfig::default()).unwrap();
        assert!(pre.wait_for_init());
        assert_eq!(pre.init(&c).unwrap().len(), 2);
        let mut native = by_name("native", &BuiltinConfig::default()).unwrap();
        assert!(native.on_access(&e).unwrap().is_empty());
    }

    #[test]
    fn mmap_recordings_follow_progress_samples() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("t");
        let c = ctx(dir.path(), &[("m.bin", 64 * MIB)]);
        let mut p = TemplatePolicy::new(config(&store, "mmap")).unwrap();
        p.init(&c).unwrap();
        p.on_access(&event(
            dir.path(),
            5,
            "m.bin",
            0,
            64 * MIB,
            AccessKind::Mmap,
        ))
        .unwrap();
        for at in [8, 16, 40] {
            p.on_access(&event(
                dir.path(),
                5,
                "m.bin",
                at * MIB,
                0,
                AccessKind::Progress,
            ))
            .unwrap();
        }
        p.exit().unwrap();
        let t = TemplateStore::new(store)
            .load(&ServiceId::from_spec("mmap"))
            .unwrap()
            .unwrap();
        let r: Vec<(u64, u64)> = t.workers[0]
            .ranges
            .iter()
            .map(|r| (r.offset / MIB, r.len / MIB))
            .collect();
        // 0..40 from progress, then the unsampled tail 40..64 from the mapping.
        assert_eq!(r, [(0, 64)]);
    }
}
