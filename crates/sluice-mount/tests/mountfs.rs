//! `MountFs` driven directly, without FUSE, over a directory behind the fault-injecting
//! backend: file-system semantics, exact bytes across blocks, every block fetched once
//! however many streams and threads read it, the pool's budget, lookahead, and a failed
//! read that is an EIO for that read only.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sluice_mount::{DirBackend, FaultyBackend, MountFs, MountOptions, StreamConfig, ROOT_INO};

const BLOCK: u64 = 64 << 10;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u64)
                .wrapping_mul(2654435761)
                .wrapping_add(seed as u64) as u8
                ^ (i >> 12) as u8
        })
        .collect()
}

fn options(pool_blocks: u64) -> MountOptions {
    MountOptions {
        block_bytes: BLOCK,
        pool_bytes: pool_blocks * BLOCK,
        prefetch_threads: 4,
        streams: StreamConfig {
            max_window: 8,
            ..StreamConfig::default()
        },
        lookahead_files: 1,
        disk_cache: None,
        passthrough: true,
    }
}

/// A tree: `a.bin` (2.5 blocks), `sub/model-0000{1,2}-of-00002.safetensors` (40 blocks
/// and a bit each), `sub/deeper/empty`.
fn tree(root: &Path) -> Vec<(String, Vec<u8>)> {
    let files = vec![
        ("a.bin".to_string(), pattern((BLOCK * 5 / 2) as usize, 1)),
        (
            "sub/model-00001-of-00002.safetensors".to_string(),
            pattern((BLOCK * 40 + 123) as usize, 2),
        ),
        (
            "sub/model-00002-of-00002.safetensors".to_string(),
            pattern((BLOCK * 40 + 7) as usize, 3),
        ),
        ("sub/deeper/empty".to_string(), Vec::new()),
    ];
    for (name, data) in &files {
        let p = root.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }
    files
}

/// A mounted tree: its directory, the backend double, the file system, and the files.
type Setup = (
    tempfile::TempDir,
    Arc<FaultyBackend>,
    MountFs,
    Vec<(String, Vec<u8>)>,
);

fn setup(pool_blocks: u64, delay: Duration) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let files = tree(dir.path());
    let backend = Arc::new(FaultyBackend::new(
        Arc::new(DirBackend::new(dir.path()).unwrap()),
        delay,
    ));
    let fs = MountFs::new(backend.clone(), options(pool_blocks)).unwrap();
    (dir, backend, fs, files)
}

fn ino_of(fs: &MountFs, path: &str) -> u64 {
    let mut ino = ROOT_INO;
    for part in path.split('/') {
        ino = fs.lookup(ino, part).unwrap().ino;
    }
    ino
}

fn read_all(fs: &MountFs, ino: u64, size: u64, step: u32) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let got = fs.read(ino, out.len() as u64, step).unwrap();
        if got.is_empty() {
            break;
        }
        out.extend_from_slice(&got);
    }
    assert_eq!(out.len() as u64, size);
    out
}

