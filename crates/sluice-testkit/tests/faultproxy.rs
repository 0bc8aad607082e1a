//! The fault proxy in-process, between a test client and a tiny upstream on
//! loopback: bytes pass unchanged, the delay is added each way, and each
//! fault lands after exactly its byte count on the connections it names.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_testkit::faultproxy::{self, FaultProxyConfig, ProxyExit, ResponseFault};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Pseudo-random bytes, so a reordered or shifted chunk shows.
fn payload(len: usize) -> Vec<u8> {
    sluice_testkit::random_bytes(len, 1)
}

/// An upstream that answers each connection's first byte with `body`, then
/// closes.
async fn serving_upstream(body: Vec<u8>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let body = Arc::new(body);
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut request = [0u8; 1];
                if conn.read_exact(&mut request).await.is_ok() {
                    let _ = conn.write_all(&body).await;
                }
            });
        }
    });
    addr
}

/// An upstream that echoes every connection until it half-closes.
async fn echo_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut rd, mut wr) = conn.split();
                let _ = tokio::io::copy(&mut rd, &mut wr).await;
                let _ = wr.shutdown().await;
            });
        }
    });
    addr
}

async fn start_proxy(config: FaultProxyConfig) -> (SocketAddr, JoinHandle<ProxyExit>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let proxy = tokio::spawn(faultproxy::run(listener, config, std::future::pending()));
    (addr, proxy)
}

/// Sends a one-byte request through `proxy` and reads until EOF or an
/// error: the bytes received and how the stream ended.
async fn fetch(proxy: SocketAddr) -> (Vec<u8>, io::Result<()>) {
    // A reset can come before the connect or the request completes.
    let mut conn = match TcpStream::connect(proxy).await {
        Ok(conn) => conn,
        Err(err) => return (Vec::new(), Err(err)),
    };
    if let Err(err) = conn.write_all(b"G").await {
        return (Vec::new(), Err(err));
    }
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match conn.read(&mut buf).await {
            Ok(0) => return (got, Ok(())),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(err) => return (got, Err(err)),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_bytes_unchanged_both_ways() {
    let upstream = echo_upstream().await;
    let (proxy, _proxy_task) = start_proxy(FaultProxyConfig::new(upstream.to_string())).await;
    let sent = payload(16 << 20);
    let conn = TcpStream::connect(proxy).await.unwrap();
    let (mut rd, mut wr) = conn.into_split();
    let to_send = sent.clone();
    let writer = tokio::spawn(async move {
        wr.write_all(&to_send).await.unwrap();
        wr.shutdown().await.unwrap();
    });
    let mut echoed = Vec::new();
    rd.read_to_end(&mut echoed).await.unwrap();
    writer.await.unwrap();
    assert_eq!(echoed.len(), sent.len());
    assert!(
        echoed == sent,
        "the echoed payload differs from the one sent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_applies_in_each_direction() {
    let upstream = echo_upstream().await;
    let config =
        FaultProxyConfig::new(upstream.to_string()).with_one_way_delay(Duration::from_millis(50));
    let (proxy, _proxy_task) = start_proxy(config).await;
    let mut conn = TcpStream::connect(proxy).await.unwrap();
    let start = Instant::now();
    conn.write_all(b"x").await.unwrap();
    let mut reply = [0u8; 1];
    conn.read_exact(&mut reply).await.unwrap();
    let round_trip = start.elapsed();
    assert_eq!(&reply, b"x");
    assert!(
        round_trip >= Duration::from_millis(95),
        "round trip took {round_trip:?}, expected at least 2 x 50 ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_after_resets_after_exactly_that_many_bytes() {
    let upstream = serving_upstream(payload(1 << 20)).await;
    let config =
        FaultProxyConfig::new(upstream.to_string()).with_response_fault(ResponseFault::Reset {
            after_bytes: 100_000,
        });
    let (proxy, _proxy_task) = start_proxy(config).await;
    let (got, end) = fetch(proxy).await;
    assert_eq!(got.len(), 100_000);
    assert_eq!(got, payload(1 << 20)[..100_000]);
    let err = end.expect_err("the stream should end with a reset, not EOF");
    assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncate_after_ends_the_body_after_exactly_that_many_bytes() {
    let upstream = serving_upstream(payload(1 << 20)).await;
    let config =
        FaultProxyConfig::new(upstream.to_string()).with_response_fault(ResponseFault::Truncate {
            after_bytes: 100_000,
        });
    let (proxy, _proxy_task) = start_proxy(config).await;
    let (got, end) = fetch(proxy).await;
    end.expect("a truncated stream ends with EOF");
    assert_eq!(got.len(), 100_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall_after_sends_nothing_more_but_keeps_the_connection() {
    let upstream = serving_upstream(payload(1 << 20)).await;
    let config =
        FaultProxyConfig::new(upstream.to_string()).with_response_fault(ResponseFault::Stall {
            after_bytes: 100_000,
        });
    let (proxy, _proxy_task) = start_proxy(config).await;
    let mut conn = TcpStream::connect(proxy).await.unwrap();
    conn.write_all(b"G").await.unwrap();
    let mut head = vec![0u8; 100_000];
    conn.read_exact(&mut head).await.unwrap();
    let mut more = [0u8; 1];
    let next = tokio::time::timeout(Duration::from_millis(300), conn.read(&mut more)).await;
    assert!(next.is_err(), "a stalled connection returned {next:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faulty_one_affects_only_the_first_connection() {
    let body = payload(1 << 20);
    let upstream = serving_upstream(body.clone()).await;
    let config = FaultProxyConfig::new(upstream.to_string())
        .with_response_fault(ResponseFault::Truncate { after_bytes: 1000 })
        .with_faulty_connections(1);
    let (proxy, _proxy_task) = start_proxy(config).await;
    let (first, _) = fetch(proxy).await;
    assert_eq!(first.len(), 1000);
    let (second, end) = fetch(proxy).await;
    end.unwrap();
    assert!(
        second == body,
        "the second connection got {} bytes",
        second.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn die_after_resets_and_refuses_later_connections() {
    let upstream = serving_upstream(payload(1 << 20)).await;
    let config = FaultProxyConfig::new(upstream.to_string()).with_die_after_bytes(50_000);
    let (proxy, proxy_task) = start_proxy(config).await;
    let (got, end) = fetch(proxy).await;
    assert_eq!(got.len(), 50_000);
    let err = end.expect_err("the stream should end with a reset, not EOF");
    assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err}");
    assert_eq!(proxy_task.await.unwrap(), ProxyExit::Died);
    let err = TcpStream::connect(proxy)
        .await
        .expect_err("the proxy is gone");
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_upstream_drops_the_client_and_the_proxy_stays_up() {
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = closed.local_addr().unwrap();
    drop(closed);
    let (proxy, proxy_task) = start_proxy(FaultProxyConfig::new(upstream.to_string())).await;
    for _ in 0..2 {
        let (got, end) = fetch(proxy).await;
        assert!(got.is_empty());
        // Accepted, then dropped: not refused.
        if let Err(err) = end {
            assert_ne!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}");
        }
    }
    assert!(!proxy_task.is_finished());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_future_stops_the_proxy() {
    let upstream = echo_upstream().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let config = FaultProxyConfig::new(upstream.to_string());
    let proxy = tokio::spawn(faultproxy::run(listener, config, async {
        let _ = stopped.await;
    }));
    stop.send(()).unwrap();
    assert_eq!(proxy.await.unwrap(), ProxyExit::Shutdown);
}
