//! Every engine reads the same bytes as a plain `std::fs::read`, including
//! direct reads on ext4, buffered fallback on tmpfs, short tails and faults.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use sluice_engine::{
    BufferPool, BufferPoolConfig, DirectMode, Fault, FaultyEngine, IoEngine, Next, OpSource,
    ReadOp, ReadTarget, SourceFile, SyncEngine, ThreadEngine, UringEngine,
};

const CHUNK: usize = 256 << 10;

fn write_file(dir: &Path, len: usize) -> (std::path::PathBuf, Vec<u8>) {
    let path = dir.join("data.bin");
    let bytes = sluice_testkit::random_bytes(len, len as u64);
    std::fs::File::create(&path)
        .unwrap()
        .write_all(&bytes)
        .unwrap();
    (path, bytes)
}

/// Reads a whole file in aligned chunks into one buffer.
struct WholeFile {
    file: Arc<SourceFile>,
    buf: Arc<sluice_engine::PooledBuf>,
    next_offset: u64,
}

impl OpSource for WholeFile {
    fn next_op(&mut self, _may_block: bool) -> Next {
        let aligned_len = self.buf.len() as u64;
        if self.next_offset >= aligned_len {
            return Next::Done;
        }
        let len = CHUNK.min((aligned_len - self.next_offset) as usize);
        let op = ReadOp {
            file: Arc::clone(&self.file),
            offset: self.next_offset,
            len,
            buf: Arc::clone(&self.buf) as Arc<dyn ReadTarget>,
            buf_offset: self.next_offset as usize,
            token: self.next_offset,
        };
        self.next_offset += len as u64;
        Next::Op(op)
    }
}

fn read_with(engine: &dyn IoEngine, path: &Path, mode: DirectMode) -> (Vec<u8>, bool, Vec<String>) {
    let file = Arc::new(SourceFile::open(path, mode).unwrap());
    let aligned = (file.len() as usize).next_multiple_of(4096);
    let pool = BufferPool::new(BufferPoolConfig::unbounded());
    let buf = Arc::new(pool.acquire(aligned).unwrap());
    let mut source = WholeFile {
        file: Arc::clone(&file),
        buf: Arc::clone(&buf),
        next_offset: 0,
    };
    let mut total = 0usize;
    let mut errors = Vec::new();
    engine
        .run(&mut source, &mut |_op, outcome| match outcome {
            Ok(n) => total += n,
            Err(e) => errors.push(e.to_string()),
        })
        .unwrap();
    let direct = file.is_direct();
    drop(source);
    let data = buf.as_slice()[..total.min(file.len() as usize)].to_vec();
    (data, direct, errors)
}

fn engines() -> Vec<Box<dyn IoEngine>> {
    let mut all: Vec<Box<dyn IoEngine>> =
        vec![Box::new(SyncEngine), Box::new(ThreadEngine::new(4))];
    if sluice_engine::probe_io_uring().is_ok() {
        all.push(Box::new(UringEngine::new(8)));
    } else {
        eprintln!("io_uring unavailable here; skipping its engine");
    }
    all
}

#[test]
fn every_engine_reads_identical_bytes_buffered_and_direct() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (path, expected) = write_file(dir.path(), 3 * CHUNK + 12_345);
    for engine in engines() {
        for mode in [DirectMode::Off, DirectMode::Auto] {
            let (got, _, errors) = read_with(engine.as_ref(), &path, mode);
            assert!(
                errors.is_empty(),
                "{:?} {mode:?}: {errors:?}",
                engine.kind()
            );
            assert!(
                got == expected,
                "{:?} {mode:?} read different bytes",
                engine.kind()
            );
        }
    }
}

#[test]
fn direct_on_reads_identical_bytes_where_supported() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (path, expected) = write_file(dir.path(), 2 * CHUNK + 777);
    if let Err(e) = SourceFile::open(&path, DirectMode::On) {
        eprintln!("no O_DIRECT on this file system ({e}); skipping");
        return;
    }
    for engine in engines() {
        let (got, direct, errors) = read_with(engine.as_ref(), &path, DirectMode::On);
        assert!(errors.is_empty(), "{errors:?}");
        assert!(direct, "{:?} should still be direct", engine.kind());
        assert!(got == expected);
    }
}

/// A ramfs mount: a file system with no O_DIRECT at all. (tmpfs accepts
/// O_DIRECT since Linux 6.6, so it no longer exercises the fallback.) Needs
/// root; `None` where mounting is not allowed.
struct Ramfs {
    dir: tempfile::TempDir,
}

