//! [`MountFs`]: the mount's file system without FUSE: an inode table built from the
//! backend's listing, and `lookup`, `getattr`, `readdir`, `open`, `read` and `release`
//! over the shared [`BlockPool`], with per-file [`Streams`] driving a prefetch pool. An
//! open may instead be passed through to the disk tier's whole local copy ([`Opened`]).
//! The FUSE adapter (`fuse.rs`) only translates; tests drive this directly.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use sluice_engine::AlignedBuf;

use crate::backend::{Backend, Perm};
use crate::disk_cache::{DiskCache, DiskStats};
use crate::error::MountError;
use crate::lock;
use crate::pool::{Block, BlockPool, Claim, PoolStats};
use crate::streams::Prefetch;

mod options;
mod tree;

pub use options::MountOptions;
use tree::{tree, FileNode, Node};

/// The root directory's inode.
pub const ROOT_INO: u64 = 1;

/// A node's kind, size and permissions, what `getattr` answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub is_dir: bool,
    /// The source's owner and read/execute bits; `None` for the mount's defaults.
    pub perm: Option<Perm>,
}

/// What `readdir` lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    pub name: String,
    pub is_dir: bool,
}

/// What [`MountFs::release_handle`] closed: a passed-through handle or a cached one, and
/// whether it was the file's last of that kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Released {
    pub backed: bool,
    pub last: bool,
}

/// How an open handle reads.
#[derive(Debug)]
pub enum Opened {
    /// Through the mount: the pool, the disk tier, prefetch.
    Cached(u64),
    /// From this whole, checked local copy in the disk tier, which the kernel may read
    /// directly (FUSE passthrough); pinned until the handle is released.
    Backed(u64, std::fs::File),
}

impl Opened {
    pub fn fh(&self) -> u64 {
        match self {
            Opened::Cached(fh) | Opened::Backed(fh, _) => *fh,
        }
    }
}

/// The bytes of a read: a range of one pooled block (kept alive while the reply is
/// sent), or a copy where the read spans blocks.
pub enum ReadData {
    Block(Block, std::ops::Range<usize>),
    Owned(Vec<u8>),
}

impl std::ops::Deref for ReadData {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ReadData::Block(bytes, range) => &bytes.as_slice()[range.clone()],
            ReadData::Owned(v) => v,
        }
    }
}

/// Counters of a mount, for `sluice mount --stats` and tests.
#[derive(Clone, Copy, Debug, Default)]
pub struct MountStats {
    pub pool: PoolStats,
    /// Bytes asked of the backend, and in how many reads.
    pub backend_reads: u64,
    pub backend_bytes: u64,
    pub backend_errors: u64,
    pub prefetch_queued: u64,
    /// Block reads that waited on a prefetch still in flight.
    pub waited_on_prefetch: u64,
    /// Blocks a read had to fetch itself (no prefetch had asked for them).
    pub demand_fetches: u64,
    /// The disk tier's counters (all zero without one).
    pub disk: DiskStats,
    /// Opens handed a local copy whose backing file the kernel then refused (read through
    /// the mount instead); `disk.passthrough_opens` counts them too.
    pub passthrough_refused: u64,
}

struct Job {
    ino: u64,
    block: u64,
    cancel: Arc<AtomicBool>,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    shutdown: bool,
}

struct Inner {
    backend: Arc<dyn Backend>,
    nodes: Vec<Node>,
    /// Inodes of `.safetensors` files in name order.
    shards: Vec<u64>,
    pool: BlockPool,
    disk: Option<DiskCache>,
    opts: MountOptions,
    queue: Mutex<Queue>,
    work: Condvar,
    backend_reads: AtomicU64,
    backend_bytes: AtomicU64,
    backend_errors: AtomicU64,
    prefetch_queued: AtomicU64,
    /// Prefetch jobs being fetched now.
    running: AtomicUsize,
    /// Reads that waited on a prefetch in flight, and reads that fetched a block nobody
    /// had asked for (prefetch missed it).
    waited: AtomicU64,
    demand_fetches: AtomicU64,
}

