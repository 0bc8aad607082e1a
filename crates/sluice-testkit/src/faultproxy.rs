//! A TCP proxy that adds latency and injects faults, standing in for netem
//! (this project's test kernels have no `sch_netem`) between a client and a
//! local S3 server in tests and benchmarks.
//!
//! Each accepted connection is joined to a fresh connection to the upstream,
//! and each direction runs as a delay line ([`delay_line`]): a reader task
//! reads whatever has arrived (up to 256 KiB at a time), stamps it with the
//! time it may leave (read time + `one_way_delay`) and queues it; a writer
//! task sleeps until the head chunk is due and writes it. Reading never waits
//! for writing, so the delay adds latency without limiting throughput; only
//! the bytes queued per direction are bounded, like netem's queue limit. A
//! request/response round trip therefore costs 2 × `one_way_delay` more than
//! it would without the proxy. The TCP handshake itself is not delayed.
//!
//! Faults act on the response bytes (upstream → client) of the first
//! `faulty_connections` connections: after exactly `after_bytes` bytes the
//! connection is reset (RST on both sockets), truncated (FIN to the client),
//! or stalled (held open with nothing more sent, until the client closes).
//! `die_after_bytes` counts response bytes over all connections; when it is
//! spent the proxy stops listening, resets every connection and [`run`]
//! returns, like a server that dies mid-transfer.

mod delay_line;

use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use delay_line::{DirectionPlan, PumpEnd};

/// What the proxy does to each connection; see the module header.
#[derive(Debug, Clone)]
pub struct FaultProxyConfig {
    /// Where each accepted connection is forwarded (`host:port`), resolved
    /// per connection so the upstream may start after the proxy.
    pub upstream: String,
    /// Latency added to every byte in each direction (a round trip costs
    /// twice this). Zero forwards bytes as soon as they are read.
    pub one_way_delay: Duration,
    /// The fault applied to the response bytes of faulty connections.
    pub response_fault: Option<ResponseFault>,
    /// How many of the first accepted connections get `response_fault`;
    /// `None` means all of them.
    pub faulty_connections: Option<u64>,
    /// Response bytes over all connections after which the proxy resets
    /// every connection, stops listening and returns.
    pub die_after_bytes: Option<u64>,
    /// Bytes a direction may hold in its delay line before it stops reading
    /// (TCP backpressure then slows the sender).
    pub max_in_flight_bytes: usize,
}

/// 32 MiB: holds 5 ms of data at 6.7 GB/s (10 ms at 3.3 GB/s), so the
/// delay line is not what limits loopback throughput at the delays tests
/// use, while a client slower than its server pins at most this much per
/// direction and connection (netem's default queue is similar: 1000 packets
/// of up to 64 KiB). Raise it for long delays: 50 ms caps one connection
/// at 670 MB/s.
pub const DEFAULT_MAX_IN_FLIGHT_BYTES: usize = 32 << 20;

impl FaultProxyConfig {
    /// A proxy to `upstream` that adds no delay and injects no faults.
    pub fn new(upstream: impl Into<String>) -> Self {
        Self {
            upstream: upstream.into(),
            one_way_delay: Duration::ZERO,
            response_fault: None,
            faulty_connections: None,
            die_after_bytes: None,
            max_in_flight_bytes: DEFAULT_MAX_IN_FLIGHT_BYTES,
        }
    }

    pub fn with_one_way_delay(mut self, delay: Duration) -> Self {
        self.one_way_delay = delay;
        self
    }

    pub fn with_response_fault(mut self, fault: ResponseFault) -> Self {
        self.response_fault = Some(fault);
        self
    }

    pub fn with_faulty_connections(mut self, count: u64) -> Self {
        self.faulty_connections = Some(count);
        self
    }

    pub fn with_die_after_bytes(mut self, bytes: u64) -> Self {
        self.die_after_bytes = Some(bytes);
        self
    }

