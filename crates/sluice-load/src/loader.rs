//! The load plane's entry point: open a checkpoint once, then stream it or
//! load it whole.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sluice_engine::{
    page_size, select_engine, BufferPool, BufferPoolConfig, DirectMode, EngineChoice, IoEngine,
    LentMemory, ReadTarget, SourceFile,
};
use sluice_formats::Checkpoint;

use crate::checkpoint_reader::ReadOptions;
use crate::config::{LoadConfig, DEFAULT_STREAM_MEMORY_LIMIT};
use crate::error::LoadError;
use crate::object_engine::ObjectEngine;
use crate::open_shards::open_shard_files;
use crate::read_plan::{PlanOptions, ReadPlan};
use crate::shard_file::ShardFile;
use crate::tensor_stream::{DriverInput, LoadedWindow, TensorStream};

/// Fewest windows a stream's memory limit should hold: one the consumer is
/// copying out of, and three in flight to keep the device queue full.
const STREAM_WINDOWS_IN_LIMIT: u64 = 4;

/// [`Loader::stream_into`]: neighbouring tensors are read together through a
/// pooled buffer while their run stays under this many bytes; a larger tensor
/// is read straight into its destination. 4 MiB: one chunk, so a remote store
/// pays one round trip for a run of small tensors (norms, biases), and the
/// copy out of the buffer touches a small share of a model's bytes.
pub const INTO_GATHER_BYTES: usize = 4 << 20;

/// How each file of a load is being read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileMode {
    pub path: std::path::PathBuf,
    pub direct: bool,
    /// Why the file is read buffered, when it is.
    pub reason: Option<String>,
}

/// What a load did, for logs, the CLI and benchmarks.
#[derive(Clone, Debug)]
pub struct LoadStats {
    pub engine: &'static str,
    pub files: Vec<FileMode>,
    pub tensors: usize,
    pub tensor_bytes: u64,
    pub read_bytes: u64,
    pub windows: usize,
    pub elapsed: Duration,
    pub peak_pool_bytes: u64,
    /// Shards left out because they are absent (only with `allow_partial`).
    pub missing_shards: Vec<std::path::PathBuf>,
}

impl LoadStats {
    /// "direct", "buffered" or "mixed".
    pub fn io_mode(&self) -> &'static str {
        let direct = self.files.iter().filter(|f| f.direct).count();
        match direct {
            0 => "buffered",
            d if d == self.files.len() => "direct",
            _ => "mixed",
        }
    }

    /// Tensor bytes per second, in GB/s (1e9).
    pub fn gb_per_s(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.tensor_bytes as f64 / secs / 1e9
        } else {
            0.0
        }
    }
}

/// Every window of a full load.
pub struct LoadedCheckpoint {
    pub windows: Vec<LoadedWindow>,
    pub stats: LoadStats,
}

/// A validated checkpoint plus the configuration to read it with.
pub struct Loader {
    checkpoint: Checkpoint,
    /// The descriptors (or pinned objects) the headers were validated from,
    /// one per shard: the data is read from these same files, whatever the
    /// paths name by then. Shared with the `OpenCheckpoint` a loader may
    /// come from.
    files: Arc<[ShardFile]>,
    /// Absent shards a partial load leaves out.
    missing: Vec<std::path::PathBuf>,
    config: LoadConfig,
    engine: Option<Arc<dyn IoEngine>>,
}

impl Loader {
    /// Parses and validates the checkpoint at `path` (file, directory or
    /// index, local or an `s3://`, `gs://` or `az://` URL); reads nothing
    /// but headers.
    pub fn open(path: &Path, config: LoadConfig) -> Result<Loader, LoadError> {
        config.validate()?;
        let options = ReadOptions {
            allow_partial: config.allow_partial,
        };
        let found = open_shard_files(path, options)?;
        Ok(Loader {
            checkpoint: found.checkpoint,
            files: found.files.into(),
            missing: found.missing,
            config,
            engine: None,
        })
    }

