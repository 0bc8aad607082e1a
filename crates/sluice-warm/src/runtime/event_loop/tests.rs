//! The loop over an in-memory page cache and scripted events: no root, no
//! sleeps, no processes.

use std::path::{Path, PathBuf};

use super::*;
use crate::builtin::{BuiltinConfig, Eager, TemplatePolicy};
use crate::idle_gate::IdleGate;
use crate::manager::tests::FakeCache;
use crate::manager::ManagerConfig;
use crate::policy::{AccessKind, FileRange, Guarded, Prefetch, WarmPolicy};
use crate::runtime::MemoryEvents;
use crate::template::{ServiceId, TemplateStore};

const MIB: u64 = 1 << 20;

/// A model of two sparse files, a (64 MiB) and b (32 MiB): sizes past the
/// template policy's 16 MiB re-plan distance, with no bytes on disk.
fn model(dir: &Path) -> (PathBuf, Vec<(PathBuf, u64)>) {
    let m = dir.join("model");
    std::fs::create_dir(&m).unwrap();
    let mut files = Vec::new();
    for (name, len) in [("a.safetensors", 64 * MIB), ("b.safetensors", 32 * MIB)] {
        let path = m.join(name);
        std::fs::File::create(&path).unwrap().set_len(len).unwrap();
        files.push((path, len));
    }
    (m, files)
}

fn read(path: &Path, offset: u64, len: u64) -> AccessEvent {
    AccessEvent {
        pid: 0,
        worker: Some(0),
        path: path.to_path_buf(),
        offset,
        len,
        kind: AccessKind::Read,
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    model: PathBuf,
    files: Vec<(PathBuf, u64)>,
    templates: PathBuf,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let (model, files) = model(dir.path());
        let templates = dir.path().join("templates");
        Setup {
            _dir: dir,
            model,
            files,
            templates,
        }
    }

    fn a(&self) -> PathBuf {
        self.files[0].0.clone()
    }

    fn b(&self) -> PathBuf {
        self.files[1].0.clone()
    }

    fn ctx(&self, memory_limited: bool) -> PolicyContext {
        PolicyContext {
            model_dir: self.model.clone(),
            files: self.files.clone(),
            memory_limited,
        }
    }

    fn template_config(&self, record: bool) -> BuiltinConfig {
        BuiltinConfig {
            service: Some(ServiceId::from_spec("loop-test")),
            template_dir: Some(self.templates.clone()),
            record,
            bar_distance_bytes: 4 * MIB,
            ..BuiltinConfig::default()
        }
    }

    /// A runtime over `cache` with `policy`, fed by the returned script.
    fn runtime(
        &self,
        policy: Box<dyn WarmPolicy>,
        cache: FakeCache,
        chunks_per_turn: usize,
    ) -> (Runtime<FakeCache>, MemoryEvents) {
        let manager = Manager::new(
            Guarded::new(policy),
            cache,
            ManagerConfig {
                chunk_bytes: MIB,
                watermark: 0.8,
                memory_check_bytes: MIB,
            },
        );
        let config = RuntimeConfig {
            chunks_per_turn,
            ..RuntimeConfig::default()
        };
        let events = MemoryEvents::new();
        let runtime = Runtime::new(manager, ModelNames::new(&self.files), config)
            .with_source(Box::new(events.handle()));
        (runtime, events)
    }

    /// Records worker 0 reading a then b in 1 MiB reads.
    fn record(&self) {
        let policy = TemplatePolicy::new(self.template_config(true)).unwrap();
        let (mut rt, events) = self.runtime(Box::new(policy), FakeCache::default(), 4);
        rt.start(&self.ctx(true));
        for (path, len) in &self.files {
            for at in (0..*len).step_by(MIB as usize) {
                events.push(vec![read(path, at, MIB)]);
            }
        }
        while events.pending() > 0 {
            rt.turn();
        }
        rt.finish();
        assert!(
            rt.manager().cache().prefetches.is_empty(),
            "recording prefetches nothing"
        );
    }

    fn replay(
        &self,
        cache: FakeCache,
        chunks_per_turn: usize,
    ) -> (Runtime<FakeCache>, MemoryEvents) {
        let policy = TemplatePolicy::new(self.template_config(false)).unwrap();
        let (mut rt, events) = self.runtime(Box::new(policy), cache, chunks_per_turn);
        rt.start(&self.ctx(true));
        (rt, events)
    }
}