/// The mount's file system. Dropping it stops the prefetch threads.
pub struct MountFs {
    inner: Arc<Inner>,
    workers: Vec<JoinHandle<()>>,
    next_fh: AtomicU64,
    /// Open handles: inode, and whether passed through.
    handles: Mutex<std::collections::HashMap<u64, (u64, bool)>>,
    refused: AtomicU64,
}

fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

impl MountFs {
    /// Lists the backend once, opens the disk tier if asked, and starts the prefetch
    /// threads.
    pub fn new(backend: Arc<dyn Backend>, opts: MountOptions) -> Result<MountFs, MountError> {
        opts.validate()?;
        let disk = match &opts.disk_cache {
            Some(d) => Some(DiskCache::open(d, &backend.describe(), opts.block_bytes)?),
            None => None,
        };
        let listed = backend.list().map_err(|source| MountError::Backend {
            root: backend.describe(),
            source,
        })?;
        let (nodes, shards) = tree(listed, &opts);
        let inner = Arc::new(Inner {
            backend,
            nodes,
            shards,
            pool: BlockPool::new(opts.pool_bytes),
            disk,
            queue: Mutex::new(Queue::default()),
            work: Condvar::new(),
            backend_reads: AtomicU64::new(0),
            backend_bytes: AtomicU64::new(0),
            backend_errors: AtomicU64::new(0),
            prefetch_queued: AtomicU64::new(0),
            running: AtomicUsize::new(0),
            waited: AtomicU64::new(0),
            demand_fetches: AtomicU64::new(0),
            opts,
        });
        let mut workers = Vec::new();
        for i in 0..inner.opts.prefetch_threads {
            let inner = Arc::clone(&inner);
            let handle = std::thread::Builder::new()
                .name(format!("sluice-prefetch-{i}"))
                .spawn(move || inner.prefetch_worker())
                .map_err(MountError::Thread)?;
            workers.push(handle);
        }
        Ok(MountFs {
            inner,
            workers,
            next_fh: AtomicU64::new(1),
            handles: Mutex::new(std::collections::HashMap::new()),
            refused: AtomicU64::new(0),
        })
    }

    pub fn options(&self) -> &MountOptions {
        &self.inner.opts
    }

    pub fn lookup(&self, parent: u64, name: &str) -> io::Result<Attr> {
        match self.inner.node(parent)? {
            Node::Dir { children, .. } => {
                let ino = *children.get(name).ok_or_else(|| errno(libc::ENOENT))?;
                self.getattr(ino)
            }
            Node::File(_) => Err(errno(libc::ENOTDIR)),
        }
    }

    pub fn getattr(&self, ino: u64) -> io::Result<Attr> {
        Ok(match self.inner.node(ino)? {
            Node::Dir { perm, .. } => Attr {
                ino,
                size: 0,
                is_dir: true,
                perm: *perm,
            },
            Node::File(f) => Attr {
                ino,
                size: f.entry.size,
                is_dir: false,
                perm: f.entry.perm,
            },
        })
    }

    pub fn readdir(&self, ino: u64) -> io::Result<Vec<DirEntry>> {
        match self.inner.node(ino)? {
            Node::Dir { children, .. } => Ok(children
                .iter()
                .map(|(name, &child)| DirEntry {
                    ino: child,
                    name: name.clone(),
                    is_dir: matches!(self.inner.nodes[(child - 1) as usize], Node::Dir { .. }),
                })
                .collect()),
            Node::File(_) => Err(errno(libc::ENOTDIR)),
        }
    }

    /// Opens a file for reading through the mount; a `.safetensors` file's first open
    /// starts prefetching its start at once, without waiting for two sequential reads.
    pub fn open(&self, ino: u64) -> io::Result<u64> {
        self.open_handle(ino, false).map(|o| o.fh())
    }

