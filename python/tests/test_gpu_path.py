"""The GPU data path's host side, on a machine without CUDA: pinned streams fall back to
plain host memory with the same bytes, and the fencing that keeps a window out of the
loader's pool until the copies from it have run (issue 29; docs/design/gpu.md)."""

from __future__ import annotations

import ctypes
import weakref
from typing import ClassVar

import numpy as np
import pytest
import sluice
import sluice.torch as st
import torch
from conftest import assert_same_tensors
from safetensors.torch import load_file as st_load_file
from safetensors.torch import save_file
from sluice import _core, _pinned, _sluice


@pytest.fixture
def model(tmp_path):
    gen = torch.Generator().manual_seed(29)
    tensors = {
        f"w{i}": torch.randn((64, 33 + i), generator=gen).to(dt)
        for i, dt in enumerate([torch.float32, torch.bfloat16, torch.float16] * 3)
    }
    tensors["odd"] = torch.arange(7, dtype=torch.int8)
    path = tmp_path / "m.safetensors"
    save_file(tensors, path)
    return path


def test_without_cuda_a_pinned_stream_reads_the_same_bytes_unpinned(model):
    if _sluice.gpu_runtime() is not None:
        pytest.skip(f"this machine has a CUDA runtime ({_sluice.gpu_runtime()})")
    got = {}
    for window in _core.iter_windows(model, None, bounded=True, pin=True, memory_limit="1MiB"):
        for name, t in st.window_tensors(window):
            got[name] = t.clone()
    assert_same_tensors(got, st_load_file(model))
    # load_into's converting path asks for pinned windows too.
    dest = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in st_load_file(model).items()}
    sluice.load_into(model, dest)
    for k, v in st_load_file(model).items():
        assert torch.equal(dest[k], v.to(torch.float64)), k


class FakeEvent:
    """Stands in for torch.cuda.Event: completes when the test says so."""

    made: ClassVar[list[FakeEvent]] = []

    def __init__(self):
        self.done = False
        self.recorded = None
        FakeEvent.made.append(self)

    def record(self, stream):
        self.recorded = stream

    def query(self):
        return self.done

    def synchronize(self):
        self.done = True


class Window:
    """A window whose memory is what its host views point into."""

    def __init__(self, i):
        self.i = i


class DeviceTensor:
    device = torch.device("cuda", 0)


class FakeStream:
    def __init__(self):
        self.synchronized = 0

    def synchronize(self):
        self.synchronized += 1


def test_a_window_goes_back_only_after_its_copies_event_and_at_most_two_wait(monkeypatch):
    FakeEvent.made = []
    stream = FakeStream()
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: stream)
    monkeypatch.setattr(st, "window_tensors", lambda w: [(f"t{w.i}", torch.zeros(1))])
    alive = []

    def produce():
        for i in range(5):
            w = Window(i)
            alive.append(weakref.ref(w))
            yield w

    copies = []

    def copy(name, host):
        copies.append(name)
        return DeviceTensor()

    gen = st._fenced(produce(), copy)
    next(gen)  # window 0's copy queued
    next(gen)  # window 0 fenced (an event on the device's current stream), window 1 queued
    assert FakeEvent.made[0].recorded is stream
    assert alive[0]() is not None, "window 0 is held while its copy may run"
    next(gen)  # window 1 fenced; two wait, none released
    assert alive[0]() is not None and alive[1]() is not None
    next(gen)  # window 2 fenced: three would wait, so window 0's event is waited for
    assert FakeEvent.made[0].done and alive[0]() is None
    assert not FakeEvent.made[1].done and alive[1]() is not None
    FakeEvent.made[1].done = True  # its copy finished
    next(gen)  # window 3 fenced: window 1 released, window 2's copy still runs
    assert alive[1]() is None and alive[2]() is not None
    assert stream.synchronized == 0, "no host sync while the windows flow"
    # Closing part-way through window 4 (its copy queued, no event yet) waits for the
    # stream, then for every event, before any of their memory can go back.
    gen.close()
    assert stream.synchronized == 1
    assert all(e.done for e in FakeEvent.made)
    assert all(a() is None for a in alive)
    assert copies == ["t0", "t1", "t2", "t3", "t4"]


