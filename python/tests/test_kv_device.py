"""``sluice.kv`` with device tensors (issue 29), on a machine without CUDA: CPU tensors stand
in for CUDA ones through the staging path's seams, so the batching through pinned slots, the
bytes, the miss rule and the errors are checked here; the stream ordering runs on a GPU
(benches/gpu_check.py)."""

from __future__ import annotations

import numpy as np
import pytest
import sluice._kv_device as kd
import sluice.kv as kv
import torch
from sluice.errors import ConfigError

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
    monkeypatch.setattr(kd, "pinned_empty", lambda n: torch.empty(n, dtype=torch.uint8))
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


def test_submit_calls_still_refuse_device_tensors_naming_the_calls_that_take_them(store):
    class Cuda:
        device = torch.device("cuda", 0)

        def data_ptr(self):
            return 0

        def is_contiguous(self):
            return True

    with pytest.raises(ValueError, match="put_batch and get_batch_into take CUDA tensors"):
        store.submit_put([b"a"], [Cuda()])


class FakeEvent:
    def __init__(self, log):
        self.log = log

    def record(self, stream):
        self.log.append(("record", stream))

    def synchronize(self):
        self.log.append(("sync", id(self)))


def test_a_slot_is_reused_only_after_the_event_of_its_copies(monkeypatch):
    log = []
    monkeypatch.setattr(kd, "pinned_empty", lambda n: torch.empty(n, dtype=torch.uint8))
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
