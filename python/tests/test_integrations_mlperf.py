"""Contract tests of the MLPerf Storage kv_cache_benchmark backend (docs/design/
kv-adapters.md §4.5): the calls its MultiTierCache makes on the ``nvme`` backend, from
many request threads, with whole-context float16 arrays."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from integration_fakes.engine_fakes import flip_byte_of_block
from sluice.errors import ConfigError, SluiceIOError
from sluice.integrations.mlperf import (
    CAPACITY_RESERVE,
    SluiceCapacityError,
    SluiceKVBenchBackend,
    SluiceReadError,
    capacity_args,
    main,
)


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


def test_store_options_reach_the_store_and_an_unknown_one_is_named(tmp_path):
    b = SluiceKVBenchBackend(
        base_path=str(tmp_path / "c"), block_bytes="256KiB", ssd="16MiB", io_threads=2
    )
    try:
        data = context(5, (2, 2, 64, 8, 128))
        b.write("k", data)
        assert np.array_equal(b.read("k")[0], data)
    finally:
        b.close()
    with pytest.raises((TypeError, ConfigError), match="iothreads"):
        SluiceKVBenchBackend(base_path=str(tmp_path / "d"), ssd="16MiB", iothreads=2)


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


def test_a_deleted_entry_gives_its_blocks_back_to_the_store(backend):
    data = context(6, (2, 2, 64, 8, 128))  # 128 KiB a token row: 2 blocks of 256 KiB
    backend.write("a", data)
    backend.write("b", data)
    held = backend._store.stats()["ssd"]["blocks"]
    assert held == backend.held_blocks() > 0
    backend.delete("a")
    s = backend._store.stats()
    assert s["ssd"]["blocks"] == held // 2 == backend.held_blocks()
    assert s["deletes"] == held // 2
    backend.clear()
    assert backend._store.stats()["ssd"]["blocks"] == 0 == backend.held_blocks()


def test_a_rewrite_of_a_key_frees_the_old_version(backend):
    backend.write("k", context(7, (2, 2, 64, 8, 128)))
    held = backend._store.stats()["ssd"]["blocks"]
    new = context(8, (2, 2, 64, 8, 128))
    backend.write("k", new)
    assert backend._store.stats()["ssd"]["blocks"] == held
    assert backend.read("k")[0].tobytes() == new.tobytes()


def test_a_write_past_sluices_capacity_is_refused_naming_both_figures(tmp_path):
    b = SluiceKVBenchBackend(str(tmp_path / "c"), block_bytes="256KiB", ssd="4MiB")
    try:
        assert b.capacity_blocks == 16
        b.write("fits", np.zeros(12 << 18, np.uint8))  # 12 blocks
        with pytest.raises(SluiceCapacityError, match=r"5 blocks .* 16 blocks .* 12 of them"):
            b.write("big", np.zeros(5 << 18, np.uint8))
        assert b.rejected_writes == 1 and b.held_blocks() == 12
        with pytest.raises(KeyError):
            b.read("big")
        # The entry the benchmark holds was never evicted for it.
        assert b.read("fits")[0].nbytes == 12 << 18
        b.delete("fits")
        b.write("big", np.zeros(5 << 18, np.uint8))
    finally:
        b.close()


def test_buffers_reach_o_direct_without_a_staging_copy(backend):
    """Fails without the aligned buffers: every block of an entry numpy allocated was
    copied through the store's staging pool (16 bytes off a page, as malloc leaves it)."""
    raw = np.zeros((2 << 20) + 16, np.uint8)
    off = -raw.ctypes.data % 4096 + 16
    unaligned = raw[off : off + (1 << 20)]
    backend.write("u", unaligned)
    assert np.array_equal(backend.read("u")[0], unaligned)
    assert backend._store.stats()["staged_writes"] == 0


def test_a_read_that_loses_a_race_with_a_delete_is_a_key_error_not_a_failure(backend):
    backend.write("k", context(9, (2, 2, 64, 8, 128)))
    get = backend._store.get_batch_into

    def deleted_meanwhile(keys, bufs):
        backend.delete("k")
        return get(keys, bufs)

    backend._store.get_batch_into = deleted_meanwhile
    with pytest.raises(KeyError, match="deleted while it was read"):
        backend.read("k")
    assert (backend.raced_reads, backend.failed_reads) == (1, 0)


def test_the_runner_gives_the_benchmark_sluices_capacity_or_refuses_a_larger_one(capsys):
    args = ["--model", "llama3.1-8b"]
    got = capacity_args(args, "20GiB", "1MiB")
    assert got[:2] == args and got[2] == "--storage-capacity-gb"
    assert float(got[3]) == pytest.approx(20 * CAPACITY_RESERVE)
    for zero in (["--storage-capacity-gb", "0"], ["--storage-capacity-gb=0"]):
        got = capacity_args([*zero, "--seed", "1"], "2GiB", "1MiB")
        assert got[:2] == ["--seed", "1"] and float(got[3]) == pytest.approx(2 * CAPACITY_RESERVE)
    assert capacity_args(["--storage-capacity-gb", "19.5"], "20GiB", "1MiB")[1] == "19.5"
    with pytest.raises(ConfigError, match=r"30 GiB .* --sluice-ssd 20GiB is 20480 blocks"):
        capacity_args(["--storage-capacity-gb=30"], "20GiB", "1MiB")
    with pytest.raises(ConfigError, match="'lots'"):
        capacity_args(["--storage-capacity-gb", "lots"], "20GiB", "1MiB")
    # The runner refuses before it imports the benchmark.
    assert main(["--sluice-ssd", "1GiB", "--", "--storage-capacity-gb", "2"]) == 2
    assert "more than Sluice holds" in capsys.readouterr().err
