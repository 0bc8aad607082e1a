//! `sluice kv serve` and its clients: sharing one store between processes' handles,
//! namespaces, batches larger than a shared region, failing open when the server dies,
//! and a server that survives hostile clients.

mod common;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use sluice_engine::{send_with_fd, SharedMemory};
use sluice_formats::kv_wire::{Request, Response, WireErrorKind, WireNamespace, WIRE_VERSION};
use sluice_kv::{BlockStore, KvClient, KvClientConfig, KvServer, KvServerConfig, KvStore};

/// A server on its own thread; stopped (and joined) on drop.
struct Running {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

fn serve(store: &KvStore, socket: &Path, cfg: KvServerConfig) -> Running {
    let server = KvServer::bind(store.clone(), socket, cfg).unwrap();
    let stop = server.stop_flag();
    let thread = std::thread::spawn(move || server.run(&|| false).unwrap());
    Running {
        stop,
        thread: Some(thread),
    }
}

fn client_cfg(model: &str) -> KvClientConfig {
    let mut c = KvClientConfig::new(ns(model));
    c.retry_ms = 50;
    c.timeout_ms = 5_000;
    c
}

#[test]
fn clients_share_one_store_and_see_what_each_other_stored() {
    let dir = tempdir();
    let store = KvStore::open(dir.path(), config(16, 64)).unwrap();
    let sock = dir.path().join("kv.sock");
    let _server = serve(&store, &sock, KvServerConfig::default());
    let a = KvClient::connect(&sock, client_cfg("m")).unwrap();
    let b = KvClient::connect(&sock, client_cfg("m")).unwrap();
    assert_eq!(BlockStore::block_bytes(&a), BLOCK);
    assert_eq!(put(&a, &[1, 2, 3]), vec![true; 3]);
    assert_eq!(lookup(&b, &[1, 2, 3, 4]), 3);
    assert_eq!(get(&b, &[1, 2, 3, 4]), vec![true, true, true, false]);
    // The owner's own handle sees the clients' blocks too (same namespace).
    assert_eq!(get(&store, &[1, 2]), vec![true, true]);
    let stats = b.stats_json().unwrap();
    assert_eq!(stats["server"]["clients"], 2);
    assert_eq!(stats["client"]["connected"], true);
    assert!(stats["hits_dram"].as_u64().unwrap() >= 3);
}

#[test]
fn namespaces_of_clients_never_see_each_others_blocks() {
    let dir = tempdir();
    let store = KvStore::open(dir.path(), config(16, 64)).unwrap();
    let sock = dir.path().join("kv.sock");
    let _server = serve(&store, &sock, KvServerConfig::default());
    let m1 = KvClient::connect(&sock, client_cfg("model-1")).unwrap();
    let m2 = KvClient::connect(&sock, client_cfg("model-2")).unwrap();
    assert_eq!(put(&m1, &[7]), vec![true]);
    assert_eq!(lookup(&m2, &[7]), 0);
    assert_eq!(get(&m2, &[7]), vec![false]);
    assert_eq!(get(&m1, &[7]), vec![true]);
}

#[test]
fn batches_larger_than_the_shared_region_go_in_parts() {
    let dir = tempdir();
    let store = KvStore::open(dir.path(), config(0, 256)).unwrap();
    let sock = dir.path().join("kv.sock");
    let _server = serve(&store, &sock, KvServerConfig::default());
    let mut cfg = client_cfg("m");
    cfg.shm_bytes = 2 * BLOCK; // two blocks per request
    let c = KvClient::connect(&sock, cfg).unwrap();
    let ids: Vec<u64> = (0..7).collect();
    assert_eq!(put(&c, &ids), vec![true; 7]);
    assert_eq!(lookup(&c, &ids), 7);
    assert_eq!(get(&c, &ids), vec![true; 7]);
    // Prefix semantics across parts: a miss in the second part ends the batch there.
    let ids = [0, 1, 2, 99, 4, 5];
    assert_eq!(get(&c, &ids), vec![true, true, true, false, false, false]);
    assert!(
        c.stats_json().unwrap()["client"]["requests"]
            .as_u64()
            .unwrap()
            >= 10
    );
}

#[test]
fn jobs_run_through_the_client() {
    let dir = tempdir();
    let store = KvStore::open(dir.path(), config(16, 64)).unwrap();
    let sock = dir.path().join("kv.sock");
    let _server = serve(&store, &sock, KvServerConfig::default());
    let c = KvClient::connect(&sock, client_cfg("m")).unwrap();
    let keys = vec![key(1), key(2)];
    let blocks: Vec<Box<dyn sluice_kv::JobBuffer>> =
        keys.iter().map(|k| Box::new(block_for(k)) as _).collect();
    let put = c.submit_put(keys.clone(), blocks).unwrap();
    assert_eq!(put.wait(None), Some(vec![true, true]));
    let bufs: Vec<Box<dyn sluice_kv::JobBuffer>> = keys
        .iter()
        .map(|_| Box::new(vec![0u8; BLOCK as usize]) as _)
        .collect();
    let get = c.submit_get(keys.clone(), bufs).unwrap();
    assert_eq!(get.wait(None), Some(vec![true, true]));
    let back = get.take_buffers();
    assert!(back[1].bytes() == block_for(&keys[1]).as_slice());
    // A bad buffer is refused at submit, as for a local store.
    let short: Vec<Box<dyn sluice_kv::JobBuffer>> = vec![Box::new(vec![0u8; 10])];
    assert!(c.submit_get(vec![key(1)], short).is_err());
}

#[test]
fn a_dead_server_is_a_miss_and_the_client_reconnects_when_one_is_back() {
    let dir = tempdir();
    let sock = dir.path().join("kv.sock");
    let cfg = config(0, 64);
    let store = KvStore::open(dir.path(), cfg.clone()).unwrap();
    let server = serve(&store, &sock, KvServerConfig::default());
    let c = KvClient::connect(&sock, client_cfg("m")).unwrap();
    assert_eq!(put(&c, &[1, 2]), vec![true; 2]);
    drop(server);
    store.close().unwrap();
    drop(store);
    // Fail open: misses, promptly, no error and no hang.
    let t = Instant::now();
    assert_eq!(lookup(&c, &[1, 2]), 0);
    assert_eq!(get(&c, &[1, 2]), vec![false, false]);
    assert_eq!(put(&c, &[3]), vec![false]);
    assert!(c.sync().is_err(), "sync cannot pretend durability");
    assert_eq!(c.stats_json().unwrap()["client"]["connected"], false);
    assert!(t.elapsed() < Duration::from_secs(3));
    // A new server on the same store: the blocks written through the old one are there.
    let store = KvStore::open(dir.path(), cfg).unwrap();
    let _server = serve(&store, &sock, KvServerConfig::default());
    // Misses until retry_ms has passed since the outage, then the reconnect serves.
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(&c, &[1, 2]) != vec![true, true] {
        assert!(Instant::now() < deadline, "the client never reconnected");
        std::thread::sleep(Duration::from_millis(5));
    }
    let s = c.stats_json().unwrap();
    assert_eq!(
        (
            s["client"]["outages"].as_u64(),
            s["client"]["reconnects"].as_u64()
        ),
        (Some(1), Some(1))
    );
    assert!(s["client"]["failed_open"].as_u64().unwrap() >= 4);
}

/// Issue 27: a sidecar restarted with another block size left its old clients missing
/// for ever, with one "Broken pipe" warning and no reason. The client re-handshakes when a
/// connection breaks, notices the new block size, and every call then fails naming both.
#[test]
fn a_server_restarted_with_another_block_size_is_an_error_naming_both_sizes() {
    let dir = tempdir();
    let sock = dir.path().join("kv.sock");
    let store = KvStore::open(&dir.path().join("a"), config(0, 64)).unwrap();
    let server = serve(&store, &sock, KvServerConfig::default());
    let c = KvClient::connect(&sock, client_cfg("m")).unwrap();
    assert_eq!(put(&c, &[1]), vec![true]);
    drop(server);
    store.close().unwrap();
    let mut other = config(0, 0);
    other.block_bytes = 2 * BLOCK;
    other.ssd_bytes = 64 * other.block_bytes;
    let store = KvStore::open(&dir.path().join("b"), other).unwrap();
    let _server = serve(&store, &sock, KvServerConfig::default());
    let k = key(2);
    let block = block_for(&k);
    for _ in 0..2 {
        let err = c
            .put_batch(&[&k], &[&block])
            .expect_err("an error, not a miss");
        let text = err.to_string();
        assert!(
            matches!(err, sluice_kv::KvError::Incompatible { .. }),
            "{text}"
        );
        assert!(text.contains("16384") && text.contains("8192"), "{text}");
        assert!(c.lookup(&[&k], false).is_err());
    }
}

#[test]
fn connecting_to_nothing_or_a_refused_namespace_is_an_error_not_a_miss() {
    let dir = tempdir();
    let missing = KvClient::connect(&dir.path().join("none.sock"), client_cfg("m"));
    assert!(matches!(missing, Err(sluice_kv::KvError::Io { .. })));
    let store = KvStore::open(dir.path(), config(16, 0)).unwrap();
    let sock = dir.path().join("kv.sock");
    let _server = serve(&store, &sock, KvServerConfig::default());
    let mut cfg = client_cfg("m");
    cfg.recompute = Some(sluice_kv::RecomputeModel {
        tokens_per_s: -1.0,
        block_tokens: 16,
    });
    let err = KvClient::connect(&sock, cfg).err().unwrap();
    assert!(matches!(err, sluice_kv::KvError::Config { .. }), "{err}");
    let mut cfg = client_cfg("m");
    cfg.shm_bytes = 1; // smaller than a block
    assert!(KvClient::connect(&sock, cfg).is_err());
}

#[test]
fn a_server_at_its_client_limit_says_busy() {
    let dir = tempdir();
    let store = KvStore::open(dir.path(), config(16, 0)).unwrap();
    let sock = dir.path().join("kv.sock");
    let cfg = KvServerConfig {
        max_clients: 1,
        ..KvServerConfig::default()
    };
    let _server = serve(&store, &sock, cfg);
    let mut one = client_cfg("m");
    one.connections = 1;
    let first = KvClient::connect(&sock, one).unwrap();
    let err = KvClient::connect(&sock, client_cfg("m")).err().unwrap();
    assert!(err.to_string().contains("limit of 1 clients"), "{err}");
    assert_eq!(put(&first, &[1]), vec![true]);
}

#[test]
fn a_stale_socket_is_replaced_a_live_one_and_other_files_refused() {
    let dir = tempdir();
    let store = KvStore::open(dir.path(), config(16, 0)).unwrap();
    let sock = dir.path().join("kv.sock");
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap()); // a dead server's file
    let server = serve(&store, &sock, KvServerConfig::default());
    let err = KvServer::bind(store.clone(), &sock, KvServerConfig::default())
        .err()
        .unwrap();
    assert!(err.to_string().contains("another server answers"), "{err}");
    drop(server);
    assert!(!sock.exists(), "the socket file goes with its server");
    let file = dir.path().join("file.sock");
    std::fs::write(&file, b"x").unwrap();
    let err = KvServer::bind(store.clone(), &file, KvServerConfig::default())
        .err()
        .unwrap();
    assert!(err.to_string().contains("not a socket"), "{err}");
    assert!(file.exists());
}

