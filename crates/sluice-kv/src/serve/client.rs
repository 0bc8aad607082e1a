//! [`KvClient`]: an engine process's handle on a store that `sluice kv serve` owns.
//!
//! The client keeps up to `connections` connections, each with its own shared region, so
//! an engine's thread and its job threads make requests at once. A block goes into the
//! region (put) or comes out of it (get) with one copy; keys and flags go over the socket.
//!
//! It fails open. When the server cannot be reached, or a request breaks off, the call
//! answers as the store would with nothing in it (lookup 0, put and get `false`), logs
//! once, and the next call after `retry_ms` tries to reconnect. An engine then recomputes
//! instead of stalling or crashing. Errors of the engine's own making (a key or buffer of
//! the wrong size, a namespace the server refuses) are still errors.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use sluice_engine::{send_with_fd, SharedMemory};
use sluice_formats::kv::{align_up, MAX_KEY_BYTES};
use sluice_formats::kv_wire::{
    Request, Response, WireErrorKind, WireNamespace, MAX_BATCH_KEYS, MAX_FRAME_BYTES, WIRE_VERSION,
};

use super::frame::{read_frame, write_frame};
use crate::args::{check_buffers, check_keys};
use crate::block_store::BlockStore;
use crate::config::RecomputeModel;
use crate::error::KvError;
use crate::fork_guard::ForkGuard;
use crate::jobs::{JobBuffer, JobKind, JobQueue, KvJob};
use crate::namespace::Namespace;
use crate::sync::lock;

/// How a client connects. Every default says why it has its value.
#[derive(Debug, Clone)]
pub struct KvClientConfig {
    /// The engine's namespace (model, dtype, TP rank, ...): blocks of other namespaces in
    /// the same store are never seen.
    pub namespace: Namespace,
    /// The engine's prefill model, for `lookup_worth_loading`.
    pub recompute: Option<RecomputeModel>,
    /// Shared memory per connection: 64 MiB, the most block bytes one request moves (a
    /// larger batch goes in parts). 32 blocks of 2 MiB, about one scheduler step of one
    /// rank, and small beside the KV memory it moves.
    pub shm_bytes: u64,
    /// Connections at most: 4, for the engine's own thread and the two job threads at
    /// once, with one to spare.
    pub connections: usize,
    /// After the server is found unreachable, calls answer as misses for this long before
    /// one tries to reconnect: 1,000 ms, so a dead server costs each call nothing.
    pub retry_ms: u64,
    /// A request unanswered this long counts as a dead server: 60,000 ms. A 64 MiB batch
    /// takes well under a second on an SSD; a server stuck for a minute is no use.
    pub timeout_ms: u64,
}

impl KvClientConfig {
    pub fn new(namespace: Namespace) -> KvClientConfig {
        KvClientConfig {
            namespace,
            recompute: None,
            shm_bytes: 64 << 20,
            connections: 4,
            retry_ms: 1000,
            timeout_ms: 60_000,
        }
    }
}

/// What the client counts (in `stats_json()["client"]`).
#[derive(Default)]
struct ClientCounters {
    requests: AtomicU64,
    /// Calls answered as misses because the server was unreachable.
    failed_open: AtomicU64,
    outages: AtomicU64,
    reconnects: AtomicU64,
}

/// One connection and its shared region.
struct Conn {
    stream: UnixStream,
    region: SharedMemory,
}

#[derive(Default)]
struct Pool {
    idle: Vec<Conn>,
    open: usize,
}

impl Pool {
    /// Closes every idle connection.
    fn drop_idle(&mut self) {
        self.open -= self.idle.len();
        self.idle.clear();
    }
}

struct ClientInner {
    socket: PathBuf,
    config: KvClientConfig,
    block_bytes: u64,
    /// Bytes between blocks in a region: a block rounded up to 4 KiB, so every block
    /// starts page-aligned and the server can write it to disk with O_DIRECT as it is.
    stride: usize,
    server_pid: AtomicU32,
    /// Set when a reconnect found the server storing blocks of another size.
    server_block_bytes: Mutex<Option<u64>>,
    pool: Mutex<Pool>,
    freed: Condvar,
    /// While the server is unreachable: when the next call may try again.
    retry_at: Mutex<Option<Instant>>,
    jobs: Arc<JobQueue>,
    counters: ClientCounters,
    closed: AtomicBool,
    /// The process that connected: a forked child shares its sockets and regions, so its
    /// copy refuses every call.
    fork: ForkGuard,
}

