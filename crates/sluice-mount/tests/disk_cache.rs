//! The mount's disk tier, driven through `MountFs` over a directory behind the
//! fault-injecting backend: a restarted mount reads from disk and not the backend; a
//! corrupt block, a hole, a wrong hash or a damaged table is fetched again, never served;
//! the budget holds; a changed file misses; a full disk leaves blocks uncached with exact
//! reads; the directory is refused when it holds other files or another mount uses it; and
//! a file held whole and checked is handed out for passthrough, pinned while open.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sluice_mount::{
    DirBackend, DiskCacheOptions, FaultyBackend, MountError, MountFs, MountOptions, Opened,
    StreamConfig, ROOT_INO,
};

const BLOCK: u64 = 64 << 10;
/// What one block costs the budget at most in these tests (its bytes; a file's table of
/// hashes is 56 bytes and 32 per block).
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
        passthrough: true,
    }
}

fn mount(src: &Path, opts: MountOptions) -> (Arc<FaultyBackend>, MountFs) {
    let backend = Arc::new(FaultyBackend::new(
        Arc::new(DirBackend::new(src).unwrap()),
        Duration::ZERO,
    ));
    // A test that runs `mount(8)` forks this process: until the child execs, it holds a
    // copy of every descriptor, the previous mount's cache lock included, so a remount in
    // that window finds the directory busy. The lock is ours; wait that window out.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let fs = loop {
        match MountFs::new(backend.clone(), opts.clone()) {
            Err(e)
                if e.to_string()
                    .contains("another mount uses this cache directory")
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20))
            }
            other => break other.unwrap(),
        }
    };
    (backend, fs)
}

fn ino_of(fs: &MountFs, path: &str) -> u64 {
    let mut ino = ROOT_INO;
    for part in path.split('/') {
        ino = fs.lookup(ino, part).unwrap().ino;
    }
    ino
}

/// File `ino`'s bytes, read through the mount (an open handle) to its end.
fn read_whole(fs: &MountFs, ino: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let got = fs.read(ino, out.len() as u64, 100_000).unwrap();
        if got.is_empty() {
            return out;
        }
        out.extend_from_slice(&got);
    }
}

/// Reads every file through the mount, checking its bytes, then waits for prefetch.
fn read_everything(fs: &MountFs, files: &[(String, Vec<u8>)]) {
    for (name, data) in files {
        let ino = ino_of(fs, name);
        fs.open(ino).unwrap();
        assert!(&read_whole(fs, ino) == data, "{name}: wrong bytes");
        fs.release(ino).unwrap();
    }
    fs.quiesce();
}

/// The cache's files in its subdirectories (`ext` "data" or "sums"), in name order.
fn cache_files(cache: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for sub in std::fs::read_dir(cache).unwrap() {
        let sub = sub.unwrap().path();
        if sub.is_dir() {
            for f in std::fs::read_dir(&sub).unwrap() {
                let f = f.unwrap().path();
                if f.extension().is_some_and(|e| e == ext) {
                    out.push(f);
                }
            }
        }
    }
    out.sort();
    out
}

/// The cache's data and table for a file of `len` bytes (data files are as long as theirs).
fn files_of(cache: &Path, len: u64) -> (PathBuf, PathBuf) {
    let data = cache_files(cache, "data")
        .into_iter()
        .find(|p| std::fs::metadata(p).unwrap().len() == len)
        .expect("a data file of that length");
    let sums = data.with_extension("sums");
    (data, sums)
}

/// Bytes the cache takes on disk: data files' allocated blocks, tables' lengths.
fn on_disk(cache: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let data: u64 = cache_files(cache, "data")
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().blocks() * 512)
        .sum();
    let sums: u64 = cache_files(cache, "sums")
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    data + sums
}

fn patch(path: &Path, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset).unwrap();
}

fn blocks_of(data: &[u8]) -> u64 {
    (data.len() as u64).div_ceil(BLOCK)
}

fn total_blocks(files: &[(String, Vec<u8>)]) -> u64 {
    files
        .iter()
        .map(|(_, d)| (d.len() as u64).div_ceil(BLOCK))
        .sum()
}