    /// Opens a file: passed through ([`Opened::Backed`]) when `backing` is allowed (or
    /// another handle of the file passes through), the mount's options allow it, the disk
    /// tier holds every block of the file checked, and no handle reads the file through
    /// the mount; else read through the mount.
    pub fn open_handle(&self, ino: u64, backing: bool) -> io::Result<Opened> {
        let inner = &self.inner;
        let file = inner.file(ino)?;
        let mut opens = lock(&file.opens);
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        // While one handle passes through, every open of the file must (the kernel keeps
        // one I/O mode per inode, and refuses a cached open beside a passed-through one).
        if (backing || opens.backed > 0) && inner.opts.passthrough && opens.cached == 0 {
            let copy = inner
                .disk
                .as_ref()
                .and_then(|d| d.pin_complete(&file.entry));
            if let Some(copy) = copy {
                opens.backed += 1;
                lock(&self.handles).insert(fh, (ino, true));
                return Ok(Opened::Backed(fh, copy));
            }
        }
        opens.cached += 1;
        let first = opens.cached == 1;
        drop(opens);
        if first && file.safetensors {
            let prefetch = lock(&file.streams).arm(0, file.entry.size);
            if let Some(p) = prefetch {
                inner.enqueue(ino, p);
            }
        }
        lock(&self.handles).insert(fh, (ino, false));
        Ok(Opened::Cached(fh))
    }

    /// The kernel refused the backing file of handle `fh` (not root, or a cache directory
    /// it cannot stack on): releases it and opens the file through the mount instead.
    pub fn backing_refused(&self, ino: u64, fh: u64) -> io::Result<Opened> {
        self.refused.fetch_add(1, Ordering::Relaxed);
        self.release_handle(ino, fh)?;
        self.open_handle(ino, false)
    }

    /// Closes a handle from [`MountFs::open`] (tests that do not track handles).
    pub fn release(&self, ino: u64) -> io::Result<()> {
        let file = self.inner.file(ino)?;
        self.release_cached(file);
        Ok(())
    }

    /// Closes handle `fh` of `ino`. A file's last cached close cancels its queued
    /// prefetch; its last passed-through close unpins its local copy.
    pub fn release_handle(&self, ino: u64, fh: u64) -> io::Result<Released> {
        let file = self.inner.file(ino)?;
        let backed = match lock(&self.handles).remove(&fh) {
            Some((owner, backed)) if owner == ino => backed,
            _ => false,
        };
        if !backed {
            let last = self.release_cached(file);
            return Ok(Released { backed, last });
        }
        if let Some(d) = &self.inner.disk {
            d.unpin(&file.entry);
        }
        let mut opens = lock(&file.opens);
        opens.backed = opens.backed.saturating_sub(1);
        Ok(Released {
            backed,
            last: opens.backed == 0,
        })
    }

    /// True when that was the last cached handle.
    fn release_cached(&self, file: &FileNode) -> bool {
        let mut opens = lock(&file.opens);
        if opens.cached == 1 {
            lock(&file.streams).clear();
        }
        opens.cached = opens.cached.saturating_sub(1);
        opens.cached == 0
    }

    /// Whether the next open of `ino` would be passed through (waiting, as an open does,
    /// for the last blocks being written), with no handle reading it through the mount.
    /// The kernel's own cached copy of such a file is then redundant.
    pub fn passes_through(&self, ino: u64) -> bool {
        let inner = &self.inner;
        let Ok(file) = inner.file(ino) else {
            return false;
        };
        inner.opts.passthrough
            && inner
                .disk
                .as_ref()
                .is_some_and(|d| d.is_complete(&file.entry))
            && lock(&file.opens).cached == 0
    }

    /// Up to `size` bytes of file `ino` at `offset`: short only at the end of the file.
    /// A failed backend read is an `EIO` for this read only; the mount stays up.
    pub fn read(&self, ino: u64, offset: u64, size: u32) -> io::Result<Vec<u8>> {
        self.read_data(ino, offset, size).map(|d| d.to_vec())
    }

