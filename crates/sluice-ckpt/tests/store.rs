//! The checkpoint store: round trips, dedup, incremental saves, saves that never finished,
//! damaged and missing chunks, manifests it must refuse, garbage collection, diff.

mod common;
use common::pattern;

use std::path::Path;

use sluice_ckpt::{diff, CkptError, CkptStore, EntryKind, Manifest, SaveItem};

const CHUNK: u64 = 4096;

fn tensor<'a>(key: &str, bytes: &'a [u8]) -> SaveItem<'a> {
    SaveItem {
        key: key.into(),
        kind: EntryKind::Tensor,
        dtype: Some("uint8".into()),
        shape: Some(vec![bytes.len() as u64]),
        bytes,
        meta: serde_json::Value::Null,
    }
}

fn load(store: &CkptStore, name: &str, key: &str, len: usize) -> Result<Vec<u8>, CkptError> {
    let m = Manifest::read(&store.checkpoint_dir(name)?)?;
    let mut out = vec![0u8; len];
    store.read_entry(&m, key, &mut out, 4)?;
    Ok(out)
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir_in("/var/tmp").unwrap()
}

#[test]
fn a_checkpoint_round_trips_and_stores_repeated_bytes_once() {
    let dir = tmp();
    let store = CkptStore::open(dir.path()).unwrap();
    let w = pattern(1, 10_000);
    let zeros = vec![0u8; 3 * CHUNK as usize];
    let items = [
        tensor("w", &w),
        tensor("tied", &w), // a tied weight: same bytes
        tensor("m", &zeros),
        tensor("v", &zeros),
        tensor("empty", &[]),
    ];
    let r = store.save("step-1", &items, CHUNK, 4).unwrap();
    assert_eq!(r.logical_bytes, 2 * 10_000 + 2 * 3 * CHUNK);
    assert_eq!(r.unique_bytes, 10_000 + CHUNK); // w once, one zero chunk
    assert_eq!(r.written_bytes, r.unique_bytes);
    assert_eq!(load(&store, "step-1", "tied", 10_000).unwrap(), w);
    assert_eq!(load(&store, "step-1", "v", zeros.len()).unwrap(), zeros);
    assert_eq!(
        load(&store, "step-1", "empty", 0).unwrap(),
        Vec::<u8>::new()
    );
    // Wrong key, wrong size: named.
    let err = load(&store, "step-1", "nope", 1).unwrap_err();
    assert!(err.to_string().contains("\"nope\""), "{err}");
    let err = load(&store, "step-1", "w", 9_999).unwrap_err();
    assert!(err.to_string().contains("10000"), "{err}");
}

#[test]
fn an_incremental_save_writes_only_the_chunks_that_changed() {
    let dir = tmp();
    let store = CkptStore::open(dir.path()).unwrap();
    let mut w = pattern(2, 100 * CHUNK as usize);
    store.save("a", &[tensor("w", &w)], CHUNK, 2).unwrap();
    // Change 5 of 100 chunks.
    for c in [3usize, 17, 40, 41, 99] {
        w[c * CHUNK as usize] ^= 0xFF;
    }
    let r = store.save("b", &[tensor("w", &w)], CHUNK, 2).unwrap();
    assert_eq!(r.written_chunks, 5);
    assert_eq!(r.written_bytes, 5 * CHUNK);
    let d = diff(
        &Manifest::read(&store.checkpoint_dir("a").unwrap()).unwrap(),
        &Manifest::read(&store.checkpoint_dir("b").unwrap()).unwrap(),
    );
    assert_eq!((d.changed.len(), d.changed_bytes), (1, 5 * CHUNK));
    assert_eq!(load(&store, "b", "w", w.len()).unwrap(), w);
}

#[test]
fn a_save_that_never_finished_is_invisible_and_gc_collects_what_it_left() {
    let dir = tmp();
    let store = CkptStore::open(dir.path()).unwrap();
    let a = pattern(3, 3 * CHUNK as usize);
    store.save("good", &[tensor("x", &a)], CHUNK, 2).unwrap();
    // A crashed save: chunks written, a temporary left, no manifest.
    let b = pattern(4, 2 * CHUNK as usize);
    let chunks = sluice_ckpt::chunk(&b, CHUNK as usize, 1);
    let pairs: Vec<_> = chunks
        .iter()
        .zip(b.chunks(CHUNK as usize))
        .map(|(c, s)| (*c, s))
        .collect();
    store.write_chunks(&pairs, 1).unwrap();
    std::fs::create_dir(dir.path().join("crashed")).unwrap();
    let fan = store.chunks().path_of(&chunks[0].digest);
    std::fs::write(fan.with_file_name("abc.tmp-1-1"), b"half").unwrap();
    let names: Vec<String> = store.list().unwrap().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, vec!["good"]);
    assert!(matches!(
        load(&store, "crashed", "x", 1),
        Err(CkptError::NoCheckpoint { .. })
    ));
    drop(store);
    let store = CkptStore::open_exclusive(dir.path()).unwrap();
    let g = store.gc(10).unwrap();
    assert_eq!((g.chunks_removed, g.temporaries_removed), (2, 1));
    assert_eq!(load(&store, "good", "x", a.len()).unwrap(), a);
}

