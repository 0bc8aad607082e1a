"""The public Python surface: progress, name filters, devices, zero copy, inspect, stats."""

from __future__ import annotations

import ast
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest
import sluice
import sluice.numpy
import torch
from conftest import MiB, assert_same_tensors, entry, random_tensor, write_raw, write_sharded
from safetensors.torch import save_file


@pytest.fixture
def three_shards(tmp_path: Path, gen: torch.Generator) -> tuple[Path, dict[str, torch.Tensor]]:
    shards = {
        f"model-{i}.safetensors": {f"s{i}.w0": random_tensor(torch.float16, (256, 8 + i), gen)}
        for i in range(3)
    }
    index = write_sharded(tmp_path / "ckpt", shards)
    return index, {n: t for tensors in shards.values() for n, t in tensors.items()}


def assert_progress_well_formed(calls: list[tuple[int, int]], total: int) -> None:
    assert calls, "the callback was never called"
    assert all(t == total for _, t in calls)
    dones = [d for d, _ in calls]
    assert dones == sorted(dones), f"done went backwards: {dones}"
    assert dones[-1] == total
    assert all(0 <= d <= total for d in dones)


def test_progress_callback_is_monotonic_and_ends_at_total(three_shards) -> None:
    index, tensors = three_shards
    calls: list[tuple[int, int]] = []

    sluice.load_file(index, on_progress=lambda done, total: calls.append((done, total)))

    total = sum(t.numel() * t.element_size() for t in tensors.values())
    assert_progress_well_formed(calls, total)
    assert len(calls) >= 3, "one report per window at least (one window per shard)"