/// A connection to a `sluice kv serve` sidecar. Cheap to clone; clones share connections.
#[derive(Clone)]
pub struct KvClient {
    inner: Arc<ClientInner>,
}

/// How one request ended.
enum CallError {
    /// The connection broke: fail open.
    Io(std::io::Error),
    /// The server refused the request.
    Refused(WireErrorKind, String),
}

impl From<std::io::Error> for CallError {
    fn from(e: std::io::Error) -> Self {
        CallError::Io(e)
    }
}

impl KvClient {
    /// Connects to the server at `socket`. This first connection must succeed: a wrong
    /// path or a refused namespace is an error here, not a silent miss on every call.
    pub fn connect(socket: &Path, config: KvClientConfig) -> Result<KvClient, KvError> {
        if config.connections == 0 {
            return Err(KvError::config("connections", 0, "at least 1"));
        }
        config.namespace.validate()?;
        super::check_socket_path(socket)?;
        let (conn, block_bytes, pid) = open_conn(socket, &config).map_err(|e| match e {
            CallError::Io(e) => KvError::io(socket)(named_timeout(e, config.timeout_ms)),
            CallError::Refused(kind, message) => refused(socket, kind, message),
        })?;
        let stride = align_up(block_bytes).unwrap_or(u64::MAX) as usize;
        if (conn.region.len()) < stride {
            return Err(KvError::config(
                "shm_bytes",
                config.shm_bytes,
                format!("must hold at least one {block_bytes}-byte block"),
            ));
        }
        let inner = ClientInner {
            socket: socket.to_path_buf(),
            config,
            block_bytes,
            stride,
            server_pid: AtomicU32::new(pid),
            server_block_bytes: Mutex::new(None),
            pool: Mutex::new(Pool {
                idle: vec![conn],
                open: 1,
            }),
            freed: Condvar::new(),
            retry_at: Mutex::new(None),
            jobs: Arc::new(JobQueue::default()),
            counters: ClientCounters::default(),
            closed: AtomicBool::new(false),
            fork: ForkGuard::this_process(),
        };
        Ok(KvClient {
            inner: Arc::new(inner),
        })
    }

    pub fn socket(&self) -> &Path {
        &self.inner.socket
    }

    /// Blocks one request can move: what fits in a region, and in one frame's keys.
    fn per_request(&self) -> usize {
        let by_region = (self.inner.config.shm_bytes as usize / self.inner.stride).max(1);
        let by_frame = MAX_FRAME_BYTES / (MAX_KEY_BYTES + 16);
        by_region.min(by_frame).min(MAX_BATCH_KEYS)
    }

    /// Runs `f` on a connection. `Ok(None)`: the server is unreachable (the caller fails
    /// open); errors are refusals of the request itself, or a server that now stores
    /// blocks of another size.
    ///
    /// A pooled connection that breaks may only be stale (the server restarted since it
    /// was opened): the request is tried once more on a fresh connection, which also
    /// re-handshakes, before the server counts as unreachable. Requests are idempotent
    /// (a put of a stored block is a no-op), so running one twice is harmless.
    fn call<T>(
        &self,
        mut f: impl FnMut(&mut Conn) -> Result<T, CallError>,
    ) -> Result<Option<T>, KvError> {
        let inner = &self.inner;
        inner.counters.requests.fetch_add(1, Ordering::Relaxed);
        let mut tries = 0;
        loop {
            tries += 1;
            let Some((mut conn, fresh)) = self.acquire()? else {
                self.check_block_size()?;
                inner.counters.failed_open.fetch_add(1, Ordering::Relaxed);
                return Ok(None);
            };
            match f(&mut conn) {
                Ok(v) => {
                    self.release(Some(conn));
                    return Ok(Some(v));
                }
                Err(CallError::Refused(kind, message)) => {
                    // After a protocol error the server hangs up: drop the connection.
                    let keep = kind != WireErrorKind::BadRequest;
                    self.release(keep.then_some(conn));
                    return Err(refused(&inner.socket, kind, message));
                }
                // A broken pooled connection may only be stale; one that timed out
                // reached a server that did not answer, and so would a fresh one.
                Err(CallError::Io(e)) if !fresh && tries == 1 && !is_timeout(&e) => {
                    self.release(None);
                    // Its idle siblings were opened to the same server: stale too.
                    lock(&inner.pool).drop_idle();
                }
                Err(CallError::Io(e)) => {
                    self.release(None);
                    self.outage(&named_timeout(e, inner.config.timeout_ms).to_string());
                    inner.counters.failed_open.fetch_add(1, Ordering::Relaxed);
                    return Ok(None);
                }
            }
        }
    }

