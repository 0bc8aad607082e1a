//! [`KvServer`]: the sidecar side of `sluice kv serve`.
//!
//! One thread accepts; each client gets a thread that reads a frame, runs it on the
//! store (under the client's namespace) and writes the answer. A client that sends bad
//! bytes, names offsets outside its region or hangs up mid-request ends its own session
//! only; the store and every other client go on.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use sluice_engine::SharedMemory;
use sluice_formats::kv_wire::{Request, Response, WireErrorKind, WireNamespace, WIRE_VERSION};

use super::frame::{read_frame, write_frame};
use crate::config::RecomputeModel;
use crate::error::KvError;
use crate::namespace::Namespace;
use crate::store::KvStore;
use crate::sync::lock;

/// How a server runs. Every default says why it has its value.
#[derive(Debug, Clone)]
pub struct KvServerConfig {
    /// Clients connected at once: 64, far more than the TP ranks and engines of one node,
    /// few enough that client threads and mapped regions stay bounded. One more is told
    /// the server is busy.
    pub max_clients: usize,
    /// The largest shared region a client may pass: 4 GiB. Regions are the client's
    /// memory (mapped here too, not copied), so this bounds address space, not RAM.
    pub max_shm_bytes: u64,
    /// Permissions of the socket file: 0o600, only the user who started the server may
    /// connect; 0o660 lets the file's group in too.
    pub socket_mode: u32,
}

impl Default for KvServerConfig {
    fn default() -> Self {
        KvServerConfig {
            max_clients: 64,
            max_shm_bytes: 4 << 30,
            socket_mode: 0o600,
        }
    }
}

/// Counters of the server itself (the store's are in its stats).
#[derive(Default)]
struct ServerCounters {
    clients_total: AtomicU64,
    clients_refused: AtomicU64,
    bad_requests: AtomicU64,
}

struct Clients {
    next_id: u64,
    /// A second handle on each client's socket, to end its session on shutdown.
    streams: HashMap<u64, UnixStream>,
    threads: Vec<JoinHandle<()>>,
}

/// A store served on a Unix socket.
pub struct KvServer {
    store: KvStore,
    listener: UnixListener,
    socket: PathBuf,
    /// The socket file's inode, so shutdown removes only the file this server created.
    socket_ino: u64,
    config: KvServerConfig,
    stopping: Arc<AtomicBool>,
    clients: Arc<Mutex<Clients>>,
    counters: Arc<ServerCounters>,
}

