"""Loading tensors from an S3 server (moto, in its own process on loopback): every dtype
bit-exact through `load_file`, `stream`, `safe_open` and `sluice.numpy`; sharded prefixes
and index JSONs; and the failures: a missing object, wrong credentials, a truncated
object, an object replaced mid-read, and a network that resets, truncates, stalls or dies
(through the project's fault proxy, `sluice-faultproxy`). Each failure is a typed error
naming the object URL, after a bounded time, and never a partial result."""

from __future__ import annotations

import _thread
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import sluice
import sluice.numpy
import sluice.torch
import torch
from conftest import (
    TORCH_DTYPES,
    assert_same_tensors,
    random_tensor,
    write_sharded,
)
from s3_support import BUCKET, FaultProxy, S3Server, boto3, faultproxy_bin, moto_with_auth
from safetensors.numpy import save_file as save_numpy
from safetensors.torch import save_file
from sluice.errors import (
    HeaderError,
    SluiceFileNotFoundError,
    SluiceIOError,
    SluicePermissionError,
)

needs_proxy = pytest.mark.skipif(
    not Path(faultproxy_bin()).exists(), reason="sluice-faultproxy not built (make build)"
)


@pytest.fixture
def s3_env(s3, monkeypatch):
    """The server's environment in this process, where the loader reads it; short
    timeouts so a failing network fails the test in seconds, not minutes."""
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SLUICE_REMOTE_TIMEOUT_S", "5")
    monkeypatch.setenv("SLUICE_REMOTE_RETRIES", "2")
    return s3


def put_file(s3: S3Server, path: Path, key: str) -> str:
    s3.client.upload_file(str(path), BUCKET, key)
    return f"s3://{BUCKET}/{key}"


@pytest.fixture(scope="module")
def every_dtype(s3, tmp_path_factory):
    """One object with a tensor of every dtype (odd sizes, one of 9 MiB so a read spans
    several GETs), and its tensors."""
    gen = torch.Generator().manual_seed(7)
    tensors = {
        f"t.{name}": random_tensor(dtype, (37, 129), gen) for name, dtype in TORCH_DTYPES.items()
    }
    tensors["big"] = random_tensor(torch.float32, (9 << 18, 1), gen)
    tensors["empty"] = torch.empty(0, 3)
    path = tmp_path_factory.mktemp("dtypes") / "model.safetensors"
    save_file(tensors, str(path))
    return put_file(s3, path, "dtypes/model.safetensors"), tensors


def test_load_file_is_bit_exact_for_every_dtype(s3_env, every_dtype):
    url, want = every_dtype
    assert_same_tensors(sluice.torch.load_file(url), want)
    stats = sluice.last_load_stats()
    assert stats["tensors"] == len(want)
    assert all(f["path"] == url and not f["direct"] for f in stats["files"])
    # Bounded streaming: the same bytes within a memory limit smaller than the object.
    got = {}
    for name, tensor in sluice.torch.stream(url, memory_limit="24MiB"):
        got[name] = tensor.clone()
    assert_same_tensors(got, want)


def test_safe_open_reads_tensors_and_slices(s3_env, every_dtype):
    url, want = every_dtype
    with sluice.torch.safe_open(url, framework="pt") as f:
        assert set(f.keys()) == set(want)
        got = {
            "f16": f.get_tensor("t.F16"),
            "f32": f.get_slice("t.F32")[3:9, 100:120],
            "big": f.get_slice("big")[5 : 8 << 18],
        }
    expected = {
        "f16": want["t.F16"],
        "f32": want["t.F32"][3:9, 100:120],
        "big": want["big"][5 : 8 << 18],
    }
    assert_same_tensors(got, expected)