/// A raw connection that has said hello with a proper region.
fn raw_hello(sock: &Path) -> (UnixStream, SharedMemory) {
    let s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let region = SharedMemory::create("test", 4 * BLOCK as usize).unwrap();
    send_with_fd(&s, &hello().encode(), region.fd()).unwrap();
    assert!(matches!(answer(&s), Some(Response::Hello { .. })));
    (s, region)
}

fn hello() -> Request {
    Request::Hello {
        version: WIRE_VERSION,
        namespace: WireNamespace {
            model: "m".into(),
            ..WireNamespace::default()
        },
        shm_bytes: 4 * BLOCK,
        recompute: None,
    }
}

/// The next answer, or `None` if the server hung up.
fn answer(s: &UnixStream) -> Option<Response> {
    use std::io::Read;
    let mut head = [0u8; 5];
    if (&*s).read_exact(&mut head).is_err() {
        return None;
    }
    let len = u32::from_le_bytes(head[..4].try_into().unwrap()) as usize;
    let mut body = vec![0u8; len];
    (&*s).read_exact(&mut body).ok()?;
    Response::decode(head[4], &body).ok()
}

fn refusal(r: Option<Response>) -> WireErrorKind {
    match r {
        Some(Response::Error { kind, .. }) => kind,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn hostile_clients_end_only_their_own_session() {
    let dir = tempdir();
    let store = KvStore::open(dir.path(), config(16, 64)).unwrap();
    let sock = dir.path().join("kv.sock");
    let running = serve(&store, &sock, KvServerConfig::default());
    let good = KvClient::connect(&sock, client_cfg("m")).unwrap();
    assert_eq!(put(&good, &[1]), vec![true]);

    // Garbage instead of a hello.
    let s = UnixStream::connect(&sock).unwrap();
    (&s).write_all(&[1, 0, 0, 0, 99, 7]).unwrap();
    assert_eq!(refusal(answer(&s)), WireErrorKind::BadRequest);
    // A hello with no region, and one with a plain file (not sealed) as its region.
    let s = UnixStream::connect(&sock).unwrap();
    (&s).write_all(&hello().encode()).unwrap();
    assert_eq!(refusal(answer(&s)), WireErrorKind::BadRequest);
    let s = UnixStream::connect(&sock).unwrap();
    let f = tempfile::tempfile().unwrap();
    f.set_len(4 * BLOCK).unwrap();
    send_with_fd(&s, &hello().encode(), std::os::fd::AsRawFd::as_raw_fd(&f)).unwrap();
    assert_eq!(refusal(answer(&s)), WireErrorKind::Config);
    // Another protocol version.
    let s = UnixStream::connect(&sock).unwrap();
    let region = SharedMemory::create("t", 4 * BLOCK as usize).unwrap();
    let mut old = hello();
    if let Request::Hello { version, .. } = &mut old {
        *version = 0;
    }
    send_with_fd(&s, &old.encode(), region.fd()).unwrap();
    assert_eq!(refusal(answer(&s)), WireErrorKind::Version);
    // A frame length past the limit: the server hangs up.
    let (s, _r) = raw_hello(&sock);
    (&s).write_all(&[0xff, 0xff, 0xff, 0x7f, 3]).unwrap();
    assert!(answer(&s).is_none());
    // Offsets outside the region, overlapping get buffers: refused, the session goes on.
    let (s, _r) = raw_hello(&sock);
    let outside = Request::Put {
        keys: vec![key(5)],
        offsets: vec![4 * BLOCK - 10],
    };
    (&s).write_all(&outside.encode()).unwrap();
    assert_eq!(refusal(answer(&s)), WireErrorKind::InvalidArgument);
    let overlapping = Request::Get {
        keys: vec![key(1), key(1)],
        offsets: vec![0, 100],
    };
    (&s).write_all(&overlapping.encode()).unwrap();
    assert_eq!(refusal(answer(&s)), WireErrorKind::InvalidArgument);
    let wrapping = Request::Put {
        keys: vec![key(5)],
        offsets: vec![u64::MAX - 1],
    };
    (&s).write_all(&wrapping.encode()).unwrap();
    assert_eq!(refusal(answer(&s)), WireErrorKind::InvalidArgument);
    (&s).write_all(&Request::Stats.encode()).unwrap();
    assert!(matches!(answer(&s), Some(Response::Text(_))));
    // Half a frame, then gone.
    let (s, _r) = raw_hello(&sock);
    (&s).write_all(&Request::Stats.encode()[..3]).unwrap();
    drop(s);

    // The server and the well-behaved client never noticed.
    assert_eq!(get(&good, &[1]), vec![true]);
    assert_eq!(put(&good, &[2]), vec![true]);
    let bad = good.stats_json().unwrap()["server"]["bad_requests"]
        .as_u64()
        .unwrap();
    assert!(bad >= 5, "{bad}");
    drop(running);
}

#[test]
fn stopping_the_server_ends_sessions_blocked_on_a_silent_client() {
    let dir = tempdir();
    let store = KvStore::open(dir.path(), config(16, 0)).unwrap();
    let sock = dir.path().join("kv.sock");
    let running = serve(&store, &sock, KvServerConfig::default());
    let (_silent, _region) = raw_hello(&sock);
    let t = Instant::now();
    drop(running); // joins the server thread, which joins the session threads
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(!running_socket_exists(&sock));
}

fn running_socket_exists(sock: &Path) -> bool {
    UnixStream::connect(sock).is_ok()
}

/// A sidecar that answers hellos (when `hello`) and then nothing (a stopped process, a
/// SIGSTOPped one): the connections it accepted. Its thread lives for the test binary.
fn stalled_server(sock: &Path, hello: bool) -> Arc<std::sync::Mutex<Vec<UnixStream>>> {
    let listener = std::os::unix::net::UnixListener::bind(sock).unwrap();
    let accepted: Arc<std::sync::Mutex<Vec<UnixStream>>> = Arc::default();
    let kept = Arc::clone(&accepted);
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let s = s.unwrap();
            kept.lock().unwrap().push(s.try_clone().unwrap()); // before the client can go on
            if hello {
                let _ = answer(&s); // the client's hello, read as a frame
                let reply = Response::Hello {
                    version: WIRE_VERSION,
                    block_bytes: BLOCK,
                    server_pid: 1,
                };
                (&s).write_all(&reply.encode()).unwrap();
            }
        }
    });
    accepted
}

