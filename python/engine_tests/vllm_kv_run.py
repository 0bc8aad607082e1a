"""Engines one after another in one driver process, for the KV offloading tests: each step
starts a vLLM engine (its engine core is a fresh process, as after a restart), generates
greedily from token-id prompts, prints the outcome as JSON and shuts the engine down.

    python vllm_kv_run.py MODEL STEPS_JSON

STEPS_JSON is a list of ``{"sluice": {...} | null, "prompts": [[ids], ...]}``: ``sluice`` is
the store options of ``SluiceOffloadingSpec`` (null: no offloading). Optional keys order
engines in two driver processes: ``wait_before`` (a file to wait for once the engine is up),
``signal_after`` (a file to create once the prompts are done, and once a `sluice kv serve`
counts ``await_puts: {"socket", "puts"}`` puts when that is given), ``wait_after`` (a file
to wait for before shutting down). Each step prints
``RESULT {"outputs": [{"token_ids", "logprobs", "num_cached_tokens"}, ...]}``.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

CHUNK_TOKENS = 64


def kv_transfer_config(sluice: dict) -> dict:
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "SluiceOffloadingSpec",
            "spec_module_path": "sluice.integrations.vllm",
            "cpu_bytes_to_use": 64 << 20,
            "block_size": CHUNK_TOKENS,
            "sluice": sluice,
        },
    }


def wait_for(path: str | None, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while path and not Path(path).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear in {timeout} s")
        time.sleep(0.1)


def await_puts(socket: str, puts: int, timeout: float = 120) -> None:
    """Waits until the server on ``socket`` has stored ``puts`` blocks: vLLM hands chunks to
    its secondary tier a few engine steps after it computed them."""
    import sluice.kv

    deadline = time.monotonic() + timeout
    with sluice.kv.connect(socket) as store:
        while store.stats()["puts"] < puts:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the kv server stored {store.stats()['puts']} < {puts} blocks")
            time.sleep(0.1)


def run_step(model: str, step: dict) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    extra = {}
    if step.get("sluice") is not None:
        extra["kv_transfer_config"] = kv_transfer_config(step["sluice"])
    llm = LLM(
        model=model,
        enforce_eager=True,
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_model_len=2048,
        block_size=CHUNK_TOKENS,
        seed=0,
        **extra,
    )
    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=1, detokenize=False)
    wait_for(step.get("wait_before"))
    outputs = []
    for p in step["prompts"]:
        (out,) = llm.generate([TokensPrompt(prompt_token_ids=p)], params, use_tqdm=False)
        c = out.outputs[0]
        outputs.append(
            {
                "token_ids": list(c.token_ids),
                "logprobs": [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)],
                "num_cached_tokens": out.num_cached_tokens,
            }
        )
    if step.get("await_puts"):
        await_puts(**step["await_puts"])
    if step.get("signal_after"):
        Path(step["signal_after"]).touch()
    wait_for(step.get("wait_after"))
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return {"outputs": outputs}


def main() -> None:
    model, steps = sys.argv[1], json.loads(sys.argv[2])
    for step in steps:
        print("RESULT " + json.dumps(run_step(model, step)), flush=True)


if __name__ == "__main__":
    main()