/// A source tree and an empty cache directory.
fn fresh() -> (tempfile::TempDir, tempfile::TempDir, Vec<(String, Vec<u8>)>) {
    let src = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let files = tree(src.path());
    (src, cache, files)
}

/// A source tree and a cache directory that one mount already filled and left.
fn filled(cache_blocks: u64) -> (tempfile::TempDir, tempfile::TempDir, Vec<(String, Vec<u8>)>) {
    let (src, cache, files) = fresh();
    let (_b, fs) = mount(src.path(), options(cache.path(), cache_blocks));
    read_everything(&fs, &files);
    drop(fs);
    (src, cache, files)
}

#[test]
fn a_restarted_mount_reads_from_disk_not_the_backend() {
    let (src, cache, files) = fresh();
    let (_b, fs) = mount(src.path(), options(cache.path(), 64));
    read_everything(&fs, &files);
    let first = fs.stats();
    drop(fs);
    assert_eq!(first.disk.written_blocks, total_blocks(&files), "{first:?}");
    assert_eq!(first.disk.blocks, total_blocks(&files), "{first:?}");
    assert_eq!(cache_files(cache.path(), "data").len(), files.len());
    assert_eq!(cache_files(cache.path(), "sums").len(), files.len());

    let (backend, fs) = mount(src.path(), options(cache.path(), 64));
    read_everything(&fs, &files);
    let second = fs.stats();
    assert_eq!(second.backend_reads, 0, "{second:?} {:?}", backend.reads());
    assert_eq!(second.disk.hits, total_blocks(&files), "{second:?}");
    assert_eq!(second.disk.written_blocks, 0);
}

#[test]
fn a_corrupt_block_a_hole_a_wrong_hash_or_a_bad_table_is_fetched_again_not_served() {
    let (src, cache, files) = filled(64);
    let big = files[1].1.len() as u64;
    let (data, sums) = files_of(cache.path(), big);
    // In the model: one bit flipped in block 1; block 3's hash replaced by block 4's; block 5
    // zeroed (as a hole reads). In a.bin: its table's magic broken, so the whole file goes.
    let mut byte = [0u8; 1];
    {
        use std::os::unix::fs::FileExt;
        std::fs::File::open(&data)
            .unwrap()
            .read_exact_at(&mut byte, BLOCK + 1000)
            .unwrap();
    }
    patch(&data, BLOCK + 1000, &[byte[0] ^ 0x10]);
    let table = std::fs::read(&sums).unwrap();
    patch(&sums, 56 + 32 * 3, &table[56 + 32 * 4..56 + 32 * 5]);
    patch(&data, 5 * BLOCK, &vec![0u8; BLOCK as usize]);
    let (_, small_sums) = files_of(cache.path(), files[0].1.len() as u64);
    patch(&small_sums, 0, b"X");

    let (_backend, fs) = mount(src.path(), options(cache.path(), 64));
    let small_blocks = (files[0].1.len() as u64).div_ceil(BLOCK);
    assert_eq!(fs.stats().disk.blocks, total_blocks(&files) - small_blocks);
    read_everything(&fs, &files);
    let s = fs.stats();
    assert_eq!(s.disk.corrupt, 3, "{s:?}");
    assert_eq!(s.backend_reads, 3 + small_blocks, "{s:?}");
    assert_eq!(
        s.disk.hits,
        total_blocks(&files) - 3 - small_blocks,
        "{s:?}"
    );
    // Refetched blocks are written again, whole.
    assert_eq!(s.disk.written_blocks, 3 + small_blocks, "{s:?}");
    drop(fs);
    let (_backend, fs) = mount(src.path(), options(cache.path(), 64));
    read_everything(&fs, &files);
    assert_eq!(fs.stats().backend_reads, 0);
    assert_eq!(fs.stats().disk.corrupt, 0);
}

