//! What a mount lists, from hostile sources: a directory's owners and permission bits kept
//! (a root-only file stays root-only), symbolic links followed (a Hugging Face snapshot)
//! with loops, dangling links and special files skipped, object-store folder markers and
//! file/directory name clashes served as the directory, and an empty prefix or an object
//! URL refused as a missing source.

use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use object_store::memory::InMemory;
use object_store::{ObjectStore, PutPayload};
use sluice_mount::{
    Backend, DirBackend, Entry, MountError, MountFs, MountOptions, ObjectBackend, ROOT_INO,
};
use sluice_remote::{ObjectUrl, RemoteOptions, RemoteStore};

fn options() -> MountOptions {
    MountOptions {
        block_bytes: 64 << 10,
        pool_bytes: 1 << 20,
        prefetch_threads: 1,
        ..MountOptions::default()
    }
}

fn lookup(fs: &MountFs, path: &str) -> std::io::Result<sluice_mount::Attr> {
    let mut attr = fs.getattr(ROOT_INO)?;
    for part in path.split('/').filter(|p| !p.is_empty()) {
        attr = fs.lookup(attr.ino, part)?;
    }
    Ok(attr)
}

fn names(fs: &MountFs, path: &str) -> Vec<(String, bool)> {
    let ino = lookup(fs, path).unwrap().ino;
    fs.readdir(ino)
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.is_dir))
        .collect()
}

fn read(fs: &MountFs, path: &str) -> std::io::Result<Vec<u8>> {
    let a = lookup(fs, path)?;
    fs.read(a.ino, 0, a.size as u32 + 10)
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn a_directory_source_keeps_its_owners_and_read_bits() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(root.join("secret.safetensors"), b"root only").unwrap();
    std::fs::write(root.join("open.safetensors"), b"for all").unwrap();
    std::fs::create_dir(root.join("private")).unwrap();
    std::fs::write(root.join("private/x"), b"x").unwrap();
    chmod(&root.join("secret.safetensors"), 0o600);
    chmod(&root.join("open.safetensors"), 0o664);
    chmod(&root.join("private"), 0o710);
    chmod(root, 0o751);
    let fs = MountFs::new(Arc::new(DirBackend::new(root).unwrap()), options()).unwrap();
    for (path, mode) in [
        ("", 0o551),
        ("secret.safetensors", 0o400),
        ("open.safetensors", 0o444),
        ("private", 0o510),
        (
            "private/x",
            std::fs::metadata(root.join("private/x")).unwrap().mode() & 0o555,
        ),
    ] {
        let meta = std::fs::metadata(root.join(path)).unwrap();
        let perm = lookup(&fs, path).unwrap().perm.expect(path);
        assert_eq!(
            (perm.mode, perm.uid, perm.gid),
            (mode, meta.uid(), meta.gid()),
            "{path}"
        );
    }
}

/// A Hugging Face cache: `snapshots/<rev>/<file> -> ../../blobs/<hash>`.
#[test]
fn symlinks_are_followed_and_loops_dangling_links_and_fifos_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path();
    let rev = cache.join("snapshots/abc123");
    std::fs::create_dir_all(&rev).unwrap();
    std::fs::create_dir_all(cache.join("blobs")).unwrap();
    std::fs::create_dir_all(cache.join("extra/nested")).unwrap();
    std::fs::write(cache.join("blobs/h1"), b"shard one").unwrap();
    std::fs::write(cache.join("blobs/h2"), b"{\"config\": 1}").unwrap();
    std::fs::write(cache.join("extra/nested/t.json"), b"tok").unwrap();
    let link =
        |target: &str, name: &str| std::os::unix::fs::symlink(target, rev.join(name)).unwrap();
    link("../../blobs/h1", "model.safetensors");
    link("../../blobs/h2", "config.json");
    link("../../extra", "extra");
    link("../../blobs/missing", "dangling.bin");
    link(".", "self");
    link("..", "up");
    link("loop-b", "loop-a");
    link("loop-a", "loop-b");
    let fifo =
        std::ffi::CString::new(rev.join("pipe").into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);

    let fs = MountFs::new(Arc::new(DirBackend::new(&rev).unwrap()), options()).unwrap();
    assert_eq!(
        names(&fs, ""),
        [
            ("config.json".to_string(), false),
            ("extra".to_string(), true),
            ("model.safetensors".to_string(), false),
            ("up".to_string(), true),
        ]
    );
    assert_eq!(read(&fs, "model.safetensors").unwrap(), b"shard one");
    assert_eq!(lookup(&fs, "model.safetensors").unwrap().size, 9);
    assert_eq!(read(&fs, "extra/nested/t.json").unwrap(), b"tok");
    // `up` is `snapshots/`, whose `abc123` is the root itself: a loop, skipped.
    assert!(names(&fs, "up").is_empty());
    // Pinned to the target: a blob changed since listing is an EIO, never other bytes.
    std::fs::write(cache.join("blobs/h2"), b"{\"config\": 2}").unwrap();
    assert_eq!(
        read(&fs, "config.json").unwrap_err().raw_os_error(),
        Some(libc::EIO)
    );
}

/// A backend that lists what it is given.
struct Listed(Vec<Entry>);

impl Backend for Listed {
    fn list(&self) -> std::io::Result<Vec<Entry>> {
        Ok(self.0.clone())
    }
    fn read(&self, entry: &Entry, offset: u64, dst: &mut [u8]) -> std::io::Result<usize> {
        let data = entry.path.as_bytes();
        let from = (offset as usize).min(data.len());
        let n = (data.len() - from).min(dst.len());
        dst[..n].copy_from_slice(&data[from..from + n]);
        Ok(n)
    }
    fn describe(&self) -> String {
        "listed".into()
    }
}