#[test]
fn a_damaged_chunk_is_an_error_naming_it_and_verify_finds_it() {
    let dir = tmp();
    let store = CkptStore::open(dir.path()).unwrap();
    let w = pattern(5, 2 * CHUNK as usize);
    store
        .save("s", &[tensor("layer.0.w", &w)], CHUNK, 2)
        .unwrap();
    let m = Manifest::read(&store.checkpoint_dir("s").unwrap()).unwrap();
    let c = m.entries["layer.0.w"].chunks[1];
    let path = store.chunks().path_of(&c.digest);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[7] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let err = load(&store, "s", "layer.0.w", w.len()).unwrap_err();
    assert!(matches!(err, CkptError::CorruptChunk { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&c.digest.hex()) && text.contains("layer.0.w"),
        "{text}"
    );
    let v = store.verify("s", 2).unwrap();
    assert_eq!((v.chunks, v.problems.len()), (2, 1));
    // Truncated, then gone.
    std::fs::write(&path, &bytes[..100]).unwrap();
    assert!(matches!(
        load(&store, "s", "layer.0.w", w.len()),
        Err(CkptError::CorruptChunk { .. })
    ));
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(
        load(&store, "s", "layer.0.w", w.len()),
        Err(CkptError::MissingChunk { .. })
    ));
}

fn write_manifest(dir: &Path, body: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("manifest.json"), body).unwrap();
}

#[test]
fn manifests_from_a_newer_format_garbage_or_lying_about_sizes_are_refused() {
    let dir = tmp();
    let store = CkptStore::open(dir.path()).unwrap();
    let newer =
        r#"{"format":"sluice-ckpt","version":9,"created_unix":0,"chunk_bytes":4096,"entries":{}}"#;
    write_manifest(&dir.path().join("n"), newer);
    assert!(matches!(
        Manifest::read(&dir.path().join("n")),
        Err(CkptError::NewerFormat { found: 9, .. })
    ));
    write_manifest(&dir.path().join("g"), "{not json");
    assert!(matches!(
        Manifest::read(&dir.path().join("g")),
        Err(CkptError::BadManifest { .. })
    ));
    let d = sluice_ckpt::Digest::of(b"x").hex();
    let lying = format!(
        r#"{{"format":"sluice-ckpt","version":1,"created_unix":0,"chunk_bytes":4096,
            "entries":{{"w":{{"kind":"tensor","nbytes":10,"chunks":[{{"d":"{d}","n":999}}]}}}}}}"#
    );
    write_manifest(&dir.path().join("l"), &lying);
    let err = Manifest::read(&dir.path().join("l")).unwrap_err();
    assert!(err.to_string().contains("\"w\""), "{err}");
    // ls refuses to hide a damaged checkpoint.
    assert!(store.list().is_err());
}

#[test]
fn bad_names_sizes_and_keys_are_refused_and_a_file_is_not_a_store() {
    let dir = tmp();
    let store = CkptStore::open(dir.path()).unwrap();
    let w = pattern(6, 10);
    for name in ["", "a/b", ".hidden", "chunks", "lock"] {
        assert!(
            store.save(name, &[tensor("w", &w)], CHUNK, 1).is_err(),
            "{name:?}"
        );
    }
    assert!(store.save("s", &[tensor("w", &w)], 0, 1).is_err());
    let err = store
        .save("s", &[tensor("w", &w), tensor("w", &w)], CHUNK, 1)
        .unwrap_err();
    assert!(err.to_string().contains("saved twice"), "{err}");
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    assert!(CkptStore::open(&file).is_err());
}

#[test]
fn gc_keeps_the_newest_checkpoints_and_every_chunk_they_share() {
    let dir = tmp();
    let store = CkptStore::open(dir.path()).unwrap();
    let base = pattern(7, 4 * CHUNK as usize);
    for i in 0..4u8 {
        let mut w = base.clone();
        w[0] = i; // one chunk differs per step, three are shared by all
        store
            .save(&format!("step-{i}"), &[tensor("w", &w)], CHUNK, 2)
            .unwrap();
    }
    drop(store);
    let store = CkptStore::open_exclusive(dir.path()).unwrap();
    let g = store.gc(2).unwrap();
    assert_eq!(g.checkpoints_removed, vec!["step-0", "step-1"]);
    assert_eq!(g.chunks_removed, 2);
    let infos = store.infos().unwrap();
    assert_eq!(infos.len(), 2);
    assert_eq!(infos[1].shared_bytes, 3 * CHUNK);
    let mut w = base.clone();
    w[0] = 3;
    assert_eq!(load(&store, "step-3", "w", w.len()).unwrap(), w);
}

#[test]
fn a_fifo_in_place_of_the_marker_or_the_lock_is_refused_not_waited_on() {
    // open(2) of a FIFO blocks until the other end opens: a hostile or botched store
    // must fail at once, naming the file.
    for name in ["sluice-ckpt.json", "lock"] {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let root = dir.path().join("store");
        drop(CkptStore::open(&root).unwrap());
        let path = root.join(name);
        std::fs::remove_file(&path).unwrap();
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo on a path we own.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let r2 = root.clone();
        std::thread::spawn(move || {
            let _ = tx.send(CkptStore::open(&r2).map(|_| ()));
        });
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("opening a store whose {name} is a FIFO hung"));
        let e = got.unwrap_err();
        assert!(e.to_string().contains(name), "{e}");
    }
}

#[test]
fn ranks_that_create_one_new_store_at_once_all_open_it() {
    // Issue 27: a group's ranks open a new store together; one that found the directory
    // empty and then the marker another had just written refused it as a foreign
    // directory ("holds files Sluice did not write").
    for round in 0..20 {
        let dir = tmp();
        let root = dir.path().join("store");
        let barrier = std::sync::Barrier::new(32);
        std::thread::scope(|s| {
            let opened: Vec<_> = (0..32)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        CkptStore::open(&root).map(drop)
                    })
                })
                .collect();
            for t in opened {
                let r = t.join().unwrap();
                assert!(r.is_ok(), "round {round}: {}", r.unwrap_err());
            }
        });
    }
}