/// Turns until nothing is queued (bounded: a loop bug fails, not hangs).
fn settle(rt: &mut Runtime<FakeCache>) {
    for _ in 0..10_000 {
        if !rt.manager().has_pending() {
            return;
        }
        rt.turn();
    }
    panic!("still {} bytes pending", rt.manager().pending_bytes());
}

#[test]
fn a_recording_replays_the_sequence_ahead_of_the_reader() {
    let s = Setup::new();
    s.record();
    let store = TemplateStore::new(s.templates.clone());
    let template = store
        .load(&ServiceId::from_spec("loop-test"))
        .unwrap()
        .expect("the recording wrote a template");
    assert_eq!(template.total_bytes(), 96 * MIB);

    let (mut rt, events) = s.replay(FakeCache::default(), 4);
    events.push(vec![read(&s.a(), 0, MIB)]);
    rt.turn();
    settle(&mut rt);
    let stats = rt.manager().stats().clone();
    assert_eq!(stats.prefetched_bytes, 96 * MIB, "{stats:?}");
    // In sequence order: all of a, then all of b, no byte twice.
    let fetched = &rt.manager().cache().prefetches;
    let last_a = fetched.iter().rposition(|r| r.path == s.a()).unwrap();
    let first_b = fetched.iter().position(|r| r.path == s.b()).unwrap();
    assert!(last_a < first_b, "a before b: {fetched:?}");
    assert_eq!(fetched.first().map(|r| r.offset), Some(0));
    assert!(fetched.iter().all(|r| r.len <= MIB), "chunked to 1 MiB");
}

#[test]
fn a_reader_jump_drops_the_rest_of_the_stale_plan() {
    let s = Setup::new();
    s.record();
    let (mut rt, events) = s.replay(FakeCache::default(), 1);
    events.push(vec![read(&s.a(), 0, MIB)]);
    rt.turn();
    assert_eq!(
        rt.manager().stats().prefetched_bytes,
        MIB,
        "one chunk a turn"
    );
    // The reader skips the rest of a: the plan starts over at b.
    events.push(vec![read(&s.b(), 0, MIB)]);
    rt.turn();
    settle(&mut rt);
    let stats = rt.manager().stats().clone();
    assert_eq!(stats.superseded_bytes, 63 * MIB, "{stats:?}");
    let fetched = &rt.manager().cache().prefetches;
    assert!(fetched[1..].iter().all(|r| r.path == s.b()), "{fetched:?}");
    assert_eq!(stats.prefetched_bytes, MIB + 32 * MIB, "{stats:?}");
}

#[test]
fn burn_after_reading_evicts_only_what_the_reader_passed() {
    let s = Setup::new();
    s.record();
    // 24 MiB of memory: the 0.8 watermark is met after about 19 MiB.
    let cache = FakeCache {
        limit: 24 * MIB,
        ..FakeCache::default()
    };
    let (mut rt, events) = s.replay(cache, 4);
    events.push(vec![read(&s.a(), 0, MIB)]);
    for _ in 0..100 {
        rt.turn();
    }
    let paused = rt.manager().stats().clone();
    assert!(rt.manager().is_paused(), "{paused:?}");
    assert!(
        paused.pauses >= 1 && paused.evicted_bytes == 0,
        "nothing read yet: {paused:?}"
    );
    // The reader moves through a: what lies more than the 4 MiB bar
    // distance behind it goes, and prefetch resumes.
    for at in [8, 16, 24, 32] {
        events.push(vec![read(&s.a(), at * MIB, MIB)]);
        rt.turn();
    }
    let stats = rt.manager().stats().clone();
    let evicted = &rt.manager().cache().evictions;
    assert!(stats.evicted_bytes > 0, "{stats:?}");
    assert!(
        evicted
            .iter()
            .all(|r| r.path == s.a() && r.end() <= 28 * MIB),
        "only behind the reader, minus the bar distance: {evicted:?}"
    );
    assert!(
        stats.prefetched_bytes > paused.prefetched_bytes,
        "{stats:?}"
    );
    let resident = rt.manager().cache().resident_bytes();
    assert!(resident <= 24 * MIB, "{resident} bytes over the limit");
}