/// Issue 27: a sidecar that stalls. A request unanswered for `timeout_ms` was tried again
/// on a fresh connection, which waited `timeout_ms` too, so each call stalled the engine
/// twice as long as configured; and the error said only "Resource temporarily
/// unavailable (os error 11)".
#[test]
fn a_stalled_server_costs_one_timeout_and_says_so() {
    let dir = tempdir();
    let sock = dir.path().join("kv.sock");
    let accepted = stalled_server(&sock, true);
    let mut cfg = client_cfg("m");
    cfg.timeout_ms = 200;
    cfg.retry_ms = 60_000;
    let c = KvClient::connect(&sock, cfg).unwrap();
    assert_eq!(lookup(&c, &[1]), 0, "fails open");
    assert_eq!(
        accepted.lock().unwrap().len(),
        1,
        "no second connection to a server that did not answer"
    );
    let s = c.stats_json().unwrap();
    assert_eq!(s["client"]["outages"], 1);

    let silent = dir.path().join("silent.sock");
    let _accepted = stalled_server(&silent, false);
    let mut cfg = client_cfg("m");
    cfg.timeout_ms = 200;
    let err = KvClient::connect(&silent, cfg).err().unwrap().to_string();
    assert!(err.contains("did not answer within 200 ms"), "{err}");
}

