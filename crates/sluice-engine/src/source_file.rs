//! A file opened for high-throughput reads, with its direct-I/O decision.
//!
//! `DirectMode::Auto` decides per file, in order:
//! 1. `statx(STATX_DIOALIGN)` reports whether the file system supports
//!    O_DIRECT for this file at all (tmpfs, most FUSE and overlay set report 0);
//! 2. if most of the file already sits in the page cache (`cachestat`), a
//!    buffered read is a memory copy and beats the device, so stay buffered;
//! 3. otherwise open with O_DIRECT; EINVAL at open falls back to buffered.
//!
//! A direct read can still fail with EINVAL on file systems that accept the
//! open (some FUSE). The engines then call [`SourceFile::demote`], which flips
//! the file to its buffered descriptor for the rest of the load, and retry.
//! Every fallback is logged with the file's path and the reason.
//!
//! A source may also be an object in a remote store ([`SourceFile::remote`]): its
//! bytes come through a [`RangeRead`], it has no descriptor, and the engines
//! that run its reads are the blocking ones ([`crate::ThreadEngine`]).

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::OpenError;
use crate::page_cache;
use crate::regular_file::open_regular;

/// Whether reads bypass the page cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DirectMode {
    /// Probe each file; see the module docs.
    #[default]
    Auto,
    /// Require O_DIRECT; a file system without it is an error.
    On,
    /// Always read through the page cache.
    Off,
}

impl std::str::FromStr for DirectMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(DirectMode::Auto),
            "on" | "true" | "1" => Ok(DirectMode::On),
            "off" | "false" | "0" => Ok(DirectMode::Off),
            other => Err(format!(
                "direct mode must be auto, on or off, not {other:?}"
            )),
        }
    }
}

/// Fraction of a file that must already be cached before `Auto` prefers a
/// buffered read: at one half, copying from memory beats the device even
/// though the other half comes from disk through 128 KiB readahead.
const WARM_FRACTION_FOR_BUFFERED: f64 = 0.5;

/// Positional reads of something that is not a local file: an object in a
/// remote store. Implementations pin every read to the version the length
/// came from, so one load never mixes two versions' bytes.
pub trait RangeRead: Send + Sync + std::fmt::Debug {
    /// Fills `dst` with the bytes at `offset`. Returns how many were read:
    /// fewer than `dst.len()` only where the object ends first. A failure
    /// names the object and the range.
    fn read_at(&self, offset: u64, dst: &mut [u8]) -> std::io::Result<usize>;

    /// The reader as `Any`, so an engine that knows the concrete type can run its reads
    /// its own way (the loader's object engine, asynchronously).
    fn as_any(&self) -> &dyn std::any::Any;
}

/// Where a source's bytes come from.
#[derive(Debug)]
enum Backing {
    /// A local file: a buffered descriptor always, a direct one where the
    /// platform allows.
    Local {
        buffered: File,
        direct: Option<File>,
    },
    Remote(Arc<dyn RangeRead>),
}

/// An open file (or remote object) ready for the engines.
#[derive(Debug)]
pub struct SourceFile {
    path: PathBuf,
    len: u64,
    backing: Backing,
    /// Offset, length and address alignment O_DIRECT needs on this file.
    direct_align: usize,
    demoted: AtomicBool,
    why_buffered: Option<String>,
}

impl SourceFile {
    /// Opens `path` and decides its read mode.
    pub fn open(path: &Path, mode: DirectMode) -> Result<SourceFile, OpenError> {
        let buffered = open_regular(path, 0).map_err(|source| OpenError::Io {
            path: path.to_path_buf(),
            op: "open",
            source,
        })?;
        SourceFile::from_file(path, buffered, mode)
    }

    /// Takes `buffered`, a descriptor already open on `path` (the one its
    /// header was validated from), and decides its read mode. The direct
    /// descriptor is a reopening of that same file, never of whatever the
    /// path names now.
    pub fn from_file(
        path: &Path,
        buffered: File,
        mode: DirectMode,
    ) -> Result<SourceFile, OpenError> {
        let len = buffered
            .metadata()
            .map_err(|source| OpenError::Io {
                path: path.to_path_buf(),
                op: "stat",
                source,
            })?
            .len();
        let mut file = SourceFile {
            path: path.to_path_buf(),
            len,
            backing: Backing::Local {
                buffered,
                direct: None,
            },
            direct_align: 4096,
            demoted: AtomicBool::new(false),
            why_buffered: None,
        };
        match file.direct_plan(mode) {
            Ok(align) => file.open_direct(align, mode)?,
            Err(reason) if mode == DirectMode::On => {
                return Err(OpenError::DirectUnsupported {
                    path: path.to_path_buf(),
                    reason,
                });
            }
            Err(reason) => file.why_buffered = Some(reason),
        }
        if let Some(reason) = &file.why_buffered {
            tracing::info!(path = %path.display(), %reason, "reading buffered");
        }
        Ok(file)
    }

    /// A remote object of `len` bytes, shown as `path` (its URL), read
    /// through `reader`.
    pub fn remote(path: &Path, len: u64, reader: Arc<dyn RangeRead>) -> SourceFile {
        SourceFile {
            path: path.to_path_buf(),
            len,
            backing: Backing::Remote(reader),
            direct_align: 4096,
            demoted: AtomicBool::new(false),
            why_buffered: Some("an object in a remote store".into()),
        }
    }

