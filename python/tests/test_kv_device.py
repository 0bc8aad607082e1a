"""``sluice.kv`` with device tensors (issue 29), on a machine without CUDA: CPU tensors stand
in for CUDA ones through the staging path's seams, so the batching through pinned slots, the
bytes, the miss rule and the errors are checked here; the stream ordering runs on a GPU
(benches/gpu_check.py)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import numpy as np
import pytest
import sluice._kv_device as kd
import sluice._pinned as _pinned
import sluice._sluice as sluice_native
import sluice.kv as kv
import torch
from sluice.errors import ConfigError, SluiceError

BLOCK = 16 << 10  # a 16 KiB KV block, the small end seed 002 names


@pytest.fixture
def staged(monkeypatch):
    """Every tensor takes the device path (as a CUDA tensor does: the host-address check
    refuses it); slots of 5 blocks."""
    host_address = kv._address

    def address(buf, index, writable):
        if isinstance(buf, torch.Tensor):
            raise kv._DeviceBuffer(f"buffer {index}: a device tensor")
        return host_address(buf, index, writable)

    monkeypatch.setattr(kv, "_address", address)
    monkeypatch.setattr(kd, "SLOT_BYTES", 5 * BLOCK)
    return monkeypatch


@pytest.fixture
def store(tmp_path):
    s = kv.open(tmp_path / "kv", block_bytes=BLOCK, ssd="8MiB")
    yield s
    s.close()


def blocks(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(-30000, 30000, (BLOCK // 2,), dtype=torch.int16, generator=g)
            for _ in range(n)]  # fmt: skip


def count_calls(store, monkeypatch, name):
    """Counts the keys of each native `name` call the store makes."""
    native = store._native
    calls = []

    class Spy:
        def __getattr__(self, attr):
            return getattr(native, attr)

    def wrapped(keys, addrs):
        calls.append(len(keys))
        return getattr(native, name)(keys, addrs)

    setattr(Spy, name, staticmethod(wrapped))
    monkeypatch.setattr(store, "_native", Spy())
    return calls


def test_small_device_blocks_go_to_the_store_in_slot_sized_batches(staged, store):
    keys = [f"k{i}".encode() for i in range(12)]
    src = blocks(12, 1)
    puts = count_calls(store, staged, "put_batch")
    assert store.put_batch(keys, src) == [True] * 12
    assert puts == [5, 5, 2], "12 blocks through slots of 5: three store batches"
    gets = count_calls(store, staged, "get_batch_into")
    out = [torch.zeros_like(b) for b in src]
    assert store.get_batch_into(keys, out) == [True] * 12
    assert gets[-3:] == [5, 5, 2]
    for i, (a, b) in enumerate(zip(out, src)):
        assert torch.equal(a, b), i


def test_a_miss_ends_the_hits_and_leaves_later_buffers_alone(staged, store):
    keys = [f"m{i}".encode() for i in range(8)]
    src = blocks(8, 2)
    store.put_batch(keys[:6], src[:6])
    out = [torch.full((BLOCK // 2,), 7, dtype=torch.int16) for _ in range(8)]
    ok = store.get_batch_into([*keys[:6], b"absent", *keys[6:7]], out)
    assert ok == [True] * 6 + [False, False]
    assert all(torch.equal(out[i], src[i]) for i in range(6))
    assert all(bool((out[i] == 7).all()) for i in (6, 7)), "no bytes copied past the miss"


def test_host_and_device_blocks_mix_in_one_batch(staged, store):
    src = blocks(3, 3)
    mixed = [src[0], src[1].numpy(), src[2]]
    assert store.put_batch([b"a", b"b", b"c"], mixed) == [True] * 3
    out = [torch.zeros_like(src[0]), np.zeros(BLOCK, np.uint8), torch.zeros_like(src[2])]
    assert store.get_batch_into([b"a", b"b", b"c"], out) == [True] * 3
    assert torch.equal(out[0], src[0]) and torch.equal(out[2], src[2])
    assert out[1].tobytes() == src[1].numpy().tobytes()


def test_bad_device_batches_are_config_errors_naming_the_buffer(staged, store):
    with pytest.raises(ConfigError, match="2 keys but 1 buffers"):
        store.put_batch([b"a", b"b"], blocks(1, 4))
    with pytest.raises(ConfigError, match="buffer 1: 8 bytes"):
        store.put_batch([b"a", b"b"], [blocks(1, 4)[0], torch.zeros(2)])
    with pytest.raises(ValueError, match="buffer 0: the tensor is not contiguous"):
        store.get_batch_into([b"a"], [torch.zeros(BLOCK // 2, 2, dtype=torch.int16)[:, 0]])
    assert store.stats()["puts"] == 0, "nothing was stored by a refused batch"


def test_submitted_device_batches_round_trip_and_are_polled_once(staged, store):
    src = blocks(12, 7)
    put = store.submit_put([b"s%d" % i for i in range(12)], src)
    assert put.kind == "put" and put.id < 0, "device jobs have ids no native job has"
    assert put.wait(30) == [True] * 12
    out = [torch.zeros(BLOCK // 2, dtype=torch.int16) for _ in range(12)]
    get = store.submit_get([b"s%d" % i for i in range(12)], out)
    deadline = time.monotonic() + 30
    polled = []
    while not polled and time.monotonic() < deadline:
        polled = store.poll()
        time.sleep(0.01)
    assert polled == [get], "the finished job is reported by poll"
    assert store.poll() == [], "once"
    assert get.result() == [True] * 12
    assert all(torch.equal(a, b) for a, b in zip(src, out))


def test_submitted_device_batches_are_checked_at_the_call(staged, store):
    with pytest.raises(ConfigError, match="buffer 1: 8 bytes"):
        store.submit_put([b"a", b"b"], [blocks(1, 4)[0], torch.zeros(2)])
    with pytest.raises(ConfigError, match="2 keys but 1 buffers"):
        store.submit_get([b"a", b"b"], blocks(1, 4))
    assert store.stats()["puts"] == 0, "nothing was stored by a refused batch"


def test_submitted_copies_run_on_the_streams_current_at_the_call(staged, store):
    seen = []

    @contextlib.contextmanager
    def made_current(stream):
        seen.append((threading.current_thread().name, stream))
        yield

    staged.setattr(kd, "is_device", lambda b: isinstance(b, torch.Tensor))
    staged.setattr(kd, "current_stream", lambda d: f"caller's stream on {d}")
    staged.setattr(kd, "stream_context", made_current)
    staged.setattr(kd, "new_event", lambda: FakeEvent([]))
    assert store.submit_put([b"x"], blocks(1, 1)).wait(30) == [True]
    assert len(seen) == 1
    thread, stream = seen[0]
    assert thread.startswith("sluice-kv-device") and stream == "caller's stream on cpu"


def test_close_waits_for_device_jobs_and_gives_the_pinned_slots_back(staged, tmp_path):
    before = _pinned.pinned_stats()["held_bytes"]
    s = kv.open(tmp_path / "kv2", block_bytes=BLOCK, ssd="8MiB")
    release = threading.Event()
    native_put = s._native.put_batch

    def slow_put(keys, addrs):
        release.wait(30)
        return native_put(keys, addrs)

    class Slow:
        def __getattr__(self, attr):
            return getattr(native, attr)

    native = s._native
    Slow.put_batch = staticmethod(slow_put)
    s._native = Slow()
    job = s.submit_put([b"c0"], blocks(1, 3))
    assert _pinned.pinned_stats()["held_bytes"] == before + 2 * 5 * BLOCK
    threading.Timer(0.3, release.set).start()
    s._native = native  # close itself goes straight to the store
    s.close()
    assert job.done() and job.result() == [True], "close waited for the submitted put"
    assert _pinned.pinned_stats()["held_bytes"] == before, "both slots went back"
    with pytest.raises(SluiceError, match="closed"):
        s._staging.put([b"c1"], blocks(1, 3), native_put)


def test_a_full_pinned_budget_stages_through_plain_memory(staged, tmp_path, caplog):
    budget = _pinned.Budget(5 * BLOCK, lambda size: sluice_native.PinnedPool(size, 1))
    staged.setattr(_pinned, "_BUDGET", budget)
    s = kv.open(tmp_path / "kv3", block_bytes=BLOCK, ssd="8MiB")
    try:
        with caplog.at_level(logging.WARNING, logger="sluice"):
            src = blocks(12, 9)
            assert s.put_batch([b"f%d" % i for i in range(12)], src) == [True] * 12
        out = [torch.zeros(BLOCK // 2, dtype=torch.int16) for _ in range(12)]
        assert s.get_batch_into([b"f%d" % i for i in range(12)], out) == [True] * 12
        assert all(torch.equal(a, b) for a, b in zip(src, out))
        st = budget.stats()
        assert st["refused"] == 1 and st["peak"] <= 5 * BLOCK, st
        assert "do not fit the pinned budget" in caplog.text
    finally:
        s.close()
    assert budget.stats()["held_bytes"] == 0


class FakeEvent:
    def __init__(self, log):
        self.log = log

    def record(self, stream):
        self.log.append(("record", stream))

    def synchronize(self):
        self.log.append(("sync", id(self)))


def test_a_slot_is_reused_only_after_the_event_of_its_copies(monkeypatch):
    log = []
    monkeypatch.setattr(kd, "new_event", lambda: FakeEvent(log))
    monkeypatch.setattr(kd, "current_stream", lambda d: f"stream {d}")
    slot = kd.Slot(BLOCK)
    slot.wait()
    assert log == [], "a fresh slot has nothing to wait for"
    slot.fence({torch.device("cuda", 0), torch.device("cuda", 1)})
    assert sorted(e for e in log if e[0] == "record") == [
        ("record", "stream cuda:0"),
        ("record", "stream cuda:1"),
    ]
    slot.wait()
    assert [e[0] for e in log].count("sync") == 2, "both devices' copies waited for"
    slot.wait()
    assert [e[0] for e in log].count("sync") == 2, "waited once"


def test_blocks_given_as_generators_are_taken_whole(store):
    # The device check looks at every buffer first: a generator must not be used up by it.
    src = [np.full(BLOCK, i, np.uint8) for i in range(3)]
    assert store.put_batch((k for k in [b"g0", b"g1", b"g2"]), (b for b in src)) == [True] * 3
    out = [np.zeros(BLOCK, np.uint8) for _ in range(3)]
    assert store.get_batch_into([b"g0", b"g1", b"g2"], (o for o in out)) == [True] * 3
    assert all(int(o[0]) == i for i, o in enumerate(out))