/// Issue 28: a delete through the sidecar reaches the shared store (another client misses
/// afterwards); with the server gone it is an error, never a silent "nothing held".
#[test]
fn a_delete_through_the_client_reaches_the_store_and_fails_loudly_without_a_server() {
    let dir = tempdir();
    let sock = dir.path().join("kv.sock");
    let store = KvStore::open(dir.path(), config(4, 64)).unwrap();
    let server = serve(&store, &sock, KvServerConfig::default());
    let a = KvClient::connect(&sock, client_cfg("m")).unwrap();
    let b = KvClient::connect(&sock, client_cfg("m")).unwrap();
    assert_eq!(put(&a, &[1, 2, 3]), vec![true; 3]);
    let keys = [key(2), key(3), key(9)];
    let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
    assert_eq!(BlockStore::delete(&b, &refs).unwrap(), 2);
    assert_eq!(get(&a, &[1, 2]), vec![true, false]);
    assert_eq!(store.stats().deletes, 2);
    let err = BlockStore::delete(&a, &[b""]).unwrap_err();
    assert!(err.to_string().contains("key 0"), "{err}");
    drop(server);
    store.close().unwrap();
    let err = BlockStore::delete(&a, &refs[..1]).unwrap_err();
    assert!(err.to_string().contains("unreachable"), "{err}");
}
