//! [`StoreSteps`]: every file-system step a store takes, one place where tests fail them.
//!
//! A save is a sequence of steps: create, write and rename each chunk file, sync them,
//! write each rank's marker and the manifest (each an atomic write of five steps: create,
//! write, sync, rename, sync the directory), remove what a failed save left. The store
//! calls [`StoreSteps::before`] ahead of each; [`RealSteps`] lets every one through, and
//! `FailAt` (the `testing` feature) fails the n-th, so a test walks a save through a
//! failure at every step and checks that the previous checkpoint still loads and the new
//! one is not visible.

use std::path::Path;
use std::sync::Arc;

/// One kind of step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Creating a chunk's temporary file (and its fan-out directory).
    ChunkCreate,
    /// Writing a chunk's bytes.
    ChunkWrite,
    /// Renaming a chunk into place.
    ChunkRename,
    /// Making written chunks durable (`syncfs`).
    Sync,
    /// A step of an atomic write (a marker or a manifest): create, write, sync, rename,
    /// sync the directory.
    Atomic(&'static str),
    /// Removing a file (a failed save's chunks, a collected checkpoint).
    Remove,
}

/// What a store calls before each file-system step.
pub trait StoreSteps: Send + Sync {
    /// `Err` fails the step (as the OS would), naming nothing: the caller adds the path.
    fn before(&self, step: Step, path: &Path) -> std::io::Result<()>;
}

/// The steps as they are: nothing fails on purpose.
pub struct RealSteps;

impl StoreSteps for RealSteps {
    fn before(&self, _step: Step, _path: &Path) -> std::io::Result<()> {
        Ok(())
    }
}

/// The default steps, shared.
pub fn real() -> Arc<dyn StoreSteps> {
    Arc::new(RealSteps)
}

/// An atomic write (`sluice_engine::atomic_write`) whose five steps go through `steps`.
pub fn atomic_write(
    steps: &dyn StoreSteps,
    path: &Path,
    bytes: &[u8],
) -> Result<(), sluice_engine::OsError> {
    let mut adapter = Adapter(steps);
    sluice_engine::atomic_write_steps(&mut adapter, path, |out| out.write_all(bytes))
}

struct Adapter<'a>(&'a dyn StoreSteps);

impl sluice_engine::AtomicSteps for Adapter<'_> {
    fn create(&mut self, path: &Path) -> std::io::Result<std::fs::File> {
        self.0.before(Step::Atomic("create"), path)?;
        sluice_engine::RealSteps.create(path)
    }

    fn write(
        &mut self,
        file: &mut std::fs::File,
        fill: &mut sluice_engine::Fill<'_>,
    ) -> std::io::Result<()> {
        self.0.before(Step::Atomic("write"), Path::new(""))?;
        sluice_engine::RealSteps.write(file, fill)
    }

    fn sync_file(&mut self, file: &std::fs::File) -> std::io::Result<()> {
        self.0.before(Step::Atomic("sync"), Path::new(""))?;
        sluice_engine::RealSteps.sync_file(file)
    }

    fn rename(&mut self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.0.before(Step::Atomic("rename"), to)?;
        sluice_engine::RealSteps.rename(from, to)
    }

    fn sync_dir(&mut self, dir: &Path) -> std::io::Result<()> {
        self.0.before(Step::Atomic("sync directory"), dir)?;
        sluice_engine::RealSteps.sync_dir(dir)
    }
}

#[cfg(any(test, feature = "testing"))]
pub use testing::FailAt;

#[cfg(any(test, feature = "testing"))]
mod testing {
    use std::path::Path;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    use super::{Step, StoreSteps};

    /// Fails the `n`-th step (counting from 0) with `EIO`, and counts every step, so a
    /// test can first count a clean run's steps and then fail each in turn. Steps of kind
    /// [`Step::Remove`] are counted apart and never failed: they are a failed save's
    /// clean-up, which must not hide the first failure.
    pub struct FailAt {
        fail_at: Option<usize>,
        seen: AtomicUsize,
        log: Mutex<Vec<Step>>,
    }

    impl FailAt {
        /// Fails step `n`; `None` fails nothing (a counting run).
        pub fn new(n: Option<usize>) -> FailAt {
            FailAt {
                fail_at: n,
                seen: AtomicUsize::new(0),
                log: Mutex::new(Vec::new()),
            }
        }

        /// Steps seen so far (removals left out).
        pub fn steps(&self) -> Vec<Step> {
            self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
        }
    }

    impl StoreSteps for FailAt {
        fn before(&self, step: Step, _path: &Path) -> std::io::Result<()> {
            if step == Step::Remove {
                return Ok(());
            }
            self.log
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(step);
            let i = self.seen.fetch_add(1, Ordering::SeqCst);
            if Some(i) == self.fail_at {
                return Err(std::io::Error::from_raw_os_error(libc::EIO));
            }
            Ok(())
        }
    }
}
