//! The template policy alone: recording, replay from each reader, burn
//! after reading, a changed model.

use std::path::Path;

use super::*;
use crate::builtin::by_name;
use crate::builtin::test_support::{ctx, event, MIB};
use crate::policy::AccessKind;
use crate::template::{ServiceId, TemplateStore};

fn config(store: &Path, spec: &str) -> BuiltinConfig {
    BuiltinConfig {
        service: Some(ServiceId::from_spec(spec)),
        spec: spec.into(),
        template_dir: Some(store.to_path_buf()),
        bar_distance_bytes: 4 * MIB,
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
            // Never at or ahead of the reader, and at least bar_distance_bytes behind.
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
    // bar_distance_bytes before it.
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
    cfg.bar_distance_bytes = MIB;
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

#[test]
fn a_discarded_recording_writes_no_template() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("t");
    let c = ctx(dir.path(), &[("m.bin", 8 * MIB)]);
    for discard in [true, false] {
        let mut p = TemplatePolicy::new(config(&store, "failed")).unwrap();
        p.init(&c).unwrap();
        p.on_access(&event(dir.path(), 5, "m.bin", 0, MIB, AccessKind::Read))
            .unwrap();
        if discard {
            p.discard().unwrap();
        }
        p.exit().unwrap();
        let saved = TemplateStore::new(store.clone())
            .load(&ServiceId::from_spec("failed"))
            .unwrap();
        assert_eq!(saved.is_some(), !discard, "discard {discard}");
    }
}
