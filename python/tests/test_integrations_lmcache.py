"""Contract tests of the LMCache 0.5.6 MP-mode L2 adapter (docs/design/
kv-adapters.md §3.2-3.3).

The adapter is built the way the LMCache server builds a plugin (``--l2-adapter`` JSON,
then ``create_l2_adapter``) and driven as its controllers and ``basic_check`` drive one:
submit, wait on the task's eventfd, then pop or query the result once. Runs against
the real LMCache modules where importable, else against tests/integration_fakes.
"""

from __future__ import annotations

import argparse
import json
import re
import select
import threading

import pytest
from integration_fakes.engine_fakes import flip_byte_of_block, unwritable_dir, use_engine
from sluice.errors import ConfigError, SluicePermissionError

torch = pytest.importorskip("torch")
REAL_LMCACHE = use_engine("lmcache.v1.distributed.l2_adapters.base")

from lmcache.v1.distributed.api import ObjectKey  # noqa: E402
from lmcache.v1.distributed.l2_adapters import create_l2_adapter  # noqa: E402
from lmcache.v1.distributed.l2_adapters.config import (  # noqa: E402
    parse_args_to_l2_adapters_config,
)

OBJ_BYTES = 8192


class Obj:
    """The part of an L1 MemoryObj an adapter touches: its CPU tensor."""

    def __init__(self, seed=None):
        self.tensor = torch.zeros(OBJ_BYTES // 2, dtype=torch.bfloat16)
        if seed is not None:
            gen = torch.Generator().manual_seed(seed)
            self.tensor.copy_(torch.randn(self.tensor.shape, generator=gen))

    def raw(self):
        return self.tensor.view(torch.uint8).numpy().tobytes()


def key(n, model="test-model", rank=0):
    return ObjectKey(chunk_hash=n.to_bytes(16, "big"), model_name=model, kv_rank=rank)


def make_adapter(path, **params):
    spec = {
        "type": "plugin",
        "module_path": "sluice.integrations.lmcache",
        "class_name": "SluiceL2Adapter",
        "adapter_params": {"path": str(path), "block_bytes": OBJ_BYTES, "ssd": "16MiB", **params},
    }
    cfg = parse_args_to_l2_adapters_config(argparse.Namespace(l2_adapter=[json.dumps(spec)]))
    return create_l2_adapter(cfg.adapters[0])


def wait_fd(fd, timeout_s=10.0):
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    assert poll.poll(timeout_s * 1000), "eventfd not signalled"
    import os

    os.eventfd_read(fd)


def store(adapter, keys, objs):
    task = adapter.submit_store_task(keys, objs)
    wait_fd(adapter.get_store_event_fd())
    done = adapter.pop_completed_store_tasks()
    return done[task]


def lookup(adapter, keys):
    task = adapter.submit_lookup_and_lock_task(keys, {})
    wait_fd(adapter.get_lookup_and_lock_event_fd())
    bitmap = adapter.query_lookup_and_lock_result(task)
    assert adapter.query_lookup_and_lock_result(task) is None  # returned once
    return [bitmap.test(i) for i in range(len(keys))]


def load(adapter, keys, objs):
    task = adapter.submit_load_task(keys, objs)
    wait_fd(adapter.get_load_event_fd())
    bitmap = adapter.query_load_result(task)
    assert adapter.query_load_result(task) is None
    return [bitmap.test(i) for i in range(len(keys))]


def test_store_lookup_load_round_trip_bit_per_key(tmp_path):
    adapter = make_adapter(tmp_path / "kv")
    try:
        fds = {
            adapter.get_store_event_fd(),
            adapter.get_lookup_and_lock_event_fd(),
            adapter.get_load_event_fd(),
        }
        assert len(fds) == 3
        keys = [key(i) for i in range(3)]
        missing = key(99)
        assert lookup(adapter, keys) == [False] * 3
        adapter.submit_unlock(keys)
        objs = [Obj(seed=i) for i in range(3)]
        result = store(adapter, keys, objs)
        assert result.is_successful() and result.bytes_transferred() == 3 * OBJ_BYTES
        assert adapter.pop_completed_store_tasks() == {}
        assert lookup(adapter, [keys[0], missing, keys[2]]) == [True, False, True]
        outs = [Obj(), Obj(), Obj()]
        assert load(adapter, [keys[0], missing, keys[2]], outs) == [True, False, True]
        assert outs[0].raw() == objs[0].raw() and outs[2].raw() == objs[2].raw()
        assert outs[1].raw() == Obj().raw()  # the missing key's buffer is untouched
        adapter.submit_unlock(keys)
    finally:
        adapter.close()


def test_keys_of_other_models_ranks_and_salts_are_distinct(tmp_path):
    adapter = make_adapter(tmp_path / "kv")
    try:
        assert store(adapter, [key(1)], [Obj(seed=1)]).is_successful()
        others = [key(1, model="other"), key(1, rank=1)]
        others.append(ObjectKey(key(1).chunk_hash, "test-model", 0, cache_salt="user-b"))
        assert lookup(adapter, [key(1), *others]) == [True, False, False, False]
    finally:
        adapter.close()


def test_two_controller_threads_store_and_load_at_once(tmp_path):
    adapter = make_adapter(tmp_path / "kv")
    try:
        first = [key(i) for i in range(16)]
        objs = [Obj(seed=i) for i in range(16)]
        assert store(adapter, first, objs).is_successful()
        out = [Obj() for _ in first]
        results = {}

        def storer():
            results["store"] = store(adapter, [key(100 + i) for i in range(16)], objs)

        def loader():
            results["load"] = load(adapter, first, out)

        threads = [threading.Thread(target=storer), threading.Thread(target=loader)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert results["store"].is_successful()
        assert results["load"] == [True] * 16
        assert [o.raw() for o in out] == [o.raw() for o in objs]
    finally:
        adapter.close()


def test_a_corrupted_object_loads_as_a_zero_bit_never_wrong_bytes(tmp_path):
    adapter = make_adapter(tmp_path / "kv")
    objs = [Obj(seed=7), Obj(seed=8)]
    assert store(adapter, [key(1), key(2)], objs).is_successful()
    adapter.close()
    flip_byte_of_block(tmp_path / "kv" / "lmcache-l2", objs[0].raw())
    adapter = make_adapter(tmp_path / "kv")
    try:
        out = [Obj(), Obj()]
        got = load(adapter, [key(1), key(2)], out)
        assert got == [False, True]
        assert out[1].raw() == objs[1].raw()
    finally:
        adapter.close()


def test_bad_input_fails_the_task_or_raises_typed_errors_naming_the_value(tmp_path):
    with pytest.raises(ConfigError, match="'max_size_gb'"):
        make_adapter(tmp_path / "kv", max_size_gb=1)
    bad = unwritable_dir(tmp_path)
    with pytest.raises(SluicePermissionError, match=re.escape(str(bad))):
        make_adapter(bad)
    adapter = make_adapter(tmp_path / "kv")
    try:
        small = Obj()
        small.tensor = torch.zeros(16, dtype=torch.uint8)
        assert not store(adapter, [key(1)], [small]).is_successful()
        assert lookup(adapter, [key(1)]) == [False]
        assert load(adapter, [key(1)], [small]) == [False]
    finally:
        adapter.close()
