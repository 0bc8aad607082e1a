//! The loader returns every selected tensor's exact bytes, under every
//! engine and direct mode, and fails whole on bad input or faults.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::*;
use sluice_engine::{
    DirectMode, EngineChoice, Fault, FaultyEngine, IoEngine, SyncEngine, ThreadEngine, UringEngine,
};
use sluice_load::{LoadConfig, LoadError, Loader};

fn small_windows() -> LoadConfig {
    // Small chunks and windows so that a test-sized checkpoint still spans
    // many windows and many reads per window. Test files are freshly written
    // and so cached; mapping them would skip the reads these tests are about.
    LoadConfig {
        chunk_bytes: 64 << 10,
        window_bytes: 256 << 10,
        map_cached: false,
        ..LoadConfig::default()
    }
}

fn mapping_allowed() -> LoadConfig {
    LoadConfig {
        map_cached: true,
        ..small_windows()
    }
}

fn collect(
    loader: &Loader,
    names: Option<&[String]>,
) -> Result<HashMap<String, Vec<u8>>, LoadError> {
    let loaded = loader.load_all(names)?;
    let mut out = HashMap::new();
    for w in &loaded.windows {
        for t in &w.tensors {
            assert!(
                out.insert(t.name.clone(), w.tensor_bytes(t).to_vec())
                    .is_none(),
                "{} twice",
                t.name
            );
        }
    }
    Ok(out)
}

fn assert_same(got: &HashMap<String, Vec<u8>>, expected: &[TestTensor]) {
    assert_eq!(got.len(), expected.len());
    for t in expected {
        assert!(got[&t.name] == t.bytes, "bytes differ for {}", t.name);
    }
}

fn engines() -> Vec<Arc<dyn IoEngine>> {
    let mut all: Vec<Arc<dyn IoEngine>> =
        vec![Arc::new(SyncEngine), Arc::new(ThreadEngine::new(4))];
    if sluice_engine::probe_io_uring().is_ok() {
        all.push(Arc::new(UringEngine::new(16)));
    }
    all
}

#[test]
fn single_file_loads_bit_identical_with_every_engine_and_mode() {
    let dir = tempdir();
    let tensors = tensors(23, 1);
    let path = write_file(&dir.path().join("m.safetensors"), &tensors);
    for engine in engines() {
        for direct in [DirectMode::Off, DirectMode::Auto, DirectMode::On] {
            let cfg = LoadConfig {
                direct,
                ..small_windows()
            };
            let loader = Loader::open(&path, cfg)
                .unwrap()
                .with_engine(Arc::clone(&engine));
            assert_same(&collect(&loader, None).unwrap(), &tensors);
        }
    }
}

#[test]
fn sharded_index_and_bare_directory_load_the_same_tensors() {
    let dir = tempdir();
    let tensors = tensors(31, 2);
    let index = write_sharded(dir.path(), &tensors, 4);
    let by_index = collect(&Loader::open(&index, small_windows()).unwrap(), None).unwrap();
    assert_same(&by_index, &tensors);
    let by_dir = collect(&Loader::open(dir.path(), small_windows()).unwrap(), None).unwrap();
    assert_same(&by_dir, &tensors);
    std::fs::remove_file(&index).unwrap();
    let bare = collect(&Loader::open(dir.path(), small_windows()).unwrap(), None).unwrap();
    assert_same(&bare, &tensors);
}

#[test]
fn name_filter_loads_only_the_named_tensors() {
    let dir = tempdir();
    let tensors = tensors(20, 3);
    let index = write_sharded(dir.path(), &tensors, 3);
    let wanted: Vec<String> = tensors.iter().step_by(3).map(|t| t.name.clone()).collect();
    let got = collect(
        &Loader::open(&index, small_windows()).unwrap(),
        Some(&wanted),
    )
    .unwrap();
    let expected: Vec<TestTensor> = tensors.into_iter().step_by(3).collect();
    assert_same(&got, &expected);
}

#[test]
fn unknown_tensor_name_is_an_error_naming_it() {
    let dir = tempdir();
    let path = write_file(&dir.path().join("m.safetensors"), &tensors(4, 4));
    let loader = Loader::open(&path, small_windows()).unwrap();
    let err = collect(&loader, Some(&["no.such.weight".to_string()])).unwrap_err();
    assert!(matches!(err, LoadError::UnknownTensor { .. }));
    assert!(err.to_string().contains("no.such.weight"), "{err}");
}

