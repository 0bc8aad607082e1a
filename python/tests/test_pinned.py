"""The process's pinned staging memory (``sluice._pinned``, issue 29) and the native
``PinnedPool`` under it. Without CUDA the pool is plain page-aligned memory; the budget, the
reuse and the refusals are the same code that runs on a GPU."""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest
import sluice._pinned as _pinned
import sluice._sluice as native
from sluice.errors import ConfigError

PAGE = _pinned.PAGE


def budget(nbytes):
    made = []

    def make(size):
        made.append(size)
        return native.PinnedPool(size, 1)

    return _pinned.Budget(nbytes, make), made


def test_a_given_back_buffer_is_kept_registered_and_reused_for_its_size():
    b, made = budget(16 * PAGE)
    first = b.take(3 * PAGE - 5, "t")
    assert first.nbytes == 3 * PAGE - 5 and first.address % PAGE == 0
    view = first.numpy()
    view[:] = 9
    addr = first.address
    first.release()
    first.release()  # twice is harmless
    again = b.take(3 * PAGE, "t")
    assert again.address == addr and made == [3 * PAGE], "no second registration"
    st = b.stats()
    assert st["registrations"] == 1 and st["reuses"] == 1 and st["held_bytes"] == 3 * PAGE


def test_a_collected_buffer_goes_back_to_the_budget():
    b, _ = budget(4 * PAGE)
    buf = b.take(PAGE, "t")
    assert b.stats()["held_bytes"] == PAGE
    del buf
    assert b.stats()["held_bytes"] == 0 and b.stats()["kept_bytes"] == PAGE


def test_kept_buffers_of_other_sizes_make_room_and_a_full_budget_refuses():
    b, made = budget(4 * PAGE)
    b.take(3 * PAGE, "t").release()
    assert b.stats()["kept_bytes"] == 3 * PAGE
    two = b.take(2 * PAGE, "t")
    assert two is not None and b.stats()["kept_bytes"] == 0, "the kept 3-page buffer went"
    assert made == [3 * PAGE, 2 * PAGE]
    assert b.take(3 * PAGE, "t") is None, "2 held + 3 would pass the budget"
    assert b.stats()["refused"] == 1
    two.release()


def test_the_budget_holds_under_random_takes_and_releases_from_threads():
    total = 64 * PAGE
    b, _ = budget(total)
    errors = []

    def worker(seed):
        rng = random.Random(seed)
        held = []
        for _ in range(300):
            if held and rng.random() < 0.5:
                buf, fill = held.pop(rng.randrange(len(held)))
                if not (buf.numpy() == fill).all():
                    errors.append("another holder wrote into a held buffer")
                buf.release()
            else:
                buf = b.take(rng.choice([1, 2, 5, 9]) * PAGE, "t")
                if buf is not None:
                    fill = rng.randrange(256)
                    buf.numpy()[:] = fill
                    held.append((buf, fill))
            st = b.stats()
            if st["held_bytes"] + st["kept_bytes"] > total:
                errors.append(f"over budget: {st}")
        for buf, _ in held:
            buf.release()

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    st = b.stats()
    assert st["held_bytes"] == 0 and st["peak"] <= total and st["refused"] > 0, st


def test_the_budget_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("SLUICE_PINNED_BYTES", "64MiB")
    assert _pinned.budget_from_env() == 64 << 20
    monkeypatch.setenv("SLUICE_PINNED_BYTES", "0")
    assert _pinned.budget_from_env() == 0
    monkeypatch.setenv("SLUICE_PINNED_BYTES", "lots")
    with pytest.raises(ConfigError, match="SLUICE_PINNED_BYTES='lots'"):
        _pinned.budget_from_env()
    monkeypatch.delenv("SLUICE_PINNED_BYTES")
    assert _pinned.budget_from_env() == _pinned.DEFAULT_BUDGET


def test_a_zero_budget_refuses_everything_and_says_so(caplog):
    b, made = budget(0)
    assert b.take(1, "sluice.kv device staging") is None and made == []
    assert "sluice.kv device staging" in caplog.text and "SLUICE_PINNED_BYTES" in caplog.text


def test_the_native_pool_hands_out_page_aligned_slots_and_waits_for_them():
    pool = native.PinnedPool(5000, 2)
    assert pool.slot_bytes % PAGE == 0 and pool.slot_bytes >= 5000
    assert pool.pinned is (native.gpu_runtime() is not None)
    a, b = pool.acquire(), pool.acquire()
    assert a.address % PAGE == 0 and b.address % PAGE == 0 and a.address != b.address
    assert len(a) == pool.slot_bytes and a.held
    np.asarray(a)[:] = 1
    t0 = time.monotonic()
    assert pool.acquire(0.05) is None, "both held: the timeout ends the wait"
    assert time.monotonic() - t0 >= 0.04
    threading.Timer(0.1, b.release).start()
    c = pool.acquire(10)
    assert c is not None and c.address == b.address and not b.held
    st = pool.stats()
    assert st["held"] == 2 and st["waits_for_holders"] >= 1, st


def test_the_native_pool_refuses_bad_sizes_and_timeouts():
    with pytest.raises(ConfigError, match="at least one slot"):
        native.PinnedPool(0, 1)
    with pytest.raises(ConfigError, match="at least one slot"):
        native.PinnedPool(4096, 0)
    with pytest.raises(OverflowError):
        native.PinnedPool(-1, 1)
    with pytest.raises(ConfigError, match="timeout: expected seconds"):
        native.PinnedPool(4096, 1).acquire(-1.0)
    with pytest.raises(ConfigError, match="timeout: expected seconds"):
        native.PinnedPool(4096, 1).acquire(float("nan"))
