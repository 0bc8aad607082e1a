"""`az://` against a real Azure Blob implementation: Azurite (Microsoft's emulator, from the
npm registry; `make test` installs it into ~/.cache/sluice/azurite) in its own process on
loopback. object_store reaches it through its own emulator settings
(AZURE_STORAGE_USE_EMULATOR, AZURITE_BLOB_STORAGE_URL), as a user's would. The S3 tests cover
the fault cases in depth; this checks that the same loaders read Azure bit-exact, by prefix,
index and single object, and that a missing blob and a wrong key are typed errors."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import assert_same_tensors, check_ckpt_store, two_shards_of_six_dtypes, write_sharded
from s3_support import _stop, free_port, wait_for_port
from sluice.errors import SluiceFileNotFoundError, SluicePermissionError

blob = pytest.importorskip("azure.storage.blob")

AZURITE = Path(
    os.environ.get(
        "SLUICE_AZURITE",
        Path.home() / ".cache/sluice/azurite/node_modules/.bin/azurite-blob",
    )
)
# Azurite's well-known development account (public, documented by Microsoft).
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
CONTAINER = "models"

pytestmark = pytest.mark.skipif(
    not AZURITE.exists() or shutil.which("node") is None,
    reason=f"Azurite is not installed at {AZURITE} (make test installs it with npm)",
)


@pytest.fixture(scope="module")
def azurite(tmp_path_factory):
    """Azurite's blob service on a free loopback port, with one container; yields the
    environment a client of it needs and a container client to upload with."""
    port = free_port()
    data = tmp_path_factory.mktemp("azurite")
    proc = subprocess.Popen(
        [
            *(str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port)),
            *("--location", str(data), "--silent", "--skipApiVersionCheck", "--loose"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, proc, "azurite")
        url = f"http://127.0.0.1:{port}"
        conn = (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
            f"BlobEndpoint={url}/{ACCOUNT};"
        )
        service = blob.BlobServiceClient.from_connection_string(conn)
        service.create_container(CONTAINER)
        env = {
            "AZURE_STORAGE_USE_EMULATOR": "true",
            "AZURITE_BLOB_STORAGE_URL": url,
            "AZURE_STORAGE_ACCOUNT_NAME": ACCOUNT,
            "AZURE_STORAGE_ACCOUNT_KEY": KEY,
        }
        yield env, service.get_container_client(CONTAINER)
    finally:
        _stop(proc)


@pytest.fixture
def az_env(azurite, monkeypatch):
    env, container = azurite
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return container


def upload_dir(container, src: Path, prefix: str) -> None:
    for f in sorted(src.iterdir()):
        with open(f, "rb") as fh:
            container.upload_blob(f"{prefix}/{f.name}", fh, overwrite=True)


@pytest.fixture
def sharded(tmp_path, az_env):
    gen = torch.Generator().manual_seed(15)
    shards = two_shards_of_six_dtypes(gen)
    index = write_sharded(tmp_path / "src", shards)
    upload_dir(az_env, index.parent, "llm")
    return {k: v for s in shards.values() for k, v in s.items()}


def test_load_file_stream_and_safe_open_read_azure_bit_exact(sharded):
    import sluice.torch

    assert_same_tensors(sluice.torch.load_file(f"az://{CONTAINER}/llm/"), sharded)
    index = f"az://{CONTAINER}/llm/model.safetensors.index.json"
    assert_same_tensors(sluice.torch.load_file(index), sharded)
    streamed = {name: t.clone() for name, t in sluice.torch.stream(index)}
    assert_same_tensors(streamed, sharded)
    one = f"az://{CONTAINER}/llm/model-00002-of-00002.safetensors"
    with sluice.torch.safe_open(one, framework="pt") as f:
        names = f.keys()
        assert sorted(names) == sorted(n for n in sharded if n.startswith("s1."))
        for name in names:
            assert torch.equal(
                f.get_tensor(name).view(torch.uint8), sharded[name].view(torch.uint8)
            )


def test_a_missing_blob_and_a_wrong_key_are_typed_errors(sharded, monkeypatch):
    import sluice.torch

    missing = f"az://{CONTAINER}/llm/nope.safetensors"
    with pytest.raises(SluiceFileNotFoundError, match=r"nope\.safetensors"):
        sluice.torch.load_file(missing)
    wrong = "A" * 86 + "=="
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", wrong)
    with pytest.raises(SluicePermissionError, match=CONTAINER):
        sluice.torch.load_file(f"az://{CONTAINER}/llm/")


def test_checkpoints_save_load_and_publish_once_in_azure(az_env, monkeypatch):
    """sluice.ckpt with its store in a container; a wrong key is a permission error."""
    import sluice.ckpt as ck

    store = f"az://{CONTAINER}/ckpt"
    check_ckpt_store(store)
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", "A" * 86 + "==")
    with pytest.raises(SluicePermissionError, match=CONTAINER):
        ck.load({"w": torch.zeros(256, 256)}, f"{store}/b")


def test_kv_blocks_shared_through_a_container(az_env, tmp_path):
    """Two KV stores share blocks through a container (`remote="az://..."`): what one put
    and closed, the other finds at open, reads bit-exact and keeps."""
    import numpy as np
    import sluice.kv

    block = 64 << 10
    keys = [b"az-chain-%04d" % i for i in range(4)]
    data = [np.frombuffer(np.random.default_rng(i).bytes(block), np.uint8) for i in range(4)]
    common = dict(block_bytes=block, ssd="4MiB", model="m", remote=f"az://{CONTAINER}/kv")
    with sluice.kv.open(tmp_path / "a", shared="4MiB", **common) as a:
        assert a.put_batch(keys, data) == [True] * 4
    with sluice.kv.open(tmp_path / "b", **common) as b:
        assert b.lookup(keys) == 4
        out = [np.zeros(block, np.uint8) for _ in keys]
        assert b.get_batch_into(keys, out) == [True] * 4
        assert all((o == d).all() for o, d in zip(out, data))
        assert b.stats()["hits_shared"] == 4
