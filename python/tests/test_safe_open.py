"""``sluice.safe_open``: held files, ``get_slice``, devices, and missing shards.

Each behaviour is checked against ``safetensors.safe_open`` where it has one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors
import sluice
import sluice.numpy
import torch
from conftest import assert_same_tensors, random_tensor, write_sharded
from safetensors.torch import save_file
from sluice.errors import (
    ConfigError,
    SluiceError,
    SluiceFileNotFoundError,
    SluiceIOError,
)
from sluice.torch import slice_plan, to_device


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit equality (random bits include NaNs, which ``torch.equal`` calls unequal)."""
    as_bytes = lambda t: t.contiguous().flatten().view(torch.uint8)  # noqa: E731
    return torch.equal(as_bytes(a), as_bytes(b))


def test_a_file_replaced_after_opening_still_yields_its_own_bytes(tmp_path: Path) -> None:
    # Same size, order swapped: re-opening the path per call would hand back
    # y's bytes for x, with no error. safetensors keeps its mapping.
    x, y = torch.full((256,), 1.0), torch.full((256,), 2.0)
    path = tmp_path / "m.safetensors"
    save_file({"x": x, "y": y}, str(path))
    ours = sluice.safe_open(path)
    theirs = safetensors.safe_open(str(path), framework="pt")
    staged = tmp_path / "staged.safetensors"
    # Same names, same sizes, bytes where the other tensor's were.
    save_file({"x": y.clone(), "y": x.clone()}, str(staged))
    os.replace(staged, path)

    assert torch.equal(ours.get_tensor("x"), x)
    assert torch.equal(ours.get_tensor("y"), y)
    assert torch.equal(ours.get_slice("x")[:10], theirs.get_slice("x")[:10])


def test_get_tensors_reads_the_held_files(tmp_path: Path) -> None:
    x = torch.arange(4096, dtype=torch.float32)
    path = tmp_path / "m.safetensors"
    save_file({"x": x}, str(path))
    ours = sluice.safe_open(path)
    save_file({"x": x + 1}, str(tmp_path / "staged.safetensors"))
    os.replace(tmp_path / "staged.safetensors", path)

    assert torch.equal(ours.get_tensors()["x"], x)


def test_close_releases_the_files_and_later_reads_raise(mixed_file) -> None:
    path, _ = mixed_file
    with sluice.safe_open(path) as f:
        f.get_tensor("embed")
    with pytest.raises(SluiceError, match="closed"):
        f.get_tensor("embed")
    with pytest.raises(SluiceError, match="closed"):
        f.keys()


INDICES: list[Any] = [
    0,
    -1,
    slice(2, 5),
    (slice(None), slice(3, 9)),
    (Ellipsis, 2),
    (1, Ellipsis, slice(2, 4)),
    slice(None, None, 2),
    (slice(None), slice(None, None, 3), slice(1, 5, 2)),
    slice(0, 100),
    slice(-100, 2),
    slice(5, 1),
    slice(0, 0),
    None,
    (None, 1, None),
    (1, 2, 3),
    torch.tensor(1),
    np.int64(2),
    (slice(None), -1),
    [0, 2],
    True,
    (slice(1, 7), slice(None), 0),
]


@pytest.mark.parametrize("index", INDICES, ids=repr)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_get_slice_matches_safetensors_and_torch(
    tmp_path: Path, gen: torch.Generator, dtype: torch.dtype, index: Any
) -> None:
    t = random_tensor(dtype, (7, 6, 11), gen)
    path = tmp_path / "s.safetensors"
    save_file({"pad": torch.zeros(3), "w": t}, str(path))
    ours = sluice.safe_open(path).get_slice("w")
    theirs = safetensors.safe_open(str(path), framework="pt").get_slice("w")

    assert ours.get_shape() == theirs.get_shape() == [7, 6, 11]
    assert ours.get_dtype() == theirs.get_dtype()
    got = ours[index]
    want = theirs[index]
    assert got.dtype == want.dtype
    assert tuple(got.shape) == tuple(want.shape) == tuple(t[index].shape)
    assert same_bytes(got, want)


@pytest.mark.parametrize(
    ("index", "message"),
    [
        (7, "index 7 is out of bounds for dimension 0 with size 7"),
        (-8, "index -8 is out of bounds for dimension 0 with size 7"),
        ((0, 0, 0, 0), "too many indices for tensor of dimension 3"),
        ((Ellipsis, 11), "index 11 is out of bounds for dimension 2 with size 11"),
    ],
)
def test_get_slice_out_of_range_raises_index_error_like_safetensors(
    tmp_path: Path, index: Any, message: str
) -> None:
    path = tmp_path / "s.safetensors"
    save_file({"w": torch.zeros(7, 6, 11)}, str(path))
    with pytest.raises(IndexError, match=message):
        sluice.safe_open(path).get_slice("w")[index]
    with pytest.raises(IndexError):
        safetensors.safe_open(str(path), framework="pt").get_slice("w")[index]


