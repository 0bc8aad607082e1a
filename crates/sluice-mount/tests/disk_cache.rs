//! The mount's disk tier, driven through `MountFs` over a directory behind the
//! fault-injecting backend: a restarted mount reads from disk and not the backend; a
//! corrupt, truncated or misplaced block is fetched again, never served; the budget holds;
//! a changed file misses; a full disk leaves blocks uncached with exact reads; and the
//! directory is refused when it holds other files or another mount uses it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sluice_mount::{
    DirBackend, DiskCacheOptions, FaultyBackend, MountError, MountFs, MountOptions, StreamConfig,
    ROOT_INO,
};

const BLOCK: u64 = 64 << 10;
const HEADER: u64 = 80;

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    sluice_testkit::random_bytes(len, seed)
}

/// `a.bin` (3.5 blocks) and `model.safetensors` (12 blocks and a bit).
fn tree(root: &Path) -> Vec<(String, Vec<u8>)> {
    let files = vec![
        ("a.bin".to_string(), pattern((BLOCK * 7 / 2) as usize, 1)),
        (
            "m/model.safetensors".to_string(),
            pattern((BLOCK * 12 + 99) as usize, 2),
        ),
    ];
    for (name, data) in &files {
        let p = root.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }
    files
}

fn options(cache: &Path, cache_blocks: u64) -> MountOptions {
    MountOptions {
        block_bytes: BLOCK,
        pool_bytes: 64 * BLOCK,
        prefetch_threads: 4,
        streams: StreamConfig {
            max_window: 8,
            ..StreamConfig::default()
        },
        lookahead_files: 1,
        disk_cache: Some(DiskCacheOptions {
            dir: cache.to_path_buf(),
            budget: cache_blocks * (BLOCK + HEADER),
        }),
    }
}

fn mount(src: &Path, opts: MountOptions) -> (Arc<FaultyBackend>, MountFs) {
    let backend = Arc::new(FaultyBackend::new(
        Arc::new(DirBackend::new(src).unwrap()),
        Duration::ZERO,
    ));
    let fs = MountFs::new(backend.clone(), opts).unwrap();
    (backend, fs)
}

fn ino_of(fs: &MountFs, path: &str) -> u64 {
    let mut ino = ROOT_INO;
    for part in path.split('/') {
        ino = fs.lookup(ino, part).unwrap().ino;
    }
    ino
}

/// Reads every file through the mount, checking its bytes, then waits for prefetch.
fn read_everything(fs: &MountFs, files: &[(String, Vec<u8>)]) {
    for (name, data) in files {
        let ino = ino_of(fs, name);
        fs.open(ino).unwrap();
        let mut out = Vec::new();
        loop {
            let got = fs.read(ino, out.len() as u64, 100_000).unwrap();
            if got.is_empty() {
                break;
            }
            out.extend_from_slice(&got);
        }
        assert!(&out == data, "{name}: wrong bytes");
        fs.release(ino).unwrap();
    }
    fs.quiesce();
}

fn block_files(cache: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for sub in std::fs::read_dir(cache).unwrap() {
        let sub = sub.unwrap().path();
        if sub.is_dir() {
            for f in std::fs::read_dir(&sub).unwrap() {
                out.push(f.unwrap().path());
            }
        }
    }
    out.sort();
    out
}

fn total_blocks(files: &[(String, Vec<u8>)]) -> u64 {
    files
        .iter()
        .map(|(_, d)| (d.len() as u64).div_ceil(BLOCK))
        .sum()
}

/// A source tree and a cache directory that one mount already filled and left.
fn filled(cache_blocks: u64) -> (tempfile::TempDir, tempfile::TempDir, Vec<(String, Vec<u8>)>) {
    let src = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let files = tree(src.path());
    let (_b, fs) = mount(src.path(), options(cache.path(), cache_blocks));
    read_everything(&fs, &files);
    drop(fs);
    (src, cache, files)
}

