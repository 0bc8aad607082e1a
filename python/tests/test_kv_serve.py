"""`sluice kv serve` with `sluice.kv.connect`: processes sharing one store through the
sidecar, signals, a killed server (clients fail open, then reconnect), bad input."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import sluice.kv
from forking import status_in_fork
from kv_server import Server
from sluice.errors import (
    ConfigError,
    SluiceFileNotFoundError,
    SluiceIOError,
    StoreFormatError,
    StoreLockedError,
)

BLOCK = 16384


def keys_for(n, start=0):
    return [b"chain-%08d" % i for i in range(start, start + n)]


def blocks_for(keys):
    return [
        np.frombuffer(np.random.default_rng(int(k[-8:])).bytes(BLOCK), np.uint8).copy()
        for k in keys
    ]


@pytest.fixture
def serve(sluice_bin, tmp_path):
    started = []

    def start(*extra: str, store: Path | None = None, block_bytes: str = "16KiB") -> Server:
        s = Server(
            sluice_bin,
            store or tmp_path / "store",
            tmp_path / "kv.sock",
            *extra,
            block_bytes=block_bytes,
        )
        started.append(s)
        return s

    yield start
    for s in started:
        s.close()


def connect(server: Server, **kw) -> sluice.kv.KvStore:
    args = dict(model="m", dtype="bfloat16", retry_ms=50, timeout_ms=10_000)
    args.update(kw)
    return sluice.kv.connect(server.socket, **args)


def test_processes_share_one_store_and_sigterm_stops_the_server_cleanly(serve, tmp_path):
    server = serve()
    keys = keys_for(5)
    with connect(server) as client:
        assert client.block_bytes == BLOCK
        assert client.put_batch(keys, blocks_for(keys)) == [True] * 5
        # Another process reads what this one stored, byte for byte.
        reader = textwrap.dedent(
            f"""
            import numpy as np, sluice.kv
            keys = [b"chain-%08d" % i for i in range(6)]
            c = sluice.kv.connect({str(server.socket)!r}, model="m", dtype="bfloat16")
            out = [np.zeros({BLOCK}, np.uint8) for _ in keys]
            print(c.lookup(keys), c.get_batch_into(keys, out))
            want = [np.random.default_rng(int(k[-8:])).bytes({BLOCK}) for k in keys[:5]]
            assert all(o.tobytes() == w for o, w in zip(out, want))
            print(c.stats()["server"]["clients"])
            """
        )
        done = subprocess.run(
            [sys.executable, "-c", reader], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        lines = done.stdout.split("\n")
        assert lines[0] == "5 [True, True, True, True, True, False]"
        assert lines[1] == "2"
        # Another namespace sees none of it.
        with connect(server, model="other") as other:
            assert other.lookup(keys) == 0
    assert server.stop(signal.SIGTERM) == 0
    assert not server.socket.exists()
    assert "stopped" in server.stderr()


def test_ctrl_c_stops_the_server_with_a_client_still_connected(serve):
    server = serve()
    client = connect(server)
    assert client.put_batch(keys_for(1), blocks_for(keys_for(1))) == [True]
    assert server.stop(signal.SIGINT) == 0
    assert not server.socket.exists()
    # The client fails open: a miss, not an exception or a hang.
    assert client.lookup(keys_for(1)) == 0
    assert client.stats()["client"]["connected"] is False
    client.close()


def test_a_killed_server_is_a_miss_and_a_restarted_one_serves_the_same_blocks(serve, tmp_path):
    server = serve()
    keys = keys_for(4)
    data = blocks_for(keys)
    client = connect(server)
    assert client.put_batch(keys, data) == [True] * 4  # durable: batch durability
    server.proc.kill()
    server.proc.wait()
    assert server.socket.exists(), "a killed server leaves its socket file"
    out = [np.zeros(BLOCK, np.uint8) for _ in keys]
    t = time.monotonic()
    assert client.lookup(keys) == 0
    assert client.get_batch_into(keys, out) == [False] * 4
    assert client.put_batch(keys_for(1, 100), blocks_for(keys_for(1, 100))) == [False]
    assert time.monotonic() - t < 5
    serve()  # replaces the stale socket, recovers the store
    # Misses until retry_ms has passed since the outage, then the reconnect serves.
    deadline = time.monotonic() + 10
    while client.get_batch_into(keys, out) != [True] * 4:
        assert time.monotonic() < deadline, "the client never reconnected"
        time.sleep(0.005)
    assert all(o.tobytes() == d.tobytes() for o, d in zip(out, data))
    stats = client.stats()["client"]
    assert (stats["outages"], stats["reconnects"]) == (1, 1)
    client.close()


def test_connecting_wrongly_raises_typed_errors(serve, tmp_path):
    with pytest.raises(SluiceFileNotFoundError, match=r"none\.sock"):
        sluice.kv.connect(tmp_path / "none.sock", model="m")
    server = serve()
    with pytest.raises(ConfigError, match="shm"):
        connect(server, shm="lots")
    with pytest.raises(ConfigError, match="shared region is 4096 bytes"):
        connect(server, shm=4096)  # smaller than one block
    with pytest.raises(ConfigError, match="recompute"):
        connect(server, recompute_tokens_per_s=100.0)
    with pytest.raises(ConfigError, match="connections"):
        connect(server, connections=0)
    with connect(server) as client:
        with pytest.raises(ConfigError, match="buffer 0"):
            client.put_batch(keys_for(1), [np.zeros(10, np.uint8)])
        with pytest.raises(ConfigError, match="key 0"):
            client.lookup([b""])
    server.proc.kill()
    server.proc.wait()
    with pytest.raises(SluiceIOError, match=r"kv\.sock"):
        sluice.kv.connect(server.socket, model="m")  # a stale socket: nobody answers


def test_serve_refuses_bad_flags_and_foreign_files(sluice_bin, tmp_path):
    def run(*args):
        return subprocess.run(
            [str(sluice_bin), "kv", "serve", str(tmp_path / "s"), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    sock = str(tmp_path / "kv.sock")
    done = run("--socket", sock)
    assert done.returncode == 2 and "--block-bytes" in done.stderr
    done = run("--socket", sock, "--block-bytes", "16KiB", "--socket-mode", "9z")
    assert done.returncode == 2 and "socket-mode" in done.stderr
    done = run("--socket", sock, "--block-bytes", "16KiB", "--durability", "often")
    assert done.returncode == 2 and "durability" in done.stderr
    regular = tmp_path / "file.sock"
    regular.write_text("mine")
    done = run("--socket", str(regular), "--block-bytes", "16KiB", "--ssd", "16MiB")
    assert done.returncode != 0 and "not a socket" in done.stderr
    assert regular.read_text() == "mine"
    # Issue 27: a socket path too long for a Unix socket is a usage error (2) naming it
    # and the limit, not a failure (1); connect() raises ConfigError for it.
    long = str(tmp_path / ("x" * 120) / "kv.sock")
    done = run("--socket", long, "--block-bytes", "16KiB", "--ssd", "16MiB")
    assert done.returncode == 2, done.stderr
    assert long in done.stderr and "107 bytes" in done.stderr
    with pytest.raises(ConfigError, match="107 bytes"):
        sluice.kv.connect(long, model="m")
    # The store it opened was closed again: another process can take it.
    with sluice.kv.open(tmp_path / "s", block_bytes=BLOCK, ssd="16MiB") as store:
        assert store.lookup([b"x"]) == 0


def test_a_second_server_on_a_live_socket_is_refused(serve, tmp_path, sluice_bin):
    server = serve()
    other = subprocess.run(
        [
            str(sluice_bin),
            *("kv", "serve", str(tmp_path / "store2"), "--socket", str(server.socket)),
            *("--block-bytes", "16KiB", "--ssd", "16MiB"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert other.returncode != 0 and "another server answers" in other.stderr
    with connect(server) as client:
        assert client.lookup(keys_for(1)) == 0
    assert os.path.exists(server.socket)


def test_a_server_restarted_with_another_block_size_fails_calls_naming_both(serve, tmp_path):
    """Issue 27: clients of a sidecar restarted with another --block-bytes used to miss
    for ever after one "Broken pipe" warning; now every call raises, naming both sizes."""
    server = serve()
    client = connect(server)
    keys = keys_for(2)
    assert client.put_batch(keys, blocks_for(keys)) == [True, True]
    assert server.stop() == 0
    serve(store=tmp_path / "store-32k", block_bytes="32KiB")
    for _ in range(2):
        with pytest.raises(StoreFormatError, match=r"32768-byte blocks.*16384-byte blocks"):
            client.lookup(keys)


def test_a_forked_child_cannot_read_through_its_parents_connection(serve):
    # Issue 27: a child forked after connect shared its parent's socket and shared region;
    # their requests interleaved and each read the other's blocks: gets returned True with
    # another key's bytes.
    server = serve()
    keys = keys_for(4)
    data = blocks_for(keys)
    with connect(server) as client:
        assert client.put_batch(keys, data) == [True] * 4

        def child():
            out = [np.zeros(BLOCK, np.uint8) for _ in keys]
            for call in (
                lambda: client.get_batch_into(keys, out),
                lambda: client.lookup(keys),
                lambda: client.put_batch(keys, data),
                lambda: client.submit_get(keys, out),
            ):
                with pytest.raises(StoreLockedError, match="is a fork"):
                    call()
            assert not any(o.any() for o in out)
            client.close()

        assert status_in_fork(child) == 0
        out = [np.zeros(BLOCK, np.uint8) for _ in keys]
        assert client.get_batch_into(keys, out) == [True] * 4
        assert all((o == d).all() for o, d in zip(out, data))