    /// Parses and validates the checkpoint at `url` in `store`: the same as
    /// [`Loader::open`] with an object URL, over a store the caller built
    /// (tests put a fault-injecting double here).
    pub fn open_remote(
        store: Arc<sluice_remote::RemoteStore>,
        url: &sluice_remote::ObjectUrl,
        config: LoadConfig,
    ) -> Result<Loader, LoadError> {
        let options = ReadOptions {
            allow_partial: config.allow_partial,
        };
        let found = crate::remote_reader::open_remote_in(&store, url, options)?;
        Loader::from_open_files(found.checkpoint, found.files.into(), found.missing, config)
    }

    /// A loader over a validated checkpoint and the descriptors, one per
    /// shard, its headers were read from.
    pub(crate) fn from_open_files(
        checkpoint: Checkpoint,
        files: Arc<[ShardFile]>,
        missing: Vec<std::path::PathBuf>,
        config: LoadConfig,
    ) -> Result<Loader, LoadError> {
        config.validate()?;
        Ok(Loader {
            checkpoint,
            files,
            missing,
            config,
            engine: None,
        })
    }

    /// Uses `engine` instead of probing (tests inject fault doubles here).
    pub fn with_engine(mut self, engine: Arc<dyn IoEngine>) -> Self {
        self.engine = Some(engine);
        self
    }