#[test]
fn a_restarted_mount_reads_from_disk_not_the_backend() {
    let src = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let files = tree(src.path());
    let (_b, fs) = mount(src.path(), options(cache.path(), 64));
    read_everything(&fs, &files);
    let first = fs.stats();
    drop(fs);
    assert_eq!(first.disk.written_blocks, total_blocks(&files), "{first:?}");
    assert_eq!(block_files(cache.path()).len() as u64, total_blocks(&files));

    let (backend, fs) = mount(src.path(), options(cache.path(), 64));
    read_everything(&fs, &files);
    let second = fs.stats();
    assert_eq!(second.backend_reads, 0, "{second:?} {:?}", backend.reads());
    assert_eq!(second.disk.hits, total_blocks(&files), "{second:?}");
    assert_eq!(second.disk.written_blocks, 0);
}

#[test]
fn a_corrupt_truncated_or_misplaced_block_is_fetched_again_not_served() {
    let (src, cache, files) = filled(64);
    // Whole blocks only (tails differ in size), in name order (random across runs).
    let blocks: Vec<PathBuf> = block_files(cache.path())
        .into_iter()
        .filter(|b| std::fs::metadata(b).unwrap().len() == BLOCK + HEADER)
        .collect();
    // One bit flipped in the data, one block cut short, one block's file copied over
    // another's name (a whole, valid block, but of another key), one header's magic bad.
    let mut data = std::fs::read(&blocks[0]).unwrap();
    data[HEADER as usize + 1000] ^= 0x10;
    std::fs::write(&blocks[0], &data).unwrap();
    let len = std::fs::metadata(&blocks[1]).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&blocks[1])
        .unwrap()
        .set_len(len - 5)
        .unwrap();
    std::fs::copy(&blocks[4], &blocks[2]).unwrap();
    let mut data = std::fs::read(&blocks[3]).unwrap();
    data[0] = b'X';
    std::fs::write(&blocks[3], &data).unwrap();

    let (_backend, fs) = mount(src.path(), options(cache.path(), 64));
    read_everything(&fs, &files);
    let s = fs.stats();
    assert_eq!(s.disk.corrupt, 4, "{s:?}");
    assert_eq!(s.backend_reads, 4, "{s:?}");
    assert_eq!(s.disk.hits, total_blocks(&files) - 4, "{s:?}");
    // Refetched blocks are written again, whole.
    assert_eq!(s.disk.written_blocks, 4, "{s:?}");
    drop(fs);
    let (_backend, fs) = mount(src.path(), options(cache.path(), 64));
    read_everything(&fs, &files);
    assert_eq!(fs.stats().backend_reads, 0);
    assert_eq!(fs.stats().disk.corrupt, 0);
}

#[test]
fn the_disk_cache_never_exceeds_its_budget() {
    let src = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let files = tree(src.path());
    let budget_blocks = 5;
    let (_b, fs) = mount(src.path(), options(cache.path(), budget_blocks));
    let budget = budget_blocks * (BLOCK + HEADER);
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| read_everything(&fs, &files));
        }
    });
    let st = fs.stats();
    assert!(st.disk.held_bytes <= budget, "{st:?}");
    assert!(st.disk.evicted > 0, "{st:?}");
    let on_disk: u64 = block_files(cache.path())
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert!(on_disk <= budget, "{on_disk} on disk, budget {budget}");
    assert_eq!(on_disk, st.disk.held_bytes);
    drop(fs);
    // A restart with a smaller budget evicts down to it at once.
    let (_b, fs) = mount(src.path(), options(cache.path(), 4));
    assert!(fs.stats().disk.held_bytes <= 4 * (BLOCK + HEADER));
    assert!(block_files(cache.path()).len() <= 4);
}