/// Fails on the second event it sees.
struct FailsOnSecond {
    calls: u32,
}

impl WarmPolicy for FailsOnSecond {
    fn name(&self) -> &str {
        "fails-on-second"
    }

    fn on_access(&mut self, event: &AccessEvent) -> Result<Vec<Prefetch>, WarmError> {
        self.calls += 1;
        if self.calls == 2 {
            return Err(WarmError::Policy {
                name: "fails-on-second".into(),
                message: "lost its state".into(),
            });
        }
        Ok(vec![Prefetch {
            stream: 0,
            range: FileRange::new(&event.path, event.offset + event.len, MIB),
        }])
    }
}

/// A service that ends with `code` after `turns` looks.
struct Scripted {
    turns: u32,
    code: i32,
    stopped: bool,
}

impl Service for Scripted {
    fn pid(&self) -> i32 {
        0
    }

    fn try_exit(&mut self) -> Result<Option<ServiceExit>, WarmError> {
        self.turns = self.turns.saturating_sub(1);
        Ok((self.turns == 0).then_some(ServiceExit::Code(self.code)))
    }

    fn signal(&mut self, _: i32) {
        self.stopped = true;
    }
}

#[test]
fn a_failing_policy_is_disabled_and_the_run_goes_on_to_the_service_exit() {
    let s = Setup::new();
    let (mut rt, events) = s.runtime(
        Box::new(FailsOnSecond { calls: 0 }),
        FakeCache::default(),
        4,
    );
    rt.start(&s.ctx(false));
    for at in 0..4 {
        events.push(vec![read(&s.a(), at * MIB, MIB)]);
    }
    let mut service = Scripted {
        turns: 20,
        code: 3,
        stopped: false,
    };
    let stop = StopRequest::new();
    let exit = rt.run(Some(&mut service), &stop, &mut |_| {}).unwrap();
    rt.finish();
    assert_eq!(exit, Some(ServiceExit::Code(3)), "the service's own exit");
    let fault = rt
        .manager()
        .policy()
        .fault()
        .unwrap_or_default()
        .to_string();
    assert!(fault.contains("lost its state"), "{fault}");
    let stats = rt.manager().stats();
    assert_eq!(stats.events, 4, "every event still counted: {stats:?}");
    assert_eq!(
        stats.prefetched_bytes, MIB,
        "only the first answer: {stats:?}"
    );
    assert_eq!(events.observed().len(), 4);
}

#[test]
fn a_vanished_file_is_a_counted_error_and_the_rest_is_prefetched() {
    let s = Setup::new();
    let cache = FakeCache {
        fail_prefetch_on: Some(s.b()),
        ..FakeCache::default()
    };
    let (mut rt, events) = s.runtime(Box::new(Eager::default()), cache, 4);
    rt.start(&s.ctx(false));
    events.push(vec![read(&s.a(), 0, MIB)]);
    rt.turn();
    settle(&mut rt);
    let stats = rt.manager().stats().clone();
    assert_eq!(
        stats.prefetch_errors, 32,
        "each 1 MiB chunk of b: {stats:?}"
    );
    assert_eq!(stats.prefetched_bytes, 64 * MIB, "all of a: {stats:?}");
}