    pub fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }

    pub fn config(&self) -> &LoadConfig {
        &self.config
    }

    /// Starts streaming `names` (all when `None`) under the memory limit.
    pub fn stream(&self, names: Option<&[String]>) -> Result<(TensorStream, LoadStats), LoadError> {
        let limit = self
            .config
            .memory_limit
            .unwrap_or(DEFAULT_STREAM_MEMORY_LIMIT);
        let window_bytes = (self.config.window_bytes as u64).min(limit / STREAM_WINDOWS_IN_LIMIT);
        let pool = BufferPool::new(self.stream_pool(limit));
        self.start(names, window_bytes as usize, pool, Some(limit), None)
    }

    /// Reads each named tensor straight into the caller's memory for it,
    /// which must hold exactly the tensor's bytes. The stream's windows carry
    /// no memory; they report progress, and the stream's end (or its first
    /// error) says when the memory is filled. A tensor alone in its window is
    /// read into its destination; runs of small tensors (under
    /// [`INTO_GATHER_BYTES`] together) are read as one range into a pooled
    /// buffer under the memory limit and copied out, so a remote store pays
    /// one round trip for them. Local files are read buffered: destinations
    /// have whatever alignment the caller's allocator gave them.
    pub fn stream_into(
        &self,
        into: HashMap<String, Arc<LentMemory>>,
    ) -> Result<(TensorStream, LoadStats), LoadError> {
        let names: Vec<String> = into.keys().cloned().collect();
        for (_, entry) in self.checkpoint.tensors() {
            let Some(dst) = into.get(&entry.name) else {
                continue;
            };
            if dst.len() as u64 != entry.byte_len() {
                return Err(LoadError::config(
                    format!("tensor {:?}", entry.name),
                    format!(
                        "the destination holds {} bytes, the checkpoint's tensor {}",
                        dst.len(),
                        entry.byte_len()
                    ),
                ));
            }
        }
        let limit = self
            .config
            .memory_limit
            .unwrap_or(DEFAULT_STREAM_MEMORY_LIMIT);
        let pool = BufferPool::new(self.stream_pool(limit));
        let window_bytes = INTO_GATHER_BYTES.min((limit / STREAM_WINDOWS_IN_LIMIT) as usize);
        self.start(Some(&names), window_bytes, pool, Some(limit), Some(into))
    }

    /// A stream's buffers: `limit` bytes, recycled, registered with the GPU runtime when
    /// the config names one.
    fn stream_pool(&self, limit: u64) -> BufferPoolConfig {
        let pool = BufferPoolConfig::bounded(limit);
        match &self.config.pin {
            Some(pin) => pool.pinned_by(pin.0.clone()),
            None => pool,
        }
    }

    /// Reads `names` (all when `None`) completely. Fails as a whole: on any
    /// error nothing is returned.
    pub fn load_all(&self, names: Option<&[String]>) -> Result<LoadedCheckpoint, LoadError> {
        let (mut stream, mut stats) = self.stream_unbounded(names)?;
        let mut windows = Vec::with_capacity(stats.windows + 1);
        while let Some(window) = stream.next_window() {
            windows.push(window?);
        }
        stats.elapsed = stream.elapsed();
        stats.peak_pool_bytes = stream.pool().stats().peak_mapped_bytes;
        Ok(LoadedCheckpoint { windows, stats })
    }

    /// Starts reading `names` (all when `None`) with no memory limit and no
    /// buffer reuse: every window stays valid for as long as it is held, as
    /// a full load's result must. Windows arrive as they land, so a caller
    /// can build its result while reads continue.
    pub fn stream_unbounded(
        &self,
        names: Option<&[String]>,
    ) -> Result<(TensorStream, LoadStats), LoadError> {
        let pool = BufferPool::new(BufferPoolConfig::unbounded());
        let window_bytes = self.config.window_bytes.max(self.config.chunk_bytes);
        self.start(names, window_bytes, pool, None, None)
    }

    fn start(
        &self,
        names: Option<&[String]>,
        window_bytes: usize,
        pool: BufferPool,
        limit: Option<u64>,
        into: Option<HashMap<String, Arc<LentMemory>>>,
    ) -> Result<(TensorStream, LoadStats), LoadError> {
        // Reads into lent memory are buffered and unaligned.
        let direct = match into {
            Some(_) => DirectMode::Off,
            None => self.config.direct,
        };
        let files = self.open_files(direct)?;
        let align = match into {
            Some(_) => 1,
            None => files
                .iter()
                .map(|f| f.direct_align())
                .max()
                .unwrap_or(4096)
                .max(page_size()),
        };
        let window_bytes = window_bytes.max(align).next_multiple_of(align);
        let opts = PlanOptions {
            window_bytes,
            max_gap_bytes: self.config.max_gap_bytes,
            align,
        };
        let mut plan = ReadPlan::build(&self.checkpoint, names, opts)?;
        // A read never spans more than a window, so small streams get small reads. Reads
        // into lent memory take no budget: the gather windows' size must not shrink them.
        let chunk_bytes = match into {
            Some(_) => self.config.chunk_bytes,
            None => (self.config.chunk_bytes.min(window_bytes) / align).max(1) * align,
        };
        // "Burn after reading" must not keep pages mapped, so it turns
        // mapping off along with staging. So does pinning: a window mapped from the page
        // cache is not the pool's registered memory, and its copy to a device would not
        // be asynchronous.
        let map_cached = self.config.map_cached
            && self.config.direct != DirectMode::On
            && !self.config.drop_cache
            && self.config.pin.is_none()
            && into.is_none();
        // Staging buffered reads and mapping them needs the pages to stay
        // cached, which "burn after reading" forbids.
        let stage = map_cached && files.iter().any(|f| !f.is_direct() && !f.is_remote());
        if let Some(limit) = limit.filter(|_| into.is_none()) {
            let scratch_bytes = if stage {
                pool.capacity_for(chunk_bytes) as u64
            } else {
                0
            };
            let windows_limit = limit.saturating_sub(scratch_bytes);
            plan.order_for_limit(|n| pool.capacity_for(n) as u64, windows_limit);
            check_stream_fits(&plan, &pool, limit, scratch_bytes)?;
        }
        let engine = match &self.engine {
            Some(e) => Arc::clone(e),
            // Remote objects: GETs as futures on the remote runtime (object_engine.rs).
            None if files.iter().any(|f| f.is_remote()) => {
                Arc::new(ObjectEngine::new(self.config.concurrency)) as Arc<dyn IoEngine>
            }
            None => {
                let denied = self
                    .config
                    .io_uring_disabled
                    .then_some("disabled by SLUICE_IO_URING=0");
                select_engine(
                    engine_for(self.config.engine, &files),
                    self.config.concurrency,
                    denied,
                )?
            }
        };
        let stats = LoadStats {
            engine: engine.kind().as_str(),
            files: files
                .iter()
                .map(|f| FileMode {
                    path: f.path().to_path_buf(),
                    direct: f.is_direct(),
                    reason: f.buffered_reason().map(str::to_owned),
                })
                .collect(),
            tensors: plan.tensor_count(),
            tensor_bytes: plan.tensor_bytes,
            read_bytes: plan.read_bytes,
            windows: plan.windows.len(),
            elapsed: Duration::ZERO,
            peak_pool_bytes: 0,
            missing_shards: self.missing.clone(),
        };
        tracing::info!(
            engine = stats.engine,
            io = stats.io_mode(),
            windows = stats.windows,
            tensor_bytes = stats.tensor_bytes,
            "load started"
        );
        let in_order = limit.is_some() && into.is_none();
        let scratch = if stage {
            Some(Arc::new(pool.acquire(chunk_bytes)?))
        } else {
            None
        };
        let input = DriverInput {
            plan,
            files,
            engine,
            pool,
            chunk_bytes,
            drop_cache: self.config.drop_cache,
            in_order,
            map_cached,
            scratch,
            into,
        };
        Ok((TensorStream::start(input, limit)?, stats))
    }

    fn open_files(&self, direct: DirectMode) -> Result<Vec<Arc<SourceFile>>, LoadError> {
        self.checkpoint
            .shards
            .iter()
            .zip(self.files.iter())
            .map(|(s, held)| held.source(&s.path, direct).map(Arc::new))
            .collect()
    }
}

