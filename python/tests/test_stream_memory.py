"""``sluice.stream`` stays inside its memory limit, by the pool's own accounting.

Nothing here measures time: the limit is checked on ``peak_pool_bytes``, and tests that
could hang on a regression run the consumer in a thread with a generous join timeout, so
a deadlock fails the test instead of stalling the suite.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

import pytest
import sluice
import torch
from conftest import MiB, assert_same_tensors, raw_bytes
from safetensors.torch import save_file
from sluice import MemoryLimitError

LIMIT = 8 * MiB
# Generous: each of these loads takes well under a second; only a hang comes near it.
HANG_GUARD_SECONDS = 60.0


def run_guarded(work: Callable[[], Any]) -> Any:
    """Runs ``work`` in a daemon thread; fails the test if it has not ended in time."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = work()
        except BaseException as e:  # handed back to the test's thread
            outcome["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_SECONDS)
    if thread.is_alive():
        pytest.fail(f"stream did not finish within {HANG_GUARD_SECONDS} s: it hangs")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


@pytest.fixture(scope="module")
def forty_mb(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    """40 MiB in 1 MiB tensors (distinct contents): five times the limit."""
    tensors = {f"layer.{i:02d}": torch.full((MiB // 4,), float(i)) for i in range(40)}
    tensors["tail.bias"] = torch.arange(3, dtype=torch.float16)
    path = tmp_path_factory.mktemp("stream") / "forty.safetensors"
    save_file(tensors, str(path))
    return path, tensors


@pytest.mark.parametrize("limit", [LIMIT, 5_000_000])
@pytest.mark.parametrize(("engine", "direct"), [("threads", "off"), ("io_uring", "on")])
def test_stream_peak_pool_bytes_stay_under_memory_limit(
    forty_mb, engine: str, direct: str, limit: int, request
) -> None:
    if engine == "io_uring":
        request.getfixturevalue("require_io_uring")
    path, tensors = forty_mb

    seen = {}
    for name, tensor in sluice.stream(path, memory_limit=limit, engine=engine, direct=direct):
        seen[name] = tensor.clone()
        del tensor

    assert_same_tensors(seen, tensors)
    stats = sluice.last_load_stats()
    assert stats["tensor_bytes"] > 4 * limit
    assert 0 < stats["peak_pool_bytes"] <= limit
    assert stats["engine"] == engine


def test_stream_limit_from_environment_is_respected(forty_mb, monkeypatch) -> None:
    path, tensors = forty_mb
    monkeypatch.setenv("SLUICE_MEMORY_LIMIT", "6MiB")

    count = sum(1 for _ in sluice.stream(path, memory_limit=None))

    assert count == len(tensors)
    assert 0 < sluice.last_load_stats()["peak_pool_bytes"] <= 6 * MiB


def test_consumer_holding_every_tensor_gets_memory_limit_error_not_a_hang(forty_mb) -> None:
    path, _ = forty_mb
    held: list[torch.Tensor] = []

    def hoard() -> None:
        for _, tensor in sluice.stream(path, memory_limit="8MiB"):
            held.append(tensor)

    with pytest.raises(MemoryLimitError, match="memory_limit") as caught:
        run_guarded(hoard)

    assert isinstance(caught.value, MemoryError)
    assert 0 < len(held) < 40
    held.clear()
    assert len(sluice.load_file(path)) == 41, "a new load works after the error"


def test_tensor_larger_than_the_limit_fails_before_yielding(tmp_path: Path) -> None:
    path = tmp_path / "huge.safetensors"
    save_file({"small": torch.zeros(4), "huge": torch.zeros(9 * MiB // 4)}, str(path))
    yielded = []

    with pytest.raises(MemoryLimitError, match="huge"):
        yielded.extend(run_guarded(lambda: list(sluice.stream(path, memory_limit="8MiB"))))

    assert yielded == []


def test_two_neighbouring_tensors_over_half_the_limit_fail_before_yielding(
    tmp_path: Path,
) -> None:
    # The consumer holds one while the other is read, so together they must fit.
    path = tmp_path / "pair.safetensors"
    save_file({"a": torch.zeros(5 * MiB // 4), "b": torch.ones(5 * MiB // 4)}, str(path))
    stream = sluice.stream(path, memory_limit="8MiB")

    with pytest.raises(MemoryLimitError, match="8388608"):
        run_guarded(lambda: next(stream))


def test_tensor_over_half_the_limit_streams_when_smaller_windows_separate_it(
    tmp_path: Path,
) -> None:
    tensors = {"big": torch.full((5 * MiB // 4,), 2.0), "bias": torch.arange(8.0)}
    path = tmp_path / "one_big.safetensors"
    save_file(tensors, str(path))

    seen = {name: t.clone() for name, t in sluice.stream(path, memory_limit="8MiB")}

    assert_same_tensors(seen, tensors)
    assert sluice.last_load_stats()["peak_pool_bytes"] <= LIMIT


def test_held_tensors_keep_their_bytes_while_later_ones_are_yielded(forty_mb) -> None:
    path, tensors = forty_mb
    held: dict[str, torch.Tensor] = {}

    def consume() -> tuple[int, dict[str, Any]]:
        count = 0
        for name, tensor in sluice.stream(path, memory_limit="8MiB"):
            count += 1
            if name in ("layer.00", "layer.01"):
                held[name] = tensor  # a view into a pooled buffer, kept to the end
        return count, sluice.last_load_stats()  # stats are per thread

    count, stats = run_guarded(consume)

    assert count == len(tensors)
    assert sorted(held) == ["layer.00", "layer.01"]
    for name, tensor in held.items():
        assert raw_bytes(tensor) == raw_bytes(tensors[name]), name
    assert stats["peak_pool_bytes"] <= LIMIT


def test_breaking_out_early_stops_cleanly_and_a_new_load_works(forty_mb) -> None:
    path, tensors = forty_mb

    def take_three() -> list[str]:
        names = []
        stream = sluice.stream(path, memory_limit="8MiB")
        for name, _ in stream:
            names.append(name)
            if len(names) == 3:
                break
        stream.close()
        return names

    assert len(run_guarded(take_three)) == 3
    assert_same_tensors(run_guarded(lambda: sluice.load_file(path)), tensors)


def test_abandoned_stream_without_close_does_not_block_later_loads(forty_mb) -> None:
    path, tensors = forty_mb

    def abandon() -> None:
        stream = sluice.stream(path, memory_limit="8MiB")
        next(stream)
        del stream

    run_guarded(abandon)
    count = run_guarded(lambda: sum(1 for _ in sluice.stream(path, memory_limit="8MiB")))
    assert count == len(tensors)


def test_load_file_ignores_memory_limit_since_its_buffers_are_the_result(forty_mb) -> None:
    path, tensors = forty_mb

    loaded = sluice.load_file(path, memory_limit="1MiB")

    assert_same_tensors(loaded, tensors)
