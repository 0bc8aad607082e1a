"""Builders shared by the Sluice test suite.

- ``write_raw`` writes a safetensors file byte by byte, so tests can put tensors at any
  (odd) offset and write malformed headers that no library would produce.
- ``random_tensor`` / ``write_sharded`` build real checkpoints with ``safetensors``.
- ``assert_same_tensors`` compares two state dicts dtype by dtype, shape by shape and byte
  by byte (NaN payloads included).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Optional, Union

import pytest
import torch
from safetensors.torch import save_file

MiB = 1 << 20

# Fixtures of their own module: the S3 server's (`s3`, `s3_env`).
pytest_plugins = ["s3_fixtures"]

# safetensors dtype name -> torch dtype, for every dtype both torch and safetensors know.
_ALL_TORCH_DTYPES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "U16": "uint16",
    "I16": "int16",
    "U32": "uint32",
    "I32": "int32",
    "U64": "uint64",
    "I64": "int64",
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
    "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu",
}
TORCH_DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, attr) for name, attr in _ALL_TORCH_DTYPES.items() if hasattr(torch, attr)
}

Header = Union[Mapping[str, Any], str, bytes]


def write_raw(
    path: Union[str, os.PathLike[str]],
    header: Header,
    data: bytes = b"",
    *,
    header_len: Optional[int] = None,
) -> Path:
    """Writes ``<u64 little-endian length><header><data>`` to ``path``.

    ``header`` is a dict (JSON-encoded as is), a str or raw bytes (for malformed
    headers); ``header_len`` overrides the length prefix, to lie about it.
    """
    if isinstance(header, Mapping):
        header_bytes = json.dumps(header).encode()
    elif isinstance(header, str):
        header_bytes = header.encode()
    else:
        header_bytes = header
    length = len(header_bytes) if header_len is None else header_len
    out = Path(path)
    out.write_bytes(struct.pack("<Q", length) + header_bytes + data)
    return out


def entry(dtype: str, shape: list[int], start: int, end: int) -> dict[str, Any]:
    """One tensor's header entry."""
    return {"dtype": dtype, "shape": shape, "data_offsets": [start, end]}


def raw_bytes(t: torch.Tensor) -> bytes:
    """The tensor's bytes in memory order (works for 0-d and empty tensors)."""
    flat = t.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes()


def random_tensor(dtype: torch.dtype, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """A tensor of random bytes (bools are 0 or 1, the only values torch defines)."""
    numel = 1
    for dim in shape:
        numel *= dim
    nbytes = numel * dtype.itemsize
    high = 2 if dtype == torch.bool else 256
    raw = torch.randint(0, high, (nbytes,), dtype=torch.uint8, generator=gen)
    return raw.view(dtype).reshape(shape)


def assert_same_tensors(actual: Mapping[str, Any], expected: Mapping[str, Any]) -> None:
    """Same names, and per tensor the same dtype, shape and bytes."""
    assert sorted(actual) == sorted(expected)
    for name, want in expected.items():
        got = actual[name]
        assert got.dtype == want.dtype, name
        assert tuple(got.shape) == tuple(want.shape), name
        assert raw_bytes(got) == raw_bytes(want), f"bytes differ in tensor {name!r}"


def assert_same_arrays(actual: Mapping[str, Any], expected: Mapping[str, Any]) -> None:
    """Same names, and per numpy array the same dtype, shape and bytes."""
    assert sorted(actual) == sorted(expected)
    for name, want in expected.items():
        assert actual[name].dtype == want.dtype, name
        assert actual[name].shape == want.shape, name
        assert actual[name].tobytes() == want.tobytes(), name


def write_sharded(
    directory: Path,
    shards: Mapping[str, Mapping[str, torch.Tensor]],
    *,
    index: bool = True,
    metadata: Optional[dict[str, str]] = None,
) -> Path:
    """Saves each shard with safetensors and, if ``index``, a matching index.

    Returns the index path (or the directory when there is no index).
    """
    directory.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for shard_name, tensors in shards.items():
        save_file(dict(tensors), str(directory / shard_name), metadata=metadata)
        weight_map.update(dict.fromkeys(tensors, shard_name))
    if not index:
        return directory
    index_path = directory / "model.safetensors.index.json"
    index_path.write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return index_path


def two_shards_of_six_dtypes(gen: torch.Generator) -> dict[str, dict[str, torch.Tensor]]:
    """Two shards, each with a small tensor of six common dtypes (the object-store
    emulator tests' checkpoint): file name -> tensors."""
    dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.int64, torch.bool]
    return {
        f"model-{i + 1:05d}-of-00002.safetensors": {
            f"s{i}.{d}": random_tensor(d, (33, 17 + i), gen) for d in dtypes
        }
        for i in range(2)
    }