    /// [`MountFs::read`] without a copy where the range lies in one block (nearly every
    /// read: the kernel asks at most 1 MiB, blocks are 8 MiB): the reply is sent straight
    /// from the pooled block.
    pub fn read_data(&self, ino: u64, offset: u64, size: u32) -> io::Result<ReadData> {
        let inner = &self.inner;
        let file = inner.file(ino)?;
        let len = file.entry.size.saturating_sub(offset).min(size as u64);
        let block = inner.opts.block_bytes;
        let mut parts: Vec<(Block, usize, usize)> = Vec::new();
        let mut at = offset;
        while at < offset + len {
            let b = at / block;
            let bytes = inner.block(ino, file, b)?;
            let from = (at - b * block) as usize;
            let to = ((offset + len - b * block) as usize).min(bytes.len());
            if from >= to {
                tracing::error!(file = %file.entry.path, block = b, "block shorter than the file");
                return Err(errno(libc::EIO));
            }
            at += (to - from) as u64;
            parts.push((bytes, from, to));
        }
        let out = match parts.len() {
            0 => ReadData::Owned(Vec::new()),
            1 => {
                let (bytes, from, to) = parts.pop().expect("one part");
                ReadData::Block(bytes, from..to)
            }
            _ => {
                let mut out = Vec::with_capacity(len as usize);
                for (bytes, from, to) in &parts {
                    out.extend_from_slice(&bytes.as_slice()[*from..*to]);
                }
                ReadData::Owned(out)
            }
        };
        let prefetch = lock(&file.streams).on_read(offset, len.max(1), file.entry.size);
        if let Some(p) = prefetch {
            let passed_middle = p.blocks.end * block > file.entry.size / 2;
            inner.enqueue(ino, p);
            if passed_middle {
                inner.look_ahead(file);
            }
        }
        Ok(out)
    }

    pub fn stats(&self) -> MountStats {
        let i = &self.inner;
        MountStats {
            pool: i.pool.stats(),
            backend_reads: i.backend_reads.load(Ordering::Relaxed),
            backend_bytes: i.backend_bytes.load(Ordering::Relaxed),
            backend_errors: i.backend_errors.load(Ordering::Relaxed),
            prefetch_queued: i.prefetch_queued.load(Ordering::Relaxed),
            waited_on_prefetch: i.waited.load(Ordering::Relaxed),
            demand_fetches: i.demand_fetches.load(Ordering::Relaxed),
            disk: i.disk.as_ref().map(DiskCache::stats).unwrap_or_default(),
            passthrough_refused: self.refused.load(Ordering::Relaxed),
        }
    }

