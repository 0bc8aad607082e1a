"""Malformed input gets a typed error that names the file and the value at fault.

Each checkpoint below is broken in one way. Every front end (``load_file``, ``stream``,
``safe_open``, ``inspect``, ``sluice.numpy``) must raise the same class, with a message a
user can act on, and ``load_file`` must never hand back a partial dict.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import sluice
import sluice.numpy
import torch
from conftest import MiB, entry, write_raw, write_sharded
from safetensors.torch import save_file
from sluice import (
    HeaderError,
    SluiceError,
    SluiceFileNotFoundError,
    SluiceIOError,
    SluicePermissionError,
    TensorNotFoundError,
)

F32x4 = bytes(16)

# Writes a broken checkpoint under a directory and returns its path.
Case = Callable[[Path], Path]


def shorter_than_prefix(d: Path) -> Path:
    (d / "short.safetensors").write_bytes(b"\x01\x02\x03")
    return d / "short.safetensors"


def header_longer_than_file(d: Path) -> Path:
    return write_raw(d / "f.safetensors", {"w": entry("F32", [4], 0, 16)}, F32x4, header_len=5000)


def header_over_100mb(d: Path) -> Path:
    return write_raw(d / "f.safetensors", "{}", b"", header_len=100_000_001)


def header_not_utf8(d: Path) -> Path:
    return write_raw(d / "f.safetensors", b'{"w\xff\xfe": 1}', b"")


def header_invalid_json(d: Path) -> Path:
    return write_raw(d / "f.safetensors", '{"w": {"dtype": "F32",', F32x4)


def header_not_object(d: Path) -> Path:
    return write_raw(d / "f.safetensors", "[1, 2, 3]", b"")


def unknown_dtype(d: Path) -> Path:
    return write_raw(d / "f.safetensors", {"w": entry("F128", [1], 0, 16)}, F32x4)


def size_mismatch(d: Path) -> Path:
    return write_raw(d / "f.safetensors", {"w": entry("F32", [2, 3], 0, 20)}, bytes(24))


def offsets_past_data(d: Path) -> Path:
    return write_raw(d / "f.safetensors", {"w": entry("F32", [4], 0, 16)}, bytes(12))


def overlapping(d: Path) -> Path:
    header = {"first": entry("F32", [4], 0, 16), "second": entry("F32", [4], 8, 24)}
    return write_raw(d / "f.safetensors", header, bytes(24))


def repeated_name_leaves_a_gap(d: Path) -> Path:
    # As in safetensors, the last "w" wins; the first one's bytes are then a gap.
    one = json.dumps(entry("F32", [4], 0, 16))
    two = json.dumps(entry("F32", [4], 16, 32))
    return write_raw(d / "f.safetensors", f'{{"w": {one}, "w": {two}}}', bytes(32))


def trailing_bytes(d: Path) -> Path:
    return write_raw(d / "f.safetensors", {"w": entry("F32", [4], 0, 16)}, bytes(17))


def gap_between_tensors(d: Path) -> Path:
    header = {"a": entry("F32", [4], 0, 16), "b": entry("F32", [4], 20, 36)}
    return write_raw(d / "f.safetensors", header, bytes(36))


def empty_shape_past_i64(d: Path) -> Path:
    # safetensors accepts the header; numpy and torch then cannot build the tensor.
    return write_raw(d / "f.safetensors", {"w": entry("U8", [0, 2**63, 2**63], 0, 0)})


def metadata_not_string(d: Path) -> Path:
    header = {"__metadata__": {"epoch": 3}, "w": entry("F32", [4], 0, 16)}
    return write_raw(d / "f.safetensors", header, F32x4)


def header_length_zero(d: Path) -> Path:
    return write_raw(d / "f.safetensors", "", F32x4, header_len=0)


def size_overflows_u64(d: Path) -> Path:
    return write_raw(d / "f.safetensors", {"w": entry("F32", [2**62, 2**62], 0, 16)}, F32x4)


def offsets_inverted(d: Path) -> Path:
    return write_raw(d / "f.safetensors", {"w": entry("U8", [0], 16, 0)}, F32x4)


def metadata_not_object(d: Path) -> Path:
    header = {"__metadata__": ["pt"], "w": entry("F32", [4], 0, 16)}
    return write_raw(d / "f.safetensors", header, F32x4)


def index_not_json(d: Path) -> Path:
    (d / "model.safetensors.index.json").write_text('{"weight_map": {"w": ')
    return d / "model.safetensors.index.json"


def index_without_weight_map(d: Path) -> Path:
    write_sharded(d, {"a.safetensors": {"w": torch.zeros(4)}}, index=False)
    (d / "model.safetensors.index.json").write_text('{"metadata": {}}')
    return d / "model.safetensors.index.json"


def index(d: Path, weight_map: dict[str, str]) -> Path:
    path = d / "model.safetensors.index.json"
    path.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


def index_missing_shard(d: Path) -> Path:
    write_sharded(d, {"a.safetensors": {"w": torch.zeros(4)}}, index=False)
    return index(d, {"w": "a.safetensors", "v": "gone.safetensors"})


def index_names_absent_tensor(d: Path) -> Path:
    write_sharded(d, {"a.safetensors": {"w": torch.zeros(4)}}, index=False)
    return index(d, {"w": "a.safetensors", "ghost": "a.safetensors"})


def tensor_in_two_shards(d: Path) -> Path:
    shards = {
        "a.safetensors": {"w": torch.zeros(4)},
        "b.safetensors": {"w": torch.ones(4), "v": torch.ones(2)},
    }
    write_sharded(d, shards, index=False)
    return index(d, {"w": "a.safetensors", "v": "b.safetensors"})


def tensor_in_two_shards_no_index(d: Path) -> Path:
    shards = {"a.safetensors": {"w": torch.zeros(4)}, "b.safetensors": {"w": torch.ones(4)}}
    return write_sharded(d, shards, index=False)


def index_path_traversal(d: Path) -> Path:
    # The escaping shard exists and is valid: only the name's '..' may stop it.
    save_file({"w": torch.zeros(4)}, str(d / "outside.safetensors"))
    (d / "ckpt").mkdir()
    return index(d / "ckpt", {"w": "../outside.safetensors"})


def directory_without_shards(d: Path) -> Path:
    (d / "empty").mkdir()
    (d / "empty" / "README.md").write_text("no tensors here")
    return d / "empty"


# case -> (builder, error class, words the message must hold besides the file name)
CASES: dict[str, tuple[Case, type[Exception], list[str]]] = {
    "shorter_than_8_bytes": (shorter_than_prefix, HeaderError, ["3 bytes"]),
    "header_length_past_end_of_file": (header_longer_than_file, HeaderError, ["5000"]),
    "header_length_over_100mb": (header_over_100mb, HeaderError, ["100000001"]),
    "header_not_utf8": (header_not_utf8, HeaderError, ["UTF-8"]),
    "header_invalid_json": (header_invalid_json, HeaderError, ["JSON"]),
    "header_not_an_object": (header_not_object, HeaderError, ["object"]),
    "header_length_zero": (header_length_zero, HeaderError, ["header length is 0"]),
    "unknown_dtype": (unknown_dtype, HeaderError, ["'w'", "F128"]),
    "shape_size_overflows_u64": (size_overflows_u64, HeaderError, ["'w'", "overflow"]),
    "offsets_start_after_end": (offsets_inverted, HeaderError, ["'w'", "[16, 0]"]),
    "metadata_not_an_object": (metadata_not_object, HeaderError, ["__metadata__", "array"]),
    "index_invalid_json": (index_not_json, HeaderError, ["JSON"]),
    "index_without_weight_map": (index_without_weight_map, HeaderError, ["weight_map"]),
    "shape_times_dtype_not_span": (size_mismatch, HeaderError, ["'w'", "24", "20"]),
    "offsets_past_data": (offsets_past_data, HeaderError, ["'w'", "16", "12"]),
    "overlapping_tensors": (overlapping, HeaderError, ["first", "second"]),
    "repeated_tensor_name_leaves_a_gap": (
        repeated_name_leaves_a_gap,
        HeaderError,
        ["'w'", "[0, 16)"],
    ),
    "trailing_bytes": (trailing_bytes, HeaderError, ["17 bytes", "[16, 17)"]),
    "gap_between_tensors": (gap_between_tensors, HeaderError, ["'b'", "[16, 20)"]),
    "empty_shape_past_i64": (empty_shape_past_i64, HeaderError, ["'w'", "numpy or torch"]),
    "metadata_value_not_string": (metadata_not_string, HeaderError, ["epoch"]),
    "index_missing_shard_file": (index_missing_shard, SluiceFileNotFoundError, ["gone"]),
    "index_names_absent_tensor": (index_names_absent_tensor, HeaderError, ["ghost"]),
    "tensor_in_two_shards": (tensor_in_two_shards, HeaderError, ["'w'", "a.", "b."]),
    "tensor_in_two_shards_no_index": (tensor_in_two_shards_no_index, HeaderError, ["'w'"]),
    "index_path_traversal": (index_path_traversal, HeaderError, ["../outside.safetensors"]),
    "directory_without_shards": (directory_without_shards, HeaderError, ["no *.safetensors"]),
}


def load_torch(path: Path) -> object:
    return sluice.load_file(path)


def stream_all(path: Path) -> object:
    return list(sluice.stream(path))


def open_and_list(path: Path) -> object:
    return sluice.safe_open(path).keys()


def load_numpy(path: Path) -> object:
    return sluice.numpy.load_file(path)


FRONTS = {
    "load_file": load_torch,
    "stream": stream_all,
    "safe_open": open_and_list,
    "inspect": sluice.inspect,
    "numpy": load_numpy,
}


@pytest.mark.parametrize("front", sorted(FRONTS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_checkpoint_raises_typed_error_naming_file(
    tmp_path: Path, case: str, front: str
) -> None:
    build, error, words = CASES[case]
    path = build(tmp_path)
    result = None

    with pytest.raises(error) as caught:
        result = FRONTS[front](path)

    assert result is None, "no partial result may be returned"
    message = str(caught.value)
    # The checkpoint itself, or (for cross-shard errors) a shard file beside it.
    assert str(path) in message or str(path.parent) in message, message
    for word in words:
        assert word in message, message
    assert "\n" not in message


def test_missing_path_raises_file_not_found(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.safetensors"
    with pytest.raises(SluiceFileNotFoundError, match=r"nowhere\.safetensors") as caught:
        sluice.load_file(path)
    assert isinstance(caught.value, FileNotFoundError)
    assert isinstance(caught.value, SluiceIOError)


def test_a_fifo_is_refused_at_once_naming_it(tmp_path: Path) -> None:
    # In a child with a deadline: before the fix, opening the FIFO blocked for good.
    fifo = tmp_path / "m.safetensors"
    os.mkfifo(fifo)
    code = (
        "import sys, sluice.numpy\n"
        "try:\n"
        "    sluice.numpy.load_file(sys.argv[1])\n"
        "except OSError as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.startswith("SluiceIOError"), done.stdout + done.stderr
    assert "FIFO" in done.stdout and str(fifo) in done.stdout


def test_header_error_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        sluice.load_file(header_not_object(tmp_path))


@pytest.mark.parametrize("front", ["load_file", "stream", "numpy"])
def test_unknown_name_in_names_raises_tensor_not_found(tmp_path: Path, front: str) -> None:
    path = tmp_path / "m.safetensors"
    save_file({"w": torch.zeros(4)}, str(path))
    loaders = {"load_file": sluice.load_file, "numpy": sluice.numpy.load_file}
    loaders["stream"] = lambda p, names: list(sluice.stream(p, names=names))

    with pytest.raises(TensorNotFoundError) as caught:
        loaders[front](path, names=["w", "nope"])

    assert isinstance(caught.value, KeyError)
    assert "nope" in str(caught.value) and "m.safetensors" in str(caught.value)


def test_safe_open_get_tensor_of_unknown_name_raises_key_error(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_file({"w": torch.zeros(4)}, str(path))
    with pytest.raises(KeyError, match="nope"):
        sluice.safe_open(path).get_tensor("nope")


UNPRIVILEGED_LOAD = """
import os, sys
import sluice, sluice.torch
try:
    os.setuid(65534)