def evict_from_page_cache(path: Path) -> None:
    """Flushes ``path`` and drops its clean pages, so the next read is cold."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


_SYS_CACHESTAT = 451


def cached_fraction(path: Path) -> Optional[float]:
    """Fraction of ``path`` in the page cache via ``cachestat(2)``, or None without it."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        span = (ctypes.c_uint64 * 2)(0, 0)  # off, len (0 = to the end)
        out = (ctypes.c_uint64 * 5)()  # nr_cache, nr_dirty, ...
        if libc.syscall(_SYS_CACHESTAT, fd, span, out, 0) != 0:
            return None
        pages = -(-os.path.getsize(path) // os.sysconf("SC_PAGE_SIZE"))
        return min(out[0] / max(pages, 1), 1.0)
    finally:
        os.close(fd)


def clear_sluice_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Removes the caller's SLUICE_* overrides (all but SLUICE_BIN)."""
    for name in list(os.environ):
        if name.startswith("SLUICE_") and name != "SLUICE_BIN":
            monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def hermetic_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts without the caller's overrides and sets its own."""
    clear_sluice_env(monkeypatch)


@pytest.fixture
def gen() -> torch.Generator:
    """A seeded generator, so failures reproduce."""
    return torch.Generator().manual_seed(1234)


@pytest.fixture
def mixed_file(tmp_path: Path, gen: torch.Generator) -> tuple[Path, dict[str, torch.Tensor]]:
    """A ~3 MiB file of tensors of several dtypes and sizes, some not page multiples."""
    tensors = {
        "embed": random_tensor(torch.bfloat16, (512, 1024), gen),
        "layer.0.w": random_tensor(torch.float32, (300, 1001), gen),
        "layer.0.b": random_tensor(torch.float16, (7,), gen),
        "layer.1.w": random_tensor(torch.int64, (4097,), gen),
        "flag": random_tensor(torch.bool, (3,), gen),
        "scale": random_tensor(torch.float64, (), gen),
    }
    path = tmp_path / "mixed.safetensors"
    save_file(tensors, str(path))
    return path, tensors


@pytest.fixture(scope="session")
def require_io_uring(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Skips where io_uring is unavailable (old kernel, seccomp, SLUICE_IO_URING=0)."""
    import sluice

    path = tmp_path_factory.mktemp("probe") / "probe.safetensors"
    save_file({"x": torch.zeros(4)}, str(path))
    with pytest.MonkeyPatch.context() as env:
        clear_sluice_env(env)  # session scope: runs before the autouse fixture
        try:
            sluice.load_file(path, engine="io_uring")
        except sluice.SluiceIOError as e:
            pytest.skip(f"io_uring unavailable here: {e}")


@contextlib.contextmanager
def mounted(tmp_path: Path, fstype: str, options: str = "") -> Iterator[Path]:
    """A fresh file system of `fstype` mounted under `tmp_path`; the test is skipped, saying
    why, where mounting is not permitted (root and mount(8) are needed)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip(f"mounting a {fstype} needs root and mount(8)")
    mount_point = tmp_path / fstype
    mount_point.mkdir()
    cmd = ["mount", "-t", fstype, *(["-o", options] if options else []), fstype, str(mount_point)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount {fstype}: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=True)


@pytest.fixture
def ramfs(tmp_path: Path) -> Iterator[Path]:
    """A ramfs mount, which refuses O_DIRECT (tmpfs accepts it since Linux 6.6)."""
    with mounted(tmp_path, "ramfs") as mount_point:
        yield mount_point


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 3 MiB tmpfs: a disk that fills up."""
    with mounted(tmp_path, "tmpfs", "size=3m") as mount_point:
        yield mount_point


@pytest.fixture
def world_readable_dir() -> Iterator[Path]:
    """A directory other users can enter (pytest's tmp_path is 0700)."""
    with tempfile.TemporaryDirectory(prefix="sluice-perm-") as tmp:
        os.chmod(tmp, 0o755)
        yield Path(tmp)


@pytest.fixture(scope="session")
def sluice_bin() -> Path:
    """The CLI: $SLUICE_BIN, else target/release/sluice (``cargo build --release``)."""
    repo = Path(__file__).resolve().parents[2]
    path = Path(os.environ.get("SLUICE_BIN") or repo / "target" / "release" / "sluice")
    if not path.is_file():
        pytest.skip(f"sluice CLI not built ({path}); run: cargo build --release --bin sluice")
    return path


def check_ckpt_store(store: str) -> None:
    """sluice.ckpt in an object-store prefix (issue 30): a round trip bit-exact, an
    incremental save uploading only the changed chunk, a name published once, ls, verify
    and gc."""
    import sluice.ckpt as ck
    import torch
    from sluice.errors import ConfigError

    g = torch.Generator().manual_seed(3)
    sd = {"w": torch.randn(256, 256, generator=g), "step": 1}
    r1 = ck.save(sd, f"{store}/a", chunk_bytes=64 << 10, blocking=True).result()
    back = ck.load({"w": torch.zeros(256, 256), "step": None}, f"{store}/a")
    assert torch.equal(back["w"], sd["w"]) and back["step"] == 1
    sd["w"][0] += 1
    r2 = ck.save(sd, f"{store}/b", chunk_bytes=64 << 10, blocking=True).result()
    assert r2["written_bytes"] < r1["written_bytes"] / 3
    with pytest.raises(ConfigError, match="exists already"):
        ck.save(sd, f"{store}/b", blocking=True)
    assert [c["name"] for c in ck.ls(store)] == ["a", "b"]
    assert ck.verify(f"{store}/b")["problems"] == []
    assert ck.gc(store, 1, grace_s=0)["checkpoints_removed"] == ["a"]
    assert torch.equal(ck.load({"w": torch.zeros(256, 256)}, f"{store}/b")["w"], sd["w"])
