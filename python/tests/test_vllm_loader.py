"""`--load-format sluice`'s option checks, without vLLM (the engine tests are in
python/engine_tests, run by `make engine-test`)."""

from __future__ import annotations

import pytest
from sluice.errors import ConfigError
from sluice.integrations.vllm_loader import (
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
