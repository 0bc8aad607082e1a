"""The fallbacks run and say why: O_DIRECT refused, io_uring off, warm files, drop_cache."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import safetensors.torch
import sluice
import torch
from conftest import assert_same_tensors, cached_fraction, evict_from_page_cache, random_tensor
from sluice import SluiceError, SluiceIOError


@pytest.fixture
def on_ramfs(ramfs: Path, mixed_file) -> tuple[Path, dict[str, torch.Tensor]]:
    source, tensors = mixed_file
    path = ramfs / source.name
    shutil.copyfile(source, path)
    return path, tensors


def test_direct_auto_on_a_file_system_without_o_direct_reads_buffered(on_ramfs) -> None:
    path, tensors = on_ramfs

    loaded = sluice.load_file(path, direct="auto")

    assert_same_tensors(loaded, tensors)
    stats = sluice.last_load_stats()
    assert stats["io_mode"] == "buffered"
    [entry] = stats["files"]
    file, direct, reason = entry["path"], entry["direct"], entry["buffered_reason"]
    assert (file, direct) == (str(path), False)
    assert reason


def test_direct_on_where_o_direct_is_refused_raises_naming_the_file(on_ramfs) -> None:
    path, _ = on_ramfs

    with pytest.raises(SluiceIOError) as caught:
        sluice.load_file(path, direct="on")

    assert isinstance(caught.value, SluiceError)
    message = str(caught.value)
    assert str(path) in message
    assert "direct" in message.lower()


def test_io_uring_disabled_by_environment_falls_back_to_threads(
    mixed_file, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, tensors = mixed_file
    evict_from_page_cache(path)  # cold and direct: auto would pick io_uring
    monkeypatch.setenv("SLUICE_IO_URING", "0")

    loaded = sluice.load_file(path, direct="on")

    assert_same_tensors(loaded, tensors)
    assert sluice.last_load_stats()["engine"] == "threads"


def test_io_uring_required_while_disabled_raises_with_the_reason(
    mixed_file, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = mixed_file
    monkeypatch.setenv("SLUICE_IO_URING", "0")

    with pytest.raises(SluiceError, match="SLUICE_IO_URING"):
        sluice.load_file(path, engine="io_uring")


def test_cold_file_under_direct_auto_uses_o_direct_and_io_uring(
    mixed_file, require_io_uring
) -> None:
    path, tensors = mixed_file
    evict_from_page_cache(path)
    if cached_fraction(path) is None:
        pytest.skip("cachestat(2) unavailable: auto cannot tell cold from warm")

    loaded = sluice.load_file(path, direct="auto")

    assert_same_tensors(loaded, tensors)
    stats = sluice.last_load_stats()
    assert (stats["io_mode"], stats["engine"]) == ("direct", "io_uring")
    assert stats["files"] == [{"path": str(path), "direct": True, "buffered_reason": None}]


@pytest.mark.parametrize("direct", ["on", "off", "auto"])
def test_explicit_threads_engine_loads_correctly(mixed_file, direct: str) -> None:
    path, tensors = mixed_file

    loaded = sluice.load_file(path, engine="threads", direct=direct, concurrency=3)

    assert_same_tensors(loaded, tensors)
    assert sluice.last_load_stats()["engine"] == "threads"


def test_engine_from_environment_applies(mixed_file, monkeypatch: pytest.MonkeyPatch) -> None:
    path, _ = mixed_file
    monkeypatch.setenv("SLUICE_ENGINE", "threads")
    monkeypatch.setenv("SLUICE_DIRECT", "on")

    sluice.load_file(path)

    stats = sluice.last_load_stats()
    assert (stats["engine"], stats["io_mode"]) == ("threads", "direct")


def test_warm_file_under_direct_auto_is_read_buffered_because_cached(mixed_file) -> None:
    path, tensors = mixed_file  # just written: in the page cache
    if cached_fraction(path) is None:
        pytest.skip("cachestat(2) unavailable: auto cannot tell cold from warm")

    loaded = sluice.load_file(path, direct="auto")

    assert_same_tensors(loaded, tensors)
    [entry] = sluice.last_load_stats()["files"]
    direct, reason = entry["direct"], entry["buffered_reason"]
    assert direct is False
    assert "page cache" in reason


def test_direct_off_reports_the_setting_as_the_reason(mixed_file) -> None:
    path, _ = mixed_file

    sluice.load_file(path, direct="off")

    [entry] = sluice.last_load_stats()["files"]
    direct, reason = entry["direct"], entry["buffered_reason"]
    assert (direct, reason) == (False, "direct=off")


def test_mixed_direct_and_buffered_shards_report_mixed(tmp_path: Path, gen, on_ramfs) -> None:
    ramfs_shard, ramfs_tensors = on_ramfs
    ext4_shard = tmp_path / "cold.safetensors"
    cold = {"cold.w": random_tensor(torch.float32, (512 * 1024,), gen)}  # 2 MiB
    safetensors.torch.save_file(cold, str(ext4_shard))
    evict_from_page_cache(ext4_shard)
    if cached_fraction(ext4_shard) is None:
        pytest.skip("cachestat(2) unavailable: auto cannot tell cold from warm")
    index = tmp_path / "model.safetensors.index.json"
    weight_map = {name: "cold.safetensors" for name in cold}
    weight_map.update({name: f"ramfs/{ramfs_shard.name}" for name in ramfs_tensors})
    index.write_text(json.dumps({"weight_map": weight_map}))

    loaded = sluice.load_file(index, direct="auto")

    assert_same_tensors(loaded, {**cold, **ramfs_tensors})
    stats = sluice.last_load_stats()
    assert stats["io_mode"] == "mixed"
    assert {Path(f["path"]).name: f["direct"] for f in stats["files"]} == {
        "cold.safetensors": True,
        ramfs_shard.name: False,
    }


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_drop_cache_leaves_the_file_mostly_uncached(
    mixed_file, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    path, tensors = mixed_file
    evict_from_page_cache(path)  # fsync, so every page is clean and droppable
    path.read_bytes()  # warm it again
    before = cached_fraction(path)
    if before is None:
        pytest.skip("cachestat(2) unavailable")
    assert before > 0.9
    if how == "environment":
        monkeypatch.setenv("SLUICE_DROP_CACHE", "1")
        loaded = sluice.load_file(path, direct="off")
    else:
        loaded = sluice.load_file(path, direct="off", drop_cache=True)

    assert_same_tensors(loaded, tensors)
    after = cached_fraction(path)
    assert after is not None and after < 0.1


def test_without_drop_cache_a_buffered_load_leaves_the_file_cached(mixed_file) -> None:
    path, _ = mixed_file
    if cached_fraction(path) is None:
        pytest.skip("cachestat(2) unavailable")

    sluice.load_file(path, direct="off")

    assert cached_fraction(path) > 0.9


def test_fully_cached_file_is_mapped_not_read(mixed_file) -> None:
    path, tensors = mixed_file
    safetensors.torch.load_file(str(path))  # make sure every page is cached
    if cached_fraction(path) is None:
        pytest.skip("cachestat unavailable: mapping is never chosen")

    loaded = sluice.load_file(path)

    assert_same_tensors(loaded, tensors)
    stats = sluice.last_load_stats()
    assert stats["mapped_bytes"] > 0
    assert stats["read_bytes"] == 0


def test_mapping_can_be_turned_off_by_environment(
    mixed_file, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, tensors = mixed_file
    safetensors.torch.load_file(str(path))
    monkeypatch.setenv("SLUICE_MAP_CACHED", "0")

    loaded = sluice.load_file(path)

    assert_same_tensors(loaded, tensors)
    stats = sluice.last_load_stats()
    assert stats["mapped_bytes"] == 0
    assert stats["read_bytes"] > 0


def test_mapped_tensors_are_writable_without_changing_the_file(mixed_file) -> None:
    path, tensors = mixed_file
    safetensors.torch.load_file(str(path))
    before = path.read_bytes()

    loaded = sluice.load_file(path)
    for t in loaded.values():
        if t.numel():
            t.view(-1).view(torch.uint8)[0] ^= 0xFF

    assert path.read_bytes() == before
    assert_same_tensors(sluice.load_file(path), tensors)