def test_host_copies_need_no_event(monkeypatch):
    def no_event():
        raise AssertionError("no CUDA event for host copies")

    monkeypatch.setattr(torch.cuda, "Event", no_event)
    monkeypatch.setattr(st, "window_tensors", lambda w: [(f"t{w.i}", torch.ones(2) * w.i)])
    out = dict(st._fenced([Window(i) for i in range(4)], lambda n, t: t.clone()))
    assert [float(v[0]) for v in out.values()] == [0.0, 1.0, 2.0, 3.0]


class LoggedEvent:
    def __init__(self, log, k):
        self.log, self.k = log, k

    def synchronize(self):
        self.log.append(("wait", self.k))


def pinned_reads(monkeypatch, data, window, fail_at=None):
    """``_through_pinned`` over ``data`` with windows of ``window`` bytes: the log of reads,
    copies and event waits, and the destination."""
    monkeypatch.setattr(st, "_GET_WINDOW_BYTES", window)
    log = []
    dst = torch.zeros(len(data), dtype=torch.uint8)
    src = torch.frombuffer(bytearray(data), dtype=torch.uint8)

    def read_into(offset, addr, n):
        if offset == fail_at:
            raise sluice.SluiceIOError(f"m.safetensors: read at {offset} failed")
        log.append(("read", offset))
        torch.from_numpy(np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(addr)))[:] = src[
            offset : offset + n
        ]

    def record():
        k = sum(1 for e in log if e[0] == "read") - 1
        log.append(("record", k))
        return LoggedEvent(log, k)

    return log, dst, lambda: st._through_pinned(read_into, dst, record, "test")


def test_a_cuda_get_tensor_reads_through_two_pinned_windows_waiting_before_reuse(monkeypatch):
    data = bytes(range(256)) * 40  # 10240 bytes: 5 windows of 2048
    held = _pinned.pinned_stats()["held_bytes"]
    log, dst, run = pinned_reads(monkeypatch, data, 2048)
    assert run() is True
    assert bytes(dst.numpy()) == data
    reads = [e for e in log if e[0] != "record"]
    # Window k is read into again only after the event of its copy k-2.
    assert reads[:8] == [("read", 0), ("read", 2048), ("wait", 0), ("read", 4096), ("wait", 1),
                         ("read", 6144), ("wait", 2), ("read", 8192)]  # fmt: skip
    assert sorted(reads[8:]) == [("wait", 3), ("wait", 4)], "returns once every copy ran"
    assert _pinned.pinned_stats()["held_bytes"] == held, "both windows went back"


def test_a_failed_read_mid_tensor_waits_for_queued_copies_and_gives_windows_back(monkeypatch):
    data = bytes(range(256)) * 40
    held = _pinned.pinned_stats()["held_bytes"]
    log, _, run = pinned_reads(monkeypatch, data, 2048, fail_at=6144)
    with pytest.raises(sluice.SluiceIOError, match="read at 6144 failed"):
        run()
    assert sorted(log[-2:]) == [("wait", 1), ("wait", 2)], "the copies in flight ran first"
    assert _pinned.pinned_stats()["held_bytes"] == held


def test_a_full_pinned_budget_makes_get_tensor_read_the_pageable_way(monkeypatch):
    budget = _pinned.Budget(0, lambda size: _sluice.PinnedPool(size, 1))
    monkeypatch.setattr(_pinned, "_BUDGET", budget)
    log, dst, run = pinned_reads(monkeypatch, b"x" * 5000, 2048)
    assert run() is False and log == [] and int(dst.sum()) == 0


def test_reads_into_caller_memory_stay_inside_the_tensor(model):
    ck = _sluice.open_checkpoint(str(model))
    buf = np.zeros(16, np.uint8)
    ck.read_tensor_into("odd", 2, buf.ctypes.data, 5)
    assert list(buf[:6]) == [2, 3, 4, 5, 6, 0]
    with pytest.raises(sluice.ConfigError, match="outside the tensor's 7 bytes"):
        ck.read_tensor_into("odd", 4, buf.ctypes.data, 8)
    with pytest.raises(sluice.ConfigError, match="null address"):
        ck.read_tensor_into("odd", 0, 0, 7)
    with pytest.raises(sluice.TensorNotFoundError, match="nope"):
        ck.read_tensor_into("nope", 0, buf.ctypes.data, 1)