def test_numpy_load_file(s3_env, tmp_path):
    arrays = {
        f"a{i}": np.arange(1000 + i, dtype=dt)
        for i, dt in enumerate([np.uint8, np.int16, np.float32, np.float64, np.complex64])
    }
    save_numpy(arrays, str(tmp_path / "np.safetensors"))
    url = put_file(s3_env, tmp_path / "np.safetensors", "np/np.safetensors")
    got = sluice.numpy.load_file(url)
    assert set(got) == set(arrays)
    for k, a in arrays.items():
        assert got[k].dtype == a.dtype and np.array_equal(got[k], a)


@pytest.fixture(scope="module")
def sharded(s3, tmp_path_factory):
    gen = torch.Generator().manual_seed(3)
    shards = {
        f"model-{i:05d}-of-00003.safetensors": {
            f"layer{i}.{j}": random_tensor(torch.bfloat16, (256 + i, 1000 + j), gen)
            for j in range(3)
        }
        for i in range(3)
    }
    index = write_sharded(tmp_path_factory.mktemp("sharded") / "m", shards)
    prefix = s3.upload_dir(index.parent, "sharded")
    want = {k: v for s in shards.values() for k, v in s.items()}
    return prefix, want


def test_sharded_prefix_index_and_names(s3_env, sharded):
    prefix, want = sharded
    for url in (prefix, prefix + "/", prefix + "/model.safetensors.index.json"):
        assert_same_tensors(sluice.torch.load_file(url), want)
    assert len(sluice.last_load_stats()["files"]) == 3
    some = sluice.torch.load_file(prefix, names=lambda n: n.startswith("layer1."))
    assert_same_tensors(some, {k: v for k, v in want.items() if k.startswith("layer1.")})


def test_prefix_without_index(s3_env, tmp_path):
    a = {"x": torch.arange(10.0)}
    b = {"y": torch.arange(5, dtype=torch.int32)}
    save_file(a, str(tmp_path / "a.safetensors"))
    save_file(b, str(tmp_path / "b.safetensors"))
    prefix = s3_env.upload_dir(tmp_path, "noindex")
    assert_same_tensors(sluice.torch.load_file(prefix), {**a, **b})


def test_a_prefix_holds_only_the_objects_directly_under_it(s3_env, tmp_path):
    """As a local directory: a deeper prefix (another checkpoint, a folder of its own)
    is not merged in, nor its index taken, nor an odd key under it fatal."""
    top = {"x": torch.arange(4.0)}
    deeper = {"y": torch.arange(3.0)}
    save_file(top, str(tmp_path / "a.safetensors"))
    save_file(deeper, str(tmp_path / "b.safetensors"))
    put_file(s3_env, tmp_path / "a.safetensors", "nested/a.safetensors")
    put_file(s3_env, tmp_path / "b.safetensors", "nested/deeper/b.safetensors")
    (tmp_path / "i.json").write_text('{"weight_map": {"z": "gone.safetensors"}}')
    put_file(s3_env, tmp_path / "i.json", "nested/deeper/model.safetensors.index.json")
    put_file(s3_env, tmp_path / "b.safetensors", "nested/odd//b.safetensors")
    assert_same_tensors(sluice.torch.load_file(f"s3://{BUCKET}/nested/"), top)


