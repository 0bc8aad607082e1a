"""`--load-format sluice`'s option checks, without vLLM (the engine tests are in
python/engine_tests, run by `make engine-test`)."""

from __future__ import annotations

import pytest
from sluice.errors import ConfigError
from sluice.integrations.vllm_loader import stream_options, weights_source


def test_the_extra_config_keys_become_stream_options():
    assert stream_options(None) == {}
    opts = {"memory_limit": "2GiB", "concurrency": 8, "direct": "off", "engine": "threads"}
    assert stream_options(dict(opts, drop_cache=True, chunk_bytes=1 << 20)) == dict(
        opts, drop_cache=True, chunk_bytes=1 << 20
    )


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"memory_limt": 1}, "'memory_limt'"),
        ({"concurrency": 0}, "concurrency=0"),
        ({"concurrency": True}, "concurrency=True"),
        ({"concurrency": "8"}, "concurrency='8'"),
        ({"memory_limit": -1}, "memory_limit=-1"),
        ({"memory_limit": 1.5}, "memory_limit=1.5"),
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
