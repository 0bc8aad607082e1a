"""Contract tests of the MLPerf Storage kv_cache_benchmark backend (docs/design/
kv-adapters.md §4.5): the calls its MultiTierCache makes on the ``nvme`` backend, from
many request threads, with whole-context float16 arrays."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from integration_fakes.engine_fakes import flip_byte_of_block
from sluice.errors import SluiceIOError
from sluice.integrations.mlperf import SluiceKVBenchBackend, SluiceReadError


def context(seed, shape=(8, 2, 250, 8, 128)):
    """A request's KV: (layers, 2, tokens, kv_heads, head_dim) float16."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float16)


@pytest.fixture
def backend(tmp_path):
    b = SluiceKVBenchBackend(base_path=str(tmp_path / "cache"), block_bytes="256KiB", ssd="64MiB")
    yield b
    b.close()


def test_write_read_round_trip_with_timings(backend, tmp_path):
    assert backend.base_path == tmp_path / "cache"
    data = context(1)
    t = backend.write("conv_1_0_turn_1", data)
    assert min(t.total, t.device, t.host) >= 0 and t.total >= t.device
    got, t = backend.read("conv_1_0_turn_1")
    assert got.dtype == data.dtype and got.shape == data.shape
    assert got.tobytes() == data.tobytes()
    assert min(t.total, t.device, t.host) >= 0
    odd = np.arange(1001, dtype=np.float16).reshape(7, 11, 13)  # not a block multiple
    backend.write("rag_7", odd)
    assert np.array_equal(backend.read("rag_7")[0], odd)
    with pytest.raises(KeyError):
        backend.read("nope")


def test_delete_clear_and_a_rewritten_key_reads_its_new_bytes(backend):
    backend.write("k", context(2))
    backend.delete("k")
    backend.delete("k")  # tolerated
    with pytest.raises(KeyError):
        backend.read("k")
    new = context(3)
    backend.write("k", new)
    assert backend.read("k")[0].tobytes() == new.tobytes()
    backend.clear()
    with pytest.raises(KeyError):
        backend.read("k")


def test_a_run_starts_empty_like_the_nvme_backend(tmp_path):
    b = SluiceKVBenchBackend(base_path=str(tmp_path / "c"), block_bytes="256KiB", ssd="16MiB")
    b.write("system_prompt_0", context(4, (2, 2, 64, 8, 128)))
    b.close()
    b = SluiceKVBenchBackend(base_path=str(tmp_path / "c"), block_bytes="256KiB", ssd="16MiB")
    try:
        assert b._store.stats()["recovered_blocks"] == 0
    finally:
        b.close()


def test_a_failed_read_raises_and_is_counted_never_wrong_bytes(backend):
    data = context(5, (2, 2, 64, 8, 128))
    backend.write("u1_req_1", data)
    backend._store.sync()
    # Corrupt the first block on disk; the DRAM tier is off, so the read goes to SSD.
    flip_byte_of_block(
        backend.base_path / "sluice-kv", data.reshape(-1).view(np.uint8)[: 256 << 10].tobytes()
    )
    with pytest.raises(SluiceReadError, match="u1_req_1"):
        backend.read("u1_req_1")
    assert backend.failed_reads == 1
    assert isinstance(SluiceReadError("x"), SluiceIOError)


def test_sixteen_request_threads_write_read_delete(backend):
    errors = []

    def worker(t):
        try:
            for i in range(4):
                key, data = f"u{t}_req_{i}", context(100 * t + i, (2, 2, 32, 8, 128))
                backend.write(key, data)
                assert backend.read(key)[0].tobytes() == data.tobytes()
                backend.delete(key)
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(16)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert errors == []