    /// `Err` naming both sizes once a reconnect found the server storing blocks of another
    /// size (restarted with another `--block-bytes`): this client's buffers and regions
    /// are sized for the old one, so it can never be served again.
    fn check_block_size(&self) -> Result<(), KvError> {
        let Some(now) = *lock(&self.inner.server_block_bytes) else {
            return Ok(());
        };
        Err(KvError::Incompatible {
            path: self.inner.socket.clone(),
            detail: format!(
                "the kv server now stores {now}-byte blocks, but this client was connected \
                 for {}-byte blocks (the server was restarted with another --block-bytes): \
                 connect again for the new size, or restart the server with --block-bytes {}",
                self.inner.block_bytes, self.inner.block_bytes
            ),
        })
    }

    /// An idle connection (`false`) or a new one (`true`), or `None` while the server is
    /// unreachable or stores blocks of another size.
    fn acquire(&self) -> Result<Option<(Conn, bool)>, KvError> {
        let inner = &self.inner;
        inner.fork.check(&inner.socket)?;
        if inner.closed.load(Ordering::Acquire) {
            return Err(KvError::Closed);
        }
        self.check_block_size()?;
        if lock(&inner.retry_at).is_some_and(|t| Instant::now() < t) {
            return Ok(None);
        }
        let mut pool = lock(&inner.pool);
        loop {
            if let Some(c) = pool.idle.pop() {
                return Ok(Some((c, false)));
            }
            if pool.open < inner.config.connections {
                pool.open += 1;
                drop(pool);
                return Ok(self.reconnect().map(|c| (c, true)));
            }
            pool = inner.freed.wait(pool).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Opens a connection (its slot in the pool is taken); `None` starts or continues an
    /// outage.
    fn reconnect(&self) -> Option<Conn> {
        let inner = &self.inner;
        match open_conn(&inner.socket, &inner.config) {
            Ok((conn, block_bytes, pid)) if block_bytes == inner.block_bytes => {
                inner.server_pid.store(pid, Ordering::Relaxed);
                if lock(&inner.retry_at).take().is_some() {
                    inner.counters.reconnects.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        "kv client: reconnected to {} (pid {pid})",
                        inner.socket.display()
                    );
                }
                Some(conn)
            }
            Ok((_, block_bytes, _)) => {
                self.release(None);
                *lock(&inner.server_block_bytes) = Some(block_bytes);
                tracing::error!(
                    "kv client: the server at {} now stores {block_bytes}-byte blocks; this client was connected for {}-byte blocks, so every call fails until it connects again",
                    inner.socket.display(),
                    inner.block_bytes
                );
                None
            }
            Err(CallError::Io(e)) => {
                self.release(None);
                self.outage(&named_timeout(e, inner.config.timeout_ms).to_string());
                None
            }
            Err(CallError::Refused(_, message)) => {
                self.release(None);
                self.outage(&message);
                None
            }
        }
    }

    fn release(&self, conn: Option<Conn>) {
        let mut pool = lock(&self.inner.pool);
        match conn {
            Some(c) => pool.idle.push(c),
            None => pool.open -= 1,
        }
        self.inner.freed.notify_one();
    }

    /// Marks the server unreachable for `retry_ms`; logs the first time.
    fn outage(&self, why: &str) {
        let inner = &self.inner;
        let retry = Instant::now() + Duration::from_millis(inner.config.retry_ms);
        if lock(&inner.retry_at).replace(retry).is_none() {
            inner.counters.outages.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                "kv client: the server at {} is unreachable ({why}); answering as misses, retrying every {} ms",
                inner.socket.display(),
                inner.config.retry_ms
            );
        }
        // Idle connections to a dead server are dead too.
        lock(&inner.pool).drop_idle();
    }

    fn lookup_as(
        &self,
        keys: &[&[u8]],
        lease: bool,
        worth_loading: bool,
    ) -> Result<usize, KvError> {
        check_keys(keys, None)?;
        let mut found = 0;
        for chunk in keys.chunks(self.per_request()) {
            let req = Request::Lookup {
                lease,
                worth_loading,
                keys: chunk.iter().map(|k| k.to_vec()).collect(),
            };
            let n = self.call(|c| match exchange(c, &req)? {
                Response::Count(n) => Ok(n as usize),
                other => Err(unexpected(&other)),
            })?;
            let n = n.unwrap_or(0).min(chunk.len());
            found += n;
            if n < chunk.len() {
                break;
            }
        }
        Ok(found)
    }