#[test]
fn missing_shard_file_is_named() {
    let dir = tempdir();
    let index = write_sharded(dir.path(), &tensors(12, 5), 3);
    let victim = dir.path().join("model-00002-of-00003.safetensors");
    std::fs::remove_file(&victim).unwrap();
    let err = Loader::open(&index, small_windows()).err().unwrap();
    assert!(err.is_not_found());
    assert!(
        err.to_string().contains("model-00002-of-00003.safetensors"),
        "{err}"
    );
}

#[test]
fn missing_path_and_empty_directory_are_errors() {
    let dir = tempdir();
    let err = Loader::open(&dir.path().join("nope.safetensors"), LoadConfig::default())
        .err()
        .unwrap();
    assert!(err.is_not_found(), "{err}");
    let err = Loader::open(dir.path(), LoadConfig::default())
        .err()
        .unwrap();
    assert!(matches!(err, LoadError::NoShards { .. }), "{err}");
}

#[test]
fn failed_read_fails_the_whole_load_naming_the_file() {
    let dir = tempdir();
    let path = write_file(&dir.path().join("m.safetensors"), &tensors(23, 6));
    let engine = Arc::new(FaultyEngine::new(vec![Fault::FailWith {
        op: 3,
        errno: libc::EIO,
    }]));
    let loader = Loader::open(&path, small_windows())
        .unwrap()
        .with_engine(engine);
    let err = loader.load_all(None).err().unwrap();
    assert!(matches!(err, LoadError::Read { .. }), "{err}");
    assert!(err.to_string().contains("m.safetensors"), "{err}");
}

#[test]
fn short_read_is_reported_as_truncation() {
    let dir = tempdir();
    let path = write_file(&dir.path().join("m.safetensors"), &tensors(23, 7));
    let engine = Arc::new(FaultyEngine::new(vec![Fault::ShortRead { op: 0 }]));
    let loader = Loader::open(&path, small_windows())
        .unwrap()
        .with_engine(engine);
    let err = loader.load_all(None).err().unwrap();
    assert!(matches!(err, LoadError::Truncated { .. }), "{err}");
}

#[test]
fn file_truncated_after_open_is_an_error_not_short_data() {
    let dir = tempdir();
    let path = write_file(&dir.path().join("m.safetensors"), &tensors(23, 8));
    let loader = Loader::open(
        &path,
        LoadConfig {
            direct: DirectMode::Off,
            ..small_windows()
        },
    )
    .unwrap();
    halve(&path);
    let err = loader.load_all(None).err().unwrap();
    assert!(matches!(err, LoadError::Truncated { .. }), "{err}");
}

#[test]
fn stream_respects_its_memory_limit_by_pool_accounting() {
    let dir = tempdir();
    let tensors = tensors(60, 9);
    let path = write_file(&dir.path().join("m.safetensors"), &tensors);
    let limit = 2 << 20;
    let cfg = LoadConfig {
        memory_limit: Some(limit),
        ..small_windows()
    };
    let loader = Loader::open(&path, cfg).unwrap();
    let (mut stream, stats) = loader.stream(None).unwrap();
    assert!(
        stats.windows > 4,
        "the test needs several windows, got {}",
        stats.windows
    );
    let mut got = HashMap::new();
    while let Some(window) = stream.next_window() {
        let window = window.unwrap();
        for t in &window.tensors {
            got.insert(t.name.clone(), window.tensor_bytes(t).to_vec());
        }
        assert!(stream.pool().stats().mapped_bytes <= limit);
    }
    let pool = stream.pool().stats();
    assert!(
        pool.peak_mapped_bytes <= limit,
        "peak {} > limit {limit}",
        pool.peak_mapped_bytes
    );
    assert!(
        pool.reused > 0,
        "a long stream should recycle buffers: {pool:?}"
    );
    assert_same(&got, &tensors);
}

