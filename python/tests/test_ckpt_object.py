"""`sluice.ckpt` with its store in an object store (issue 30, part 2), against the servers
the suite already runs: moto (S3) in depth, Azurite (az://) and fake-gcs-server (gs://) for
the round trip and the create-only publish.

What is checked: save/load/ls/verify/gc round trips bit-exact; dedup across steps (an
incremental save uploads only the changed chunks); the manifest published last and
create-only (a second save of a name is refused before any chunk goes up); a save SIGKILLed
mid-upload is never visible and `gc` removes what it left; a corrupted or missing chunk
object is a typed error naming it; wrong credentials are a permission error; grouped saves
and DCP at world 2 over gloo; the CLI on a URL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sluice.ckpt as ck
import torch
import worlds
from s3_support import BUCKET, FaultProxy, S3Server, moto_with_auth
from sluice.errors import (
    ChunkCorruptError,
    ConfigError,
    SluiceFileNotFoundError,
    SluiceIOError,
    SluicePermissionError,
)

HERE = Path(__file__).resolve().parent


_seq = iter(range(1 << 30))


@pytest.fixture
def store(s3_env):
    """A fresh prefix in the bucket for each test."""
    return f"s3://{BUCKET}/ckpt-{next(_seq)}-{os.getpid()}"


def keys(s3: S3Server, prefix: str) -> dict[str, int]:
    """Every object under ``prefix`` (without ``s3://bucket/``) and its size."""
    return s3.objects(prefix)


def prefix_of(url: str) -> str:
    return url.removeprefix(f"s3://{BUCKET}/") + "/"


def chunk_keys(s3: S3Server, store: str) -> dict[str, int]:
    return {k: n for k, n in keys(s3, prefix_of(store)).items() if "/chunks/" in k}


def model(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(512, 1024, generator=g)  # 2 MiB: 32 chunks of 64 KiB
    return {
        "w": w,
        "tied": w,
        "b": torch.randn(1000, generator=g).to(torch.bfloat16),
        "i": torch.randint(-100, 100, (77, 3), generator=g, dtype=torch.int64),
        "m": torch.rand(300, generator=g) > 0.5,
        "zeros": torch.zeros(256, 1024),  # one chunk, stored once
        "step": 7,
        "cfg": {"lr": 0.1, "name": "x"},
    }


def blank(sd: dict) -> dict:
    return {
        k: (torch.full_like(v, 3) if isinstance(v, torch.Tensor) else blank(v))
        if isinstance(v, (torch.Tensor, dict))
        else None
        for k, v in sd.items()
    }


def same(a: dict, b: dict) -> bool:
    for k, v in a.items():
        if isinstance(v, torch.Tensor):
            if v.dtype != b[k].dtype or not torch.equal(v, b[k]):
                return False
        elif isinstance(v, dict):
            if not same(v, b[k]):
                return False
        elif v != b[k]:
            return False
    return True


CHUNK = 64 << 10


def test_save_load_ls_verify_and_an_incremental_save_upload_only_new_chunks(store, s3_env):
    sd = model()
    r1 = ck.save(sd, f"{store}/step-1", chunk_bytes=CHUNK, blocking=True).result()
    assert r1["path"] == f"{store}/step-1"
    # Dedup inside one save: the tied tensor and the zeros are uploaded once.
    assert r1["written_bytes"] == r1["unique_bytes"] < r1["logical_bytes"] - (2 << 20)
    stored = chunk_keys(s3_env, store)
    assert sum(stored.values()) == r1["unique_bytes"]  # uploaded = unique, nothing more
    back = ck.load(blank(sd), f"{store}/step-1")
    assert same(sd, back)
    # A few rows change: the next save uploads the chunks that hold them, no others.
    sd["w"][:8] += 1  # 32 KiB of one 64 KiB chunk
    sd["step"] = 8
    r2 = ck.save(sd, f"{store}/step-2", chunk_bytes=CHUNK, blocking=True).result()
    assert r2["written_bytes"] < 2 * CHUNK, r2
    assert sum(chunk_keys(s3_env, store).values()) == r1["unique_bytes"] + r2["written_bytes"]
    assert same(sd, ck.load(blank(sd), f"{store}/step-2"))
    assert same(model(), ck.load(blank(sd), f"{store}/step-1"))  # untouched
    listing = ck.ls(store)
    assert [c["name"] for c in listing] == ["step-1", "step-2"]
    assert listing[1]["shared_bytes"] > 0.9 * listing[1]["unique_bytes"]
    v = ck.verify(f"{store}/step-2")
    assert v["problems"] == [] and v["bytes"] == listing[1]["unique_bytes"]
    assert ck.manifest(f"{store}/step-2")["entries"]["w"]["shape"] == [512, 1024]


def test_large_chunks_go_up_as_multipart_uploads(store, s3_env):
    """Chunks above 16 MiB are multipart uploads (an S3 multipart ETag ends in -<parts>),
    read back bit-exact."""
    g = torch.Generator().manual_seed(9)
    sd = {"big": torch.randn(10 << 20, generator=g)}  # 40 MiB: one 32 MiB chunk and the rest
    ck.save(sd, f"{store}/m", chunk_bytes=32 << 20, blocking=True)
    big = [k for k, n in chunk_keys(s3_env, store).items() if n == 32 << 20]
    assert len(big) == 1
    etag = s3_env.client.head_object(Bucket=BUCKET, Key=big[0])["ETag"]
    assert etag.strip('"').endswith("-4"), etag  # 8 MiB parts
    assert torch.equal(ck.load({"big": torch.zeros(10 << 20)}, f"{store}/m")["big"], sd["big"])


def test_a_name_is_published_once_and_refused_before_any_upload(store, s3_env):
    sd = model()
    ck.save(sd, f"{store}/a", chunk_bytes=CHUNK, blocking=True)
    before = keys(s3_env, prefix_of(store))
    sd["w"] += 1  # new bytes that would have to go up
    with pytest.raises(ConfigError, match=f"{store}/a: exists already"):
        ck.save(sd, f"{store}/a", chunk_bytes=CHUNK, blocking=True)
    assert keys(s3_env, prefix_of(store)) == before
    assert same(model(), ck.load(blank(sd), f"{store}/a"))


def test_objects_the_store_did_not_write_are_refused(s3_env):
    s3_env.client.put_object(Bucket=BUCKET, Key="foreign/data.bin", Body=b"x")
    with pytest.raises(ConfigError, match=r"holds files Sluice did not write.*data\.bin"):
        ck.save({"w": torch.ones(4)}, f"s3://{BUCKET}/foreign/a", blocking=True)
    store = f"s3://{BUCKET}/mixed-{os.getpid()}"
    ck.save({"w": torch.ones(4)}, f"{store}/a", blocking=True)
    s3_env.client.put_object(Bucket=BUCKET, Key=f"{prefix_of(store)}b/notes.txt", Body=b"x")
    with pytest.raises(ConfigError, match=r"notes\.txt"):
        ck.save({"w": torch.ones(4)}, f"{store}/b", blocking=True)
    with pytest.raises(SluiceFileNotFoundError, match="not a checkpoint store"):
        ck.ls(f"s3://{BUCKET}/nothing-here-{os.getpid()}")


def test_bad_urls_are_config_errors_naming_them(s3_env):
    for bad, why in [
        (f"s3:/{BUCKET}/run/x", "pathlib"),
        (f"s3://{BUCKET}", "names no checkpoint"),
        (f"s3://{BUCKET}/run/", "names no checkpoint"),
        (f"s3://{BUCKET}/../x/y", "'..'"),
        ("http://host/run/x", "not supported"),
    ]:
        with pytest.raises(ConfigError, match=why):
            ck.save({"w": torch.ones(2)}, bad, blocking=True)


def test_a_corrupted_or_missing_chunk_object_is_a_typed_error_naming_it(store, s3_env):
    sd = model()
    ck.save(sd, f"{store}/c", chunk_bytes=CHUNK, blocking=True)
    entry = ck.manifest(f"{store}/c")["entries"]["w"]
    digest = entry["chunks"][3]["d"]
    key = f"{prefix_of(store)}chunks/{digest[:2]}/{digest}"
    body = bytearray(s3_env.client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    body[100] ^= 0xFF
    s3_env.client.put_object(Bucket=BUCKET, Key=key, Body=bytes(body))
    with pytest.raises(ChunkCorruptError, match=f'{digest} of "w" in s3://{BUCKET}/{key}'):
        ck.load(blank(sd), f"{store}/c")
    problems = ck.verify(f"{store}/c")["problems"]
    assert [p[0] for p in problems] == [digest]
    s3_env.client.put_object(Bucket=BUCKET, Key=key, Body=bytes(body[:1000]))
    with pytest.raises(ChunkCorruptError, match="only 1000 bytes"):
        ck.load(blank(sd), f"{store}/c")
    s3_env.client.delete_object(Bucket=BUCKET, Key=key)
    with pytest.raises(SluiceFileNotFoundError, match=f"{digest}.*missing"):
        ck.load(blank(sd), f"{store}/c")


def test_gc_keeps_the_newest_and_leaves_young_chunks_for_saves_in_flight(store, s3_env):
    for step in range(3):
        sd = model(step)  # different bytes each step
        ck.save(sd, f"{store}/s{step}", chunk_bytes=CHUNK, blocking=True)
    all_chunks = chunk_keys(s3_env, store)
    # Default grace (an hour): the checkpoints go, their chunks stay for now.
    r = ck.gc(store, 1)
    assert r["checkpoints_removed"] == ["s0", "s1"] and r["chunks_removed"] == 0
    assert chunk_keys(s3_env, store) == all_chunks
    r = ck.gc(store, 1, grace_s=0)
    kept = ck.manifest(f"{store}/s2")
    live = {c["d"] for e in kept["entries"].values() for c in e["chunks"]}
    live |= set(kept.get("packs", {}))
    assert {k.rsplit("/", 1)[1] for k in chunk_keys(s3_env, store)} == live
    assert r["chunks_removed"] == len(all_chunks) - len(live)
    assert same(model(2), ck.load(blank(model()), f"{store}/s2"))
    with pytest.raises(ConfigError, match="grace_s"):
        ck.gc(store, 1, grace_s=-1)


KILL_CHILD = r"""
import os, sys, torch, sluice.ckpt as ck
g = torch.Generator().manual_seed(5)
sd = {f"w{i}": torch.randn(1 << 20, generator=g) for i in range(24)}  # 96 MiB
print("saving", flush=True)
ck.save(sd, sys.argv[1], blocking=True)
print("done", flush=True)
"""


def test_a_save_killed_mid_upload_is_never_visible_and_gc_removes_what_it_left(
    store, s3_env, monkeypatch
):
    first = model()
    ck.save(first, f"{store}/good", chunk_bytes=CHUNK, blocking=True)
    before = chunk_keys(s3_env, store)
    # 5 ms each way and 4 uploads in flight: the 96 MiB save takes seconds, not one.
    with FaultProxy(s3_env.port, "--delay-ms", "5") as proxy:
        env = dict(
            os.environ,
            **s3_env.env(proxy.endpoint),
            SLUICE_REMOTE_CONCURRENCY="4",
        )
        child = subprocess.Popen(
            [sys.executable, "-c", KILL_CHILD, f"{store}/killed"],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 120
            while len(chunk_keys(s3_env, store)) < len(before) + 3:
                assert child.poll() is None, "the save ended before it was killed"
                assert time.monotonic() < deadline, "no chunk went up"
                time.sleep(0.05)
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
        finally:
            if child.poll() is None:
                child.kill()
    assert child.returncode == -signal.SIGKILL
    assert "done" not in child.stdout.read()
    left = chunk_keys(s3_env, store)
    assert len(left) > len(before)  # it had uploaded some
    assert [c["name"] for c in ck.ls(store)] == ["good"]
    with pytest.raises(SluiceFileNotFoundError, match="no checkpoint here"):
        ck.manifest(f"{store}/killed")
    assert same(first, ck.load(blank(first), f"{store}/good"))
    r = ck.gc(store, 10, grace_s=0)
    assert r["checkpoints_removed"] == [] and r["chunks_removed"] == len(left) - len(before)
    assert chunk_keys(s3_env, store) == before
    assert same(first, ck.load(blank(first), f"{store}/good"))


def test_saves_and_loads_through_latency_and_connection_resets(store, s3_env, monkeypatch):
    """Through the fault proxy: 5 ms each way, and a connection reset after every 3 MiB
    (retried by the client): the bytes come back exact."""
    sd = model(4)
    with FaultProxy(s3_env.port, "--delay-ms", "5", "--reset-after", str(3 << 20)) as p:
        for k, v in s3_env.env(p.endpoint).items():
            monkeypatch.setenv(k, v)
        ck.save(sd, f"{store}/f", chunk_bytes=CHUNK, blocking=True)
        assert same(sd, ck.load(blank(sd), f"{store}/f"))
        assert ck.verify(f"{store}/f")["problems"] == []


def test_a_server_that_dies_mid_save_fails_it_and_leaves_nothing_visible(
    store, s3_env, monkeypatch
):
    first = model()
    ck.save(first, f"{store}/good", chunk_bytes=CHUNK, blocking=True)
    monkeypatch.setenv("SLUICE_REMOTE_RETRIES", "1")
    # The proxy dies once it has passed 20 kB of responses: a few dozen requests in.
    with FaultProxy(s3_env.port, "--die-after", "20000") as p:
        monkeypatch.setenv("AWS_ENDPOINT_URL", p.endpoint)
        sd = model(1)
        t0 = time.monotonic()
        with pytest.raises(SluiceIOError, match=f"s3://{BUCKET}/"):
            ck.save(sd, f"{store}/lost", chunk_bytes=CHUNK, blocking=True)
        assert time.monotonic() - t0 < 60
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_env.endpoint)
    assert [c["name"] for c in ck.ls(store)] == ["good"]
    assert same(first, ck.load(blank(first), f"{store}/good"))


def test_stalled_requests_are_timed_out_and_retried_to_a_whole_save(store, s3_env, monkeypatch):
    """The first connections stop answering mid-response: each request times out (1 s here)
    and is retried on a new connection; the save and the load are bit-exact."""
    monkeypatch.setenv("SLUICE_REMOTE_TIMEOUT_S", "1")
    sd = model(2)
    with FaultProxy(s3_env.port, "--stall-after", "0", "--faulty", "2") as p:
        monkeypatch.setenv("AWS_ENDPOINT_URL", p.endpoint)
        ck.save(sd, f"{store}/s", chunk_bytes=CHUNK, blocking=True)
        assert same(sd, ck.load(blank(sd), f"{store}/s"))


def test_wrong_credentials_are_a_permission_error_naming_the_store(monkeypatch):
    """moto with IAM auth on checks signatures: a wrong secret is refused with 403."""
    with moto_with_auth() as env:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        store = f"s3://{BUCKET}/auth"
        sd = {"w": torch.arange(8.0)}
        ck.save(sd, f"{store}/a", blocking=True)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        with pytest.raises(SluicePermissionError, match=f"{store}"):
            ck.load({"w": torch.zeros(8)}, f"{store}/a")
        with pytest.raises(SluicePermissionError, match=f"{store}"):
            ck.save(sd, f"{store}/b", blocking=True)


def test_grouped_save_and_load_at_world_2_over_gloo(store, s3_env, tmp_path):
    codes, results = worlds.run_world(
        "ckpt_worker.py", 2, store, "object", tmp_path, env=s3_env.env()
    )
    assert codes == [0, 0], results
    s1 = results[0]["s1"]
    assert s1["written_bytes"] == s1["unique_bytes"]
    assert min(s1["written_bytes_per_rank"]) > 0  # both ranks uploaded
    s2 = results[0]["s2"]
    assert s2["written_bytes"] < 0.15 * s1["unique_bytes"]  # only the changed chunks
    for r in results:
        assert r["s1_exact"] and r["s2_exact"], r
        assert r["order"] == ["staged", "durable"], r
        assert r["replicate"].startswith("ConfigError") and "object store" in r["replicate"], r
    # Each unique chunk of s2 was read by one rank of the two.
    assert sum(r["s2_read_bytes"] for r in results) == ck.ls(store)[1]["unique_bytes"]
    assert [c["name"] for c in ck.ls(store)] == ["s1", "s2"]
    assert not [k for k in keys(s3_env, prefix_of(store)) if "/.pending/" in k]


def test_a_rank_killed_mid_save_fails_the_other_within_seconds(store, s3_env, tmp_path):
    """No file lock in an object store: rank 1's heartbeat object stops aging forward when
    it is SIGKILLed, and rank 0 raises seconds later, not at the 30-minute timeout."""
    t0 = time.monotonic()
    codes, results = worlds.run_world(
        "ckpt_worker.py", 2, store, "kill", tmp_path, env=s3_env.env(), timeout=120
    )
    assert codes == [0, -signal.SIGKILL], results
    assert "rank 1 is gone" in results[0]["s2"] and "not published" in results[0]["s2"]
    assert time.monotonic() - t0 < 90
    assert [c["name"] for c in ck.ls(store)] == ["s1"]
    # The killed save's markers are left (rank 1 could not remove its own); gc takes them.
    assert ck.gc(store, 10, grace_s=0)["temporaries_removed"] > 0
    assert not [k for k in keys(s3_env, prefix_of(store)) if "/.pending/" in k]


def test_dcp_save_async_save_and_load_at_world_2(store, s3_env, tmp_path):
    env = s3_env.env()
    codes, results = worlds.run_world("dcp_worker.py", 2, store, "save", tmp_path, env=env)
    assert codes == [0, 0], results
    for r in results:
        assert r["order"] == ["staged", "durable"] and r["response"] == "AsyncSaveResponse"
        assert r["bad"] != "saved", r
    assert [c["name"] for c in ck.ls(store)] == ["s1", "s2"]
    codes, results = worlds.run_world("dcp_worker.py", 2, store, "load", tmp_path, env=env)
    assert codes == [0, 0], results
    for r in results:
        assert r["s1"] == [] and r["s2"] == [], r


def test_the_cli_lists_inspects_verifies_and_collects_an_object_store(store, s3_env):
    sd = model()
    ck.save(sd, f"{store}/one", chunk_bytes=CHUNK, blocking=True)
    sd["w"] += 1
    ck.save(sd, f"{store}/two", chunk_bytes=CHUNK, blocking=True)
    sluice = os.environ.get("SLUICE_BIN") or "sluice"

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sluice, "ckpt", *args], capture_output=True, text=True)

    ls = cli("ls", store, "--json")
    assert ls.returncode == 0, ls.stderr
    assert [c["name"] for c in json.loads(ls.stdout)] == ["one", "two"]
    assert cli("inspect", f"{store}/two").returncode == 0
    v = cli("verify", f"{store}/two")
    assert v.returncode == 0, v.stdout + v.stderr
    gc = cli("gc", store, "--keep", "1", "--grace-s", "0", "--json")
    assert gc.returncode == 0, gc.stderr
    assert json.loads(gc.stdout)["checkpoints_removed"] == ["one"]
    assert same(sd, ck.load(blank(sd), f"{store}/two"))
    bad = cli("gc", store, "--keep", "1", "--grace-s=-3")
    assert bad.returncode != 0 and "grace" in bad.stderr
