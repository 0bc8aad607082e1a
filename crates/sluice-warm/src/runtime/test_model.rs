//! Model directories for the runtime's tests.

use std::path::{Path, PathBuf};

/// A two-file model (a: 8 MiB, b: 4 MiB, plus a hidden file), synced and
/// dropped from the page cache (clean pages only can be dropped), so
/// prefetch has something to do.
pub fn model(dir: &Path) -> PathBuf {
    let m = dir.join("model");
    std::fs::create_dir(&m).unwrap();
    for (name, len) in [("a.safetensors", 8usize << 20), ("b.safetensors", 4 << 20)] {
        let path = m.join(name);
        let f = std::fs::File::create(&path).unwrap();
        std::io::Write::write_all(&mut &f, &vec![1u8; len]).unwrap();
        f.sync_all().unwrap();
        sluice_engine::page_cache::dontneed(&f, &path, 0, u64::MAX).unwrap();
    }
    std::fs::write(m.join(".hidden"), b"x").unwrap();
    m
}

/// A Hugging Face cache: `snapshots/rev/*.safetensors` are symlinks to
/// `blobs/*`. Returns the snapshot directory.
pub fn hf_layout(dir: &Path) -> PathBuf {
    let m = model(dir);
    let blobs = dir.join("blobs");
    let snap = dir.join("snapshots/rev");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::rename(&m, &blobs).unwrap();
    for name in ["a.safetensors", "b.safetensors"] {
        std::os::unix::fs::symlink(format!("../../blobs/{name}"), snap.join(name)).unwrap();
    }
    snap
}
