//! Loads from an object store through the engines: an in-memory store behind the
//! fault-injecting double. Bytes land exactly (in plan order, several GETs per window),
//! broken GETs are retried, and what cannot be read is a typed error naming the object;
//! a stream never hands out a window with wrong bytes.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, PutPayload};
use sluice_load::{LoadConfig, LoadError, Loader};
use sluice_remote::{Fault, FaultyStore, ObjectUrl, RemoteError, RemoteOptions, RemoteStore};

use common::{safetensors_bytes, tensors, TestTensor};

fn put(store: &InMemory, key: &str, data: Vec<u8>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(store.put(&Path::from(key), PutPayload::from(data)))
        .unwrap();
}

fn small_reads() -> LoadConfig {
    LoadConfig {
        chunk_bytes: 64 << 10,
        window_bytes: 256 << 10,
        concurrency: 4,
        ..LoadConfig::default()
    }
}

/// A 3-shard checkpoint in memory under `m/`, its store behind `faults`, and the tensors.
fn setup(faults: Vec<Fault>) -> (Arc<FaultyStore>, Arc<RemoteStore>, Vec<TestTensor>) {
    let mem = Arc::new(InMemory::new());
    let all = tensors(12, 5);
    for (i, shard) in all.chunks(4).enumerate() {
        put(
            &mem,
            &format!("m/model-{:05}-of-00003.safetensors", i + 1),
            safetensors_bytes(shard),
        );
    }
    let faulty = Arc::new(FaultyStore::new(mem, faults));
    // More retries than any test schedules faults: with GETs in flight together, one
    // piece may draw every fault.
    let opts = RemoteOptions {
        retries: 5,
        piece_bytes: 100 << 10,
        ..RemoteOptions::default()
    };
    let url = ObjectUrl::parse("s3://bucket/m").unwrap();
    let store = Arc::new(RemoteStore::with_store(&url, faulty.clone(), &opts));
    (faulty, store, all)
}

fn collect(loader: &Loader) -> Result<HashMap<String, Vec<u8>>, LoadError> {
    let loaded = loader.load_all(None)?;
    let mut out = HashMap::new();
    for w in &loaded.windows {
        for t in &w.tensors {
            out.insert(t.name.clone(), w.tensor_bytes(t).to_vec());
        }
    }
    Ok(out)
}

fn url() -> ObjectUrl {
    ObjectUrl::parse("s3://bucket/m").unwrap()
}

#[test]
fn a_prefix_loads_exactly_through_the_object_engine_and_the_thread_engine() {
    let (faulty, store, want) = setup(vec![]);
    let loader = Loader::open_remote(store.clone(), &url(), small_reads()).unwrap();
    let got = collect(&loader).unwrap();
    assert_eq!(got.len(), want.len());
    for t in &want {
        assert_eq!(got[&t.name], t.bytes, "{}", t.name);
    }
    // Headers (one GET each: they fit the first read) plus data in pieces.
    assert!(faulty.gets() > 3 + 3, "{} GETs", faulty.gets());
    let (_, stats) = loader.stream(None).unwrap();
    assert_eq!(stats.engine, "object_store");
    assert!(stats
        .files
        .iter()
        .all(|f| !f.direct && f.path.to_str().unwrap().starts_with("s3://bucket/m/")));
    // The blocking thread engine reads remote objects to the same bytes.
    let threads = Loader::open_remote(store, &url(), small_reads())
        .unwrap()
        .with_engine(Arc::new(sluice_engine::ThreadEngine::new(4)));
    assert_eq!(collect(&threads).unwrap(), got);
}

#[test]
fn broken_gets_are_retried_to_the_same_bytes() {
    // The three header reads pass; then data GETs fail, come short or long.
    let faults = vec![
        Fault::None,
        Fault::None,
        Fault::None,
        Fault::Fail,
        Fault::Short(100),
        Fault::Long,
        Fault::Short(1),
    ];
    let (_, store, want) = setup(faults);
    let got = collect(&Loader::open_remote(store, &url(), small_reads()).unwrap()).unwrap();
    for t in &want {
        assert_eq!(got[&t.name], t.bytes, "{}", t.name);
    }
}

#[test]
fn a_get_that_keeps_failing_fails_the_whole_load_naming_the_object() {
    let mut faults = vec![Fault::None; 3];
    faults.extend(std::iter::repeat_n(Fault::Short(10), 50));
    let (_, store, _) = setup(faults);
    let loader = Loader::open_remote(store, &url(), small_reads()).unwrap();
    match collect(&loader) {
        Err(LoadError::Remote(RemoteError::Short { url, .. })) => {
            assert!(url.starts_with("s3://bucket/m/model-"), "{url}")
        }
        other => panic!(
            "expected a short-read error, got {:?}",
            other.map(|m| m.len())
        ),
    }
}

#[test]
fn an_object_replaced_after_open_is_refused() {
    let mut faults = vec![Fault::None; 3];
    faults.push(Fault::Changed);
    let (_, store, _) = setup(faults);
    let loader = Loader::open_remote(store, &url(), small_reads()).unwrap();
    let mut stream = loader.stream(None).unwrap().0;
    let mut failed = None;
    while let Some(w) = stream.next_window() {
        if let Err(e) = w {
            failed = Some(e);
            break;
        }
    }
    match failed {
        Some(LoadError::Remote(RemoteError::Changed { url, .. })) => {
            assert!(url.starts_with("s3://bucket/m/"), "{url}")
        }
        other => panic!("expected a changed-object error, got {other:?}"),
    }
}

#[test]
fn direct_on_is_refused_for_objects() {
    let (_, store, _) = setup(vec![]);
    let config = LoadConfig {
        direct: sluice_engine::DirectMode::On,
        ..small_reads()
    };
    let loader = Loader::open_remote(store, &url(), config).unwrap();
    let err = loader.load_all(None).err().expect("direct=on must fail");
    assert!(err.to_string().contains("O_DIRECT"), "{err}");
}
