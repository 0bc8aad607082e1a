"""Grouped model loading over torch.distributed (issue 30): ranks of a gloo group read each
byte once between them and pass the rest point to point. Real process groups at world 2 and
4 (python/tests/group_worker.py), a rank killed or stalled mid-load, and the planner's
rules on their own."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from sluice import _grouped

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import group_worker  # noqa: E402
import worlds  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    d = tmp_path_factory.mktemp("grouped")
    tensors = group_worker.make_tensors()
    names = sorted(tensors)
    half = len(names) // 2
    # Two shards and an index, so reads span files.
    shards = {"m-00001-of-00002.safetensors": names[:half],
              "m-00002-of-00002.safetensors": names[half:]}  # fmt: skip
    weight_map = {}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, d / shard)
        weight_map.update(dict.fromkeys(keys, shard))
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    save_file({"other": torch.zeros(3)}, d / "other.safetensors")
    return d / "model.safetensors.index.json"


def run_world(world, checkpoint, mode, tmp_path, timeout=240, env=None):
    return worlds.run_world(
        "group_worker.py", world, checkpoint, mode, tmp_path, timeout=timeout, env=env
    )


def nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize(("world", "via"), [(2, "network"), (4, "page cache")])
def test_grouped_loads_read_each_byte_once_and_are_bit_exact(world, via, checkpoint, tmp_path):
    # On one host the ranks share through the page cache unless told to use the network.
    env = {"SLUICE_GROUP_SHARE_CACHE": "0" if via == "network" else "1"}
    codes, results = run_world(world, checkpoint, "all", tmp_path, env=env)
    assert codes == [0] * world, results
    for r in results:
        assert "crash" not in r, r["crash"]
    tensors = group_worker.make_tensors()
    total = nbytes(tensors.values())
    for part in ("full", "load_file", "load_into", "again"):
        for rank, r in enumerate(results):
            assert r[part]["bad"] == [], (part, rank)
    # Every tensor read by one rank, the reads shared, the rest passed on by the group
    # (network) or found in the page cache the other ranks' buffered reads filled.
    slack = 2 * 4096 * len(tensors)  # direct reads round each run out to pages
    files = sum(p.stat().st_size for p in checkpoint.parent.glob("m-*.safetensors"))
    full = [r["full"]["stats"] for r in results]
    assert sum(s["tensor_bytes"] for s in full) == total
    assert min(s["tensor_bytes"] for s in full) > 0.5 * total / world
    assert sum(s["read_bytes"] for s in full) <= files + slack
    passed_on = "received_bytes" if via == "network" else "cached_bytes"
    unused = "cached_bytes" if via == "network" else "received_bytes"
    for s in full:
        assert s[passed_on] == total - s["tensor_bytes"], s
        assert s[unused] == 0, s
    assert sum(s["sent_bytes"] for s in full) == sum(s["received_bytes"] for s in full)
    # Subsets: each rank gets only tensors it wants; what nobody wants is not read.
    wanted = {k for rank in range(world) for k in tensors if group_worker.mine(k, rank, world)}
    union = nbytes(tensors[k] for k in wanted)
    assert union < total, "the test's subsets leave tensors nobody wants"
    subs = [r["subsets"] for r in results]
    assert sum(s["stats"]["tensor_bytes"] for s in subs) == union
    # The loader reads over small gaps between a rank's tensors rather than issue more I/O,
    # and direct reads round to pages, so its bytes pass the tensors' on tensors this small.
    assert sum(s["stats"]["read_bytes"] for s in subs) <= files + slack
    for rank, s in enumerate(subs):
        assert s["bad"] == [], rank
        got = s["stats"][passed_on]
        assert got <= s["wanted_bytes"] <= got + s["stats"]["tensor_bytes"], (rank, s)
    # Failures: every rank raises, none hangs.
    for rank, r in enumerate(results):
        assert r["load_into"]["missing"] == []
        bad = r["bad_read"]
        if rank == 1:
            assert bad.startswith("SluiceIOError") and "injected read failure" in bad, bad
        else:
            assert "rank 1 failed" in bad and "injected read failure" in bad, bad
        assert bad.count("\n") == 0
        assert (
            r["mismatch"].startswith("ConfigError") and "different checkpoints" in r["mismatch"]
        ), r["mismatch"]
        if rank != 1:
            assert "rank 1 failed" in r["closed"] and "stopped" in r["closed"], r["closed"]


def test_a_grouped_load_from_an_object_store_through_latency_and_resets(checkpoint, tmp_path):
    s3_support = pytest.importorskip("s3_support")
    if not Path(s3_support.faultproxy_bin()).exists():
        pytest.skip("sluice-faultproxy not built (make build)")
    server = s3_support.S3Server()
    try:
        url = server.upload_dir(checkpoint.parent, "grouped")
        # 5 ms each way, and the first two connections reset 256 KiB into their response.
        with s3_support.FaultProxy(server.port, "--delay-ms", "5", "--reset-after",
                                   str(256 << 10), "--faulty", "2") as proxy:  # fmt: skip
            env = {**server.env(proxy.endpoint), "SLUICE_REMOTE_TIMEOUT_S": "10"}
            codes, results = run_world(2, url + "/model.safetensors.index.json", "remote",
                                       tmp_path, env=env)  # fmt: skip
    finally:
        server.stop()
    assert codes == [0, 0], results
    total = nbytes(group_worker.make_tensors().values())
    for r in results:
        assert "crash" not in r, r.get("crash")
        assert r["remote"]["bad"] == []
    assert sum(r["remote"]["stats"]["tensor_bytes"] for r in results) == total
    assert all(r["remote"]["stats"]["tensor_bytes"] > 0 for r in results)


@pytest.mark.parametrize("mode", ["kill", "stall"])
def test_a_rank_that_dies_or_stalls_makes_the_others_raise_in_time(mode, checkpoint, tmp_path):
    codes, results = run_world(2, checkpoint, mode, tmp_path, timeout=120)
    assert codes[0] == 0, results
    r0 = results[0]
    assert "crash" not in r0, r0.get("crash")
    assert r0[mode].startswith("SluiceError"), r0
    assert "grouped load" in r0[mode], r0
    # A dead peer breaks the connection at once; a stalled one (asleep for 20 s) is given
    # up on when group_timeout=4 passes.
    assert r0["seconds"] < 15, r0


def test_readers_take_contiguous_runs_balanced_by_rate_and_only_what_they_need():
    sizes = [10] * 8
    everyone = [frozenset({0, 1})] * 8
    loaded = [0.0, 0.0]
    assert _grouped.assign(range(8), sizes, everyone, [1.0, 1.0], loaded) == [0] * 4 + [1] * 4
    assert loaded == [40.0, 40.0]
    loaded = [0.0, 0.0]
    owners = _grouped.assign(range(8), sizes, everyone, [3.0, 1.0], loaded)
    assert owners == [0] * 6 + [1] * 2  # three times the rate, three times the bytes
    # Across rounds: a rank that read more already takes less of the next.
    loaded = [20.0, 0.0]
    assert _grouped.assign(range(4), [10] * 4, everyone, [1.0, 1.0], loaded) == [0, 1, 1, 1]
    assert loaded == [30.0, 30.0]
    # A tensor one rank needs is that rank's; shared ones balance around it.
    need = [frozenset({1})] * 2 + [frozenset({0, 1})] * 4
    loaded = [0.0, 0.0]
    assert _grouped.assign(range(6), [10] * 6, need, [1.0, 1.0], loaded) == [1, 1, 0, 0, 0, 1]
    assert loaded == [30.0, 30.0]
    # Four ranks, uneven sizes: one contiguous run each, in rank order.
    sizes = [10, 10, 10, 10, 40, 30, 10, 100]
    owners = _grouped.assign(range(8), sizes, [frozenset(range(4))] * 8, [1.0] * 4, [0.0] * 4)
    assert owners == sorted(owners) and set(owners) <= {0, 1, 2, 3}
    assert _grouped.fill([0.0, 0.0], [1.0, 1.0], 0) == [0.0, 0.0]


def test_the_plan_follows_measured_rates_only_past_noise_and_within_bounds():
    assert _grouped.plan_rates([None, 2e9]) == [1.0, 1.0]
    assert _grouped.plan_rates([1.0e9, 1.3e9]) == [1.0, 1.0], "side by side noise"
    assert _grouped.plan_rates([1e9, 3e9]) == [1e9, 3e9]
    fast, mid, slow = _grouped.plan_rates([100e9, 1e9, 1e9])[0], 1e9, 1e6
    assert fast == 4 * mid, "a wild measure is held within 4x of the median"
    assert _grouped.plan_rates([slow, mid, mid])[0] == mid / 4


def test_ranks_share_the_page_cache_only_over_the_very_same_files(checkpoint, tmp_path):
    from sluice import _sluice

    first = _grouped.page_cache_identity(_sluice.open_checkpoint(str(checkpoint)))
    again = _grouped.page_cache_identity(_sluice.open_checkpoint(str(checkpoint)))
    assert first is not None and first == again
    copy = tmp_path / "copy.safetensors"
    copy.write_bytes((checkpoint.parent / "other.safetensors").read_bytes())
    other = _grouped.page_cache_identity(_sluice.open_checkpoint(str(copy)))
    assert other is not None and other != first
    before = _grouped.page_cache_identity(_sluice.open_checkpoint(str(copy)))
    copy.write_bytes(copy.read_bytes())  # rewritten in place: a new change time
    assert _grouped.page_cache_identity(_sluice.open_checkpoint(str(copy))) != before


def test_rounds_keep_file_order_and_hold_at_most_the_budget():
    sizes = [4, 4, 4, 10, 1, 1]
    assert _grouped.rounds_of(sizes, range(6), 8) == [[0, 1], [2], [3], [4, 5]]
    assert _grouped.rounds_of(sizes, [0, 2, 5], 100) == [[0, 2, 5]]
    assert _grouped.rounds_of(sizes, [], 8) == []


def test_bad_group_timeouts_are_config_errors():
    import sluice
    from sluice.errors import ConfigError

    for bad in (0, -1, float("nan"), "10", True):
        with pytest.raises(ConfigError, match="group_timeout"):
            dict(sluice.stream("nowhere.safetensors", group_timeout=bad))
