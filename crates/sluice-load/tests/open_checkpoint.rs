//! `OpenCheckpoint`: per-tensor and per-block reads from held descriptors,
//! and the shard-completeness rules of opening.

mod common;

use std::io::Write;

use common::{random_bytes, shorten, tempdir, write_file, write_sharded, TestTensor};
use sluice_load::{LoadError, OpenCheckpoint, ReadOptions};

fn f32_tensor(name: &str, rows: u64, cols: u64, seed: u64) -> TestTensor {
    TestTensor {
        name: name.into(),
        dtype: "F32",
        shape: vec![rows, cols],
        bytes: random_bytes((rows * cols * 4) as usize, seed),
    }
}

#[test]
fn reads_each_tensor_bit_identical() {
    let dir = tempdir();
    let tensors = common::tensors(12, 5);
    let path = write_file(&dir.path().join("m.safetensors"), &tensors);
    let ckpt = OpenCheckpoint::open(&path, ReadOptions::default()).unwrap();
    for t in &tensors {
        assert_eq!(
            ckpt.read_tensor(&t.name).unwrap().as_slice(),
            &t.bytes[..],
            "{}",
            t.name
        );
    }
}

#[test]
fn ranges_of_a_tensor_read_into_caller_memory_piece_by_piece() {
    let dir = tempdir();
    let big = f32_tensor("big", 700, 1000, 3); // 2.8 MB: pieces past the one-pread size
    let path = write_file(&dir.path().join("m.safetensors"), &[big]);
    let want = f32_tensor("big", 700, 1000, 3).bytes;
    let ckpt = OpenCheckpoint::open(&path, ReadOptions::default()).unwrap();
    for window in [1usize, 4096, 1 << 20, want.len()] {
        let mut got = vec![0u8; want.len()];
        for (k, piece) in got.chunks_mut(window).enumerate() {
            ckpt.read_tensor_range("big", (k * window) as u64, piece)
                .unwrap();
        }
        assert!(got == want, "windows of {window} bytes");
    }
    let mut past = vec![0u8; 8];
    let err = ckpt
        .read_tensor_range("big", want.len() as u64 - 4, &mut past)
        .unwrap_err();
    assert!(matches!(err, LoadError::Config { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("outside the tensor's 2800000 bytes"),
        "{err}"
    );
    let err = ckpt.read_tensor_range("nope", 0, &mut past).unwrap_err();
    assert!(matches!(err, LoadError::UnknownTensor { .. }), "{err}");
}

#[test]
fn a_file_replaced_after_opening_still_yields_its_own_bytes() {
    // Same size, tensor order swapped: reopening the path would hand back
    // y's bytes for x with no error.
    let dir = tempdir();
    let x = f32_tensor("x", 64, 64, 1);
    let y = f32_tensor("y", 64, 64, 2);
    let path = dir.path().join("m.safetensors");
    write_file(&path, &[x, y]);
    let ckpt = OpenCheckpoint::open(&path, ReadOptions::default()).unwrap();
    let (x, y) = (f32_tensor("x", 64, 64, 1), f32_tensor("y", 64, 64, 2));
    let staged = dir.path().join("staged.safetensors");
    write_file(
        &staged,
        &[f32_tensor("y", 64, 64, 2), f32_tensor("x", 64, 64, 1)],
    );
    std::fs::rename(&staged, &path).unwrap();
    assert_eq!(ckpt.read_tensor("x").unwrap().as_slice(), &x.bytes[..]);
    assert_eq!(ckpt.read_tensor("y").unwrap().as_slice(), &y.bytes[..]);
}

#[test]
fn a_file_truncated_in_place_is_a_truncation_naming_it() {
    let dir = tempdir();
    let path = write_file(
        &dir.path().join("m.safetensors"),
        &[f32_tensor("a", 16, 16, 1), f32_tensor("b", 16, 16, 2)],
    );
    let ckpt = OpenCheckpoint::open(&path, ReadOptions::default()).unwrap();
    shorten(&path, 100);
    let err = ckpt.read_tensor("b").unwrap_err();
    assert!(matches!(err, LoadError::Truncated { .. }), "{err:?}");
    assert!(err.to_string().contains("m.safetensors"), "{err}");
    assert!(ckpt.read_tensor("a").is_ok());
}

#[test]
fn blocks_match_a_gather_from_the_whole_tensor() {
    let dir = tempdir();
    let t = f32_tensor("w", 37, 53, 9);
    let path = write_file(
        &dir.path().join("m.safetensors"),
        &[f32_tensor("pad", 3, 3, 1), t],
    );
    let whole = f32_tensor("w", 37, 53, 9).bytes;
    let ckpt = OpenCheckpoint::open(&path, ReadOptions::default()).unwrap();
    for ranges in [
        vec![(0, 37), (0, 53)],
        vec![(5, 9), (0, 53)],
        vec![(0, 37), (10, 20)],
        vec![(3, 30), (52, 53)],
        vec![(4, 4), (0, 53)],
    ] {
        let got = ckpt.read_block("w", &ranges).unwrap();
        let mut expected = Vec::new();
        for r in ranges[0].0..ranges[0].1 {
            let row = (r * 53 * 4) as usize;
            expected.extend_from_slice(
                &whole[row + ranges[1].0 as usize * 4..row + ranges[1].1 as usize * 4],
            );
        }
        assert_eq!(got.as_slice(), &expected[..], "{ranges:?}");
    }
}

#[test]
fn bad_blocks_and_names_are_typed_errors() {
    let dir = tempdir();
    let path = write_file(
        &dir.path().join("m.safetensors"),
        &[f32_tensor("w", 4, 4, 1)],
    );
    let ckpt = OpenCheckpoint::open(&path, ReadOptions::default()).unwrap();
    for ranges in [vec![(0, 4)], vec![(0, 5), (0, 4)], vec![(3, 2), (0, 4)]] {
        let err = ckpt.read_block("w", &ranges).unwrap_err();
        assert!(matches!(err, LoadError::Config(_)), "{ranges:?}: {err:?}");
        assert!(err.to_string().contains("\"w\""), "{err}");
    }
    assert!(matches!(
        ckpt.read_tensor("nope").unwrap_err(),
        LoadError::UnknownTensor { .. }
    ));
}

#[test]
fn a_large_tensor_is_read_by_several_threads_bit_identical() {
    let dir = tempdir();
    // 48 MiB: above the split threshold, not a multiple of the piece size.
    let t = f32_tensor("big", 3 * 1024 + 7, 4096, 3);
    let expected = t.bytes.clone();
    let path = write_file(
        &dir.path().join("m.safetensors"),
        &[f32_tensor("a", 1, 3, 1), t],
    );
    let ckpt = OpenCheckpoint::open(&path, ReadOptions::default()).unwrap();
    assert_eq!(ckpt.read_tensor("big").unwrap().as_slice(), &expected[..]);
    let block = ckpt
        .read_block("big", &[(0, 3 * 1024 + 7), (100, 3000)])
        .unwrap();
    assert_eq!(block.len(), (3 * 1024 + 7) * 2900 * 4);
    let row = 7 * 4096 * 4;
    assert_eq!(
        &block.as_slice()[7 * 2900 * 4..7 * 2900 * 4 + 8],
        &expected[row + 400..row + 408]
    );
}

#[test]
fn a_missing_shard_of_a_series_is_an_error_unless_partial_is_allowed() {
    let dir = tempdir();
    let tensors = common::tensors(10, 3);
    write_sharded(dir.path(), &tensors, 3);
    std::fs::remove_file(dir.path().join("model.safetensors.index.json")).unwrap();
    std::fs::remove_file(dir.path().join("model-00002-of-00003.safetensors")).unwrap();
    let err = OpenCheckpoint::open(dir.path(), ReadOptions::default()).unwrap_err();
    assert!(matches!(err, LoadError::ShardsMissing { .. }), "{err:?}");
    assert!(
        err.to_string().contains("model-00002-of-00003.safetensors"),
        "{err}"
    );
    assert!(err.is_not_found());

    let partial = OpenCheckpoint::open(
        dir.path(),
        ReadOptions {
            allow_partial: true,
        },
    )
    .unwrap();
    assert_eq!(partial.checkpoint().shards.len(), 2);
}

#[test]
fn a_dangling_shard_link_is_an_error_naming_it() {
    let dir = tempdir();
    let tensors = common::tensors(6, 3);
    write_sharded(dir.path(), &tensors, 2);
    std::fs::remove_file(dir.path().join("model.safetensors.index.json")).unwrap();
    let shard = dir.path().join("model-00002-of-00002.safetensors");
    std::fs::remove_file(&shard).unwrap();
    std::os::unix::fs::symlink(dir.path().join("gone"), &shard).unwrap();
    let err = OpenCheckpoint::open(
        dir.path(),
        ReadOptions {
            allow_partial: true,
        },
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("model-00002-of-00002.safetensors"),
        "{err}"
    );
}

#[test]
fn an_index_shard_that_is_absent_loads_the_rest_only_when_allowed() {
    let dir = tempdir();
    let tensors = common::tensors(10, 4);
    let index = write_sharded(dir.path(), &tensors, 2);
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    let err = OpenCheckpoint::open(&index, ReadOptions::default()).unwrap_err();
    assert!(matches!(err, LoadError::ShardFileMissing { .. }), "{err:?}");
    let partial = OpenCheckpoint::open(
        &index,
        ReadOptions {
            allow_partial: true,
        },
    )
    .unwrap();
    assert_eq!(partial.checkpoint().tensor_count(), 5);
    assert!(partial.find(&tensors[0].name).is_some());
    assert!(partial.find(&tensors[9].name).is_none());
}

#[test]
fn a_directory_without_a_series_needs_no_completeness() {
    let dir = tempdir();
    write_file(
        &dir.path().join("a.safetensors"),
        &[f32_tensor("a", 2, 2, 1)],
    );
    let mut f = std::fs::File::create(dir.path().join("notes.txt")).unwrap();
    f.write_all(b"x").unwrap();
    write_file(
        &dir.path().join("b.safetensors"),
        &[f32_tensor("b", 2, 2, 1)],
    );
    let ckpt = OpenCheckpoint::open(dir.path(), ReadOptions::default()).unwrap();
    assert_eq!(ckpt.checkpoint().tensor_count(), 2);
}

/// Every tensor's bytes of a whole load, by name.
fn loaded_bytes(loader: &sluice_load::Loader) -> std::collections::HashMap<String, Vec<u8>> {
    let loaded = loader.load_all(None).unwrap();
    let mut out = std::collections::HashMap::new();
    for w in &loaded.windows {
        for t in &w.tensors {
            out.insert(t.name.clone(), w.tensor_bytes(t).to_vec());
        }
    }
    out
}

#[test]
fn a_load_reads_the_files_its_headers_came_from() {
    // Replaced between validation and the reads (same size, order swapped),
    // in every direct mode: the direct descriptor is a reopening of the
    // validated file, not of the path.
    for direct in ["off", "auto", "on"] {
        let dir = tempdir();
        let path = dir.path().join("m.safetensors");
        write_file(
            &path,
            &[f32_tensor("x", 256, 64, 1), f32_tensor("y", 256, 64, 2)],
        );
        let config = sluice_load::LoadConfig {
            direct: direct.parse().unwrap(),
            ..Default::default()
        };
        let Ok(loader) = sluice_load::Loader::open(&path, config.clone()) else {
            continue; // direct=on where the file system has no O_DIRECT
        };
        let from_open = OpenCheckpoint::open(&path, ReadOptions::default())
            .unwrap()
            .loader(config)
            .unwrap();
        let staged = dir.path().join("staged.safetensors");
        write_file(
            &staged,
            &[f32_tensor("y", 256, 64, 2), f32_tensor("x", 256, 64, 1)],
        );
        std::fs::rename(&staged, &path).unwrap();
        for loader in [&loader, &from_open] {
            let got = loaded_bytes(loader);
            assert_eq!(
                got["x"],
                f32_tensor("x", 256, 64, 1).bytes,
                "direct={direct}"
            );
            assert_eq!(
                got["y"],
                f32_tensor("y", 256, 64, 2).bytes,
                "direct={direct}"
            );
        }
    }
}

#[test]
fn a_column_block_of_a_truncated_file_is_a_truncation_not_zeros() {
    // Many runs in one preadv; the file ends part way through them.
    let dir = tempdir();
    let path = write_file(
        &dir.path().join("m.safetensors"),
        &[f32_tensor("w", 600, 64, 4)],
    );
    let ckpt = OpenCheckpoint::open(&path, ReadOptions::default()).unwrap();
    shorten(&path, 64 * 4 * 100);
    let err = ckpt.read_block("w", &[(0, 600), (8, 16)]).unwrap_err();
    assert!(matches!(err, LoadError::Truncated { .. }), "{err:?}");
    let head = ckpt.read_block("w", &[(0, 500), (8, 16)]).unwrap();
    let whole = f32_tensor("w", 600, 64, 4).bytes;
    assert_eq!(&head.as_slice()[..32], &whole[32..64]);
}