#[test]
fn the_disk_cache_never_exceeds_its_budget() {
    let (src, cache, files) = fresh();
    let budget_blocks = 5;
    let (_b, fs) = mount(src.path(), options(cache.path(), budget_blocks));
    let budget = budget_blocks * (BLOCK + HEADER);
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| read_everything(&fs, &files));
        }
    });
    // Evicted blocks are holes: what the files take on disk is what the index counts
    // (give or take the 4 KiB a file's short last block takes).
    let slack = 2 * 4096;
    let within_budget = |fs: &MountFs| {
        let st = fs.stats();
        assert!(st.disk.held_bytes <= budget, "{st:?}");
        let used = on_disk(cache.path());
        assert!(used <= budget + slack, "{used} on disk, budget {budget}");
        assert!(used + slack >= st.disk.held_bytes, "{used} on disk, {st:?}");
    };
    within_budget(&fs);
    drop(fs);
    // Three readers may leave nothing to evict (a file being written, or open for
    // passthrough, is pinned): blocks are then declined, never over budget. Read one file
    // at a time from a fresh pool: `a.bin` is held, idle, when the larger file needs room.
    let one_at_a_time = MountOptions {
        prefetch_threads: 1,
        lookahead_files: 0,
        ..options(cache.path(), budget_blocks)
    };
    let (_b, fs) = mount(src.path(), one_at_a_time);
    for file in files.chunks(1) {
        read_everything(&fs, file);
    }
    assert!(fs.stats().disk.evicted > 0, "{:?}", fs.stats());
    within_budget(&fs);
    drop(fs);
    // A restart with a smaller budget evicts down to it at once.
    let (_b, fs) = mount(src.path(), options(cache.path(), 4));
    let st = fs.stats();
    assert!(st.disk.held_bytes <= 4 * (BLOCK + HEADER), "{st:?}");
    assert!(st.disk.blocks <= 4, "{st:?}");
    assert!(on_disk(cache.path()) <= 4 * (BLOCK + HEADER) + slack);
}

#[test]
fn a_changed_file_misses_its_old_blocks() {
    let (src, cache, mut files) = filled(64);
    // Same name and size, other bytes: a new version (with a later time).
    sluice_testkit::clock_past_ctime_of(&src.path().join(&files[0].0));
    files[0].1 = pattern(files[0].1.len(), 7);
    std::fs::write(src.path().join(&files[0].0), &files[0].1).unwrap();
    let (_b, fs) = mount(src.path(), options(cache.path(), 64));
    read_everything(&fs, &files);
    let s = fs.stats();
    assert_eq!(s.backend_reads, blocks_of(&files[0].1), "{s:?}");
}

#[test]
fn stray_files_are_removed_at_start() {
    let (src, cache, files) = filled(64);
    let sub = cache_files(cache.path(), "data")[0]
        .parent()
        .unwrap()
        .to_path_buf();
    // A torn temporary file, an older layout's block, a data file with no table, and a
    // table whose data file is gone.
    let strays = [
        sub.join("00112233445566778899aabbccddeeff.tmp.1.1"),
        sub.join("00112233445566778899aabbccddeeff.blk"),
        sub.join("ffeeddccbbaa99887766554433221100.data"),
    ];
    for p in &strays {
        std::fs::write(p, b"half a block").unwrap();
    }
    let (data, sums) = files_of(cache.path(), files[0].1.len() as u64);
    std::fs::remove_file(&data).unwrap();
    let (_b, fs) = mount(src.path(), options(cache.path(), 64));
    for p in strays.iter().chain([&sums]) {
        assert!(!p.exists(), "{} left", p.display());
    }
    read_everything(&fs, &files);
    let s = fs.stats();
    assert_eq!(s.backend_reads, blocks_of(&files[0].1), "{s:?}");
    assert_eq!(s.disk.corrupt, 0, "{s:?}");
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
    // Nothing half-written is counted, and what was written is served.
    assert_eq!(s.disk.blocks, s.disk.written_blocks, "{s:?}");
    assert!(on_disk(&small.0.path().join("cache")) <= 5 * BLOCK);
    drop(fs);
    let (_b, fs) = mount(src.path(), options(&small.0.path().join("cache"), 64));
    read_everything(&fs, &files);
    let s2 = fs.stats();
    assert_eq!(s2.disk.hits, s.disk.written_blocks, "{s2:?}");
    assert_eq!(s2.disk.corrupt, 0);
}

