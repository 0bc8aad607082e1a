"""The KV shared tier in an object store (issue 30, part 3), against moto's S3 server: blocks
one store put are found and read, bit-exact, by another that shares nothing with it but the
bucket; namespaces stay apart; a corrupt, missing or slow remote block is a miss, never
bytes or a wait; the tier keeps its budget by deleting whole segments; a dead server costs
uploads, not puts; bad settings and credentials are clear errors. And two "nodes", each a
process in its own network namespace with its own directories, share blocks only through
the object store."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import sluice.kv
from s3_support import BUCKET, FaultProxy, S3Server, moto_with_auth
from sluice.errors import ConfigError, SluiceFileNotFoundError, SluicePermissionError

HERE = Path(__file__).resolve().parent
BLOCK = 64 << 10


_seq = iter(range(1 << 30))


@pytest.fixture
def url(s3_env):
    """A fresh prefix in the bucket for each test."""
    return f"s3://{BUCKET}/kv-{next(_seq)}-{os.getpid()}"


def objects(s3: S3Server, url: str) -> dict[str, int]:
    return s3.objects(url + "/")


def keys_for(n: int, start: int = 0) -> list[bytes]:
    return [b"chain-%08d" % i for i in range(start, start + n)]


def block(key: bytes) -> np.ndarray:
    seed = int(key.split(b"-")[1])
    return np.frombuffer(np.random.default_rng(seed).bytes(BLOCK), np.uint8)


def open_store(path: Path, url: str, **kw):
    args = dict(
        block_bytes=BLOCK,
        ssd="4MiB",
        model="m",
        remote=url,
        shared_refresh_ms=30,
        segment_bytes="1MiB",
    )
    args.update(kw)
    return sluice.kv.open(path, **args)


def wait_until(what, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def read(kv, keys: list[bytes]) -> tuple[list[bool], list[np.ndarray]]:
    bufs = [np.zeros(BLOCK, np.uint8) for _ in keys]
    return kv.get_batch_into(keys, bufs), bufs


def test_blocks_one_store_put_another_finds_verifies_and_keeps(url, tmp_path, s3):
    keys = keys_for(5)
    with open_store(tmp_path / "a", url, shared="4MiB") as a:
        assert a.put_batch(keys, [block(k) for k in keys]) == [True] * 5
        with open_store(tmp_path / "b", url) as b:
            wait_until(lambda: b.lookup(keys) == 5)
            ok, bufs = read(b, keys)
            assert ok == [True] * 5
            assert all((x == block(k)).all() for x, k in zip(bufs, keys))
            s = b.stats()
            assert s["hits_shared"] == 5 and s["foreign"]["stores"] == 1
            # Promoted into b's own SSD tier: the next read does not go to the network.
            ok, bufs = read(b, keys)
            assert ok == [True] * 5 and b.stats()["hits_ssd"] == 5
            assert all((x == block(k)).all() for x, k in zip(bufs, keys))
        up = a.stats()["remote"]
        assert up["uploaded_segments"] >= 1 and up["failed_passes"] == 0
    # Only a's sealed segments and their summaries are there: what it wrote, no more
    # than its records (a segment sealed early goes up without its unused slots).
    names = objects(s3, url)
    assert names and all(k.endswith((".skv", ".summary")) for k in names)
    assert sum(n for k, n in names.items() if k.endswith(".skv")) < 16 * BLOCK


def test_namespaces_never_see_each_others_blocks(url, tmp_path):
    keys = keys_for(3)
    with open_store(tmp_path / "a", url, shared="4MiB", model="llama") as a:
        assert a.put_batch(keys, [block(k) for k in keys]) == [True] * 3
        with open_store(tmp_path / "b", url, model="mistral") as b:
            wait_until(lambda: b.stats()["foreign"]["blocks"] == 3)
            assert b.lookup(keys) == 0
            assert read(b, keys)[0] == [False] * 3


def test_a_corrupt_or_deleted_remote_block_is_a_miss(url, tmp_path, s3):
    keys = keys_for(4)
    with open_store(tmp_path / "a", url, shared="4MiB") as a:
        assert a.put_batch(keys, [block(k) for k in keys]) == [True] * 4
    segment = next(k for k in objects(s3, url) if k.endswith(".skv"))
    body = bytearray(s3.client.get_object(Bucket=BUCKET, Key=segment)["Body"].read())
    slot = len(body) // 5  # 1 header slot + 4 records
    body[2 * slot + slot // 2] ^= 0xFF  # inside the second record's payload
    s3.client.put_object(Bucket=BUCKET, Key=segment, Body=bytes(body))
    # b keeps nothing of its own, so every read goes to the object store.
    with open_store(tmp_path / "b", url, ssd=0) as b:
        wait_until(lambda: b.lookup(keys) == 4)
        ok, bufs = read(b, keys)
        # The first block verifies; the second does not, and prefix semantics end there.
        assert ok == [True, False, False, False]
        assert (bufs[0] == block(keys[0])).all()
        assert b.stats()["foreign"]["read_failures"] == 1
        assert b.lookup(keys) == 1
        # The segment gone (its summary still listed): misses, not errors.
        s3.client.delete_object(Bucket=BUCKET, Key=segment)
        assert read(b, keys[:1])[0] == [False]
        assert b.lookup(keys) == 0


def test_a_slow_server_is_a_miss_and_lookups_do_not_wait(url, tmp_path, s3, monkeypatch):
    keys = keys_for(2)
    with open_store(tmp_path / "a", url, shared="4MiB") as a:
        assert a.put_batch(keys, [block(k) for k in keys]) == [True] * 2
    # Every round trip through the proxy takes 1.6 s; a read may take 200 ms.
    with FaultProxy(s3.port, "--delay-ms", "800") as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        with open_store(tmp_path / "b", url, remote_timeout_ms=200) as b:
            assert b.lookup(keys) == 2  # the open listed the prefix once
            started = time.monotonic()
            ok, _ = read(b, keys)
            took = time.monotonic() - started
            assert ok == [False, False]
            assert took < 1.5, f"a read waited {took:.2f} s for a slow server"
            # The background listing is stuck behind the slow server: lookups are not.
            started = time.monotonic()
            for _ in range(100):
                b.lookup(keys)
            assert time.monotonic() - started < 1.0
            assert b.stats()["foreign"]["read_failures"] >= 1


def test_the_tier_keeps_its_budget_by_deleting_whole_segments(url, tmp_path, s3):
    """A budget of 16 blocks, 64 blocks put: FIFO drops the oldest segments locally, and
    the uploader deletes them remotely; another store stops seeing their blocks."""
    keys = keys_for(64)
    with open_store(tmp_path / "a", url, shared="1MiB", ssd=0, dram="8MiB") as a:
        # The first blocks go up before the rest push them out (a segment dropped before
        # any pass uploaded it has nothing in the bucket to delete).
        assert a.put_batch(keys[:8], [block(k) for k in keys[:8]]) == [True] * 8
        wait_until(lambda: a.stats()["remote"]["uploaded_segments"] > 0)
        for i in range(8, 64, 8):
            batch = keys[i : i + 8]
            a.put_batch(batch, [block(k) for k in batch])
        a.sync()
        s = a.stats()
        assert s["shared"]["blocks"] <= 16
        assert s["shared"]["allocated_bytes"] <= s["shared"]["disk_bytes_limit"]
        wait_until(lambda: a.stats()["remote"]["deleted_segments"] > 0)
        with open_store(tmp_path / "b", url) as b:
            wait_until(lambda: b.stats()["foreign"]["blocks"] > 0)
            assert b.lookup(keys[:1]) == 0  # the first segment is gone
    # Closed, its last pass done: the bucket holds no more than the local tier's files.
    on_disk = sum(n for k, n in objects(s3, url).items() if k.endswith(".skv"))
    assert 0 < on_disk <= s["shared"]["disk_bytes_limit"]


def test_a_dead_server_costs_uploads_not_puts(url, tmp_path, s3, monkeypatch):
    keys = keys_for(8)
    proxy = FaultProxy(s3.port)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    try:
        a = open_store(tmp_path / "a", url, shared="4MiB", dram="1MiB")
    finally:
        proxy.stop()
    started = time.monotonic()
    assert a.put_batch(keys, [block(k) for k in keys]) == [True] * 8
    ok, bufs = read(a, keys)
    assert ok == [True] * 8 and all((x == block(k)).all() for x, k in zip(bufs, keys))
    wait_until(lambda: a.stats()["remote"]["failed_passes"] > 0)
    assert "127.0.0.1" in a.stats()["remote"]["last_error"]
    a.close()
    assert time.monotonic() - started < 30
    # Reopened with the server back: what was sealed goes up.
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    with open_store(tmp_path / "a", url, shared="4MiB", dram="1MiB") as a:
        wait_until(lambda: a.stats()["remote"]["uploaded_segments"] > 0)


def test_close_does_not_wait_out_a_stalled_server(url, tmp_path, s3, monkeypatch):
    """The server stops answering mid-way (its proxy SIGSTOPped: connections accepted, no
    byte forwarded) while segments wait to go up: close() returns after the remote thread's
    grace, not after every request's timeout; the blocks stay in the local tiers."""
    import signal

    keys = keys_for(8)
    monkeypatch.setenv("SLUICE_REMOTE_TIMEOUT_S", "120")
    with FaultProxy(s3.port) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        a = open_store(tmp_path / "a", url, shared="4MiB")
        proxy.proc.send_signal(signal.SIGSTOP)
        try:
            assert a.put_batch(keys, [block(k) for k in keys]) == [True] * 8
            time.sleep(0.5)  # a pass starts, and hangs
            started = time.monotonic()
            a.close()
            took = time.monotonic() - started
        finally:
            proxy.proc.send_signal(signal.SIGCONT)
    assert took < 25, f"close() waited {took:.1f} s for a stalled server"
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    with open_store(tmp_path / "a", url, shared="4MiB") as a:
        ok, bufs = read(a, keys)
        assert ok == [True] * 8 and all((x == block(k)).all() for x, k in zip(bufs, keys))


