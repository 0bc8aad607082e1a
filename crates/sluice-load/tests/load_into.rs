//! `Loader::stream_into`: reads land in the caller's memory, bit-exact, never past a
//! destination's end, and every failure is an error, never a quiet partial fill.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::*;
use sluice_engine::{Fault, FaultyEngine, IoEngine, LentMemory, SyncEngine, ThreadEngine};
use sluice_load::{LoadConfig, LoadError, Loader};

/// Guard bytes on each side of a destination, to catch a read that strays.
const GUARD: usize = 64;
const GUARD_BYTE: u8 = 0xA5;

/// One destination with guard bytes around it.
struct Dest {
    buf: Vec<u8>,
    len: usize,
}

impl Dest {
    fn new(len: usize) -> Dest {
        Dest {
            buf: vec![GUARD_BYTE; len + 2 * GUARD],
            len,
        }
    }

    fn lend(&mut self) -> Arc<LentMemory> {
        // SAFETY: the test keeps `self` alive and untouched until the stream has ended.
        Arc::new(unsafe { LentMemory::new(self.buf.as_mut_ptr().add(GUARD), self.len) })
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[GUARD..GUARD + self.len]
    }

    fn guards_intact(&self) -> bool {
        self.buf[..GUARD]
            .iter()
            .chain(&self.buf[GUARD + self.len..])
            .all(|&b| b == GUARD_BYTE)
    }
}

/// A 1 MiB limit makes the gather windows 256 KiB, so the 600 KiB tensors are read
/// straight into their destinations and the small ones through the pool.
fn config() -> LoadConfig {
    LoadConfig {
        chunk_bytes: 64 << 10,
        memory_limit: Some(1 << 20),
        ..LoadConfig::default()
    }
}

fn dests(tensors: &[TestTensor]) -> HashMap<String, Dest> {
    tensors
        .iter()
        .map(|t| (t.name.clone(), Dest::new(t.bytes.len())))
        .collect()
}

fn run(loader: &Loader, dests: &mut HashMap<String, Dest>) -> Result<usize, LoadError> {
    let into = dests
        .iter_mut()
        .map(|(k, d)| (k.clone(), d.lend()))
        .collect();
    let (mut stream, _) = loader.stream_into(into)?;
    let mut windows = 0;
    while let Some(window) = stream.next_window() {
        let window = window?;
        assert!(window.buf.is_none(), "an into window carries no memory");
        windows += 1;
    }
    Ok(windows)
}

#[test]
fn every_destination_is_filled_bit_exact_and_nothing_past_it() {
    let dir = tempdir();
    let tensors = tensors(40, 1);
    let index = write_sharded(dir.path(), &tensors, 3);
    let engines: Vec<Arc<dyn IoEngine>> = vec![
        Arc::new(ThreadEngine::new(8)),
        Arc::new(SyncEngine),
        Arc::new(FaultyEngine::new(vec![])),
    ];
    for engine in engines {
        let loader = Loader::open(&index, config()).unwrap().with_engine(engine);
        let mut dests = dests(&tensors);
        let windows = run(&loader, &mut dests).unwrap();
        // 16 big tensors alone, the small ones between them grouped.
        assert!(windows > 16 && windows < tensors.len(), "{windows} windows");
        for t in &tensors {
            let d = &dests[&t.name];
            assert_eq!(d.bytes(), t.bytes.as_slice(), "{}", t.name);
            assert!(d.guards_intact(), "{}: a read strayed past it", t.name);
        }
    }
}

#[test]
fn a_subset_fills_only_its_destinations() {
    let dir = tempdir();
    let tensors = tensors(12, 2);
    let path = write_file(&dir.path().join("m.safetensors"), &tensors);
    let loader = Loader::open(&path, config()).unwrap();
    let mut dests: HashMap<String, Dest> = tensors
        .iter()
        .filter(|t| t.name.contains(".3.") || t.name.contains(".4."))
        .map(|t| (t.name.clone(), Dest::new(t.bytes.len())))
        .collect();
    run(&loader, &mut dests).unwrap();
    assert_eq!(dests.len(), 2);
    for t in tensors.iter().filter(|t| dests.contains_key(&t.name)) {
        assert_eq!(dests[&t.name].bytes(), t.bytes.as_slice());
        assert!(dests[&t.name].guards_intact());
    }
}

