"""`sluice inspect s3://...` against an S3-compatible server on loopback (moto, in its own
process): a single object, a prefix of shards, an index JSON, and the errors for a missing
object and a damaged header, each naming the object URL."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch
from conftest import write_sharded
from s3_support import S3Server


@pytest.fixture(scope="module")
def s3():
    server = S3Server()
    yield server.client, server.env()
    server.stop()


def sluice(env, *args):
    bin_ = os.environ.get("SLUICE_BIN", "target/release/sluice")  # as make py-test sets it
    return subprocess.run(
        [bin_, *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=120
    )


def test_inspect_reads_remote_headers_like_local_ones(s3, tmp_path):
    client, env = s3
    gen = torch.Generator().manual_seed(0)
    shards = {
        f"model-{i:05d}-of-00003.safetensors": {
            f"layer{i}.w": torch.randn(64 + i, 32, generator=gen)
        }
        for i in range(3)
    }
    index = write_sharded(tmp_path / "m", shards)
    local = index.parent
    for f in sorted(local.iterdir()):
        client.upload_file(str(f), "models", f"llama/{f.name}")
    want = json.loads(sluice(env, "inspect", "--json", str(index)).stdout)
    for url in ("s3://models/llama", "s3://models/llama/model.safetensors.index.json"):
        r = sluice(env, "inspect", "--json", url)
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        assert (
            got["tensor_count"] == want["tensor_count"]
            and got["tensor_bytes"] == want["tensor_bytes"]
        )
        assert [s["tensors"] for s in got["shards"]] == [s["tensors"] for s in want["shards"]]
        assert all(s["path"].startswith("s3://models/llama/") for s in got["shards"])
    one = sorted(p.name for p in local.glob("*.safetensors"))[0]
    r = sluice(env, "inspect", "--json", f"s3://models/llama/{one}")
    assert r.returncode == 0 and len(json.loads(r.stdout)["shards"]) == 1, r.stderr


def test_remote_errors_name_the_object(s3, tmp_path):
    client, env = s3
    r = sluice(env, "inspect", "s3://models/nope/x.safetensors")
    assert r.returncode == 4 and "s3://models/nope/x.safetensors" in r.stderr, r.stderr
    client.put_object(Bucket="models", Key="bad/x.safetensors", Body=b"\xff" * 64)
    r = sluice(env, "inspect", "s3://models/bad/x.safetensors")
    assert r.returncode == 3 and "s3://models/bad/x.safetensors" in r.stderr, r.stderr
    # Hostile objects: a prefix with no shards, an index naming a shard outside its prefix,
    # a header longer than its object.
    client.put_object(Bucket="models", Key="empty/readme.txt", Body=b"x")
    index = b'{"weight_map": {"w": "../../etc/x.safetensors"}}'
    client.put_object(Bucket="models", Key="evil/model.safetensors.index.json", Body=index)
    trunc = (10**6).to_bytes(8, "little") + b"{}"
    client.put_object(Bucket="models", Key="trunc/x.safetensors", Body=trunc)
    for url, says in [
        ("s3://models/empty/", "no *.safetensors"),
        ("s3://models/evil/", "'..' component"),
        ("s3://models/trunc/x.safetensors", "truncated"),
    ]:
        r = sluice(env, "inspect", url)
        assert r.returncode == 3 and says in r.stderr and url.rstrip("/") in r.stderr, r.stderr
    r = sluice(env, "inspect", "s3://Bad Bucket/x")
    assert r.returncode == 2 and "not an object URL" in r.stderr, r.stderr
