"""The model every real-engine test serves: a small random-weight Llama written once per run
(config.json, sharded safetensors and an index, as a Hub snapshot has)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def model(tmp_path_factory) -> Path:
    import tiny_model

    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_model.write(str(path), max_positions=2048)  # vllm_kv_run.py's max_model_len
    assert len(list(path.glob("*.safetensors"))) > 1, "the model is sharded, with an index"
    return path