impl Ramfs {
    fn mount() -> Option<Ramfs> {
        let dir = tempfile::tempdir().ok()?;
        let status = std::process::Command::new("mount")
            .args(["-t", "ramfs", "ramfs"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .ok()?;
        if !status.success() {
            eprintln!("cannot mount ramfs (not root?); skipping");
            return None;
        }
        Some(Ramfs { dir })
    }
}

impl Drop for Ramfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.dir.path())
            .status();
    }
}

#[test]
fn file_system_without_direct_io_falls_back_to_buffered() {
    let Some(ramfs) = Ramfs::mount() else { return };
    let (path, expected) = write_file(ramfs.dir.path(), CHUNK + 3);
    let file = SourceFile::open(&path, DirectMode::Auto).unwrap();
    assert!(!file.is_direct());
    assert!(file.buffered_reason().is_some());
    for engine in engines() {
        let (got, direct, errors) = read_with(engine.as_ref(), &path, DirectMode::Auto);
        assert!(errors.is_empty(), "{errors:?}");
        assert!(!direct);
        assert!(got == expected);
    }
}

#[test]
fn direct_on_is_an_error_where_unsupported() {
    let Some(ramfs) = Ramfs::mount() else { return };
    let (path, _) = write_file(ramfs.dir.path(), 100);
    let err = SourceFile::open(&path, DirectMode::On).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("data.bin") && msg.contains("direct"), "{msg}");
}

#[test]
fn cold_file_is_read_direct_in_auto_mode() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (path, _) = write_file(dir.path(), 2 * CHUNK);
    let probe = std::fs::File::open(&path).unwrap();
    probe.sync_all().unwrap();
    sluice_engine::page_cache::drop_range(std::os::fd::AsRawFd::as_raw_fd(&probe), 0, 0);
    let file = SourceFile::open(&path, DirectMode::Auto).unwrap();
    if sluice_engine::page_cache::dio_alignment(&probe) == Some(0) {
        eprintln!("no O_DIRECT here; skipping");
        return;
    }
    assert!(file.is_direct(), "{:?}", file.buffered_reason());
}

#[test]
fn warm_file_is_read_buffered_in_auto_mode() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (path, _) = write_file(dir.path(), 2 * CHUNK);
    let _ = std::fs::read(&path).unwrap();
    let file = SourceFile::open(&path, DirectMode::Auto).unwrap();
    if sluice_engine::page_cache::cached_fraction(&std::fs::File::open(&path).unwrap(), 1).is_none()
    {
        eprintln!("no cachestat here; skipping");
        return;
    }
    assert!(!file.is_direct());
    assert!(file.buffered_reason().unwrap().contains("page cache"));
}

#[test]
fn faulty_engine_reports_each_injected_fault() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (path, expected) = write_file(dir.path(), 4 * CHUNK);
    let engine = FaultyEngine::new(vec![
        Fault::FailWith {
            op: 1,
            errno: libc::EIO,
        },
        Fault::ShortRead { op: 2 },
        Fault::Corrupt { op: 3 },
    ]);
    let file = Arc::new(SourceFile::open(&path, DirectMode::Off).unwrap());
    let pool = BufferPool::new(BufferPoolConfig::unbounded());
    let buf = Arc::new(pool.acquire(4 * CHUNK).unwrap());
    let mut source = WholeFile {
        file,
        buf: Arc::clone(&buf),
        next_offset: 0,
    };
    let mut outcomes = Vec::new();
    engine
        .run(&mut source, &mut |op, outcome| {
            outcomes.push((op.token, outcome.map_err(|e| e.raw_os_error())))
        })
        .unwrap();
    drop(source);
    assert_eq!(outcomes[0], (0, Ok(CHUNK)));
    assert_eq!(outcomes[1], (CHUNK as u64, Err(Some(libc::EIO))));
    assert_eq!(outcomes[2], (2 * CHUNK as u64, Ok(CHUNK / 2)));
    assert_eq!(outcomes[3], (3 * CHUNK as u64, Ok(CHUNK)));
    assert_ne!(
        buf.as_slice()[3 * CHUNK],
        expected[3 * CHUNK],
        "corrupt fault flips the first byte"
    );
    assert_eq!(engine.ops_seen(), 4);
}

#[test]
fn open_names_the_missing_file() {
    let err = SourceFile::open(
        Path::new("/nonexistent/sluice/x.safetensors"),
        DirectMode::Auto,
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("/nonexistent/sluice/x.safetensors"),
        "{err}"
    );
}
