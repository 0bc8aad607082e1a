//! A minimal safetensors writer and random data for the load tests.

#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};

pub struct TestTensor {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<u64>,
    pub bytes: Vec<u8>,
}

pub use sluice_testkit::random_bytes;

/// `count` BF16 tensors of varied sizes (some 0-d, one empty) with random bytes.
pub fn tensors(count: usize, seed: u64) -> Vec<TestTensor> {
    (0..count)
        .map(|i| {
            let (shape, elems): (Vec<u64>, u64) = match i % 5 {
                0 => (vec![], 1),
                1 => (vec![0, 7], 0),
                2 => (vec![333, 17], 333 * 17),
                3 => (vec![1024, 300], 1024 * 300),
                _ => (vec![9], 9),
            };
            let bytes = random_bytes((elems * 2) as usize, seed + i as u64);
            TestTensor {
                name: format!("layer.{i}.weight"),
                dtype: "BF16",
                shape,
                bytes,
            }
        })
        .collect()
}

/// Serialises tensors in the given order, contiguous, header padded to 8.
pub fn safetensors_bytes(tensors: &[TestTensor]) -> Vec<u8> {
    let mut entries = Vec::new();
    let mut offset = 0u64;
    for t in tensors {
        let end = offset + t.bytes.len() as u64;
        let shape: Vec<String> = t.shape.iter().map(u64::to_string).collect();
        entries.push(format!(
            "\"{}\":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
            t.name,
            t.dtype,
            shape.join(","),
            offset,
            end
        ));
        offset = end;
    }
    let mut header = format!(
        "{{\"__metadata__\":{{\"format\":\"pt\"}},{}}}",
        entries.join(",")
    );
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    for t in tensors {
        out.extend_from_slice(&t.bytes);
    }
    out
}

pub fn write_file(path: &Path, tensors: &[TestTensor]) -> PathBuf {
    std::fs::File::create(path)
        .unwrap()
        .write_all(&safetensors_bytes(tensors))
        .unwrap();
    path.to_path_buf()
}

/// Writes `tensors` split over `shards` files plus an index; returns the index path.
pub fn write_sharded(dir: &Path, tensors: &[TestTensor], shards: usize) -> PathBuf {
    let per = tensors.len().div_ceil(shards);
    let mut weight_map = Vec::new();
    for (k, group) in tensors.chunks(per).enumerate() {
        let name = format!("model-{:05}-of-{:05}.safetensors", k + 1, shards);
        write_file(&dir.join(&name), group);
        for t in group {
            weight_map.push(format!("\"{}\":\"{}\"", t.name, name));
        }
    }
    let index = dir.join("model.safetensors.index.json");
    let json = format!(
        "{{\"metadata\":{{\"total_size\":0}},\"weight_map\":{{{}}}}}",
        weight_map.join(",")
    );
    std::fs::write(&index, json).unwrap();
    index
}

pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// Cuts `by` bytes off the end of `path`, in place (the inode stays).
pub fn shorten(path: &Path, by: u64) {
    let len = std::fs::metadata(path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len - by)
        .unwrap();
}

/// Cuts `path` to half its length, in place.
pub fn halve(path: &Path) {
    let len = std::fs::metadata(path).unwrap().len();
    shorten(path, len - len / 2);
}