    /// Waits until no prefetch is queued or running (tests and benchmarks).
    pub fn quiesce(&self) {
        loop {
            let q = lock(&self.inner.queue);
            if q.jobs.is_empty() && self.inner.busy() == 0 {
                return;
            }
            drop(q);
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
}

impl Drop for MountFs {
    fn drop(&mut self) {
        lock(&self.inner.queue).shutdown = true;
        self.inner.work.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl Inner {
    fn node(&self, ino: u64) -> io::Result<&Node> {
        ino.checked_sub(1)
            .and_then(|i| self.nodes.get(i as usize))
            .ok_or_else(|| errno(libc::ENOENT))
    }

    fn file(&self, ino: u64) -> io::Result<&FileNode> {
        match self.node(ino)? {
            Node::File(f) => Ok(f),
            Node::Dir { .. } => Err(errno(libc::EISDIR)),
        }
    }

    fn busy(&self) -> usize {
        self.running.load(Ordering::Acquire)
    }

    /// Block `b` of a file, from the pool or fetched now (waiting on a fetch in flight).
    fn block(&self, ino: u64, file: &FileNode, b: u64) -> io::Result<Block> {
        let len = self.block_len(file, b);
        match self.pool.claim((ino, b), len) {
            Claim::Ready(bytes) => Ok(bytes),
            Claim::Wait(p) => {
                self.waited.fetch_add(1, Ordering::Relaxed);
                p.wait().map_err(|e| self.read_failed(file, b, e))
            }
            Claim::Fetch(p) => {
                self.demand_fetches.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(file = %file.entry.path, block = b, "demand fetch (not prefetched)");
                let (result, fresh) = self.fetch(file, b, len);
                let block = self
                    .pool
                    .complete((ino, b), &p, result)
                    .map_err(|e| self.read_failed(file, b, e))?;
                if fresh {
                    self.keep_on_disk(file, b, &block);
                }
                Ok(block)
            }
        }
    }

    fn read_failed(&self, file: &FileNode, b: u64, e: io::Error) -> io::Error {
        tracing::warn!(file = %file.entry.path, block = b, error = %e, "read failed; EIO for this read");
        errno(libc::EIO)
    }

    fn block_len(&self, file: &FileNode, b: u64) -> u64 {
        let block = self.opts.block_bytes;
        file.entry.size.saturating_sub(b * block).min(block)
    }

    /// Block `b`'s bytes from the disk tier, or else from the backend; `true` with bytes
    /// that came from the backend (for the disk tier to keep).
    fn fetch(&self, file: &FileNode, b: u64, len: u64) -> (io::Result<AlignedBuf>, bool) {
        let mut buf = match self.pool.buffer(len) {
            Ok(buf) => buf,
            Err(e) => return (Err(e), false),
        };
        let offset = b * self.opts.block_bytes;
        if let Some(disk) = &self.disk {
            if disk.read(&file.entry, offset, buf.as_mut_slice()) {
                return (Ok(buf), false);
            }
        }
        (self.fetch_backend(file, b, len, buf), true)
    }

    fn fetch_backend(
        &self,
        file: &FileNode,
        b: u64,
        len: u64,
        mut buf: AlignedBuf,
    ) -> io::Result<AlignedBuf> {
        self.backend_reads.fetch_add(1, Ordering::Relaxed);
        let got = self
            .backend
            .read(&file.entry, b * self.opts.block_bytes, buf.as_mut_slice())
            .inspect_err(|_| {
                self.backend_errors.fetch_add(1, Ordering::Relaxed);
            })?;
        self.backend_bytes.fetch_add(got as u64, Ordering::Relaxed);
        if got as u64 != len {
            self.backend_errors.fetch_add(1, Ordering::Relaxed);
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: {} bytes at block {b}, expected {len} (truncated since listed?)",
                    file.entry.path, got
                ),
            ));
        }
        Ok(buf)
    }

    /// Writes a block fetched from the backend to the disk tier, if there is one.
    fn keep_on_disk(&self, file: &FileNode, b: u64, block: &Block) {
        if let Some(disk) = &self.disk {
            disk.write(&file.entry, b * self.opts.block_bytes, block.as_slice());
        }
    }

    fn enqueue(&self, ino: u64, p: Prefetch) {
        let mut q = lock(&self.queue);
        for block in p.blocks {
            if self.pool.contains((ino, block)) {
                continue;
            }
            q.jobs.push_back(Job {
                ino,
                block,
                cancel: Arc::clone(&p.cancel),
            });
            self.prefetch_queued.fetch_add(1, Ordering::Relaxed);
        }
        drop(q);
        self.work.notify_all();
    }

    /// Starts the next shards' first blocks, once per file.
    fn look_ahead(&self, file: &FileNode) {
        let Some(rank) = file.shard_rank else { return };
        if file.looked_ahead.swap(true, Ordering::AcqRel) {
            return;
        }
        // A small start: the lookahead shares the queue with the current file's prefetch,
        // and must not hold it up; the next file's own cursor takes over once it is read.
        let window = self.opts.streams.min_window;
        for &next in self
            .shards
            .iter()
            .skip(rank + 1)
            .take(self.opts.lookahead_files)
        {
            let Ok(f) = self.file(next) else { continue };
            let blocks = f.entry.size.div_ceil(self.opts.block_bytes).min(window);
            self.enqueue(
                next,
                Prefetch {
                    blocks: 0..blocks,
                    cancel: Arc::new(AtomicBool::new(false)),
                },
            );
        }
    }

    fn prefetch_worker(&self) {
        loop {
            let job = {
                let mut q = lock(&self.queue);
                loop {
                    if q.shutdown {
                        return;
                    }
                    if let Some(job) = q.jobs.pop_front() {
                        self.running.fetch_add(1, Ordering::AcqRel);
                        break job;
                    }
                    q = self.work.wait(q).unwrap_or_else(|p| p.into_inner());
                }
            };
            self.prefetch_one(&job);
            self.running.fetch_sub(1, Ordering::AcqRel);
        }
    }

    fn prefetch_one(&self, job: &Job) {
        if job.cancel.load(Ordering::Relaxed) {
            return;
        }
        let Ok(file) = self.file(job.ino) else { return };
        let len = self.block_len(file, job.block);
        let Some(p) = self.pool.claim_prefetch((job.ino, job.block), len) else {
            return;
        };
        let (result, fresh) = self.fetch(file, job.block, len);
        match self.pool.complete((job.ino, job.block), &p, result) {
            Ok(block) if fresh => self.keep_on_disk(file, job.block, &block),
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(file = %file.entry.path, block = job.block, error = %e, "prefetch failed")
            }
        }
    }
}