#[test]
fn tree_lookup_getattr_readdir_and_errors() {
    let (_dir, _b, fs, files) = setup(64, Duration::ZERO);
    let names: Vec<String> = fs
        .readdir(ROOT_INO)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["a.bin", "sub"]);
    let sub = fs.lookup(ROOT_INO, "sub").unwrap();
    assert!(sub.is_dir);
    let listed: Vec<(String, bool)> = fs
        .readdir(sub.ino)
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.is_dir))
        .collect();
    assert_eq!(
        listed,
        [
            ("deeper".to_string(), true),
            ("model-00001-of-00002.safetensors".to_string(), false),
            ("model-00002-of-00002.safetensors".to_string(), false)
        ]
    );
    for (name, data) in &files {
        let ino = ino_of(&fs, name);
        assert_eq!(fs.getattr(ino).unwrap().size, data.len() as u64);
    }
    let a = ino_of(&fs, "a.bin");
    let err = |r: std::io::Result<_>| r.err().and_then(|e: std::io::Error| e.raw_os_error());
    assert_eq!(
        err(fs.lookup(ROOT_INO, "nope").map(|_| ())),
        Some(libc::ENOENT)
    );
    assert_eq!(err(fs.lookup(a, "x").map(|_| ())), Some(libc::ENOTDIR));
    assert_eq!(err(fs.read(sub.ino, 0, 10).map(|_| ())), Some(libc::EISDIR));
    assert_eq!(err(fs.getattr(9999).map(|_| ())), Some(libc::ENOENT));
    assert_eq!(err(fs.readdir(a).map(|_| ())), Some(libc::ENOTDIR));
    // Reads at and past the end are short, then empty.
    let size = files[0].1.len() as u64;
    assert_eq!(
        fs.read(a, size - 3, 100).unwrap(),
        files[0].1[size as usize - 3..]
    );
    assert!(fs.read(a, size, 100).unwrap().is_empty());
    assert!(fs.read(a, size + (1 << 40), 100).unwrap().is_empty());
    let empty = ino_of(&fs, "sub/deeper/empty");
    assert!(fs.read(empty, 0, 100).unwrap().is_empty());
}

#[test]
fn reads_are_exact_across_blocks_at_any_size() {
    let (_dir, _b, fs, files) = setup(64, Duration::ZERO);
    for (name, data) in &files {
        let ino = ino_of(&fs, name);
        for step in [1000u32, 4096, BLOCK as u32 + 17, 1 << 20] {
            assert_eq!(
                &read_all(&fs, ino, data.len() as u64, step),
                data,
                "{name} {step}"
            );
        }
    }
}

/// Two readers of one file, interleaved read by read (two threads faulting one mmap);
/// returns the mount's stats and the backend's reads of the file.
fn interleaved(max_cursors: usize) -> (sluice_mount::MountStats, Vec<usize>) {
    let dir = tempfile::tempdir().unwrap();
    let files = tree(dir.path());
    let backend = Arc::new(FaultyBackend::new(
        Arc::new(DirBackend::new(dir.path()).unwrap()),
        Duration::from_millis(2),
    ));
    let mut opts = options(256);
    opts.streams.max_cursors = max_cursors;
    let fs = MountFs::new(backend.clone(), opts).unwrap();
    let (name, data) = &files[1];
    let ino = ino_of(&fs, name);
    let half = data.len() as u64 / 2;
    let step = 32 << 10;
    let (mut a, mut b) = (0u64, half);
    while a < half || b < data.len() as u64 {
        for pos in [&mut a, &mut b] {
            let end = if *pos < half { half } else { data.len() as u64 };
            if *pos >= end {
                continue;
            }
            let n = step.min(end - *pos);
            let got = fs.read(ino, *pos, n as u32).unwrap();
            assert_eq!(got, data[*pos as usize..(*pos + n) as usize]);
            *pos += n;
        }
    }
    fs.quiesce();
    let reads = backend
        .reads()
        .into_iter()
        .filter(|((p, _), _)| p == name)
        .map(|(_, n)| n)
        .collect();
    (fs.stats(), reads)
}

#[test]
fn two_interleaved_streams_fetch_each_block_once_and_keep_their_prefetch() {
    let (stats, reads) = interleaved(8);
    assert!(
        reads.iter().all(|&n| n == 1),
        "a block fetched twice: {reads:?}"
    );
    assert_eq!(reads.len() as u64, (BLOCK * 40 + 123).div_ceil(BLOCK));
    // With one cursor per file (Mountpoint's design) each stream resets the other's
    // prefetch: nothing is prefetched and every block is a demand miss.
    let (single, _) = interleaved(1);
    assert_eq!(single.prefetch_queued, 0, "{single:?}");
    assert!(stats.prefetch_queued > 0, "{stats:?}");
    // Blocks a read had to fetch itself, because no prefetch had asked for them: with
    // streams only each stream's first few.
    assert!(
        stats.demand_fetches * 4 < single.demand_fetches,
        "streams: {stats:?}\none cursor: {single:?}"
    );
}