impl KvServer {
    /// Binds `socket` for `store`. A socket file left by a server that died is replaced; a
    /// live server on it, or a file that is not a socket, is an error.
    pub fn bind(
        store: KvStore,
        socket: &Path,
        config: KvServerConfig,
    ) -> Result<KvServer, KvError> {
        super::check_socket_path(socket)?;
        clear_stale_socket(socket)?;
        let listener = UnixListener::bind(socket).map_err(KvError::io(socket))?;
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(config.socket_mode))
            .map_err(KvError::io(socket))?;
        listener
            .set_nonblocking(true)
            .map_err(KvError::io(socket))?;
        let socket_ino = std::fs::symlink_metadata(socket)
            .map_err(KvError::io(socket))?
            .ino();
        Ok(KvServer {
            store,
            listener,
            socket: socket.to_path_buf(),
            socket_ino,
            config,
            stopping: Arc::new(AtomicBool::new(false)),
            clients: Arc::new(Mutex::new(Clients {
                next_id: 0,
                streams: HashMap::new(),
                threads: Vec::new(),
            })),
            counters: Arc::default(),
        })
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// A flag that makes [`KvServer::run`] return (from another thread).
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.stopping)
    }

    /// Serves until `should_stop()` or the stop flag is true (checked every 100 ms), then
    /// ends every client's session, waits for their threads, and removes the socket file.
    /// The store stays open: the caller closes it.
    pub fn run(&self, should_stop: &dyn Fn() -> bool) -> Result<(), KvError> {
        while !should_stop() && !self.stopping.load(Ordering::Acquire) {
            if wait_readable(&self.listener, Duration::from_millis(100)) {
                self.accept_ready();
            }
            self.reap_finished();
        }
        self.shutdown();
        Ok(())
    }

    fn accept_ready(&self) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => self.start_session(stream),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and the like: log, back off, keep serving those connected.
                    tracing::warn!("kv serve: accept on {}: {e}", self.socket.display());
                    std::thread::sleep(Duration::from_millis(100));
                    return;
                }
            }
        }
    }

    fn start_session(&self, stream: UnixStream) {
        if stream.set_nonblocking(false).is_err() {
            return;
        }
        let mut clients = lock(&self.clients);
        if clients.streams.len() >= self.config.max_clients {
            self.counters
                .clients_refused
                .fetch_add(1, Ordering::Relaxed);
            let busy = error(
                WireErrorKind::Busy,
                format!(
                    "the server is serving its limit of {} clients",
                    self.config.max_clients
                ),
            );
            let _ = write_frame(&stream, &busy.encode());
            return;
        }
        let Ok(ours) = stream.try_clone() else { return };
        clients.next_id += 1;
        let id = clients.next_id;
        clients.streams.insert(id, ours);
        self.counters.clients_total.fetch_add(1, Ordering::Relaxed);
        let session = Session {
            store: self.store.clone(),
            max_shm_bytes: self.config.max_shm_bytes,
            counters: Arc::clone(&self.counters),
            clients: Arc::clone(&self.clients),
        };
        let spawned = std::thread::Builder::new()
            .name("sluice-kv-client".into())
            .spawn(move || session.run(id, stream));
        match spawned {
            Ok(t) => clients.threads.push(t),
            Err(e) => {
                tracing::warn!("kv serve: cannot start a client thread: {e}");
                clients.streams.remove(&id);
            }
        }
    }

    fn reap_finished(&self) {
        let done: Vec<JoinHandle<()>> = {
            let mut clients = lock(&self.clients);
            let (done, running) = std::mem::take(&mut clients.threads)
                .into_iter()
                .partition(|t| t.is_finished());
            clients.threads = running;
            done
        };
        for t in done {
            let _ = t.join();
        }
    }

    /// Ends every session (their sockets are shut down, so a blocked read returns), joins
    /// their threads, removes the socket file if it is still ours.
    pub fn shutdown(&self) {
        self.stopping.store(true, Ordering::Release);
        let threads = {
            let mut clients = lock(&self.clients);
            for s in clients.streams.values() {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            std::mem::take(&mut clients.threads)
        };
        for t in threads {
            let _ = t.join();
        }
        let ours =
            std::fs::symlink_metadata(&self.socket).is_ok_and(|m| m.ino() == self.socket_ino);
        if ours {
            let _ = std::fs::remove_file(&self.socket);
        }
    }

    /// Clients connected now.
    pub fn clients(&self) -> usize {
        lock(&self.clients).streams.len()
    }
}

impl Drop for KvServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A socket file at `socket` left by a dead server is removed; a live one, or anything
/// that is not a socket, is refused.
fn clear_stale_socket(socket: &Path) -> Result<(), KvError> {
    let meta = match std::fs::symlink_metadata(socket) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(KvError::io(socket)(e)),
        Ok(m) => m,
    };
    if !meta.file_type().is_socket() {
        return Err(KvError::io(socket)(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "exists and is not a socket (not removing it)",
        )));
    }
    match UnixStream::connect(socket) {
        Ok(_) => Err(KvError::io(socket)(io::Error::new(
            io::ErrorKind::AddrInUse,
            "another server answers on this socket",
        ))),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            tracing::info!(
                "{}: removing a stale socket (no server answers)",
                socket.display()
            );
            std::fs::remove_file(socket).map_err(KvError::io(socket))
        }
        Err(e) => Err(KvError::io(socket)(e)),
    }
}

/// `poll` on the listener for up to `timeout`.
fn wait_readable(listener: &UnixListener, timeout: Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd we own, for the given count.
    let n = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as libc::c_int) };
    n > 0 && pfd.revents & libc::POLLIN != 0
}

fn error(kind: WireErrorKind, message: impl Into<String>) -> Response {
    Response::Error {
        kind,
        message: message.into(),
    }
}

/// The wire's name for a store error.
fn error_of(e: &KvError) -> Response {
    let kind = match e {
        KvError::Config { .. } => WireErrorKind::Config,
        KvError::InvalidArgument { .. } => WireErrorKind::InvalidArgument,
        KvError::Closed => WireErrorKind::Closed,
        _ => WireErrorKind::Io,
    };
    error(kind, e.to_string())
}

/// One client's connection.
struct Session {
    store: KvStore,
    max_shm_bytes: u64,
    counters: Arc<ServerCounters>,
    clients: Arc<Mutex<Clients>>,
}

