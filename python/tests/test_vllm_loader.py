"""`--load-format sluice`'s option checks, without vLLM (the engine tests are in
python/engine_tests, run by `make engine-test`)."""

from __future__ import annotations

import pytest
from sluice.errors import ConfigError
from sluice.integrations.vllm_loader import (
    split_reads,
    stream_options,
    weights_device,
    weights_source,
)


def test_the_extra_config_keys_become_stream_options():
    assert stream_options(None) == {}
    opts = {"concurrency": 8, "direct": "off", "engine": "threads", "drop_cache": True}
    assert stream_options(dict(opts, memory_limit="2GiB", chunk_bytes="1.5 MB")) == dict(
        opts, memory_limit=2 << 30, chunk_bytes=1_572_864
    )
    assert stream_options({"memory_limit": 4096, "distributed": False}) == {
        "memory_limit": 4096,
        "distributed": False,
    }


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"memory_limt": 1}, "'memory_limt'"),
        ({"concurrency": 0}, "concurrency=0"),
        ({"concurrency": True}, "concurrency=True"),
        ({"concurrency": "8"}, "concurrency='8'"),
        ({"memory_limit": -1}, "memory_limit=-1"),
        ({"memory_limit": 1.5}, "memory_limit=1.5"),
        ({"memory_limit": "2 GiBs"}, "memory_limit='2 GiBs'"),
        ({"memory_limit": "0MiB"}, "memory_limit='0MiB'"),
        ({"distributed": "yes"}, "distributed='yes'"),
        ({"weights": ""}, "weights=''"),
        ({"weights": 3}, "weights=3"),
        ({"direct": "yes"}, "direct='yes'"),
        ({"engine": "aio"}, "engine='aio'"),
        ({"drop_cache": 1}, "drop_cache=1"),
        (["memory_limit"], "must be a mapping"),
    ],
)
def test_a_bad_key_or_value_is_a_config_error_naming_it(extra, named):
    with pytest.raises(ConfigError, match=named.replace("(", r"\(").replace(".", r"\.")):
        stream_options(extra)


def test_a_missing_local_model_is_named_and_a_url_passes(tmp_path):
    with pytest.raises(ConfigError, match="no-such-model"):
        weights_source(str(tmp_path / "no-such-model"))
    assert weights_source(str(tmp_path)) == str(tmp_path)
    assert weights_source("s3://bucket/llama") == "s3://bucket/llama"


def test_tensor_parallel_reads_are_split_once_contiguously_and_evenly_in_rounds():
    names = [f"t{i}" for i in range(8)]
    sizes = [10, 10, 10, 10, 40, 30, 10, 100]
    rounds = split_reads(names, sizes, 2, round_bytes=80)
    # Every tensor is read by exactly one rank, in file order.
    assert [n for r in rounds for n, _ in r] == names
    # A round holds at most the limit, unless one tensor alone is larger.
    for r in rounds:
        total = sum(sizes[names.index(n)] for n, _ in r)
        assert total <= 80 or len(r) == 1
    # Each rank owns one contiguous run of a round (no other rank's bytes between its
    # reads), about half the round's bytes.
    assert rounds[0] == [("t0", 0), ("t1", 0), ("t2", 0), ("t3", 0), ("t4", 1)]
    assert rounds[1] == [("t5", 0), ("t6", 1)]
    assert rounds[2] == [("t7", 1)]
    for r in rounds:
        owners = [o for _, o in r]
        assert owners == sorted(owners)
    assert split_reads([], [], 2, 80) == []
    assert {o for r in split_reads(names, sizes, 1, 80) for _, o in r} == {0}
    assert {o for r in split_reads(names, sizes, 4, 1000) for _, o in r} == {0, 1, 2, 3}


def test_weights_are_streamed_to_the_device_the_model_lives_on():
    import torch

    class Model:
        def __init__(self, *devices):
            self.devices = devices

        def parameters(self):
            return iter(torch.empty(0, device="meta").new_empty(0) if d == "meta" else P(d)
                        for d in self.devices)  # fmt: skip

    class P:
        def __init__(self, device):
            self.device = torch.device(device)

    assert weights_device(Model("cuda:1", "cuda:1")) == "cuda:1"
    assert weights_device(Model("cpu")) == "cpu"
    assert weights_device(Model("meta")) == "cpu", "only CUDA gets the device path"
    assert weights_device(Model()) == "cpu"