def test_get_slice_of_a_scalar_and_of_an_empty_tensor(tmp_path: Path) -> None:
    path = tmp_path / "s.safetensors"
    save_file({"s": torch.tensor(2.5), "e": torch.zeros(0, 4)}, str(path))
    f = sluice.safe_open(path)
    assert f.get_slice("s")[...].item() == 2.5
    assert f.get_slice("s").get_shape() == []
    assert tuple(f.get_slice("e")[:, 1:3].shape) == (0, 2)


def test_get_slice_reads_only_the_bytes_of_the_slice(tmp_path: Path) -> None:
    # Truncate away everything past the first rows: a row slice still
    # succeeds (it never reads the rest); the whole tensor cannot.
    rows = torch.arange(64 * 1024, dtype=torch.float32).reshape(64, 1024)
    path = tmp_path / "rows.safetensors"
    save_file({"w": rows}, str(path))
    f = sluice.safe_open(path)
    header = path.stat().st_size - rows.numel() * 4
    os.truncate(path, header + 8 * 1024 * 4)

    assert torch.equal(f.get_slice("w")[2:8], rows[2:8])
    assert torch.equal(f.get_slice("w")[3, 100:200], rows[3, 100:200])
    with pytest.raises(SluiceIOError, match=r"rows\.safetensors"):
        f.get_slice("w")[2:9]
    with pytest.raises(SluiceIOError, match=r"rows\.safetensors"):
        f.get_tensor("w")


def test_a_column_slice_of_a_large_tensor_is_bit_identical(tmp_path: Path) -> None:
    # Tensor-parallel column split: one run per row, gathered.
    w = torch.arange(1024 * 4096, dtype=torch.int32).reshape(1024, 4096)
    path = tmp_path / "tp.safetensors"
    save_file({"w": w}, str(path))
    f = sluice.safe_open(path)
    for rank in range(4):
        part = f.get_slice("w")[:, rank * 1024 : (rank + 1) * 1024]
        assert torch.equal(part, w[:, rank * 1024 : (rank + 1) * 1024])


def test_slice_plan_bounds_what_it_reads() -> None:
    ranges, rest = slice_plan([10, 20], (slice(2, 9, 3), 4))  # type: ignore[misc]
    assert ranges == [(2, 9), (4, 5)]
    assert rest == (slice(None, None, 3), 0)
    assert slice_plan([10], [1, 2]) is None  # advanced: read whole, torch indexes


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        ("cpu", torch.device("cpu")),
        (0, torch.device("cuda", 0)),
        (3, torch.device("cuda", 3)),
        ("cuda:1", torch.device("cuda", 1)),
        (torch.device("cuda", 2), torch.device("cuda", 2)),
    ],
)
def test_devices_are_read_the_same_way_everywhere(device: Any, expected: torch.device) -> None:
    assert to_device(device) == expected


@pytest.mark.parametrize("device", ["gpu7", -1, True, 1.5, "meta", torch.device("mps")])
def test_an_unknown_device_is_a_config_error_at_open(mixed_file, device: Any) -> None:
    path, _ = mixed_file
    with pytest.raises(ConfigError):
        sluice.safe_open(path, device=device)


def test_safe_open_puts_tensors_on_its_device(mixed_file, monkeypatch: pytest.MonkeyPatch) -> None:
    # The meta device stands in for a GPU this machine may lack; sluice itself refuses
    # it (a load onto it reads nothing), so its device check is stubbed out here.
    monkeypatch.setattr(sluice.torch, "usable_device", lambda device: torch.device(device))
    path, _ = mixed_file
    f = sluice.safe_open(path, device="meta")
    assert f.get_tensor("embed").device.type == "meta"
    assert f.get_slice("embed")[:2].device.type == "meta"
    assert f.get_tensors()["embed"].device.type == "meta"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
@pytest.mark.parametrize("device", [0, "cuda", "cuda:0", torch.device("cuda", 1)])
def test_cuda_without_a_gpu_is_a_config_error_before_any_read(mixed_file, device: Any) -> None:
    path, _ = mixed_file
    for call in (
        lambda: sluice.safe_open(path, device=device),
        lambda: sluice.load_file(path, device=device),
        lambda: next(iter(sluice.stream(path, device=device))),
    ):
        with pytest.raises(ConfigError, match="CUDA is not available"):
            call()