#[test]
fn a_changed_file_misses_its_old_blocks() {
    let (src, cache, mut files) = filled(64);
    // Same name and size, other bytes: a new version.
    std::thread::sleep(Duration::from_millis(20));
    files[0].1 = pattern(files[0].1.len(), 7);
    std::fs::write(src.path().join(&files[0].0), &files[0].1).unwrap();
    let (_b, fs) = mount(src.path(), options(cache.path(), 64));
    read_everything(&fs, &files);
    let s = fs.stats();
    assert_eq!(
        s.backend_reads,
        (files[0].1.len() as u64).div_ceil(BLOCK),
        "{s:?}"
    );
}

#[test]
fn torn_temporary_files_are_removed_at_start() {
    let (src, cache, _files) = filled(64);
    let torn = block_files(cache.path())[0].with_extension("tmp.1.1");
    std::fs::write(&torn, b"half a block").unwrap();
    let (_b, _fs) = mount(src.path(), options(cache.path(), 64));
    assert!(!torn.exists());
}

fn config_error(src: &Path, opts: MountOptions) -> String {
    let backend = Arc::new(DirBackend::new(src).unwrap());
    match MountFs::new(backend, opts) {
        Err(e @ MountError::Config(_)) => e.to_string(),
        Err(e) => panic!("not a config error: {e}"),
        Ok(_) => panic!("accepted"),
    }
}

#[test]
fn a_directory_of_other_files_or_in_use_is_refused() {
    let src = tempfile::tempdir().unwrap();
    tree(src.path());
    let cache = tempfile::tempdir().unwrap();
    std::fs::write(cache.path().join("notes.txt"), b"mine").unwrap();
    let why = config_error(src.path(), options(cache.path(), 64));
    assert!(why.contains("other files"), "{why}");
    assert!(cache.path().join("notes.txt").exists());

    let cache = tempfile::tempdir().unwrap();
    let (_b, _fs) = mount(src.path(), options(cache.path(), 64));
    let why = config_error(src.path(), options(cache.path(), 64));
    assert!(why.contains("another mount"), "{why}");

    let file = cache.path().join("SLUICE-CACHE");
    let why = config_error(src.path(), options(&file, 64));
    assert!(why.contains(&file.display().to_string()), "{why}");
    assert!(why.contains("not a directory"), "{why}");
    let why = config_error(src.path(), options(cache.path(), 2));
    assert!(why.contains("at least 4 blocks"), "{why}");
}

/// A tmpfs too small for the blocks (root only; skipped elsewhere).
struct SmallFs(tempfile::TempDir);

impl SmallFs {
    fn mount(bytes: u64) -> Option<SmallFs> {
        let dir = tempfile::tempdir().unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(SmallFs(dir))
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.0.path())
            .status();
    }
}

#[test]
fn a_full_disk_leaves_blocks_uncached_and_reads_exact() {
    let Some(small) = SmallFs::mount(5 * BLOCK) else {
        eprintln!("skipped: cannot mount a tmpfs (not root?)");
        return;
    };
    let src = tempfile::tempdir().unwrap();
    let files = tree(src.path());
    let (_b, fs) = mount(src.path(), options(&small.0.path().join("cache"), 64));
    read_everything(&fs, &files);
    let s = fs.stats();
    assert!(s.disk.write_errors > 0, "{s:?}");
    assert!(s.disk.written_blocks > 0, "{s:?}");
    assert_eq!(
        s.disk.written_blocks + s.disk.write_errors,
        total_blocks(&files),
        "{s:?}"
    );
    // Nothing half-written is left behind, and what was written is served.
    let on_disk = block_files(&small.0.path().join("cache"));
    assert_eq!(on_disk.len() as u64, s.disk.written_blocks);
    drop(fs);
    let (_b, fs) = mount(src.path(), options(&small.0.path().join("cache"), 64));
    read_everything(&fs, &files);
    let s2 = fs.stats();
    assert_eq!(s2.disk.hits, s.disk.written_blocks, "{s2:?}");
    assert_eq!(s2.disk.corrupt, 0);
}