    fn put_chunk(&self, keys: &[&[u8]], blocks: &[&[u8]]) -> Result<Option<Vec<bool>>, KvError> {
        let stride = self.inner.stride;
        let req = Request::Put {
            keys: keys.iter().map(|k| k.to_vec()).collect(),
            offsets: (0..keys.len() as u64).map(|i| i * stride as u64).collect(),
        };
        self.call(|c| {
            for (i, b) in blocks.iter().enumerate() {
                // SAFETY: `per_request` keeps every block inside the region, and this
                // connection (so its region) is ours alone until the answer comes.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        b.as_ptr(),
                        c.region.as_ptr().add(i * stride),
                        b.len(),
                    )
                };
            }
            flags(exchange(c, &req)?, keys.len())
        })
    }

    fn get_chunk(
        &self,
        keys: &[&[u8]],
        bufs: &mut [&mut [u8]],
    ) -> Result<Option<Vec<bool>>, KvError> {
        let stride = self.inner.stride;
        let req = Request::Get {
            keys: keys.iter().map(|k| k.to_vec()).collect(),
            offsets: (0..keys.len() as u64).map(|i| i * stride as u64).collect(),
        };
        self.call(|c| {
            let ok = flags(exchange(c, &req)?, keys.len())?;
            for (i, buf) in bufs.iter_mut().enumerate().take_while(|(i, _)| ok[*i]) {
                // SAFETY: the server wrote block `i` at `i * stride`, inside the region,
                // and answered; nothing writes the region until our next request.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        c.region.as_ptr().add(i * stride),
                        buf.as_mut_ptr(),
                        buf.len(),
                    )
                };
            }
            Ok(ok)
        })
    }

    /// Stats of the server's store, plus this client's counters under "client". While the
    /// server is unreachable, only the client's part (with `"connected": false`).
    fn stats_value(&self) -> Result<serde_json::Value, KvError> {
        let text = self.call(|c| match exchange(c, &Request::Stats)? {
            Response::Text(t) => Ok(t),
            other => Err(unexpected(&other)),
        })?;
        let connected = text.is_some();
        let mut v: serde_json::Value = text
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_else(|| serde_json::json!({}));
        let c = &self.inner.counters;
        v["client"] = serde_json::json!({
            "socket": self.inner.socket.display().to_string(),
            "connected": connected,
            "server_pid": self.inner.server_pid.load(Ordering::Relaxed),
            "requests": c.requests.load(Ordering::Relaxed),
            "failed_open": c.failed_open.load(Ordering::Relaxed),
            "outages": c.outages.load(Ordering::Relaxed),
            "reconnects": c.reconnects.load(Ordering::Relaxed),
        });
        Ok(v)
    }

    fn submit(
        &self,
        kind: JobKind,
        keys: Vec<Vec<u8>>,
        bufs: Vec<Box<dyn JobBuffer>>,
    ) -> Result<KvJob, KvError> {
        self.inner.fork.check(&self.inner.socket)?;
        let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
        check_keys(&refs, None)?;
        let lens: Vec<usize> = bufs.iter().map(|b| b.bytes().len()).collect();
        check_buffers(keys.len(), &lens, self.inner.block_bytes)?;
        let n = keys.len();
        let work = crate::jobs::batch_work(self.clone(), kind, keys);
        self.inner
            .jobs
            .submit(kind, n, bufs, work)
            .ok_or(KvError::Closed)
    }
}

/// A job's batch through the client: a refusal (the server's, after the checks at submit)
/// fails every key of the batch, logged.
impl crate::jobs::BatchRunner for KvClient {
    fn run_put(&self, keys: &[&[u8]], blocks: &[&[u8]]) -> Vec<bool> {
        self.put_batch(keys, blocks)
            .unwrap_or_else(|e| job_failed("put", e, keys.len()))
    }
    fn run_get(&self, keys: &[&[u8]], bufs: &mut [&mut [u8]]) -> Vec<bool> {
        self.get_batch_into(keys, bufs)
            .unwrap_or_else(|e| job_failed("get", e, keys.len()))
    }
}

fn job_failed(kind: &str, e: KvError, keys: usize) -> Vec<bool> {
    tracing::warn!("kv client: a {kind} job failed: {e}");
    vec![false; keys]
}

impl BlockStore for KvClient {
    fn block_bytes(&self) -> u64 {
        self.inner.block_bytes
    }