def test_bad_settings_are_clear_errors(url, tmp_path, s3):
    with pytest.raises(ConfigError, match="shared_dir"):
        open_store(tmp_path / "x", url, shared_dir=tmp_path / "nfs")
    with pytest.raises(ConfigError, match="remote"):
        open_store(tmp_path / "x", "s3:/nobucket")
    with pytest.raises(ConfigError, match="remote_timeout_ms"):
        open_store(tmp_path / "x", url, remote_timeout_ms=0)
    with pytest.raises(ConfigError, match="shared_dir or a remote"):
        sluice.kv.open(tmp_path / "x", block_bytes=BLOCK, ssd="4MiB", shared="4MiB")
    with pytest.raises(SluiceFileNotFoundError, match="no-such-bucket"):
        open_store(tmp_path / "x", "s3://no-such-bucket/kv")


def test_wrong_credentials_are_a_permission_error(tmp_path, monkeypatch):
    with moto_with_auth() as env:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        with pytest.raises(SluicePermissionError, match=f"s3://{BUCKET}/kv"):
            open_store(tmp_path / "x", f"s3://{BUCKET}/kv")


def test_the_sidecar_serves_a_remote_tier(url, tmp_path, sluice_bin, s3):
    """`sluice kv serve --remote`: blocks a client puts go up; SIGTERM uploads the rest."""
    sock = tmp_path / "kv.sock"
    server = subprocess.Popen(
        [
            sluice_bin,
            "kv",
            "serve",
            str(tmp_path / "served"),
            "--socket",
            str(sock),
            "--block-bytes",
            str(BLOCK),
            "--ssd",
            "4MiB",
            "--remote",
            url,
            "--shared",
            "4MiB",
        ],
        env=os.environ,
    )
    try:
        wait_until(sock.exists)
        keys = keys_for(3)
        client = sluice.kv.connect(sock, model="m")
        assert client.put_batch(keys, [block(k) for k in keys]) == [True] * 3
        client.close()
    finally:
        server.terminate()
        assert server.wait(timeout=60) == 0
    with open_store(tmp_path / "b", url) as b:
        assert b.lookup(keys) == 3
        ok, bufs = read(b, keys)
        assert ok == [True] * 3 and all((x == block(k)).all() for x, k in zip(bufs, keys))