#[test]
fn a_name_both_file_and_directory_is_the_directory_in_any_order() {
    let f = |p: &str| Entry::file(p, p.len() as u64, "v");
    for entries in [
        vec![f("x"), f("x/y.safetensors"), Entry::dir("m"), f("m")],
        vec![f("x/y.safetensors"), f("x"), f("m"), Entry::dir("m")],
    ] {
        let fs = MountFs::new(Arc::new(Listed(entries)), options()).unwrap();
        assert_eq!(
            names(&fs, ""),
            [("m".to_string(), true), ("x".to_string(), true)]
        );
        assert_eq!(read(&fs, "x/y.safetensors").unwrap(), b"x/y.safetensors");
    }
}

fn bucket(keys: &[(&str, &[u8])]) -> Arc<InMemory> {
    let mem = Arc::new(InMemory::new());
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for (key, data) in keys {
        let path = object_store::path::Path::parse(key).unwrap();
        rt.block_on(mem.put(&path, PutPayload::from(data.to_vec())))
            .unwrap();
    }
    mem
}

fn object_fs(mem: &Arc<InMemory>, url: &str) -> Result<MountFs, MountError> {
    let url = ObjectUrl::parse(url).unwrap();
    let store = RemoteStore::with_store(&url, mem.clone(), &RemoteOptions::default());
    MountFs::new(
        Arc::new(ObjectBackend::new(Arc::new(store), url)),
        options(),
    )
}

/// Folder markers (`conf2/sub/`, empty, as the AWS console, s3fs and rclone make them;
/// listed without their `/`) and an object `x` beside `x/y`: both served as directories.
#[test]
fn folder_markers_and_clashing_objects_are_served_as_directories() {
    let mem = bucket(&[
        ("conf2/", b""),
        ("conf2/sub/", b""),
        ("conf2/sub/in.safetensors", b"inner"),
        ("conf2/x", b"a file"),
        ("conf2/x/y.safetensors", b"why"),
        ("conf2/top.bin", b"top"),
    ]);
    let fs = object_fs(&mem, "s3://models/conf2/").unwrap();
    assert_eq!(
        names(&fs, ""),
        [
            ("sub".to_string(), true),
            ("top.bin".to_string(), false),
            ("x".to_string(), true),
        ]
    );
    assert_eq!(read(&fs, "sub/in.safetensors").unwrap(), b"inner");
    assert_eq!(read(&fs, "x/y.safetensors").unwrap(), b"why");
    // Object stores have no owners: the mount's defaults.
    assert_eq!(lookup(&fs, "top.bin").unwrap().perm, None);
}

#[test]
fn an_empty_prefix_or_an_object_url_is_a_missing_source() {
    let mem = bucket(&[("m/model.safetensors", b"weights"), ("empty/", b"")]);
    let missing = |url: &str| match object_fs(&mem, url) {
        Err(MountError::Backend { source, .. }) if source.kind() == ErrorKind::NotFound => {
            source.to_string()
        }
        Err(e) => panic!("{url}: {e}"),
        Ok(_) => panic!("{url}: mounted"),
    };
    let said = missing("s3://models/nothing/");
    assert!(
        said.contains("no objects under s3://models/nothing/"),
        "{said}"
    );
    let said = missing("s3://models/nothing");
    assert!(
        said.contains("no objects under s3://models/nothing/"),
        "{said}"
    );
    let said = missing("s3://models/m/model.safetensors");
    assert!(
        said.contains("is an object (7 bytes), not a prefix"),
        "{said}"
    );
    match object_fs(&bucket(&[]), "s3://models/") {
        Err(MountError::Backend { source, .. }) => {
            assert!(
                source.to_string().contains("no objects under s3://models/"),
                "{source}"
            )
        }
        other => panic!("an empty bucket: {:?}", other.err()),
    }
    // A folder marker alone: nothing to serve either.
    let said = missing("s3://models/empty/");
    assert!(
        said.contains("no objects under s3://models/empty/"),
        "{said}"
    );
    assert!(object_fs(&mem, "s3://models/m").is_ok());
}

#[test]
fn a_file_rewritten_in_place_with_its_mtime_put_back_or_swapped_for_a_fifo_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.bin");
    std::fs::write(&path, vec![1u8; 4096]).unwrap();
    let backend = DirBackend::new(dir.path()).unwrap();
    let entry = backend
        .list()
        .unwrap()
        .into_iter()
        .find(|e| e.path == "a.bin")
        .unwrap();
    let mut buf = vec![0u8; 4096];
    assert_eq!(backend.read(&entry, 0, &mut buf).unwrap(), 4096);
    // The same size rewritten in place, and its mtime put back (`touch -r`, `cp -p`).
    let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
    sluice_testkit::clock_past_ctime_of(&path);
    std::fs::write(&path, vec![2u8; 4096]).unwrap();
    let f = std::fs::File::options().write(true).open(&path).unwrap();
    f.set_modified(mtime).unwrap();
    drop(f);
    let err = backend.read(&entry, 0, &mut buf).unwrap_err();
    assert!(
        err.to_string().contains("changed since it was listed"),
        "{err}"
    );
    // A FIFO in its place is refused at once, not waited on.
    std::fs::remove_file(&path).unwrap();
    sluice_testkit::mkfifo(&path);
    let err = backend.read(&entry, 0, &mut buf).unwrap_err();
    assert!(err.to_string().contains("FIFO"), "{err}");
}