#[test]
fn a_destination_of_the_wrong_size_is_refused_before_any_read() {
    let dir = tempdir();
    let tensors = tensors(6, 3);
    let path = write_file(&dir.path().join("m.safetensors"), &tensors);
    let engine = Arc::new(FaultyEngine::new(vec![]));
    let loader = Loader::open(&path, config())
        .unwrap()
        .with_engine(engine.clone());
    let mut dests = dests(&tensors);
    dests.insert("layer.3.weight".into(), Dest::new(10));
    let err = run(&loader, &mut dests).err().unwrap();
    assert!(matches!(err, LoadError::Config(_)), "{err}");
    assert!(err.to_string().contains("layer.3.weight"), "{err}");
    assert_eq!(engine.ops_seen(), 0);
}

#[test]
fn an_unknown_name_is_refused() {
    let dir = tempdir();
    let tensors = tensors(6, 4);
    let path = write_file(&dir.path().join("m.safetensors"), &tensors);
    let loader = Loader::open(&path, config()).unwrap();
    let mut dests = dests(&tensors);
    dests.insert("nope".into(), Dest::new(4));
    let err = run(&loader, &mut dests).err().unwrap();
    assert!(matches!(err, LoadError::UnknownTensor { .. }), "{err}");
}

#[test]
fn failed_and_short_reads_fail_the_load() {
    let dir = tempdir();
    let tensors = tensors(20, 5);
    let path = write_file(&dir.path().join("m.safetensors"), &tensors);
    // Op 0 is a gathered window's, a later one a lent destination's: both kinds fail.
    for op in [0, 5] {
        for fault in [
            Fault::ShortRead { op },
            Fault::FailWith {
                op,
                errno: libc::EIO,
            },
        ] {
            let engine = Arc::new(FaultyEngine::new(vec![fault]));
            let loader = Loader::open(&path, config()).unwrap().with_engine(engine);
            let mut dests = dests(&tensors);
            let err = run(&loader, &mut dests).err().unwrap();
            assert!(
                matches!(err, LoadError::Truncated { .. } | LoadError::Read { .. }),
                "{err}"
            );
            assert!(err.to_string().contains("m.safetensors"), "{err}");
            assert!(dests.values().all(Dest::guards_intact));
        }
    }
}

#[test]
fn a_file_truncated_after_open_is_an_error() {
    let dir = tempdir();
    let tensors = tensors(20, 6);
    let path = write_file(&dir.path().join("m.safetensors"), &tensors);
    let loader = Loader::open(&path, config()).unwrap();
    halve(&path);
    let mut dests = dests(&tensors);
    let err = run(&loader, &mut dests).err().unwrap();
    assert!(matches!(err, LoadError::Truncated { .. }), "{err}");
    assert!(dests.values().all(Dest::guards_intact));
}

#[test]
fn a_small_memory_limit_does_not_shrink_reads_into_lent_memory() {
    // One 8 MiB tensor under a 1 MiB limit (256 KiB gather windows): it is read into its
    // destination in `chunk_bytes` pieces (2 of 4 MiB), not in pieces of a gather window.
    let dir = tempdir();
    let tensor = TestTensor {
        name: "big".into(),
        dtype: "U8",
        shape: vec![8 << 20],
        bytes: random_bytes(8 << 20, 7),
    };
    let path = write_file(
        &dir.path().join("m.safetensors"),
        std::slice::from_ref(&tensor),
    );
    let engine = Arc::new(FaultyEngine::new(vec![]));
    let cfg = LoadConfig {
        chunk_bytes: 4 << 20,
        memory_limit: Some(1 << 20),
        ..LoadConfig::default()
    };
    let loader = Loader::open(&path, cfg)
        .unwrap()
        .with_engine(engine.clone());
    let mut dests = dests(std::slice::from_ref(&tensor));
    run(&loader, &mut dests).unwrap();
    assert_eq!(dests["big"].bytes(), tensor.bytes.as_slice());
    assert_eq!(engine.ops_seen(), 2);
}