impl Session {
    fn run(self, id: u64, stream: UnixStream) {
        if let Err(e) = self.serve(&stream) {
            tracing::debug!("kv serve: client {id}: {e}");
        }
        lock(&self.clients).streams.remove(&id);
    }

    /// The `Hello`, then requests until the client hangs up or breaks the protocol.
    fn serve(&self, stream: &UnixStream) -> io::Result<()> {
        let mut fd = None;
        let Some((tag, body)) = read_frame(stream, Some(&mut fd))? else {
            return Ok(());
        };
        let (store, mut region) = match self.hello(tag, &body, fd) {
            Ok(opened) => opened,
            Err(refusal) => {
                self.counters.bad_requests.fetch_add(1, Ordering::Relaxed);
                return write_frame(stream, &refusal.encode());
            }
        };
        let hello = Response::Hello {
            version: WIRE_VERSION,
            block_bytes: store.config().block_bytes,
            server_pid: std::process::id(),
        };
        write_frame(stream, &hello.encode())?;
        while let Some((tag, body)) = self.next_frame(stream)? {
            let answer = match Request::decode(tag, &body) {
                Ok(req) => self.handle(&store, &mut region, req),
                Err(e) => {
                    // The stream can no longer be trusted to be in step: answer and hang up.
                    self.counters.bad_requests.fetch_add(1, Ordering::Relaxed);
                    return write_frame(
                        stream,
                        &error(WireErrorKind::BadRequest, e.to_string()).encode(),
                    );
                }
            };
            write_frame(stream, &answer.encode())?;
        }
        Ok(())
    }

    /// The next frame; one whose header breaks the protocol (a length past the limit) is
    /// counted as a bad request, and ends the session.
    fn next_frame(&self, stream: &UnixStream) -> io::Result<Option<(u8, Vec<u8>)>> {
        read_frame(stream, None).inspect_err(|e| {
            if e.kind() == io::ErrorKind::InvalidData {
                self.counters.bad_requests.fetch_add(1, Ordering::Relaxed);
            }
        })
    }

    /// Checks the first frame: a `Hello` of this protocol version with a sealed region.
    fn hello(
        &self,
        tag: u8,
        body: &[u8],
        fd: Option<std::os::fd::OwnedFd>,
    ) -> Result<(KvStore, SharedMemory), Response> {
        let bad = |m: String| error(WireErrorKind::BadRequest, m);
        let req = Request::decode(tag, body).map_err(|e| bad(e.to_string()))?;
        let Request::Hello {
            version,
            namespace,
            recompute,
            ..
        } = req
        else {
            return Err(bad("the first frame of a connection must be a Hello".into()));
        };
        if version != WIRE_VERSION {
            return Err(error(
                WireErrorKind::Version,
                format!("protocol version {version}; this server speaks {WIRE_VERSION}"),
            ));
        }
        let recompute = match recompute {
            None => None,
            Some((rate, tokens)) if rate.is_finite() && rate > 0.0 && tokens > 0 => {
                Some(RecomputeModel {
                    tokens_per_s: rate,
                    block_tokens: tokens,
                })
            }
            Some((rate, tokens)) => {
                return Err(error(
                    WireErrorKind::Config,
                    format!("recompute model {rate} tokens/s, {tokens} tokens per block: both must be positive"),
                ))
            }
        };
        let namespace = namespace_of(namespace);
        namespace
            .validate()
            .map_err(|e| error(WireErrorKind::Config, e.to_string()))?;
        let fd = fd.ok_or_else(|| bad("the Hello carries no shared region".into()))?;
        let block_bytes = self.store.config().block_bytes as usize;
        let max = usize::try_from(self.max_shm_bytes).unwrap_or(usize::MAX);
        let region = SharedMemory::from_fd(fd, block_bytes, max)
            .map_err(|e| error(WireErrorKind::Config, format!("shared region: {e}")))?;
        let store = self.store.with_namespace(&namespace, recompute);
        Ok((store, region))
    }