fn read_all(file: std::fs::File) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    let mut file = file;
    file.read_to_end(&mut out).unwrap();
    out
}

fn backed(fs: &MountFs, ino: u64) -> (u64, std::fs::File) {
    match fs.open_handle(ino, true).unwrap() {
        Opened::Backed(fh, file) => (fh, file),
        Opened::Cached(_) => panic!("not passed through: {:?}", fs.stats()),
    }
}

fn through_mount(fs: &MountFs, ino: u64, backing: bool) -> u64 {
    match fs.open_handle(ino, backing).unwrap() {
        Opened::Cached(fh) => fh,
        Opened::Backed(..) => panic!("passed through"),
    }
}

#[test]
fn a_file_held_whole_and_checked_is_passed_through() {
    let (src, cache, files) = fresh();
    let (_b, fs) = mount(src.path(), options(cache.path(), 64));
    let ino = ino_of(&fs, &files[1].0);
    // Not cached yet: read through the mount.
    let fh = through_mount(&fs, ino, true);
    assert!(!fs.passes_through(ino));
    let released = fs.release_handle(ino, fh).unwrap();
    assert!(!released.backed && released.last, "{released:?}");
    read_everything(&fs, &files);
    // Now whole: the kernel's cached copy may go, unless a handle still reads through.
    assert!(fs.passes_through(ino));
    let fh = fs.open(ino).unwrap();
    assert!(!fs.passes_through(ino));
    fs.release_handle(ino, fh).unwrap();

    let (fh, file) = backed(&fs, ino);
    assert!(
        read_all(file) == files[1].1,
        "wrong bytes in the local copy"
    );
    assert_eq!(fs.stats().disk.passthrough_opens, 1);
    // The kernel keeps one mode per inode: while one handle passes through, so do the
    // others, even where passthrough was not asked for; the last close says so.
    let (fh2, _) = match fs.open_handle(ino, false).unwrap() {
        Opened::Backed(fh, f) => (fh, f),
        Opened::Cached(_) => panic!("mixed modes on one inode"),
    };
    let released = fs.release_handle(ino, fh2).unwrap();
    assert!(released.backed && !released.last, "{released:?}");
    let released = fs.release_handle(ino, fh).unwrap();
    assert!(released.backed && released.last, "{released:?}");
    // And while one reads through the mount, no open passes through.
    let cached = through_mount(&fs, ino, false);
    let other = through_mount(&fs, ino, true);
    fs.release_handle(ino, other).unwrap();
    fs.release_handle(ino, cached).unwrap();
    backed(&fs, ino);
    drop(fs);

    // Off by option.
    let (_b, fs) = mount(
        src.path(),
        MountOptions {
            passthrough: false,
            ..options(cache.path(), 64)
        },
    );
    read_everything(&fs, &files);
    through_mount(&fs, ino, true);
    assert!(!fs.passes_through(ino));
    assert_eq!(fs.stats().disk.passthrough_opens, 0);
}

#[test]
fn a_restarted_mount_passes_through_only_after_checking_every_block() {
    let (src, cache, files) = filled(64);
    let (data, _) = files_of(cache.path(), files[1].1.len() as u64);
    patch(
        &data,
        2 * BLOCK + 7,
        &[files[1].1[(2 * BLOCK + 7) as usize] ^ 1],
    );
    let (_b, fs) = mount(src.path(), options(cache.path(), 64));
    let ino = ino_of(&fs, &files[1].0);
    // Held whole, but not checked by this process (and one block is bad).
    let fh = through_mount(&fs, ino, true);
    fs.release_handle(ino, fh).unwrap();
    read_everything(&fs, &files);
    assert_eq!(fs.stats().disk.corrupt, 1);
    let (_, file) = backed(&fs, ino);
    assert!(
        read_all(file) == files[1].1,
        "the refetched block is not in the copy"
    );
}