NS = ("sluicekv-a", "sluicekv-b")


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, capture_output=True, text=True)


def netns_down() -> None:
    for i, ns in enumerate(NS):
        for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
            sh("kill", "-9", pid, check=False)
        sh("ip", "link", "del", f"skv-host{i}", check=False)
        sh("ip", "netns", "del", ns, check=False)


@pytest.fixture
def two_netns():
    """Two network namespaces, each reaching the root namespace (and nothing else) over a
    veth pair: node i is 10.231.i.2, the root side 10.231.i.1."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2's ip")
    netns_down()
    try:
        for i, ns in enumerate(NS):
            host, peer = f"skv-host{i}", f"skv-node{i}"
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", host, "type", "veth", "peer", "name", peer)
            sh("ip", "link", "set", peer, "netns", ns)
            sh("ip", "addr", "add", f"10.231.{i}.1/30", "dev", host)
            sh("ip", "link", "set", host, "up")
            sh("ip", "-n", ns, "addr", "add", f"10.231.{i}.2/30", "dev", peer)
            sh("ip", "-n", ns, "link", "set", peer, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield
    finally:
        netns_down()


def test_two_nodes_share_blocks_only_through_the_object_store(two_netns, tmp_path):
    server = S3Server(host="0.0.0.0")
    try:
        url = f"s3://{BUCKET}/nodes"
        runs = []
        for i, mode in enumerate(("put", "get")):
            env = {**os.environ, **server.env(f"http://10.231.{i}.1:{server.port}")}
            node = tmp_path / f"node{i}"
            node.mkdir()
            script = str(HERE / "kv_remote_node.py")
            args = [mode, str(node / "kv"), url, "m", "24"]
            done = subprocess.run(
                ["ip", "netns", "exec", NS[i], sys.executable, script, *args],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        put, get = runs
        assert put["put"] == [True] * 24
        assert put["stats"]["remote"]["uploaded_segments"] >= 1
        assert get["found"] == 24 and get["got"] == [True] * 24 and get["exact"]
        assert get["stats"]["hits_shared"] == 24 and get["stats"]["hits_ssd"] == 24
        # Node 1 cannot reach node 0 at all: only the bucket is between them.
        probe = "import socket; socket.create_connection(('10.231.0.2', 22), timeout=1)"
        reach = sh("ip", "netns", "exec", NS[1], sys.executable, "-c", probe, check=False)
        assert reach.returncode != 0 and "unreachable" in reach.stderr
    finally:
        server.stop()