@pytest.fixture(scope="module")
def one_of_two(s3, tmp_path_factory):
    """Shard 1 of a 2-shard series, as a bare prefix and behind an index naming both."""
    gen = torch.Generator().manual_seed(5)
    first = {"a": random_tensor(torch.float32, (64, 3), gen)}
    d = tmp_path_factory.mktemp("partial")
    save_file(first, str(d / "model-00001-of-00002.safetensors"))
    s3.client.upload_file(
        str(d / "model-00001-of-00002.safetensors"),
        BUCKET,
        "series/model-00001-of-00002.safetensors",
    )
    s3.client.upload_file(
        str(d / "model-00001-of-00002.safetensors"),
        BUCKET,
        "indexed/model-00001-of-00002.safetensors",
    )
    weight_map = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (d / "index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    s3.client.upload_file(str(d / "index.json"), BUCKET, "indexed/model.safetensors.index.json")
    return first


@pytest.mark.parametrize("prefix", ["series", "indexed"])
def test_a_missing_shard_is_an_error_unless_partial_loading_is_asked_for(
    s3_env, one_of_two, prefix
):
    url = f"s3://{BUCKET}/{prefix}/"
    missing = f"s3://{BUCKET}/{prefix}/model-00002-of-00002.safetensors"
    with pytest.raises(SluiceFileNotFoundError, match="model-00002-of-00002"):
        sluice.torch.load_file(url)
    got = sluice.torch.load_file(url, allow_partial=True)
    assert_same_tensors(got, one_of_two)
    assert [str(p) for p in sluice.last_load_stats()["missing_shards"]] == [missing]


def test_a_missing_bucket_is_not_found(s3_env):
    with pytest.raises(SluiceFileNotFoundError, match="no such bucket"):
        sluice.torch.load_file("s3://no-such-bucket/m/")


@pytest.mark.parametrize(
    "endpoint", ["notaurl", "", "127.0.0.1:9000", "http://", "ftp://127.0.0.1:9000"]
)
def test_a_malformed_endpoint_is_a_config_error_naming_it(s3_env, monkeypatch, endpoint):
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    with pytest.raises(sluice.errors.ConfigError, match="AWS_ENDPOINT_URL"):
        sluice.torch.load_file(f"s3://{BUCKET}/dtypes/model.safetensors")


@pytest.mark.parametrize(
    ("var", "value", "secret"),
    [
        ("AWS_ENDPOINT_URL", " {endpoint}", False),
        ("AWS_ENDPOINT_URL", "{endpoint}\n", False),
        ("AWS_REGION", "us-east-1\n", False),
        ("AWS_ACCESS_KEY_ID", "test\n", True),
        ("AWS_SESSION_TOKEN", "tok en\t", True),
    ],
)
def test_white_space_or_control_characters_in_aws_variables_are_config_errors(
    s3_env, monkeypatch, var, value, secret
):
    value = value.format(endpoint=s3_env.endpoint)
    monkeypatch.setenv(var, value)
    with pytest.raises(sluice.errors.ConfigError, match=var) as e:
        sluice.torch.load_file(f"s3://{BUCKET}/dtypes/model.safetensors")
    assert (value.strip() in str(e.value)) != secret, str(e.value)


def test_an_empty_or_absent_prefix_is_not_found(s3_env):
    with pytest.raises(SluiceFileNotFoundError, match="no objects under it"):
        sluice.torch.load_file(f"s3://{BUCKET}/no-such-model/")


def test_a_plain_http_endpoint_without_allow_http_says_so(s3_env, monkeypatch):
    monkeypatch.delenv("AWS_ALLOW_HTTP", raising=False)
    with pytest.raises(sluice.errors.ConfigError, match="AWS_ALLOW_HTTP"):
        sluice.torch.load_file(f"s3://{BUCKET}/dtypes/model.safetensors")


@pytest.mark.parametrize("url", ["http://host/m.safetensors", "s3a://b/m", "S3://b/m"])
def test_an_unknown_scheme_is_a_config_error_not_a_missing_file(url):
    with pytest.raises(sluice.errors.ConfigError, match="scheme"):
        sluice.torch.load_file(url)


def test_cli_load_reads_an_object_url(s3_env, sharded):
    prefix, want = sharded
    bin_ = os.environ.get("SLUICE_BIN", "target/release/sluice")
    r = subprocess.run(
        [bin_, "load", prefix], env=dict(os.environ), capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert str(len(want)) in r.stdout + r.stderr


def test_missing_object_and_bad_url_are_typed(s3_env):
    url = f"s3://{BUCKET}/nope/model.safetensors"
    with pytest.raises(SluiceFileNotFoundError, match=url):
        sluice.torch.load_file(url)
    with pytest.raises(FileNotFoundError):
        sluice.torch.safe_open(url, framework="pt")
    with pytest.raises(sluice.errors.ConfigError, match="not an object URL"):
        sluice.torch.load_file("s3://Bad Bucket/x.safetensors")


def test_truncated_object_is_a_header_error(s3_env, tmp_path):
    path = tmp_path / "t.safetensors"
    save_file({"w": torch.randn(1000)}, str(path))
    data = path.read_bytes()
    key = "trunc/t.safetensors"
    s3_env.client.put_object(Bucket=BUCKET, Key=key, Body=data[: len(data) - 100])
    with pytest.raises(HeaderError, match=f"s3://{BUCKET}/{key}"):
        sluice.torch.load_file(f"s3://{BUCKET}/{key}")


def test_object_replaced_after_open_is_refused(s3_env, tmp_path):
    """Reads are pinned to the ETag the header came with: a replaced object is an error
    naming it, never a mix of two versions' bytes."""
    path = tmp_path / "r.safetensors"
    save_file({"w": torch.zeros(1 << 16)}, str(path))
    url = put_file(s3_env, path, "replaced/r.safetensors")
    with sluice.torch.safe_open(url, framework="pt") as f:
        save_file({"w": torch.ones(1 << 16)}, str(path))
        put_file(s3_env, path, "replaced/r.safetensors")
        with pytest.raises(SluiceIOError, match="changed while it was read"):
            f.get_tensor("w")


def test_wrong_credentials_are_a_permission_error(monkeypatch, tmp_path):
    """A server that checks signatures (moto with IAM auth on) refuses unknown keys with
    403: a permission error naming the object, not a retry loop."""
    with moto_with_auth() as env:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        save_file({"w": torch.arange(8.0)}, str(tmp_path / "w.safetensors"))
        client = boto3.client(
            "s3",
            endpoint_url=env["AWS_ENDPOINT_URL"],
            region_name="us-east-1",
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        )
        client.upload_file(str(tmp_path / "w.safetensors"), BUCKET, "auth/w.safetensors")
        url = f"s3://{BUCKET}/auth/w.safetensors"
        assert torch.equal(sluice.torch.load_file(url)["w"], torch.arange(8.0))
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        with pytest.raises(SluicePermissionError, match=url):
            sluice.torch.load_file(url)


@pytest.fixture(scope="module")
def big_object(s3, tmp_path_factory):
    """A 24 MiB object: several GETs, so faults land mid-load."""
    gen = torch.Generator().manual_seed(11)
    want = {f"w{i}": random_tensor(torch.float32, (1 << 20,), gen) for i in range(6)}
    path = tmp_path_factory.mktemp("big") / "big.safetensors"
    save_file(want, str(path))
    return put_file(s3, path, "big/big.safetensors"), want


def through(monkeypatch, proxy: FaultProxy) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)


@needs_proxy
@pytest.mark.parametrize("fault", ["--reset-after", "--truncate-after"])
def test_broken_responses_are_retried_to_exact_bytes(s3_env, big_object, monkeypatch, fault):
    url, want = big_object
    # The first four connections break 1 MiB into their response; retries on new
    # connections complete the load, bit-exact.
    with FaultProxy(s3_env.port, fault, str(1 << 20), "--faulty", "4") as proxy:
        through(monkeypatch, proxy)
        assert_same_tensors(sluice.torch.load_file(url), want)


@needs_proxy
@pytest.mark.parametrize(
    "fault", [["--truncate-after", "65536"], ["--reset-after", "65536"], ["--stall-after", "65536"]]
)
def test_a_network_that_keeps_failing_is_a_typed_error(s3_env, big_object, monkeypatch, fault):
    url, _ = big_object
    monkeypatch.setenv("SLUICE_REMOTE_TIMEOUT_S", "2")
    monkeypatch.setenv("SLUICE_REMOTE_RETRIES", "1")
    # Headers are read whole from the first 64 KiB, so the faults land in the data.
    with FaultProxy(s3_env.port, *fault) as proxy:
        through(monkeypatch, proxy)
        start = time.monotonic()
        with pytest.raises(SluiceIOError, match=url):
            sluice.torch.load_file(url)
        assert time.monotonic() - start < 60


@needs_proxy
def test_server_dying_mid_load_is_a_typed_error(s3_env, big_object, monkeypatch):
    url, _ = big_object
    monkeypatch.setenv("SLUICE_REMOTE_TIMEOUT_S", "2")
    monkeypatch.setenv("SLUICE_REMOTE_RETRIES", "1")
    with FaultProxy(s3_env.port, "--die-after", str(8 << 20)) as proxy:
        through(monkeypatch, proxy)
        with pytest.raises(SluiceIOError, match=url):
            sluice.torch.load_file(url)


@needs_proxy
def test_latency_keeps_bytes_exact(s3_env, sharded, monkeypatch):
    prefix, want = sharded
    with FaultProxy(s3_env.port, "--delay-ms", "10") as proxy:
        through(monkeypatch, proxy)
        assert_same_tensors(sluice.torch.load_file(prefix), want)


def test_bad_remote_settings_are_config_errors(s3_env, monkeypatch):
    monkeypatch.setenv("SLUICE_REMOTE_CONCURRENCY", "lots")
    with pytest.raises(sluice.errors.ConfigError, match="SLUICE_REMOTE_CONCURRENCY"):
        sluice.torch.load_file(f"s3://{BUCKET}/dtypes/model.safetensors")


def assert_ctrl_c_stops(call) -> None:
    """Ctrl-C (KeyboardInterrupt) 1.5 s into `call` must stop it within about a GET."""
    timer = threading.Timer(1.5, _thread.interrupt_main)
    timer.start()
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            call()
    finally:
        timer.cancel()
    assert time.monotonic() - start < 20


@needs_proxy
def test_ctrl_c_interrupts_a_slow_remote_load(s3_env, big_object, monkeypatch):
    """A window from a slow store can take minutes; Ctrl-C (KeyboardInterrupt) must still
    stop the load within about a GET, not when the window lands."""
    url, _ = big_object
    with FaultProxy(s3_env.port, "--delay-ms", "300") as proxy:
        through(monkeypatch, proxy)
        # About 400 GETs of 0.6 s each, one at a time: minutes without the interrupt.
        assert_ctrl_c_stops(lambda: sluice.torch.load_file(url, concurrency=1, chunk_bytes="64KiB"))


def test_load_into_reads_objects_into_existing_tensors(s3_env, every_dtype, sharded):
    for url, want in (every_dtype, sharded):
        dest = {k: torch.zeros_like(v) for k, v in want.items()}
        assert sluice.load_into(url, dest) == ([], [])
        assert_same_tensors(dest, want)


@needs_proxy
def test_load_into_fails_typed_when_the_server_dies(s3_env, big_object, monkeypatch):
    url, want = big_object
    monkeypatch.setenv("SLUICE_REMOTE_TIMEOUT_S", "2")
    monkeypatch.setenv("SLUICE_REMOTE_RETRIES", "1")
    dest = {k: torch.zeros_like(v) for k, v in want.items()}
    with FaultProxy(s3_env.port, "--die-after", str(8 << 20)) as proxy:
        through(monkeypatch, proxy)
        with pytest.raises(SluiceIOError, match=url):
            sluice.load_into(url, dest)


@needs_proxy
def test_ctrl_c_interrupts_a_slow_remote_load_into(s3_env, big_object, monkeypatch):
    url, want = big_object
    dest = {k: torch.zeros_like(v) for k, v in want.items()}
    with FaultProxy(s3_env.port, "--delay-ms", "300") as proxy:
        through(monkeypatch, proxy)
        assert_ctrl_c_stops(lambda: sluice.load_into(url, dest, concurrency=1, chunk_bytes="64KiB"))
    # The destinations are still ours to use, and a new load fills them whole.
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_env.env()["AWS_ENDPOINT_URL"])
    sluice.load_into(url, dest)
    assert_same_tensors(dest, want)