#[test]
fn a_stop_request_ends_the_loop_and_leaves_the_service_to_the_shutdown() {
    let s = Setup::new();
    let (mut rt, _events) = s.runtime(Box::new(Eager::default()), FakeCache::default(), 4);
    rt.start(&s.ctx(false));
    let stop = StopRequest::new();
    stop.request(libc::SIGTERM, false);
    let mut service = Scripted {
        turns: 1000,
        code: 0,
        stopped: false,
    };
    assert_eq!(
        rt.run(Some(&mut service), &stop, &mut |_| {}).unwrap(),
        None
    );
    assert!(!service.stopped, "signalling it is the shutdown's job");
    assert_eq!(rt.run(None, &stop, &mut |_| {}).unwrap(), None);
}

/// Asks for all of a at init, as a replay from launch does.
struct AtInit;

impl WarmPolicy for AtInit {
    fn name(&self) -> &str {
        "at-init"
    }

    fn init(&mut self, ctx: &PolicyContext) -> Result<Vec<Prefetch>, WarmError> {
        let (path, len) = &ctx.files[0];
        Ok(vec![Prefetch {
            stream: 0,
            range: FileRange::new(path, 0, *len),
        }])
    }
}

/// A service whose start-up reads never stop.
struct AlwaysReading(u64);

impl ServiceIo for AlwaysReading {
    fn read_bytes(&mut self) -> Option<u64> {
        self.0 += 4096;
        Some(self.0)
    }
}

#[test]
fn launch_prefetch_waits_for_the_gate_until_the_first_model_access() {
    let s = Setup::new();
    let (rt, events) = s.runtime(Box::new(AtInit), FakeCache::default(), 4);
    let gate: IdleGate<Box<dyn ServiceIo>> = IdleGate::new(
        Box::new(AlwaysReading(0)),
        std::time::Duration::from_secs(3600),
        std::time::Instant::now(),
    );
    let mut rt = rt.with_gate(gate);
    rt.start(&s.ctx(false));
    for _ in 0..50 {
        rt.turn();
    }
    assert_eq!(
        rt.manager().stats().prefetched_bytes,
        0,
        "held while the service reads"
    );
    // The service touches its model: the gate is gone.
    events.push(vec![read(&s.b(), 0, 4096)]);
    rt.turn();
    settle(&mut rt);
    assert_eq!(rt.manager().stats().prefetched_bytes, 64 * MIB);
}

#[test]
fn events_reach_the_policy_under_their_model_names_and_every_source_sees_them() {
    let dir = tempfile::tempdir().unwrap();
    let blobs = dir.path().join("blobs");
    let snap = dir.path().join("snap");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::File::create(blobs.join("x"))
        .unwrap()
        .set_len(4 * MIB)
        .unwrap();
    std::os::unix::fs::symlink(blobs.join("x"), snap.join("a.safetensors")).unwrap();
    let files = vec![(snap.join("a.safetensors"), 4 * MIB)];
    let manager = Manager::new(
        Guarded::new(Box::new(Eager::default())),
        FakeCache::default(),
        ManagerConfig::default(),
    );
    let events = MemoryEvents::new();
    let second = MemoryEvents::new();
    let mut rt = Runtime::new(manager, ModelNames::new(&files), RuntimeConfig::default())
        .with_source(Box::new(events.handle()))
        .with_source(Box::new(second.handle()));
    rt.start(&PolicyContext {
        model_dir: snap.clone(),
        files: files.clone(),
        memory_limited: false,
    });
    // The kernel names the blob; the policy and the samplers see the
    // model's name and the blob's.
    let real = blobs.join("x").canonicalize().unwrap();
    events.push(vec![read(&real, 0, 4096)]);
    rt.turn();
    for seen in [events.observed(), second.observed()] {
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].path, snap.join("a.safetensors"));
    }
    settle(&mut rt);
    let fetched = &rt.manager().cache().prefetches;
    assert!(
        fetched.iter().all(|r| r.path == snap.join("a.safetensors")),
        "{fetched:?}"
    );
}
