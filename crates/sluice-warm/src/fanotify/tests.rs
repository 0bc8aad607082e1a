//! The watch over real files (root), and its parsers over hand-made bytes.

use super::process_tree::{descends_from, parent_in_stat};
use super::*;
use sluice_testkit::require_root;
use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::time::Duration;

fn model(dir: &Path) -> PathBuf {
    let path = dir.join("w.bin");
    std::fs::write(&path, vec![7u8; 4 << 20]).unwrap();
    path
}

/// Reads from a child process (events from our own pid are ignored).
fn child_reads(path: &Path, offset: u64, len: u64) {
    let status = std::process::Command::new("dd")
        .arg(format!("if={}", path.display()))
        .arg("of=/dev/null")
        .arg("bs=1M")
        .arg(format!("skip={}", offset >> 20))
        .arg(format!("count={}", len >> 20))
        .arg("status=none")
        .status()
        .expect("dd runs");
    assert!(status.success());
}

#[test]
#[ignore = "needs root for fanotify: make test runs it as root (--include-ignored)"]
fn pre_content_reports_read_ranges_and_answers_every_event() {
    require_root();
    let Some(dir) = sluice_testkit::disk_tempdir() else {
        return;
    };
    let path = model(dir.path());
    let watch = match Watch::open(std::slice::from_ref(&path), Some(Level::PreContent), 64) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    child_reads(&path, 1 << 20, 2 << 20);
    let mut ranges = Vec::new();
    while let Some(e) = watch.recv_timeout(Duration::from_millis(500)) {
        assert_eq!(e.path, path);
        assert_eq!(e.kind, AccessKind::Read);
        ranges.push((e.offset, e.len));
    }
    assert!(!ranges.is_empty(), "no events");
    let first = ranges.iter().map(|r| r.0).min().unwrap();
    let end = ranges.iter().map(|r| r.0 + r.1).max().unwrap();
    assert!(first <= 1 << 20 && end >= 3 << 20, "{ranges:?}");
    let s = &watch.stats;
    assert_eq!(
        s.answered.load(Ordering::Relaxed),
        s.events.load(Ordering::Relaxed)
    );
    // Our own reads are answered and ignored: no deadlock, no event.
    let mut f = std::fs::File::open(&path).unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    f.read_exact(&mut buf).unwrap();
    assert!(watch.recv_timeout(Duration::from_millis(200)).is_none());
    assert!(s.own.load(Ordering::Relaxed) >= 1);
}

#[test]
#[ignore = "needs root for fanotify: make test runs it as root (--include-ignored)"]
fn open_level_reports_opens_and_tmpfs_refuses_pre_content() {
    require_root();
    let Some(dir) = sluice_testkit::disk_tempdir() else {
        return;
    };
    let path = model(dir.path());
    let watch = Watch::open(std::slice::from_ref(&path), Some(Level::Open), 64).unwrap();
    child_reads(&path, 0, 1 << 20);
    let e = watch
        .recv_timeout(Duration::from_secs(2))
        .expect("an open event");
    assert_eq!((e.kind, e.path.clone()), (AccessKind::Open, path.clone()));
    assert!(e.pid > 0 && e.pid != std::process::id() as i32);
    if Path::new("/dev/shm").is_dir() {
        let shm = tempfile::tempdir_in("/dev/shm").unwrap();
        let f = model(shm.path());
        let err = pre_content_supported(&f).unwrap_err();
        assert!(matches!(err, WarmError::Unsupported { .. }), "{err}");
    }
}