    fn lookup(&self, keys: &[&[u8]], lease: bool) -> Result<usize, KvError> {
        self.lookup_as(keys, lease, false)
    }

    fn lookup_worth_loading(&self, keys: &[&[u8]], lease: bool) -> Result<usize, KvError> {
        if self.inner.config.recompute.is_none() {
            return Err(KvError::arg(
                "lookup_worth_loading",
                "the client was connected without a recompute model (recompute_tokens_per_s)",
            ));
        }
        self.lookup_as(keys, lease, true)
    }

    fn put_batch(&self, keys: &[&[u8]], blocks: &[&[u8]]) -> Result<Vec<bool>, KvError> {
        check_keys(keys, None)?;
        let lens: Vec<usize> = blocks.iter().map(|b| b.len()).collect();
        check_buffers(keys.len(), &lens, self.inner.block_bytes)?;
        let mut out = Vec::with_capacity(keys.len());
        let per = self.per_request();
        for (k, b) in keys.chunks(per).zip(blocks.chunks(per)) {
            match self.put_chunk(k, b)? {
                Some(flags) => out.extend(flags),
                None => break,
            }
        }
        out.resize(keys.len(), false);
        Ok(out)
    }

    fn get_batch_into(&self, keys: &[&[u8]], bufs: &mut [&mut [u8]]) -> Result<Vec<bool>, KvError> {
        check_keys(keys, None)?;
        let lens: Vec<usize> = bufs.iter().map(|b| b.len()).collect();
        check_buffers(keys.len(), &lens, self.inner.block_bytes)?;
        let mut out = Vec::with_capacity(keys.len());
        let per = self.per_request();
        for (k, b) in keys.chunks(per).zip(bufs.chunks_mut(per)) {
            let Some(flags) = self.get_chunk(k, b)? else {
                break;
            };
            let whole = flags.iter().all(|f| *f);
            out.extend(flags);
            if !whole {
                break; // prefix semantics: every later key is a miss
            }
        }
        let first_miss = out.iter().position(|f| !*f).unwrap_or(out.len());
        out.truncate(first_miss);
        out.resize(keys.len(), false);
        Ok(out)
    }

    fn submit_put(
        &self,
        keys: Vec<Vec<u8>>,
        blocks: Vec<Box<dyn JobBuffer>>,
    ) -> Result<KvJob, KvError> {
        self.submit(JobKind::Put, keys, blocks)
    }

    fn submit_get(
        &self,
        keys: Vec<Vec<u8>>,
        bufs: Vec<Box<dyn JobBuffer>>,
    ) -> Result<KvJob, KvError> {
        self.submit(JobKind::Get, keys, bufs)
    }

    fn poll(&self) -> Vec<KvJob> {
        self.inner.jobs.poll()
    }

    /// Deletes in requests of `per_request()` keys. A server that cannot be reached
    /// deleted nothing: an error, not a miss, since the caller's space accounting
    /// depends on it.
    fn delete(&self, keys: &[&[u8]]) -> Result<usize, KvError> {
        check_keys(keys, None)?;
        let mut found = 0;
        for chunk in keys.chunks(self.per_request()) {
            let req = Request::Delete {
                keys: chunk.iter().map(|k| k.to_vec()).collect(),
            };
            let n = self.call(|c| match exchange(c, &req)? {
                Response::Count(n) => Ok(n as usize),
                other => Err(unexpected(&other)),
            })?;
            let Some(n) = n else {
                return Err(KvError::io(&self.inner.socket)(std::io::Error::new(
                    std::io::ErrorKind::NotConnected,
                    "the kv server is unreachable; the delete did not finish",
                )));
            };
            found += n.min(chunk.len());
        }
        Ok(found)
    }

    fn sync(&self) -> Result<(), KvError> {
        let done = self.call(|c| match exchange(c, &Request::Sync)? {
            Response::Done => Ok(()),
            other => Err(unexpected(&other)),
        })?;
        done.ok_or_else(|| {
            KvError::io(&self.inner.socket)(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "the kv server is unreachable; acknowledged puts are as durable as its durability mode made them",
            ))
        })
    }

    fn stats_json(&self) -> Result<serde_json::Value, KvError> {
        self.stats_value()
    }

    /// Waits for queued jobs, then drops the connections. The server and its store go on.
    fn close(&self) -> Result<(), KvError> {
        if self.inner.fork.is_forked() {
            // A forked child lets go of its copy; the connections are its parent's.
            self.inner.closed.store(true, Ordering::Release);
            return Ok(());
        }
        self.inner.jobs.drain();
        self.inner.closed.store(true, Ordering::Release);
        lock(&self.inner.pool).drop_idle();
        Ok(())
    }
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        self.jobs.shutdown();
    }
}