    /// The reader of a remote object; `None` for a local file.
    pub fn remote_reader(&self) -> Option<&Arc<dyn RangeRead>> {
        match &self.backing {
            Backing::Remote(r) => Some(r),
            Backing::Local { .. } => None,
        }
    }

    pub fn is_remote(&self) -> bool {
        matches!(self.backing, Backing::Remote(_))
    }

    /// The alignment to use for O_DIRECT, or why this file stays buffered.
    fn direct_plan(&self, mode: DirectMode) -> Result<usize, String> {
        if mode == DirectMode::Off {
            return Err("direct=off".into());
        }
        let Backing::Local { buffered, .. } = &self.backing else {
            return Err("an object in a remote store".into());
        };
        let align = match page_cache::dio_alignment(buffered) {
            Some(0) => {
                return Err("the file system reports no O_DIRECT support (statx DIOALIGN)".into())
            }
            Some(align) => align.max(512),
            None => 4096,
        };
        if mode == DirectMode::Auto {
            if let Some(fraction) = page_cache::cached_fraction(buffered, self.len) {
                if fraction >= WARM_FRACTION_FOR_BUFFERED {
                    return Err(format!(
                        "{:.0}% already in the page cache",
                        fraction * 100.0
                    ));
                }
            }
        }
        Ok(align)
    }

    fn open_direct(&mut self, align: usize, mode: DirectMode) -> Result<(), OpenError> {
        match self.reopen_direct() {
            Ok(f) => {
                if let Backing::Local { direct, .. } = &mut self.backing {
                    *direct = Some(f);
                }
                self.direct_align = align;
                Ok(())
            }
            Err(e) if mode == DirectMode::On => Err(OpenError::DirectUnsupported {
                path: self.path.clone(),
                reason: format!("open(O_DIRECT) failed: {e}"),
            }),
            Err(e) => {
                self.why_buffered = Some(format!("open(O_DIRECT) failed: {e}"));
                Ok(())
            }
        }
    }

    /// The buffered descriptor's file opened again with O_DIRECT: through
    /// `/proc/self/fd`, which names the open file itself, or else by path,
    /// refused if the path now names another file (replaced since).
    fn reopen_direct(&self) -> std::io::Result<File> {
        use std::os::unix::fs::MetadataExt;
        let Backing::Local { buffered, .. } = &self.backing else {
            return Err(no_descriptor(&self.path));
        };
        let proc_path = PathBuf::from(format!("/proc/self/fd/{}", buffered.as_raw_fd()));
        if let Ok(f) = open_regular(&proc_path, libc::O_DIRECT) {
            return Ok(f);
        }
        let f = open_regular(&self.path, libc::O_DIRECT)?;
        let (ours, now) = (buffered.metadata()?, f.metadata()?);
        if (ours.dev(), ours.ino()) != (now.dev(), now.ino()) {
            return Err(std::io::Error::other(
                "the path names another file than the one opened (replaced since)",
            ));
        }
        Ok(f)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// File size in bytes now (it may have changed since opening). A remote
    /// object's reads are pinned to the version opened, so its length stays.
    pub fn current_len(&self) -> std::io::Result<u64> {
        match &self.backing {
            Backing::Local { buffered, .. } => Ok(buffered.metadata()?.len()),
            Backing::Remote(_) => Ok(self.len),
        }
    }

    /// File size in bytes when opened.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True while reads go through O_DIRECT.
    pub fn is_direct(&self) -> bool {
        matches!(
            &self.backing,
            Backing::Local {
                direct: Some(_),
                ..
            }
        ) && !self.demoted.load(Ordering::Relaxed)
    }

    /// Alignment of offsets, lengths and addresses for direct reads.
    pub fn direct_align(&self) -> usize {
        self.direct_align
    }

    /// The descriptor reads should use now; a remote object has none.
    pub fn read_fd(&self) -> std::io::Result<RawFd> {
        match &self.backing {
            Backing::Local {
                direct: Some(f), ..
            } if !self.demoted.load(Ordering::Relaxed) => Ok(f.as_raw_fd()),
            Backing::Local { buffered, .. } => Ok(buffered.as_raw_fd()),
            Backing::Remote(_) => Err(no_descriptor(&self.path)),
        }
    }

    /// The buffered descriptor (for fadvise, residency queries and
    /// mappings); `None` for a remote object, which has no page cache.
    pub fn buffered_fd(&self) -> Option<RawFd> {
        match &self.backing {
            Backing::Local { buffered, .. } => Some(buffered.as_raw_fd()),
            Backing::Remote(_) => None,
        }
    }

    /// Why this file is read buffered, if it is.
    pub fn buffered_reason(&self) -> Option<&str> {
        if self.demoted.load(Ordering::Relaxed) {
            return Some("a direct read failed with EINVAL");
        }
        self.why_buffered.as_deref()
    }

    /// Switches to buffered reads after a direct read was refused. Returns
    /// true if this call made the switch (so the caller logs once).
    pub fn demote(&self, cause: &std::io::Error) -> bool {
        let has_direct = matches!(
            &self.backing,
            Backing::Local {
                direct: Some(_),
                ..
            }
        );
        if !has_direct || self.demoted.swap(true, Ordering::Relaxed) {
            return false;
        }
        tracing::warn!(path = %self.path.display(), error = %cause, "direct read refused; falling back to buffered reads");
        true
    }
}

fn no_descriptor(path: &Path) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        format!(
            "{}: an object in a remote store has no file descriptor",
            path.display()
        ),
    )
}