/// A consumer iterating in a loop still holds the window it was last given
/// while the next one is read, so every two neighbouring windows (in plan
/// order, which is roughly completion order) must fit in the limit together;
/// `order_for_limit` has already separated the pairs it could.
/// `reserved` is budget held for the whole load (the staging scratch buffer).
fn check_stream_fits(
    plan: &ReadPlan,
    pool: &BufferPool,
    limit: u64,
    reserved: u64,
) -> Result<(), LoadError> {
    let caps: Vec<u64> = plan
        .windows
        .iter()
        .map(|w| pool.capacity_for(w.read_len) as u64)
        .collect();
    let worst = (0..caps.len()).max_by_key(|&i| caps[i] + caps.get(i + 1).copied().unwrap_or(0));
    let Some(i) = worst else { return Ok(()) };
    let needed = caps[i] + caps.get(i + 1).copied().unwrap_or(0) + reserved;
    if needed <= limit {
        return Ok(());
    }
    // Name the larger of the pair, by its largest tensor: that is what to fix.
    let big = if caps.get(i + 1).is_some_and(|&next| next > caps[i]) {
        i + 1
    } else {
        i
    };
    let w = &plan.windows[big];
    let tensor = w
        .tensors
        .iter()
        .max_by_key(|t| t.byte_len)
        .map(|t| t.name.clone())
        .unwrap_or_default();
    Err(LoadError::TensorExceedsMemoryLimit {
        tensor,
        bytes: w.read_len as u64,
        needed,
        limit,
    })
}

/// `Auto` means io_uring for direct reads and the thread pool as soon as any
/// file is read buffered: io_uring hands buffered reads that miss the cache
/// to its io-wq workers, which measured 0.9 GB/s cold against 1.1–1.4 GB/s
/// for 32 `pread` threads on the same files (docs/design/loader.md).
fn engine_for(choice: EngineChoice, files: &[Arc<SourceFile>]) -> EngineChoice {
    if choice == EngineChoice::Auto && files.iter().any(|f| !f.is_direct()) {
        tracing::info!("some files are read buffered; using the thread pool");
        return EngineChoice::Threads;
    }
    choice
}