/// Connects, creates this connection's region and says hello: the connection, the
/// store's block size and the server's pid.
fn open_conn(socket: &Path, config: &KvClientConfig) -> Result<(Conn, u64, u32), CallError> {
    let stream = UnixStream::connect(socket)?;
    let timeout = Some(Duration::from_millis(config.timeout_ms.max(1)));
    stream.set_read_timeout(timeout)?;
    stream.set_write_timeout(timeout)?;
    let region = SharedMemory::create("sluice-kv-client", config.shm_bytes as usize)?;
    let ns = &config.namespace;
    let hello = Request::Hello {
        version: WIRE_VERSION,
        namespace: WireNamespace {
            model: ns.model.clone(),
            dtype: ns.dtype.clone(),
            tp_rank: ns.tp_rank,
            tp_size: ns.tp_size,
            pp_stage: ns.pp_stage,
            kv_format: ns.kv_format.clone(),
            salt: ns.salt.clone(),
        },
        shm_bytes: region.len() as u64,
        recompute: config.recompute.map(|r| (r.tokens_per_s, r.block_tokens)),
    };
    // A server that refuses the connection (busy) answers and hangs up at once, maybe
    // before our hello is sent: read its answer even when sending failed.
    let sent = send_with_fd(&stream, &hello.encode(), region.fd());
    let conn = Conn { stream, region };
    let answer = match (receive(&conn.stream), sent) {
        (Ok(answer), _) => answer,
        (Err(_), Err(e)) => return Err(CallError::Io(e)),
        (Err(e), Ok(())) => return Err(e),
    };
    match answer {
        Response::Hello {
            version: WIRE_VERSION,
            block_bytes,
            server_pid,
        } => Ok((conn, block_bytes, server_pid)),
        Response::Error { kind, message } => Err(CallError::Refused(kind, message)),
        other => Err(unexpected(&other)),
    }
}

/// Whether a socket read or write ran past its timeout (`SO_RCVTIMEO` reads as EAGAIN).
fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// A timeout in words: the socket says only "Resource temporarily unavailable".
fn named_timeout(e: std::io::Error, timeout_ms: u64) -> std::io::Error {
    if !is_timeout(&e) {
        return e;
    }
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "the server did not answer within {timeout_ms} ms (timeout_ms): it is stopped, \
             stalled or overloaded"
        ),
    )
}

/// Sends a request and reads its answer; a refusal becomes [`CallError::Refused`].
fn exchange(conn: &mut Conn, req: &Request) -> Result<Response, CallError> {
    write_frame(&conn.stream, &req.encode())?;
    match receive(&conn.stream)? {
        Response::Error { kind, message } => Err(CallError::Refused(kind, message)),
        other => Ok(other),
    }
}

fn receive(stream: &UnixStream) -> Result<Response, CallError> {
    let bad = |m: String| CallError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, m));
    let (tag, body) = read_frame(stream, None)?
        .ok_or_else(|| CallError::Io(std::io::ErrorKind::UnexpectedEof.into()))?;
    Response::decode(tag, &body).map_err(|e| bad(e.to_string()))
}

fn flags(resp: Response, n: usize) -> Result<Vec<bool>, CallError> {
    match resp {
        Response::Flags(f) if f.len() == n => Ok(f),
        other => Err(unexpected(&other)),
    }
}

/// An answer that does not fit the request: the stream is out of step, treat it as broken.
fn unexpected(resp: &Response) -> CallError {
    CallError::Io(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("unexpected answer from the server: {resp:?}"),
    ))
}

/// A server's refusal as the error the local store would have raised.
fn refused(socket: &Path, kind: WireErrorKind, message: String) -> KvError {
    match kind {
        WireErrorKind::InvalidArgument => KvError::InvalidArgument {
            what: "kv server".into(),
            detail: message,
        },
        WireErrorKind::Config | WireErrorKind::Version => KvError::Config {
            field: "kv server",
            value: socket.display().to_string(),
            expected: message,
        },
        WireErrorKind::Closed => KvError::Closed,
        WireErrorKind::BadRequest | WireErrorKind::Io | WireErrorKind::Busy => {
            KvError::io(socket)(std::io::Error::other(message))
        }
    }
}
