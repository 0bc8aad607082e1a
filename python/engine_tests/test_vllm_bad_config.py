"""Bad configuration of Sluice in a real vLLM engine fails the engine's start with an error
that names what is wrong (`make engine-test`). The engines start side by side: each one
fails within its start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="the real-engine tests run in .venv-vllm (make engine-test)")

HERE = Path(__file__).resolve().parent


def test_bad_configuration_is_named(model, tmp_path):
    # A checkpoint of another format: the config and a PyTorch .bin, no safetensors.
    bin_only = tmp_path / "bin-only"
    bin_only.mkdir()
    (bin_only / "config.json").write_bytes((model / "config.json").read_bytes())
    (bin_only / "pytorch_model.bin").write_bytes(b"not safetensors")
    # A KV store directory another deployment made with 4 KiB blocks.
    import sluice.kv

    other = tmp_path / "other-kv"
    sluice.kv.open(other / "vllm-dp0", block_bytes=4096, ssd="1MiB").close()

    load = [sys.executable, str(HERE / "vllm_run.py")]
    kv = [sys.executable, str(HERE / "vllm_kv_run.py"), str(model)]
    cases = {
        "unknown loader key": (
            [*load, str(model), "sluice", json.dumps({"memory_limt": "1GiB"})],
            "unknown key(s) 'memory_limt'",
        ),
        "missing weights": (
            [*load, str(model), "sluice", json.dumps({"weights": str(tmp_path / "nowhere")})],
            f"{tmp_path / 'nowhere'}",
        ),
        "weights of another format": (
            [*load, str(bin_only), "sluice"],
            f"{bin_only}: no *.safetensors files in this directory",
        ),
        "unknown store key": (
            [
                *kv,
                json.dumps(
                    [{"sluice": {"path": str(tmp_path / "kv"), "sdd": "1GiB"}, "prompts": []}]
                ),
            ],
            "unknown config key 'sdd'",
        ),
        "a store of another format": (
            [*kv, json.dumps([{"sluice": {"path": str(other)}, "prompts": []}])],
            "the store holds 4096-byte blocks",
        ),
    }
    procs = {
        name: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for name, (cmd, _) in cases.items()
    }
    for name, proc in procs.items():
        out = proc.communicate(timeout=300)[0]
        needle = cases[name][1]
        assert proc.returncode != 0, f"{name}: the engine started\n{out[-3000:]}"
        assert not any(line.startswith("RESULT ") for line in out.splitlines()), name
        assert needle in out, f"{name}: {needle!r} not in the output\n{out[-3000:]}"