    pub fn with_max_in_flight_bytes(mut self, bytes: usize) -> Self {
        self.max_in_flight_bytes = bytes;
        self
    }
}

/// What happens to a faulty connection once `after_bytes` response bytes
/// have been forwarded to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseFault {
    /// Abort both sockets with a TCP RST (the client reads `after_bytes`
    /// bytes, then gets a connection-reset error).
    Reset { after_bytes: u64 },
    /// Close the client socket cleanly (the client sees a short body).
    Truncate { after_bytes: u64 },
    /// Send nothing more but keep the connection open (the client must time
    /// out); it is closed once the client closes its side.
    Stall { after_bytes: u64 },
}

impl ResponseFault {
    fn after_bytes(self) -> u64 {
        match self {
            Self::Reset { after_bytes }
            | Self::Truncate { after_bytes }
            | Self::Stall { after_bytes } => after_bytes,
        }
    }
}

/// Why [`run`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyExit {
    /// The shutdown future completed.
    Shutdown,
    /// `die_after_bytes` response bytes were forwarded.
    Died,
}

/// State shared by the accept loop and every connection.
struct Shared {
    config: FaultProxyConfig,
    /// Response bytes still allowed before the proxy dies.
    die_budget: Option<AtomicU64>,
    /// Becomes `true` once `die_budget` is spent.
    died: watch::Sender<bool>,
}

impl Shared {
    fn fault_for(&self, index: u64) -> Option<ResponseFault> {
        let faulty = self.config.faulty_connections.is_none_or(|n| index < n);
        self.config.response_fault.filter(|_| faulty)
    }

    async fn wait_died(&self) {
        let mut died = self.died.subscribe();
        if died.wait_for(|died| *died).await.is_err() {
            // The sender lives as long as `self`; never reached.
            std::future::pending::<()>().await;
        }
    }
}

/// 5 s: enough for every connection to send its RST after a die, bounded
/// so a wedged task cannot keep `run` from returning.
const DIE_DRAIN_LIMIT: Duration = Duration::from_secs(5);