#[test]
fn stream_holding_every_window_errors_instead_of_hanging() {
    let dir = tempdir();
    let path = write_file(&dir.path().join("m.safetensors"), &tensors(60, 10));
    let cfg = LoadConfig {
        memory_limit: Some(2 << 20),
        ..small_windows()
    };
    let loader = Loader::open(&path, cfg).unwrap();
    let (mut stream, _) = loader.stream(None).unwrap();
    let mut held = Vec::new();
    let err = loop {
        match stream.next_window() {
            Some(Ok(w)) => held.push(w),
            Some(Err(e)) => break e,
            None => panic!("the stream cannot finish while every window is held"),
        }
    };
    assert!(
        matches!(err, LoadError::MemoryLimitExhausted { .. }),
        "{err}"
    );
    assert!(
        stream.next_window().is_none(),
        "the stream ends after the error"
    );
}

#[test]
fn tensor_larger_than_the_memory_limit_is_refused_up_front() {
    let dir = tempdir();
    let path = write_file(&dir.path().join("m.safetensors"), &tensors(5, 11));
    let cfg = LoadConfig {
        memory_limit: Some(64 << 10),
        ..small_windows()
    };
    let err = Loader::open(&path, cfg)
        .unwrap()
        .stream(None)
        .err()
        .unwrap();
    assert!(
        matches!(err, LoadError::TensorExceedsMemoryLimit { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("layer.3.weight"), "{err}");
}

#[test]
fn dropping_a_stream_midway_stops_cleanly() {
    let dir = tempdir();
    let path = write_file(&dir.path().join("m.safetensors"), &tensors(60, 12));
    let cfg = LoadConfig {
        memory_limit: Some(2 << 20),
        ..small_windows()
    };
    let loader = Loader::open(&path, cfg).unwrap();
    let (mut stream, _) = loader.stream(None).unwrap();
    let first = stream.next_window().unwrap().unwrap();
    drop(stream);
    assert!(!first.tensors.is_empty());
}

#[test]
fn thread_engine_choice_is_honoured() {
    let dir = tempdir();
    let tensors = tensors(10, 13);
    let path = write_file(&dir.path().join("m.safetensors"), &tensors);
    let cfg = LoadConfig {
        engine: EngineChoice::Threads,
        ..small_windows()
    };
    let loaded = Loader::open(&path, cfg).unwrap().load_all(None).unwrap();
    assert_eq!(loaded.stats.engine, "threads");
}

#[test]
fn drop_cache_evicts_what_a_buffered_load_read() {
    let dir = tempdir();
    let path = write_file(&dir.path().join("m.safetensors"), &tensors(40, 14));
    let file = std::fs::File::open(&path).unwrap();
    // Dirty pages cannot be dropped; a model on disk is clean, so match that.
    file.sync_all().unwrap();
    let len = file.metadata().unwrap().len();
    let Some(before) = sluice_engine::page_cache::cached_fraction(&file, len) else {
        eprintln!("no cachestat; skipping");
        return;
    };
    assert!(before > 0.5);
    let cfg = LoadConfig {
        direct: DirectMode::Off,
        drop_cache: true,
        ..small_windows()
    };
    Loader::open(&path, cfg).unwrap().load_all(None).unwrap();
    let after = sluice_engine::page_cache::cached_fraction(&file, len).unwrap();
    assert!(
        after < 0.2,
        "cached fraction after drop_cache load: {after}"
    );
}

#[test]
fn cached_windows_are_mapped_not_read_and_bit_identical() {
    let dir = tempdir();
    let tensors = tensors(23, 15);
    let path = write_file(&dir.path().join("m.safetensors"), &tensors);
    let _ = std::fs::read(&path).unwrap();
    let loader = Loader::open(&path, mapping_allowed()).unwrap();
    let (mut stream, _) = loader.stream_unbounded(None).unwrap();
    let mut got = HashMap::new();
    let mut mapped_windows = 0;
    while let Some(w) = stream.next_window() {
        let w = w.unwrap();
        mapped_windows += usize::from(w.buf.as_ref().is_some_and(|b| b.is_mapped()));
        for t in &w.tensors {
            got.insert(t.name.clone(), w.tensor_bytes(t).to_vec());
        }
    }
    let file = std::fs::File::open(&path).unwrap();
    if sluice_engine::page_cache::cached_fraction(&file, 1).is_none() {
        eprintln!("no cachestat here; mapping is never chosen");
        return;
    }
    assert!(mapped_windows > 0);
    assert_eq!(stream.bytes_read(), 0, "a fully cached file needs no reads");
    assert_same(&got, &tensors);
}

#[test]
fn mapped_stream_stays_within_its_memory_limit() {
    let dir = tempdir();
    let tensors = tensors(60, 16);
    let path = write_file(&dir.path().join("m.safetensors"), &tensors);
    let limit = 2 << 20;
    let cfg = LoadConfig {
        memory_limit: Some(limit),
        ..mapping_allowed()
    };
    let loader = Loader::open(&path, cfg).unwrap();
    let (mut stream, _) = loader.stream(None).unwrap();
    let mut got = HashMap::new();
    while let Some(w) = stream.next_window() {
        let w = w.unwrap();
        for t in &w.tensors {
            got.insert(t.name.clone(), w.tensor_bytes(t).to_vec());
        }
    }
    assert!(stream.pool().stats().peak_mapped_bytes <= limit);
    assert_same(&got, &tensors);
}

#[test]
fn file_truncated_before_mapping_is_an_error() {
    let dir = tempdir();
    let path = write_file(&dir.path().join("m.safetensors"), &tensors(23, 17));
    let loader = Loader::open(&path, mapping_allowed()).unwrap();
    halve(&path);
    let err = loader.load_all(None).err().unwrap();
    assert!(matches!(err, LoadError::Truncated { .. }), "{err}");
}

/// Writes tensors to a file and evicts it from the page cache.
fn write_cold(dir: &std::path::Path, tensors: &[TestTensor]) -> std::path::PathBuf {
    let path = write_file(&dir.join("cold.safetensors"), tensors);
    let file = std::fs::File::open(&path).unwrap();
    file.sync_all().unwrap();
    sluice_engine::page_cache::drop_range(std::os::fd::AsRawFd::as_raw_fd(&file), 0, 0);
    path
}

#[test]
fn buffered_windows_are_staged_through_the_cache_then_mapped() {
    let dir = tempdir();
    let tensors = tensors(40, 18);
    let path = write_cold(dir.path(), &tensors);
    let cfg = LoadConfig {
        direct: DirectMode::Off,
        ..mapping_allowed()
    };
    let loader = Loader::open(&path, cfg).unwrap();
    let (mut stream, _) = loader.stream_unbounded(None).unwrap();
    let mut got = HashMap::new();
    while let Some(w) = stream.next_window() {
        let w = w.unwrap();
        assert!(
            w.buf.as_ref().is_none_or(|b| b.is_mapped()),
            "buffered windows end up mapped"
        );
        for t in &w.tensors {
            got.insert(t.name.clone(), w.tensor_bytes(t).to_vec());
        }
    }
    assert!(stream.mapped_bytes() > 0);
    assert_same(&got, &tensors);
}

#[test]
fn staged_reads_that_fail_or_come_back_short_fail_the_load() {
    let dir = tempdir();
    let tensors = tensors(40, 19);
    for (fault, is_expected) in [
        (
            Fault::FailWith {
                op: 2,
                errno: libc::EIO,
            },
            (|e| matches!(e, LoadError::Read { .. })) as fn(&LoadError) -> bool,
        ),
        (Fault::ShortRead { op: 1 }, |e| {
            matches!(e, LoadError::Truncated { .. })
        }),
    ] {
        let path = write_cold(dir.path(), &tensors);
        let cfg = LoadConfig {
            direct: DirectMode::Off,
            ..mapping_allowed()
        };
        let engine = Arc::new(FaultyEngine::new(vec![fault]));
        let err = Loader::open(&path, cfg)
            .unwrap()
            .with_engine(engine)
            .load_all(None)
            .err()
            .unwrap();
        assert!(is_expected(&err), "{fault:?}: {err}");
    }
}

#[test]
fn corrupting_staged_scratch_cannot_corrupt_the_result() {
    let dir = tempdir();
    let tensors = tensors(40, 20);
    let path = write_cold(dir.path(), &tensors);
    let cfg = LoadConfig {
        direct: DirectMode::Off,
        ..mapping_allowed()
    };
    let engine = Arc::new(FaultyEngine::new(vec![
        Fault::Corrupt { op: 0 },
        Fault::Corrupt { op: 3 },
    ]));
    let loader = Loader::open(&path, cfg).unwrap().with_engine(engine);
    assert_same(&collect(&loader, None).unwrap(), &tensors);
}