#[test]
fn a_passed_through_file_is_never_evicted() {
    let (src, cache, files) = fresh();
    let c = vec![("c.bin".to_string(), pattern((4 * BLOCK) as usize, 3))];
    std::fs::write(src.path().join("c.bin"), &c[0].1).unwrap();
    // Room for the model (13 blocks and its table), not for a.bin beside it.
    let budget_blocks = 14;
    let budget = budget_blocks * (BLOCK + HEADER);
    // A pool of 4 blocks, so reading a.bin again goes to the disk tier and the backend.
    let opts = MountOptions {
        pool_bytes: 4 * BLOCK,
        ..options(cache.path(), budget_blocks)
    };
    let (_b, fs) = mount(src.path(), opts);
    read_everything(&fs, &files[1..]);
    let model = ino_of(&fs, &files[1].0);
    let model_blocks = (files[1].1.len() as u64).div_ceil(BLOCK);
    let (fh, file) = backed(&fs, model);
    read_everything(&fs, &files[..1]);
    let s = fs.stats();
    assert!(s.disk.held_bytes <= budget, "{s:?}");
    assert_eq!(s.disk.evicted, 0, "{s:?}");
    assert!(read_all(file) == files[1].1, "a pinned copy changed");
    assert!(fs.release_handle(model, fh).unwrap().last);
    // Unpinned, it makes room like any other. Read a file neither the pool nor the disk has
    // seen (a.bin's second read may come whole from the pool, depending on what prefetch
    // left there): its 4 blocks need more room than a.bin's blocks on disk can give, so
    // some of the model's must go.
    let a_blocks = s.disk.blocks - model_blocks;
    read_everything(&fs, &c);
    let s = fs.stats();
    assert!(s.disk.held_bytes <= budget, "{s:?}");
    assert!(s.disk.evicted > a_blocks, "{s:?}");
    // No longer held whole, so no longer passed through.
    through_mount(&fs, model, true);
}

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn caching_many_files_holds_no_descriptor_per_file() {
    let src = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    // More files than a default descriptor limit (1024) could hold two each.
    let files: Vec<(String, Vec<u8>)> = (0..600)
        .map(|i| (format!("f{i:04}.bin"), pattern(1000 + i, i as u64)))
        .collect();
    for (name, data) in &files {
        std::fs::write(src.path().join(name), data).unwrap();
    }
    let (_b, fs) = mount(src.path(), options(cache.path(), 1000));
    let before = open_descriptors();
    read_everything(&fs, &files);
    let s = fs.stats();
    assert_eq!(s.disk.written_blocks, files.len() as u64, "{s:?}");
    assert_eq!(s.disk.write_errors, 0, "{s:?}");
    // Other tests' threads open files too: allow a few, not one per cached file.
    let after = open_descriptors();
    assert!(
        after < before + 50,
        "{before} descriptors before, {after} after"
    );
}

#[test]
fn a_copy_written_by_another_process_after_its_check_is_not_passed_through() {
    let (src, cache, files) = fresh();
    let (_b, fs) = mount(src.path(), options(cache.path(), 64));
    let (name, data) = &files[1];
    let ino = ino_of(&fs, name);
    read_everything(&fs, &files);
    let (fh, _) = backed(&fs, ino);
    fs.release_handle(ino, fh).unwrap();
    // Someone flips a byte of the checked local copy while the mount runs.
    let (copy, _) = files_of(cache.path(), data.len() as u64);
    sluice_testkit::clock_past_ctime_of(&copy);
    patch(&copy, BLOCK * 3 + 5, &[data[(BLOCK * 3 + 5) as usize] ^ 1]);
    let fh = through_mount(&fs, ino, true);
    assert!(
        &read_whole(&fs, ino) == data,
        "wrong bytes through the mount"
    );
    fs.release_handle(ino, fh).unwrap();
    assert_eq!(
        fs.stats().disk.passthrough_opens,
        1,
        "only the open before the change"
    );
}
