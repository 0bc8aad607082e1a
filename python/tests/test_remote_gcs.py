"""`gs://` against a Google Cloud Storage implementation: fake-gcs-server (built from its Go
module; `make test` installs it into ~/.cache/sluice/bin) in its own process on loopback.
object_store reaches it the way its documentation gives for an emulator: a service-account
file naming the base URL with OAuth off, in GOOGLE_SERVICE_ACCOUNT. The S3 tests cover the
fault cases in depth; this checks that the same loaders read GCS bit-exact, by prefix, index
and single object, and that a missing object is a typed error. The emulator checks no
credentials, so a wrong key cannot be tested here."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import torch
from conftest import (
    assert_same_tensors,
    check_ckpt_store,
    random_tensor,
    two_shards_of_six_dtypes,
    write_sharded,
)
from s3_support import _stop, free_port, wait_for_port
from sluice.errors import HeaderError, SluiceFileNotFoundError, SluiceIOError

FAKE_GCS = Path(
    os.environ.get("SLUICE_FAKE_GCS", Path.home() / ".cache/sluice/bin/fake-gcs-server")
)
BUCKET = "models"

pytestmark = pytest.mark.skipif(
    not FAKE_GCS.exists(),
    reason=f"fake-gcs-server is not installed at {FAKE_GCS} (make test builds it with Go)",
)


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """The emulator on a free loopback port with one bucket; yields its URL and the
    service-account file that points object_store at it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            *(str(FAKE_GCS), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port)),
            *("-backend", "memory", "-public-host", f"127.0.0.1:{port}", "-log-level", "error"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, proc, "fake-gcs-server")
        request = urllib.request.Request(
            f"{url}/storage/v1/b",
            data=json.dumps({"name": BUCKET}).encode(),
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(request, timeout=10).close()
        account = tmp_path_factory.mktemp("gcs") / "service-account.json"
        account.write_text(
            json.dumps(
                {
                    "gcs_base_url": url,
                    "disable_oauth": True,
                    "client_email": "",
                    "private_key": "",
                    "private_key_id": "",
                }
            )
        )
        yield url, account
    finally:
        _stop(proc)


def upload_dir(url: str, src: Path, prefix: str) -> None:
    for f in sorted(src.iterdir()):
        name = urllib.parse.quote(f"{prefix}/{f.name}", safe="")
        request = urllib.request.Request(
            f"{url}/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name={name}",
            data=f.read_bytes(),
            headers={"Content-Type": "application/octet-stream"},
        )
        urllib.request.urlopen(request, timeout=30).close()


@pytest.fixture
def sharded(tmp_path, gcs, monkeypatch):
    url, account = gcs
    monkeypatch.setenv("GOOGLE_SERVICE_ACCOUNT", str(account))
    gen = torch.Generator().manual_seed(21)
    shards = two_shards_of_six_dtypes(gen)
    big = random_tensor(torch.float32, (3 << 20,), gen)  # 12 MiB: several GETs
    shards["model-00002-of-00002.safetensors"]["big"] = big
    index = write_sharded(tmp_path / "src", shards)
    upload_dir(url, index.parent, "llm")
    return {k: v for s in shards.values() for k, v in s.items()}


def test_loaders_read_gcs_bit_exact(sharded):
    import sluice.torch

    assert_same_tensors(sluice.torch.load_file(f"gs://{BUCKET}/llm/"), sharded)
    index = f"gs://{BUCKET}/llm/model.safetensors.index.json"
    assert_same_tensors(sluice.torch.load_file(index), sharded)
    streamed = {name: t.clone() for name, t in sluice.torch.stream(index, memory_limit="32MiB")}
    assert_same_tensors(streamed, sharded)
    dest = {k: torch.zeros_like(v) for k, v in sharded.items()}
    assert sluice.load_into(f"gs://{BUCKET}/llm/", dest) == ([], [])
    assert_same_tensors(dest, sharded)
    one = f"gs://{BUCKET}/llm/model-00001-of-00002.safetensors"
    with sluice.torch.safe_open(one, framework="pt") as f:
        assert sorted(f.keys()) == sorted(n for n in sharded if n.startswith("s0."))
        got = f.get_slice("s0.torch.float32")[3:9, 2:5]
    assert torch.equal(got, sharded["s0.torch.float32"][3:9, 2:5])


def test_a_missing_object_is_a_typed_error(sharded, gcs, tmp_path):
    import sluice.torch

    with pytest.raises(SluiceFileNotFoundError, match=r"nope\.safetensors"):
        sluice.torch.load_file(f"gs://{BUCKET}/llm/nope.safetensors")
    # A prefix with nothing under it: a missing "directory", as a local path would be.
    with pytest.raises(SluiceFileNotFoundError, match="no objects under it"):
        sluice.torch.load_file(f"gs://{BUCKET}/empty/")
    # A prefix with objects but no shards, as a local directory with none.
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "readme.txt").write_text("not a checkpoint")
    upload_dir(gcs[0], tmp_path / "other", "noshards")
    with pytest.raises(HeaderError, match=r"no \*\.safetensors files"):
        sluice.torch.load_file(f"gs://{BUCKET}/noshards/")


def test_checkpoints_save_load_and_publish_once_in_gcs(gcs, monkeypatch):
    """sluice.ckpt with its store in a bucket, where the emulator takes object_store's
    writes."""
    import sluice.ckpt as ck

    monkeypatch.setenv("GOOGLE_SERVICE_ACCOUNT", str(gcs[1]))
    try:
        ck.save({"w": torch.ones(4)}, f"gs://{BUCKET}/probe/x", blocking=True)
    except SluiceIOError as e:
        if "invalid uploadType" not in str(e):
            raise
        pytest.skip(
            "fake-gcs-server does not implement the XML API's object PUT that object_store "
            "writes with (fsouza/fake-gcs-server#331): checkpoint writes to gs:// are not "
            "tested against an emulator"
        )
    check_ckpt_store(f"gs://{BUCKET}/ckpt")