    fn handle(&self, store: &KvStore, region: &mut SharedMemory, req: Request) -> Response {
        let answer = match req {
            Request::Lookup {
                lease,
                worth_loading,
                keys,
            } => {
                let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
                match worth_loading {
                    true => store.lookup_worth_loading(&refs, lease),
                    false => store.lookup(&refs, lease),
                }
                .map(|n| Response::Count(n as u64))
            }
            Request::Put { keys, offsets } => {
                let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
                region_blocks(region, &offsets, store.config().block_bytes)
                    .and_then(|blocks| store.put_batch(&refs, &blocks))
                    .map(Response::Flags)
            }
            Request::Get { keys, offsets } => {
                let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
                region_blocks_mut(region, &offsets, store.config().block_bytes)
                    .and_then(|mut bufs| store.get_batch_into(&refs, &mut bufs))
                    .map(Response::Flags)
            }
            Request::Stats => Ok(Response::Text(self.stats(store))),
            Request::Sync => store.sync().map(|()| Response::Done),
            Request::Delete { keys } => {
                let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
                store.delete(&refs).map(|n| Response::Count(n as u64))
            }
            Request::Hello { .. } => Ok(error(
                WireErrorKind::BadRequest,
                "Hello sent twice on one connection",
            )),
        };
        answer.unwrap_or_else(|e| error_of(&e))
    }

    fn stats(&self, store: &KvStore) -> String {
        let mut v = serde_json::to_value(store.stats()).unwrap_or_default();
        let c = &self.counters;
        v["server"] = serde_json::json!({
            "pid": std::process::id(),
            "clients": lock(&self.clients).streams.len(),
            "clients_total": c.clients_total.load(Ordering::Relaxed),
            "clients_refused": c.clients_refused.load(Ordering::Relaxed),
            "bad_requests": c.bad_requests.load(Ordering::Relaxed),
        });
        v.to_string()
    }
}

fn namespace_of(ns: WireNamespace) -> Namespace {
    Namespace {
        model: ns.model,
        dtype: ns.dtype,
        tp_rank: ns.tp_rank,
        tp_size: ns.tp_size,
        pp_stage: ns.pp_stage,
        kv_format: ns.kv_format,
        salt: ns.salt,
    }
}

/// The start of each block the client named, checked to lie inside its region.
fn block_starts(
    region: &SharedMemory,
    offsets: &[u64],
    block_bytes: u64,
) -> Result<Vec<usize>, KvError> {
    offsets
        .iter()
        .enumerate()
        .map(|(i, &off)| {
            let end = off.checked_add(block_bytes);
            match end {
                Some(end) if end <= region.len() as u64 => Ok(off as usize),
                _ => Err(KvError::arg(
                    format!("offset {i}"),
                    format!(
                        "{off}: a {block_bytes}-byte block there ends past the {}-byte shared region",
                        region.len()
                    ),
                )),
            }
        })
        .collect()
}

/// The blocks a put names, as slices of the region.
fn region_blocks<'a>(
    region: &'a SharedMemory,
    offsets: &[u64],
    block_bytes: u64,
) -> Result<Vec<&'a [u8]>, KvError> {
    let starts = block_starts(region, offsets, block_bytes)?;
    Ok(starts
        .into_iter()
        // SAFETY: each range lies inside the live mapping (checked above), which stays
        // mapped and sized while `region` lives (the memfd is sealed against shrinking).
        // The client must not write a block while its request is in flight; if it does,
        // the bytes written may not match their checksum, and a later read is a miss.
        .map(|s| unsafe {
            std::slice::from_raw_parts(region.as_ptr().add(s), block_bytes as usize)
        })
        .collect())
}

/// The buffers a get fills: slices of the region, checked not to overlap.
fn region_blocks_mut<'a>(
    region: &'a mut SharedMemory,
    offsets: &[u64],
    block_bytes: u64,
) -> Result<Vec<&'a mut [u8]>, KvError> {
    let starts = block_starts(region, offsets, block_bytes)?;
    let base = region.as_ptr();
    let mut sorted: Vec<(usize, usize)> = starts
        .iter()
        .copied()
        .enumerate()
        .map(|(i, s)| (s, i))
        .collect();
    sorted.sort_unstable();
    if let Some(w) = sorted
        .windows(2)
        .find(|w| w[1].0 < w[0].0 + block_bytes as usize)
    {
        return Err(KvError::arg(
            format!("offset {}", w[1].1),
            format!(
                "{}: overlaps the block of offset {} ({})",
                w[1].0, w[0].1, w[0].0
            ),
        ));
    }
    Ok(starts
        .into_iter()
        // SAFETY: as in `region_blocks`, and no two ranges overlap (checked above), so
        // the mutable slices are disjoint; the client does not read them until the answer.
        .map(|s| unsafe { std::slice::from_raw_parts_mut(base.add(s), block_bytes as usize) })
        .collect())
}