def test_a_gpu_past_the_last_one_is_a_config_error_naming_the_count(
    mixed_file, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a one-GPU machine (as the H200 check found), cuda:7 used to fail mid-load in
    torch, naming no device."""
    path, _ = mixed_file
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for device in (7, "cuda:7"):
        with pytest.raises(ConfigError, match="has 1 CUDA device"):
            sluice.safe_open(path, device=device)
        with pytest.raises(ConfigError, match="'cuda:7'"):
            sluice.load_file(path, device=device)


@pytest.fixture
def series_missing_one(
    tmp_path: Path, gen: torch.Generator
) -> tuple[Path, dict[str, torch.Tensor]]:
    """Shards 1 and 3 of 3, no index: shard 2 is missing."""
    shards = {
        f"model-0000{i}-of-00003.safetensors": {f"l{i}.w": random_tensor(torch.float32, (8,), gen)}
        for i in (1, 2, 3)
    }
    directory = write_sharded(tmp_path / "model", shards, index=False)
    (directory / "model-00002-of-00003.safetensors").unlink()
    kept = {
        **shards["model-00001-of-00003.safetensors"],
        **shards["model-00003-of-00003.safetensors"],
    }
    return directory, kept


@pytest.mark.parametrize(
    "opener",
    [
        sluice.load_file,
        lambda p: dict(sluice.stream(p)),
        sluice.safe_open,
        sluice.inspect,
        sluice.numpy.load_file,
    ],
    ids=["load_file", "stream", "safe_open", "inspect", "numpy"],
)
def test_a_missing_shard_of_a_series_is_an_error_naming_it(series_missing_one, opener) -> None:
    directory, _ = series_missing_one
    with pytest.raises(SluiceFileNotFoundError, match=r"model-00002-of-00003\.safetensors"):
        opener(directory)


def test_allow_partial_loads_the_rest_and_says_what_is_missing(series_missing_one) -> None:
    directory, kept = series_missing_one
    loaded = sluice.load_file(directory, allow_partial=True)
    assert_same_tensors(loaded, kept)
    [missing] = sluice.last_load_stats()["missing_shards"]
    assert Path(missing).name == "model-00002-of-00003.safetensors"
    assert sorted(sluice.safe_open(directory, allow_partial=True).keys()) == sorted(kept)
    streamed = dict(sluice.stream(directory, allow_partial=True))
    assert_same_tensors(streamed, kept)


def test_a_dangling_shard_link_is_an_error_naming_it(tmp_path: Path, gen: torch.Generator) -> None:
    directory = write_sharded(
        tmp_path / "m",
        {"a.safetensors": {"a": random_tensor(torch.float32, (4,), gen)}},
        index=False,
    )
    (directory / "b.safetensors").symlink_to(tmp_path / "nowhere")
    with pytest.raises(SluiceFileNotFoundError, match=r"b\.safetensors"):
        sluice.load_file(directory, allow_partial=True)


def test_cli_inspect_says_partial_only_when_allowed(series_missing_one, sluice_bin) -> None:
    import json
    import subprocess

    directory, kept = series_missing_one
    strict = subprocess.run([sluice_bin, "inspect", directory], capture_output=True, text=True)
    assert strict.returncode == 4, strict  # a missing file
    assert "model-00002-of-00003.safetensors" in strict.stderr
    assert "valid" not in strict.stdout

    partial = subprocess.run(
        [sluice_bin, "inspect", "--json", "--allow-partial", directory],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(partial.stdout)
    assert report["complete"] is False
    assert [Path(p).name for p in report["missing_shards"]] == ["model-00002-of-00003.safetensors"]
    assert report["tensor_count"] == len(kept)


def test_numpy_without_ml_dtypes_fails_before_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "bf16.safetensors"
    save_file({"f": torch.zeros(4), "b": torch.zeros(4, dtype=torch.bfloat16)}, str(path))
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # import ml_dtypes -> ImportError

    def no_reads(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the checkpoint was read before the dtype check")

    monkeypatch.setattr(sluice._core, "iter_windows", no_reads)
    with pytest.raises(TypeError, match=r"'b'.*ml_dtypes"):
        sluice.numpy.load_file(path)


def test_dir_lists_the_lazy_torch_front_end() -> None:
    names = dir(sluice)
    assert {"load_file", "stream", "safe_open", "inspect", "last_load_stats"} <= set(names)


@pytest.mark.parametrize("shape", [[2, 3], [0, 3]])
def test_an_f4_tensor_with_an_odd_last_dimension_is_a_type_error_naming_it(
    tmp_path: Path, shape: list[int]
) -> None:
    # Valid safetensors (whole bytes overall), but torch's float4_e2m1fn_x2
    # packs pairs along the last dimension; was a raw RuntimeError, or a
    # tensor of the wrong shape for [0, 3].
    from conftest import entry, write_raw

    nbytes = shape[0] * shape[1] // 2
    path = write_raw(
        tmp_path / "f4.safetensors", {"q": entry("F4", shape, 0, nbytes)}, b"\0" * nbytes
    )
    for read in (
        lambda: sluice.load_file(path),
        lambda: sluice.safe_open(path).get_tensor("q"),
        lambda: sluice.safe_open(path).get_slice("q")[:1],
    ):
        with pytest.raises(TypeError, match=r"f4\.safetensors.*'q'.*odd"):
            read()