except OSError:
    sys.exit(77)
try:
    sluice.load_file(sys.argv[1])
except sluice.SluicePermissionError as e:
    assert isinstance(e, PermissionError), type(e).__mro__
    print("PermissionError:", e)
    sys.exit(0)
except BaseException as e:
    print("wrong error:", type(e).__name__, e)
    sys.exit(1)
print("loaded without permission")
sys.exit(1)
"""


def test_unreadable_file_raises_permission_error(world_readable_dir: Path) -> None:
    path = world_readable_dir / "secret.safetensors"
    save_file({"w": torch.zeros(4)}, str(path))
    path.chmod(0)
    if os.geteuid() != 0:
        with pytest.raises(SluicePermissionError, match=r"secret\.safetensors"):
            sluice.load_file(path)
        return

    # Root reads any file, so run the load as 'nobody' (imports first, while still root).
    proc = subprocess.run(
        [sys.executable, "-c", UNPRIVILEGED_LOAD, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )

    if proc.returncode == 77:
        pytest.skip("cannot switch to an unprivileged user here")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "secret.safetensors" in proc.stdout


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("direct", "sideways"),
        ("engine", "warp"),
        ("concurrency", 0),
        ("chunk_bytes", "lots"),
        ("chunk_bytes", -1),
        ("chunk_bytes", 100),
        ("memory_limit", 0),
        ("memory_limit", "12 parsecs"),
    ],
)
def test_bad_option_value_raises_value_error_naming_it(
    mixed_file, option: str, value: object
) -> None:
    path, _ = mixed_file
    with pytest.raises(ValueError) as caught:
        sluice.load_file(path, **{option: value})
    message = str(caught.value)
    assert str(value) in message or option in message, message


def test_bad_concurrency_is_a_config_error_naming_concurrency(mixed_file) -> None:
    # A ConfigError (still a ValueError), named as the option is: it was a plain ValueError,
    # and the Rust side said "queue_depth" (issue 12, item 13).
    path, _ = mixed_file
    for value in (-1, 0, 5000):
        with pytest.raises(sluice.errors.ConfigError, match=r"concurrency") as caught:
            sluice.load_file(path, concurrency=value)
        assert "queue_depth" not in str(caught.value)


@pytest.mark.parametrize(
    ("variable", "value"),
    [("SLUICE_DIRECT", "sideways"), ("SLUICE_QUEUE_DEPTH", "lots"), ("SLUICE_IO_URING", "maybe")],
)
def test_bad_environment_value_raises_value_error_naming_the_variable(
    mixed_file, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    path, _ = mixed_file
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=variable):
        sluice.load_file(path)


@pytest.fixture
def two_tensor_file(tmp_path: Path) -> Path:
    path = tmp_path / "trunc.safetensors"
    save_file({"a": torch.arange(1000.0), "b": torch.arange(1000.0)}, str(path))
    return path


def test_get_tensor_after_truncation_raises_instead_of_returning_wrong_bytes(
    two_tensor_file: Path,
) -> None:
    reader = sluice.safe_open(two_tensor_file)
    os.truncate(two_tensor_file, two_tensor_file.stat().st_size - 100)

    with pytest.raises(SluiceError, match=r"trunc\.safetensors"):
        reader.get_tensor("b")


def test_get_tensor_after_truncation_raises_sluice_io_error(two_tensor_file: Path) -> None:
    reader = sluice.safe_open(two_tensor_file)
    os.truncate(two_tensor_file, two_tensor_file.stat().st_size - 100)

    with pytest.raises(SluiceIOError, match=r"trunc\.safetensors"):
        reader.get_tensor("b")


def test_truncation_during_stream_raises_io_error_naming_file(tmp_path: Path) -> None:
    path = tmp_path / "shrinking.safetensors"
    save_file({f"t{i:02d}": torch.full((MiB // 4,), float(i)) for i in range(16)}, str(path))
    names = []
    stream = sluice.stream(path, memory_limit="8MiB")
    names.append(next(stream)[0])
    os.truncate(path, 6 * MiB)

    with pytest.raises(SluiceIOError, match=r"shrinking\.safetensors") as caught:
        names.extend(name for name, _ in stream)

    assert "truncated" in str(caught.value)
    assert len(names) < 16


def test_chunk_bytes_over_the_window_size_loads_or_is_rejected_in_its_own_terms(
    mixed_file,
) -> None:
    path, tensors = mixed_file
    try:
        loaded = sluice.load_file(path, chunk_bytes="128MiB")
    except ValueError as e:
        assert "window_bytes" not in str(e) and "chunk_bytes" in str(e), str(e)
    else:
        assert sorted(loaded) == sorted(tensors)


# A path that does not exist: an option refused "before any read" is refused before the
# file is even opened, so the error is the ConfigError, not SluiceFileNotFoundError.
def _front_ends(path: Path, **options: object) -> dict[str, Callable[[], object]]:
    numpy_dest = {"w": np.zeros(4, dtype=np.float32)}
    return {
        "load_file": lambda: sluice.load_file(path, **options),
        "stream": lambda: next(iter(sluice.stream(path, **options))),
        "safe_open": lambda: sluice.safe_open(path, **options),
        "load_into": lambda: sluice.load_into(path, {"w": torch.zeros(4)}, **options),
        # numpy's load_file holds every array: it takes no memory_limit.
        **(
            {"numpy.load_file": lambda: sluice.numpy.load_file(path, **options)}
            if "memory_limit" not in options
            else {}
        ),
        "numpy.load_into": lambda: sluice.numpy.load_into(path, numpy_dest, **options),
    }


@pytest.mark.parametrize(
    "device", ["meta", torch.device("meta"), "mps", torch.device("xpu"), "xla:0", "ipu"]
)
def test_a_device_other_than_cpu_or_cuda_is_a_config_error_naming_it_before_any_read(
    tmp_path: Path, device: object
) -> None:
    # "meta" loaded meta tensors (nothing read), "mps" raised torch's RuntimeError and
    # torch.device("xpu") an AssertionError, mid-load.
    absent = tmp_path / "absent.safetensors"
    calls = {
        "load_file": lambda: sluice.load_file(absent, device=device),
        "stream": lambda: next(iter(sluice.stream(absent, device=device))),
        "safe_open": lambda: sluice.safe_open(absent, device=device),
    }
    for front_end, call in calls.items():
        with pytest.raises(sluice.ConfigError) as caught:
            call()
        assert repr(device) in str(caught.value), (front_end, str(caught.value))


def test_load_into_refuses_a_meta_destination_naming_it_before_any_read(mixed_file) -> None:
    # It "succeeded": copy_ into a meta tensor does nothing, so nothing was loaded.
    path, _ = mixed_file
    untouched = torch.zeros(300, 1001)
    dest = {
        "layer.0.w": untouched,
        "embed": torch.empty(512, 1024, dtype=torch.bfloat16, device="meta"),
    }

    with pytest.raises(sluice.ConfigError, match=r"'embed'.*meta"):
        sluice.load_into(path, dest, strict=False)

    assert not untouched.any(), "a destination was written before the refusal"


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("concurrency", 2**70),  # was OverflowError
        ("concurrency", True),  # was accepted as 1
        ("concurrency", False),
        ("chunk_bytes", True),
        ("chunk_bytes", 2**70),
        ("memory_limit", True),  # was accepted as 1 byte
        ("memory_limit", 2**64),
        ("memory_limit", 2**200),
    ],
)
def test_a_bool_or_oversized_int_option_is_a_config_error_naming_it_before_any_read(
    tmp_path: Path, option: str, value: object
) -> None:
    absent = tmp_path / "absent.safetensors"
    for front_end, call in _front_ends(absent, **{option: value}).items():
        with pytest.raises(sluice.ConfigError) as caught:
            call()
        message = str(caught.value)
        assert option in message and str(value) in message, (front_end, message)


def test_stream_takes_its_memory_limit_from_the_environment(
    mixed_file, monkeypatch: pytest.MonkeyPatch
) -> None:
    # stream's own default (512 MiB) used to hide SLUICE_MEMORY_LIMIT, which the CLI reads.
    path, tensors = mixed_file
    monkeypatch.setenv("SLUICE_MEMORY_LIMIT", "1")

    with pytest.raises(sluice.MemoryLimitError, match="memory_limit is 1 bytes"):
        next(iter(sluice.stream(path)))
    # An explicit argument wins over the environment.
    assert {name for name, _ in sluice.stream(path, memory_limit="64MiB")} == set(tensors)

    monkeypatch.setenv("SLUICE_MEMORY_LIMIT", "0")
    with pytest.raises(sluice.ConfigError, match="memory_limit: must be positive"):
        next(iter(sluice.stream(path)))


def test_load_into_copies_under_the_memory_limit_from_the_environment(
    mixed_file, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A destination of another dtype is filled from a stream, which used 512 MiB whatever
    # SLUICE_MEMORY_LIMIT said.
    path, tensors = mixed_file
    monkeypatch.setenv("SLUICE_MEMORY_LIMIT", "1")
    dest = {"layer.0.w": torch.zeros(300, 1001, dtype=torch.float64)}

    with pytest.raises(sluice.MemoryLimitError, match="memory_limit is 1 bytes"):
        sluice.load_into(path, dest, strict=False)

    sluice.load_into(path, dest, strict=False, memory_limit="64MiB")
    torch.testing.assert_close(
        dest["layer.0.w"], tensors["layer.0.w"].double(), rtol=0, atol=0, equal_nan=True
    )