#[test]
fn threads_reading_one_file_share_fetches() {
    let (_dir, backend, fs, files) = setup(256, Duration::from_millis(5));
    let (name, data) = &files[2];
    let ino = ino_of(&fs, name);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| assert_eq!(&read_all(&fs, ino, data.len() as u64, 256 << 10), data));
        }
    });
    fs.quiesce();
    let reads = backend.reads();
    assert!(
        reads
            .iter()
            .filter(|((p, _), _)| p == name)
            .all(|(_, &n)| n == 1),
        "{reads:?}"
    );
}

#[test]
fn the_pool_never_exceeds_its_budget() {
    let (_dir, _b, fs, files) = setup(6, Duration::from_millis(1));
    std::thread::scope(|s| {
        for (name, data) in &files[..3] {
            let fs = &fs;
            let ino = ino_of(fs, name);
            s.spawn(move || assert_eq!(&read_all(fs, ino, data.len() as u64, 100_000), data));
        }
    });
    fs.quiesce();
    let stats = fs.stats();
    assert!(stats.pool.peak_bytes <= 6 * BLOCK, "{stats:?}");
    assert!(stats.pool.held_bytes <= 6 * BLOCK, "{stats:?}");
    // Evicted blocks' memory was reused (and the bytes above were still exact).
    assert!(stats.pool.recycled > 0, "{stats:?}");
}

#[test]
fn opening_a_shard_prefetches_it_and_passing_its_middle_starts_the_next() {
    let (_dir, backend, fs, files) = setup(256, Duration::ZERO);
    let first = ino_of(&fs, &files[1].0);
    fs.open(first).unwrap();
    fs.quiesce();
    let reads = backend.reads();
    assert!(
        reads.contains_key(&(files[1].0.clone(), 0)),
        "open did not prefetch: {reads:?}"
    );
    read_all(&fs, first, files[1].1.len() as u64, 1 << 20);
    fs.quiesce();
    let reads = backend.reads();
    assert!(
        reads.contains_key(&(files[2].0.clone(), 0)),
        "no lookahead into the next shard: {reads:?}"
    );
}

#[test]
fn a_failed_fetch_is_an_eio_for_that_read_only() {
    let (_dir, backend, fs, files) = setup(64, Duration::ZERO);
    let ino = ino_of(&fs, "a.bin");
    backend.fail_next(1);
    let err = fs.read(ino, 0, 100).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    assert_eq!(fs.read(ino, 0, 100).unwrap(), files[0].1[..100]);
    assert_eq!(fs.stats().backend_errors, 1);
}

#[test]
fn a_file_changed_after_listing_is_an_eio_never_other_bytes() {
    let (dir, _b, fs, files) = setup(64, Duration::ZERO);
    let ino = ino_of(&fs, "a.bin");
    std::fs::write(dir.path().join("a.bin"), pattern(files[0].1.len(), 9)).unwrap();
    let err = fs.read(ino, 0, 100).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
}

#[test]
fn bad_options_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Arc::new(DirBackend::new(dir.path()).unwrap());
    for opts in [
        MountOptions {
            pool_bytes: BLOCK,
            ..options(64)
        },
        MountOptions {
            block_bytes: 1,
            ..options(64)
        },
        MountOptions {
            prefetch_threads: 0,
            ..options(64)
        },
        MountOptions {
            streams: StreamConfig {
                max_cursors: 0,
                ..StreamConfig::default()
            },
            ..options(64)
        },
    ] {
        assert!(MountFs::new(backend.clone(), opts).is_err());
    }
    assert!(DirBackend::new(&dir.path().join("missing")).is_err());
}