/// Serves `listener` until `shutdown` completes or `die_after_bytes` is
/// spent. On return the listener is closed; after a die every connection
/// has been reset, after a shutdown every connection is dropped.
pub async fn run(
    listener: TcpListener,
    config: FaultProxyConfig,
    shutdown: impl Future<Output = ()>,
) -> ProxyExit {
    let shared = Arc::new(Shared {
        die_budget: config.die_after_bytes.map(AtomicU64::new),
        config,
        died: watch::Sender::new(false),
    });
    let mut connections = JoinSet::new();
    let mut accepted: u64 = 0;
    tokio::pin!(shutdown);
    let exit = loop {
        tokio::select! {
            () = &mut shutdown => break ProxyExit::Shutdown,
            () = shared.wait_died() => break ProxyExit::Died,
            accept = listener.accept() => match accept {
                Ok((client, _)) => {
                    let fault = shared.fault_for(accepted);
                    accepted += 1;
                    connections.spawn(serve_connection(client, fault, shared.clone()));
                }
                Err(err) => {
                    // Out of descriptors and the like: back off, keep serving.
                    eprintln!("sluice-faultproxy: accept: {err}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    };
    drop(listener);
    if exit == ProxyExit::Died {
        let all_reset = async { while connections.join_next().await.is_some() {} };
        let _ = tokio::time::timeout(DIE_DRAIN_LIMIT, all_reset).await;
    }
    exit
}

/// How a connection is closed once its directions are done.
enum Ending {
    /// Normal close of both sockets.
    Close,
    /// FIN to the client, then close both.
    Truncate,
    /// RST on both sockets.
    Reset,
}

async fn serve_connection(client: TcpStream, fault: Option<ResponseFault>, shared: Arc<Shared>) {
    let upstream = match TcpStream::connect(&shared.config.upstream).await {
        Ok(upstream) => upstream,
        Err(err) => {
            eprintln!(
                "sluice-faultproxy: connect to upstream {}: {err}; resetting the client",
                shared.config.upstream
            );
            delay_line::reset_on_close(&client);
            return;
        }
    };
    // Nagle would hold back the tail of each delayed chunk behind an ACK.
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (client, upstream) = (Arc::new(client), Arc::new(upstream));
    let delay = shared.config.one_way_delay;
    let request_plan = DirectionPlan::plain(delay, shared.config.max_in_flight_bytes);
    let response_plan = DirectionPlan {
        fault,
        fault_remaining: fault.map_or(0, ResponseFault::after_bytes),
        die: Some(shared.clone()),
        ..request_plan.clone()
    };
    let mut request = Direction::spawn(client.clone(), upstream.clone(), request_plan);
    let mut response = Direction::spawn(upstream.clone(), client.clone(), response_plan);
    let ending = tokio::select! {
        ending = follow(&mut request.writer.0, &mut response.writer.0) => ending,
        () = shared.wait_died() => Ending::Reset,
    };
    ending.prepare(&client, &upstream);
    // Wait for the pumps to drop their handles, so the sockets close (with
    // an RST where asked) before this connection counts as finished.
    request.finish().await;
    response.finish().await;
}

impl Ending {
    /// Sets the sockets up so that dropping them ends the connection this way.
    fn prepare(self, client: &TcpStream, upstream: &TcpStream) {
        match self {
            Self::Close => {}
            Self::Truncate => delay_line::shutdown_write(client),
            Self::Reset => {
                delay_line::reset_on_close(client);
                delay_line::reset_on_close(upstream);
            }
        }
    }
}

/// The two tasks that carry one direction of a connection.
struct Direction {
    reader: AbortOnDrop<()>,
    writer: AbortOnDrop<PumpEnd>,
}

impl Direction {
    fn spawn(src: Arc<TcpStream>, dst: Arc<TcpStream>, plan: DirectionPlan) -> Self {
        let (reader, writer) = delay_line::spawn(src, dst, plan);
        Self {
            reader: AbortOnDrop(reader),
            writer: AbortOnDrop(writer),
        }
    }

    async fn finish(&mut self) {
        self.reader.finish().await;
        self.writer.finish().await;
    }
}

/// Waits for the two directions and decides how the connection ends: the
/// response direction's faults decide first; an error on either side
/// resets both, as a dead peer would.
async fn follow(request: &mut JoinHandle<PumpEnd>, response: &mut JoinHandle<PumpEnd>) -> Ending {
    let mut request_done = false;
    let mut response_done = false;
    while !(request_done && response_done) {
        tokio::select! {
            end = &mut *response, if !response_done => match end.unwrap_or(PumpEnd::Failed) {
                PumpEnd::Finished => response_done = true,
                // Stalled: hold the client until it gives up and closes.
                PumpEnd::Fault(ResponseFault::Stall { .. }) => response_done = true,
                PumpEnd::Fault(ResponseFault::Truncate { .. }) => return Ending::Truncate,
                PumpEnd::Fault(ResponseFault::Reset { .. }) | PumpEnd::Died | PumpEnd::Failed => {
                    return Ending::Reset;
                }
            },
            end = &mut *request, if !request_done => match end.unwrap_or(PumpEnd::Failed) {
                PumpEnd::Finished => request_done = true,
                _ => return Ending::Reset,
            },
        }
    }
    Ending::Close
}

/// A task that is aborted when its handle is dropped, so a connection's
/// pumps never outlive it.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> AbortOnDrop<T> {
    /// Aborts the task and waits until it has dropped its future (and with
    /// it its sockets). A finished task has dropped its future already, and
    /// its handle may have been polled to completion, so it is not awaited.
    async fn finish(&mut self) {
        if !self.0.is_finished() {
            self.0.abort();
            let _ = (&mut self.0).await;
        }
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
