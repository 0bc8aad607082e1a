"""Sluice against the reference: every load must equal ``safetensors`` bit for bit."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import safetensors
import safetensors.numpy
import safetensors.torch
import sluice
import sluice.numpy
import torch
from conftest import (
    TORCH_DTYPES,
    assert_same_arrays,
    assert_same_tensors,
    entry,
    random_tensor,
    raw_bytes,
    write_raw,
    write_sharded,
)
from hypothesis import given, settings
from hypothesis import strategies as st

# 0-d, empty (a zero dimension anywhere), a single element (one byte for 1-byte dtypes),
# and ordinary shapes.
EDGE_SHAPES = [(), (0,), (3, 0), (0, 2, 5), (1,), (1, 1, 1), (7,), (3, 5), (2, 3, 4)]


def reference(path: Path) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(str(path))


@pytest.mark.parametrize("dtype_name", sorted(TORCH_DTYPES))
def test_every_dtype_and_edge_shape_matches_safetensors(
    tmp_path: Path, gen: torch.Generator, dtype_name: str
) -> None:
    dtype = TORCH_DTYPES[dtype_name]
    tensors = {f"t{i}": random_tensor(dtype, shape, gen) for i, shape in enumerate(EDGE_SHAPES)}
    path = tmp_path / "dtypes.safetensors"
    safetensors.torch.save_file(tensors, str(path))

    loaded = sluice.load_file(path)

    assert_same_tensors(loaded, reference(path))
    assert_same_tensors(loaded, tensors)
    assert {row["dtype"] for row in sluice.inspect(path)} == {dtype_name}


def test_float4_packed_dtype_matches_safetensors(tmp_path: Path) -> None:
    if not hasattr(torch, "float4_e2m1fn_x2"):
        pytest.skip("torch has no float4_e2m1fn_x2")
    packed = torch.tensor([[0x12, 0x34], [0x56, 0x78]], dtype=torch.uint8)
    path = tmp_path / "f4.safetensors"
    safetensors.torch.save_file({"x": packed.view(torch.float4_e2m1fn_x2)}, str(path))

    assert_same_tensors(sluice.load_file(path), reference(path))


def odd_offset_file(path: Path, *, header_pad: int) -> tuple[Path, dict[str, np.ndarray]]:
    """Tensors packed back to back after a 1-byte tensor, so all wider ones sit at odd
    offsets; ``header_pad`` spaces make the data section itself start unaligned."""
    arrays = {
        "a_byte": np.array([7], dtype=np.uint8),
        "b_f32": np.arange(5, dtype=np.float32) * 1.5,
        "c_i16": np.array([-3, 2, 1], dtype=np.int16),
        "d_f64": np.array([np.pi, -np.e], dtype=np.float64),
        "e_i64": np.array([2**40 + 3], dtype=np.int64),
        "f_c64": np.array([1 + 2j], dtype=np.complex64),
        "g_f16": np.array([0.5, 2.0, -1.0], dtype=np.float16),
    }
    dtypes = {"a_byte": "U8", "b_f32": "F32", "c_i16": "I16", "d_f64": "F64", "e_i64": "I64"}
    dtypes.update({"f_c64": "C64", "g_f16": "F16"})
    header: dict[str, object] = {}
    data = b""
    for name, array in arrays.items():
        header[name] = entry(dtypes[name], list(array.shape), len(data), len(data) + array.nbytes)
        data += array.tobytes()
    text = json.dumps(header) + " " * header_pad
    return write_raw(path, text, data), arrays


@pytest.mark.parametrize("header_pad", [0, 1, 3])
def test_tensors_at_odd_offsets_match_safetensors(tmp_path: Path, header_pad: int) -> None:
    path, arrays = odd_offset_file(tmp_path / "odd.safetensors", header_pad=header_pad)

    loaded = sluice.load_file(path)

    assert_same_tensors(loaded, reference(path))
    for name, array in arrays.items():
        assert raw_bytes(loaded[name]) == array.tobytes(), name
        assert loaded[name].is_contiguous()


def test_numpy_front_matches_safetensors_at_odd_offsets(tmp_path: Path) -> None:
    path, arrays = odd_offset_file(tmp_path / "odd.safetensors", header_pad=1)

    loaded = sluice.numpy.load_file(path)

    assert_same_arrays(loaded, safetensors.numpy.load_file(str(path)))
    for name, array in arrays.items():
        assert loaded[name].tobytes() == array.tobytes(), name


@pytest.fixture
def sharded(tmp_path: Path, gen: torch.Generator) -> tuple[Path, dict[str, torch.Tensor]]:
    shards = {
        f"model-0000{i}-of-00003.safetensors": {
            f"layers.{i}.{kind}": random_tensor(torch.bfloat16, (64 + i, 33), gen)
            for kind in ("q", "k", "v")
        }
        for i in range(1, 4)
    }
    shards["model-00001-of-00003.safetensors"]["embed"] = random_tensor(torch.float32, (9,), gen)
    index = write_sharded(tmp_path / "ckpt", shards)
    everything = {name: t for tensors in shards.values() for name, t in tensors.items()}
    return index, everything


def load_each_shard(directory: Path) -> dict[str, torch.Tensor]:
    merged: dict[str, torch.Tensor] = {}
    for shard in sorted(directory.glob("*.safetensors")):
        merged.update(reference(shard))
    return merged


def test_sharded_index_matches_each_shard_loaded_with_safetensors(sharded) -> None:
    index, everything = sharded

    loaded = sluice.load_file(index)

    assert_same_tensors(loaded, load_each_shard(index.parent))
    assert_same_tensors(loaded, everything)
    assert sluice.last_load_stats()["tensors"] == len(everything)


def test_directory_with_index_loads_like_the_index(sharded) -> None:
    index, everything = sharded

    assert_same_tensors(sluice.load_file(index.parent), everything)


def test_directory_without_index_loads_every_shard(sharded) -> None:
    index, _ = sharded
    index.unlink()

    loaded = sluice.load_file(index.parent)

    assert_same_tensors(loaded, load_each_shard(index.parent))
    assert len(sluice.last_load_stats()["files"]) == 3


def test_names_list_loads_exactly_those_tensors(sharded) -> None:
    index, everything = sharded
    wanted = ["layers.3.v", "embed", "layers.1.q"]

    loaded = sluice.load_file(index, names=wanted)

    assert_same_tensors(loaded, {n: everything[n] for n in wanted})


def test_names_predicate_loads_the_matching_tensors(sharded) -> None:
    index, everything = sharded

    loaded = sluice.load_file(index, names=lambda n: n.endswith(".k"))

    assert_same_tensors(loaded, {n: t for n, t in everything.items() if n.endswith(".k")})


def test_empty_names_list_loads_nothing(sharded) -> None:
    index, _ = sharded

    assert sluice.load_file(index, names=[]) == {}


DTYPE_NAMES = sorted(TORCH_DTYPES)
shapes = st.lists(st.integers(min_value=0, max_value=6), min_size=0, max_size=3).map(tuple)
state_dicts = st.dictionaries(
    keys=st.text(alphabet="abcdefghij._0123456789", min_size=1, max_size=12),
    values=st.tuples(st.sampled_from(DTYPE_NAMES), shapes, st.integers(0, 2**31 - 1)),
    min_size=1,
    max_size=8,
)


@settings(max_examples=30, deadline=None)
@given(spec=state_dicts)
def test_random_state_dicts_match_safetensors(spec) -> None:
    tensors = {
        name: random_tensor(TORCH_DTYPES[dtype], shape, torch.Generator().manual_seed(seed))
        for name, (dtype, shape, seed) in spec.items()
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "random.safetensors"
        safetensors.torch.save_file(tensors, str(path))

        assert_same_tensors(sluice.load_file(path), reference(path))


@pytest.mark.parametrize("engine", ["io_uring", "threads"])
@pytest.mark.parametrize("direct", ["off", "auto", "on"])
def test_every_direct_mode_and_engine_matches_safetensors(
    mixed_file, require_io_uring, direct: str, engine: str
) -> None:
    path, tensors = mixed_file

    loaded = sluice.load_file(path, direct=direct, engine=engine, chunk_bytes="64KiB")
    assert_same_tensors(loaded, tensors)

    assert_same_tensors(loaded, reference(path))
    stats = sluice.last_load_stats()
    assert stats["engine"] == engine
    if direct != "auto":
        assert stats["io_mode"] == {"on": "direct", "off": "buffered"}[direct]


def test_stream_yields_every_tensor_once_with_equal_bytes(mixed_file) -> None:
    path, _ = mixed_file
    expected = reference(path)

    seen: list[str] = []
    for name, tensor in sluice.stream(path, memory_limit="4MiB"):
        seen.append(name)
        assert_same_tensors({name: tensor}, {name: expected[name]})

    assert sorted(seen) == sorted(expected)


def test_safe_open_matches_safetensors_safe_open(tmp_path: Path, gen: torch.Generator) -> None:
    tensors = {n: random_tensor(torch.float16, (5, i + 1), gen) for i, n in enumerate("zyxw")}
    metadata = {"format": "pt", "note": "ünïcode"}
    path = tmp_path / "meta.safetensors"
    safetensors.torch.save_file(tensors, str(path), metadata=metadata)

    with (
        sluice.safe_open(path, framework="pt") as ours,
        safetensors.safe_open(str(path), framework="pt") as theirs,
    ):
        assert ours.keys() == list(theirs.keys())
        assert ours.metadata() == theirs.metadata() == metadata
        assert all(name in ours for name in tensors)
        assert "missing" not in ours
        for name in theirs.keys():  # noqa: SIM118 - safe_open is not a dict
            assert_same_tensors({name: ours.get_tensor(name)}, {name: theirs.get_tensor(name)})


def test_safe_open_metadata_is_none_without_metadata(mixed_file) -> None:
    path, _ = mixed_file
    with safetensors.safe_open(str(path), framework="pt") as theirs:
        assert sluice.safe_open(path).metadata() == theirs.metadata()


NUMPY_DTYPES = [np.bool_, np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32]
NUMPY_DTYPES += [np.uint64, np.int64, np.float16, np.float32, np.float64, np.complex64]


def test_numpy_load_file_matches_safetensors_numpy(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    arrays = {}
    for i, dtype in enumerate(NUMPY_DTYPES):
        for j, shape in enumerate([(), (0,), (1,), (3, 4)]):
            raw = rng.integers(0, 2 if dtype is np.bool_ else 256, size=np.dtype(dtype).itemsize)
            count = int(np.prod(shape))
            data = np.frombuffer(raw.astype(np.uint8).tobytes() * count, dtype=dtype)
            arrays[f"a{i}_{j}"] = data.reshape(shape)
    path = tmp_path / "np.safetensors"
    safetensors.numpy.save_file(arrays, str(path))

    loaded = sluice.numpy.load_file(path)

    expected = safetensors.numpy.load_file(str(path))
    assert sorted(loaded) == sorted(expected)
    for name, want in expected.items():
        assert isinstance(loaded[name], np.ndarray)
        assert (loaded[name].dtype, loaded[name].shape) == (want.dtype, want.shape), name
        assert loaded[name].tobytes() == want.tobytes(), name