def test_stream_progress_callback_is_monotonic_and_ends_at_total(tmp_path: Path) -> None:
    path = tmp_path / "many.safetensors"
    save_file({f"t{i}": torch.full((MiB // 4,), float(i)) for i in range(12)}, str(path))
    calls: list[tuple[int, int]] = []

    for _ in sluice.stream(
        path, memory_limit="4MiB", on_progress=lambda d, t: calls.append((d, t))
    ):
        pass

    assert_progress_well_formed(calls, 12 * MiB)
    assert len(calls) > 1


def test_exception_from_progress_callback_propagates_and_a_new_load_works(
    mixed_file,
) -> None:
    path, tensors = mixed_file

    def fail(done: int, total: int) -> None:
        raise RuntimeError("consumer gave up")

    with pytest.raises(RuntimeError, match="consumer gave up"):
        sluice.load_file(path, on_progress=fail)
    with pytest.raises(RuntimeError, match="consumer gave up"):
        list(sluice.stream(path, memory_limit="4MiB", on_progress=fail))

    assert sorted(sluice.load_file(path)) == sorted(tensors)


def test_progress_true_off_a_terminal_prints_one_summary_line(
    mixed_file, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = mixed_file

    sluice.load_file(path, progress=True)

    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("sluice:") and "GB/s" in lines[0]
    assert "\r" not in err


def test_progress_false_prints_nothing(mixed_file, capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = mixed_file

    sluice.load_file(path)

    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", "")


def test_names_predicate_sees_every_name_once(three_shards) -> None:
    index, tensors = three_shards
    asked: list[str] = []

    def wanted(name: str) -> bool:
        asked.append(name)
        return name.startswith("s1.")

    loaded = sluice.load_file(index, names=wanted)

    assert sorted(asked) == sorted(tensors)
    assert_same_tensors(loaded, {n: t for n, t in tensors.items() if n.startswith("s1.")})


def test_numpy_front_takes_names_once_a_generator_or_predicate(three_shards) -> None:
    index, tensors = three_shards
    asked: list[str] = []

    def wanted(name: str) -> bool:
        asked.append(name)
        return name.startswith("s1.")

    by_predicate = sluice.numpy.load_file(index, names=wanted)
    by_generator = sluice.numpy.load_file(index, names=(n for n in ["s2.w0", "s0.w0"]))

    assert sorted(asked) == sorted(tensors)
    assert sorted(by_predicate) == sorted(n for n in tensors if n.startswith("s1."))
    assert sorted(by_generator) == ["s0.w0", "s2.w0"]


def test_stream_names_filter_yields_only_those(three_shards) -> None:
    index, _ = three_shards

    names = [name for name, _ in sluice.stream(index, names=["s2.w0", "s0.w0"])]

    assert sorted(names) == ["s0.w0", "s2.w0"]


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
def test_explicit_cpu_device_gives_cpu_tensors(mixed_file, device) -> None:
    path, tensors = mixed_file

    loaded = sluice.load_file(path, device=device)

    assert_same_tensors(loaded, tensors)
    assert {t.device.type for t in loaded.values()} == {"cpu"}


def test_small_neighbouring_tensors_share_one_buffer_without_copies(tmp_path: Path) -> None:
    tensors = {f"t{i}": torch.full((16,), float(i)) for i in range(4)}
    path = tmp_path / "small.safetensors"
    save_file(tensors, str(path))

    loaded = sluice.load_file(path)

    storages = {t.untyped_storage().data_ptr() for t in loaded.values()}
    assert len(storages) == 1, "adjacent small tensors are views of one window"
    starts = sorted(t.data_ptr() for t in loaded.values())
    assert len(set(starts)) == 4


def test_loaded_tensors_are_writable_and_independent(tmp_path: Path) -> None:
    tensors = {"a": torch.zeros(8), "b": torch.ones(8)}
    path = tmp_path / "rw.safetensors"
    save_file(tensors, str(path))
    loaded = sluice.load_file(path)

    loaded["a"] += 5.0

    assert torch.equal(loaded["a"], torch.full((8,), 5.0))
    assert torch.equal(loaded["b"], torch.ones(8))


def test_a_tensor_outlives_the_dict_it_came_in(tmp_path: Path) -> None:
    path = tmp_path / "keep.safetensors"
    save_file({"a": torch.arange(64.0), "b": torch.arange(64.0) * 2}, str(path))
    kept = sluice.load_file(path)["b"]

    import gc

    gc.collect()
    sluice.load_file(path)  # churn the allocator

    assert torch.equal(kept, torch.arange(64.0) * 2)


def test_package_exposes_its_version() -> None:
    assert sluice.__version__ == importlib.metadata.version("sluice")
    assert isinstance(sluice.__version__, str) and sluice.__version__


def test_import_sluice_and_numpy_front_work_without_torch(mixed_file) -> None:
    path, _ = mixed_file
    script = (
        "import sys; sys.modules['torch'] = None\n"
        "import sluice, sluice.numpy\n"
        f"arrays = sluice.numpy.load_file({str(path)!r}, names=['layer.0.b', 'scale'])\n"
        "print(sluice.__version__, sorted(arrays), arrays['scale'].shape)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)

    assert done.returncode == 0, done.stderr
    assert "['layer.0.b', 'scale'] ()" in done.stdout


def test_numpy_front_names_the_tensor_when_it_needs_ml_dtypes(tmp_path: Path) -> None:
    pytest.importorskip("numpy")
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("ml_dtypes is installed, so bf16 loads")
    path = tmp_path / "bf.safetensors"
    save_file({"bf.weight": torch.zeros(2, dtype=torch.bfloat16)}, str(path))

    with pytest.raises(TypeError, match=r"'bf\.weight'.*BF16.*ml_dtypes"):
        sluice.numpy.load_file(path)


def test_inspect_rows_match_the_header_in_file_order(tmp_path: Path) -> None:
    header = {
        "__metadata__": {"format": "pt"},
        "z.last": entry("I32", [2, 2], 20, 36),
        "a.first": entry("BF16", [5], 0, 10),
        "m.middle": entry("U8", [10], 10, 20),
        "e.empty": entry("F64", [0, 3], 36, 36),
    }
    path = write_raw(tmp_path / "h.safetensors", header, bytes(36))

    rows = sluice.inspect(path)

    by_name = {row["name"]: row for row in rows}
    assert [r["name"] for r in rows if r["bytes"]] == ["a.first", "m.middle", "z.last"]
    assert set(by_name) == {"z.last", "a.first", "m.middle", "e.empty"}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        start, end = spec["data_offsets"]
        row = by_name[name]
        assert (row["dtype"], list(row["shape"]), row["bytes"]) == (
            spec["dtype"],
            spec["shape"],
            end - start,
        )
        assert row["shard"] == str(path)


def test_inspect_of_an_index_names_each_tensors_shard(three_shards) -> None:
    index, _ = three_shards

    rows = sluice.inspect(index)

    assert {r["name"]: Path(r["shard"]).name for r in rows} == {
        "s0.w0": "model-0.safetensors",
        "s1.w0": "model-1.safetensors",
        "s2.w0": "model-2.safetensors",
    }


def test_last_load_stats_describe_the_load(three_shards) -> None:
    index, tensors = three_shards

    sluice.load_file(index, direct="off")

    stats = sluice.last_load_stats()
    expected_keys = {"engine", "io_mode", "tensors", "tensor_bytes", "read_bytes", "windows"}
    expected_keys |= {"seconds", "peak_pool_bytes", "files", "mapped_bytes", "gb_per_s"}
    expected_keys |= {"missing_shards"}
    assert expected_keys <= set(stats)
    assert stats["tensors"] == len(tensors)
    assert stats["tensor_bytes"] == sum(t.numel() * t.element_size() for t in tensors.values())
    assert stats["read_bytes"] + stats["mapped_bytes"] >= stats["tensor_bytes"]
    assert stats["windows"] == 3
    assert stats["seconds"] >= 0
    assert stats["io_mode"] == "buffered"
    assert [Path(f["path"]).name for f in stats["files"]] == [
        f"model-{i}.safetensors" for i in range(3)
    ]


def test_safe_open_rejects_other_frameworks(mixed_file) -> None:
    path, _ = mixed_file
    with pytest.raises(ValueError, match="np"):
        sluice.safe_open(path, framework="np")


def test_safe_open_over_an_index_reads_from_every_shard(three_shards) -> None:
    index, tensors = three_shards

    with sluice.safe_open(index, framework="pt") as f:
        assert f.keys() == sorted(tensors)
        got = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118

    assert_same_tensors(got, tensors)


def stub_names(node: ast.AST) -> set[str]:
    """Names a stub body defines: functions, classes and annotated or assigned names, less
    the stub's own private typing helpers (``_SimDefaults``), which the module does not have."""
    names = set()
    for item in getattr(node, "body", []):
        if isinstance(item, (ast.FunctionDef, ast.ClassDef)):
            names.add(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
    return {n for n in names if not n.startswith("_") or n.startswith("__")}


def test_native_stub_declares_exactly_what_the_module_has() -> None:
    from sluice import _sluice

    stub = ast.parse((Path(sluice.__file__).parent / "_sluice.pyi").read_text())
    classes = {
        c.name: c for c in stub.body if isinstance(c, ast.ClassDef) and not c.name.startswith("_")
    }

    assert stub_names(stub) == set(_sluice.__all__)
    for name, cls in classes.items():
        runtime = {n for n in vars(getattr(_sluice, name)) if not n.startswith("_")}
        declared = {n for n in stub_names(cls) if not n.startswith("_")}
        assert declared == runtime, name