#[test]
fn the_service_tree_is_followed_through_parents() {
    // 10 launched 11, which launched 12; 20 is unrelated; 30 was
    // orphaned to init; 40's parent is gone.
    let parents = HashMap::from([(11, 10), (12, 11), (20, 5), (5, 1), (30, 1), (40, 41)]);
    let parent_of = |p: i32| parents.get(&p).copied();
    assert_eq!(descends_from(12, 10, parent_of), Some(true));
    assert_eq!(descends_from(11, 10, parent_of), Some(true));
    assert_eq!(descends_from(20, 10, parent_of), Some(false));
    assert_eq!(descends_from(30, 10, parent_of), Some(false));
    assert_eq!(descends_from(40, 10, parent_of), None);
    // A cycle (pids reused mid-walk) ends.
    let cycle = |p: i32| Some(if p == 50 { 51 } else { 50 });
    assert_eq!(descends_from(50, 10, cycle), Some(false));

    // Real processes: this one's child is in its tree, this one is not
    // in its child's.
    let root = Arc::new(AtomicI32::new(0));
    let mut tree = ProcessTree::new(root.clone());
    let me = std::process::id() as i32;
    assert!(tree.contains(me), "no root yet: everyone counts");
    let mut child = std::process::Command::new("sleep")
        .arg("5")
        .spawn()
        .unwrap();
    let kid = child.id() as i32;
    root.store(me, Ordering::SeqCst);
    assert!(tree.contains(kid));
    root.store(kid, Ordering::SeqCst);
    assert!(
        !tree.contains(me),
        "the verdicts of the old root were forgotten"
    );
    assert!(tree.contains(kid));
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn parent_pids_parse_from_stat_lines_with_odd_names() {
    assert_eq!(parent_in_stat("123 (python3) S 77 123 123 0"), Some(77));
    assert_eq!(parent_in_stat("9 (a b) c) (d) R 42 9 9"), Some(42));
    assert_eq!(parent_in_stat("9 (no closing S 42"), None);
    assert_eq!(parent_in_stat("9 (x) S"), None);
    assert_eq!(parent_in_stat("9 (x) S notanumber"), None);
    assert_eq!(parent_in_stat(""), None);
}

/// The bytes of one event: metadata with the given lengths, then `info`.
fn event_bytes(event_len: u32, metadata_len: u16, info: &[u8]) -> Vec<u8> {
    // SAFETY: the struct is plain integers; all zeroes is valid.
    let mut meta: libc::fanotify_event_metadata = unsafe { std::mem::zeroed() };
    meta.event_len = event_len;
    meta.vers = libc::FANOTIFY_METADATA_VERSION;
    meta.metadata_len = metadata_len;
    meta.fd = -1;
    meta.pid = 42;
    // SAFETY: viewing the plain struct as its bytes.
    let head = unsafe {
        std::slice::from_raw_parts(
            (&meta as *const libc::fanotify_event_metadata).cast::<u8>(),
            METADATA_LEN,
        )
    };
    let mut out = head.to_vec();
    out.extend_from_slice(info);
    out
}

fn range_record(offset: u64, count: u64) -> Vec<u8> {
    let mut rec = vec![FAN_EVENT_INFO_TYPE_RANGE, 0, 24, 0, 0, 0, 0, 0];
    rec.extend_from_slice(&offset.to_ne_bytes());
    rec.extend_from_slice(&count.to_ne_bytes());
    rec
}

/// Walks `buf`, returning each event's info range (if any) and the
/// damaged count.
fn walk(buf: &[u8]) -> (Vec<Option<(u64, u64)>>, u64) {
    let mut seen = Vec::new();
    let damaged = for_each_event(buf, |meta, info| {
        assert_eq!(meta.pid, 42);
        seen.push(parse_range(info));
    });
    (seen, damaged)
}

#[test]
fn event_buffers_with_inconsistent_lengths_are_walked_without_slicing_past_them() {
    let full = (METADATA_LEN + 24) as u32;
    let meta = METADATA_LEN as u16;
    let good = event_bytes(full, meta, &range_record(4096, 8192));
    assert_eq!(walk(&good), (vec![Some((4096, 8192))], 0));
    let two = [good.clone(), good.clone()].concat();
    assert_eq!(walk(&two).0.len(), 2);

    // metadata_len past event_len: handed over (to be answered), with
    // no info records, and the walk goes on to the next event.
    let long_meta = event_bytes(full, meta + 100, &range_record(1, 2));
    assert_eq!(
        walk(&[long_meta, good.clone()].concat()),
        (vec![None, Some((4096, 8192))], 1)
    );
    // metadata_len below the struct: the same.
    let short_meta = event_bytes(full, 4, &range_record(1, 2));
    assert_eq!(walk(&short_meta), (vec![None], 1));

    // event_len past the buffer, below the struct, or zero (which would
    // loop forever): nothing is handed over from there on.
    let past = event_bytes(full + 4096, meta, &range_record(1, 2));
    assert_eq!(
        walk(&[good.clone(), past].concat()),
        (vec![Some((4096, 8192))], 1)
    );
    for bad_len in [0, 8, METADATA_LEN as u32 - 1] {
        let short = event_bytes(bad_len, meta, &range_record(1, 2));
        assert_eq!(walk(&short), (vec![], 1), "event_len {bad_len}");
    }
    // A buffer cut inside the metadata or inside the info.
    assert_eq!(walk(&good[..METADATA_LEN - 1]), (vec![], 1));
    assert_eq!(walk(&good[..METADATA_LEN + 10]), (vec![], 1));
    assert_eq!(walk(&[]), (vec![], 0));
}

#[test]
fn an_answer_counts_only_when_the_kernel_takes_it() {
    let (read_end, write_end) = {
        let mut fds = [0; 2];
        // SAFETY: pipe writes two descriptors into the array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both are fresh descriptors we own.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    };
    // SAFETY: the struct is plain integers; all zeroes is valid.
    let mut meta: libc::fanotify_event_metadata = unsafe { std::mem::zeroed() };
    meta.fd = 7;
    meta.pid = 42;
    let stats = WatchStats::default();
    answer(write_end.as_raw_fd(), &meta, &stats);
    assert_eq!(stats.answered.load(Ordering::Relaxed), 1);
    assert_eq!(stats.unanswered.load(Ordering::Relaxed), 0);
    // The read end refuses writes (EBADF): not answered, and counted.
    answer(read_end.as_raw_fd(), &meta, &stats);
    assert_eq!(stats.answered.load(Ordering::Relaxed), 1);
    assert_eq!(stats.unanswered.load(Ordering::Relaxed), 1);
}

#[test]
fn range_records_parse_and_garbage_does_not() {
    let mut rec = vec![FAN_EVENT_INFO_TYPE_RANGE, 0, 24, 0, 0, 0, 0, 0];
    rec.extend_from_slice(&4096u64.to_ne_bytes());
    rec.extend_from_slice(&8192u64.to_ne_bytes());
    assert_eq!(parse_range(&rec), Some((4096, 8192)));
    assert_eq!(parse_range(&rec[..10]), None);
    assert_eq!(
        parse_range(&[6, 0, 0, 0]),
        None,
        "zero length must not loop"
    );
    assert_eq!(parse_range(&[]), None);
}
