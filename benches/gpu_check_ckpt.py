#!/usr/bin/env python3
"""Standalone GPU check of `sluice.ckpt` with CUDA tensors (issue 14).

Run on a CUDA machine with a Sluice wheel installed (`maturin build --release -o wheels`, then
`pip install --no-deps --no-index wheels/*.whl` there):

    python3 benches/gpu_check_ckpt.py

Checks, each in its own try/except (the JSON summary in $OUT/gpu_check_ckpt.json):
- `sluice.ckpt.save` of a CUDA state (every common dtype, non-contiguous, empty, scalar) and
  `load` back into CUDA tensors: bit-exact, still on the GPU;
- the same through DCP: `dcp.save` / `dcp.async_save` with `StorageWriter` (staged before
  durable; the state scribbled over after staging) and `dcp.load` with `StorageReader`;
- host memory while saving a 1 GiB CUDA state with `staging_bytes=256MiB` (peak RSS growth).
GPU_CHECK_DEVICE=cpu runs it against "cpu" (script shakedown).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
import traceback

import torch

DEV = "cpu" if os.environ.get("GPU_CHECK_DEVICE") == "cpu" else "cuda:0"
RESULTS: dict = {"checks": {}, "info": {}}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def check(name):
    def run(fn):
        log(f"check {name} ...")
        t = time.perf_counter()
        try:
            RESULTS["checks"][name] = {"status": "pass", "detail": fn()}
        except BaseException as e:
            RESULTS["checks"][name] = {
                "status": "fail",
                "error": f"{type(e).__name__}: {str(e)[:1500]}",
                "traceback": traceback.format_exc().splitlines()[-8:],
            }
        RESULTS["checks"][name]["seconds"] = round(time.perf_counter() - t, 3)
        log(f"  {RESULTS['checks'][name]['status']}")
        return fn

    return run


def state() -> dict:
    g = torch.Generator().manual_seed(3)
    base = torch.randn(512, 384, generator=g)
    sd = {
        "f32": base.clone(),
        "bf16": base.to(torch.bfloat16),
        "f16": base.to(torch.float16),
        "fp8": base.clamp(-4, 4).to(torch.float8_e4m3fn),
        "i64": torch.randint(-(2**40), 2**40, (1000,), generator=g),
        "bool": torch.rand(777, generator=g) > 0.5,
        "t": base.t(),  # non-contiguous
        "empty": torch.empty(0, 3),
        "scalar": torch.tensor(1.5),
        "zeros": torch.zeros(256, 1024),
    }
    return {k: v.to(DEV) for k, v in sd.items()}


def blank(sd: dict) -> dict:
    return {k: torch.zeros_like(v) for k, v in sd.items()}


def exact(a: dict, b: dict) -> list[str]:
    bad = []
    for k, v in a.items():
        w = b[k]
        if w.device != v.device or w.dtype != v.dtype or w.shape != v.shape:
            bad.append(f"{k}: {w.device} {w.dtype} {list(w.shape)}")
        elif v.numel() and not torch.equal(
            v.contiguous().view(-1).view(torch.uint8), w.contiguous().view(-1).view(torch.uint8)
        ):
            bad.append(k)
    return bad


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    import sluice
    import sluice.ckpt as ck
    import torch.distributed.checkpoint as dcp

    RESULTS["info"] = {
        "torch": torch.__version__,
        "sluice": getattr(sluice, "__version__", "?"),
        "device": torch.cuda.get_device_name(0) if DEV != "cpu" else "cpu",
    }
    root = tempfile.mkdtemp(prefix="ckpt-gpu-", dir=os.environ.get("GPU_CHECK_DATA", "/var/tmp"))

    @check("direct save/load of a CUDA state, bit-exact")
    def _direct():
        sd = state()
        report = ck.save(sd, f"{root}/direct/s1", chunk_bytes=64 << 10).result()
        back = ck.load(blank(sd), f"{root}/direct/s1")
        bad = exact(sd, back)
        assert not bad, bad
        return {"written": report["written_bytes"], "unique": report["unique_bytes"]}

    @check("dcp.save / dcp.load with StorageWriter/Reader, CUDA")
    def _dcp():
        sd = state()
        dcp.save(sd, storage_writer=ck.StorageWriter(f"{root}/dcp/s1"))
        back = blank(sd)
        dcp.load(back, storage_reader=ck.StorageReader(f"{root}/dcp/s1"))
        bad = exact(sd, back)
        assert not bad, bad

    @check("dcp.async_save with the writer as stager, CUDA")
    def _async():
        sd = state()
        want = {k: v.clone() for k, v in sd.items()}
        w = ck.StorageWriter(f"{root}/dcp/a1")
        r = dcp.async_save(sd, storage_writer=w)
        order: list[str] = []
        if hasattr(r, "staging_completion"):
            r.staging_completion.add_done_callback(lambda f: order.append("staged"))
            r.upload_completion.add_done_callback(lambda f: order.append("durable"))
            r.staging_completion.result()
            for v in sd.values():
                v.fill_(0) if v.dtype != torch.bool else v.fill_(False)
            r.upload_completion.result()
        else:  # a torch whose async_save returns one future
            r.result()
        back = blank(want)
        dcp.load(back, storage_reader=ck.StorageReader(f"{root}/dcp/a1"))
        bad = exact(want, back)
        assert not bad, bad
        w.close()
        return {"response": type(r).__name__, "order": order}

    @check("host memory while saving a 1 GiB CUDA state (staging 256 MiB)")
    def _memory():
        sd = {f"p{i}": torch.randn(64 << 20 >> 2, device=DEV) for i in range(16)}  # 16 x 64 MiB
        if DEV != "cpu":
            torch.cuda.synchronize()
            # The CUDA runtime's own host side (pinned-copy paths load lazily): warmed with
            # 4 KiB, so the figure below is the save's, not the runtime's first use.
            before_warm = rss()
            torch.empty(4096, dtype=torch.uint8, pin_memory=True).copy_(
                sd["p0"][:1024].view(torch.uint8)
            )
            warm_cost = rss() - before_warm
        else:
            warm_cost = 0
        base = rss()
        peak = [base]
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], rss())
                time.sleep(0.005)

        t = threading.Thread(target=sample)
        t.start()
        t0 = time.perf_counter()
        h = ck.save(sd, f"{root}/mem/s1", staging_bytes=256 << 20)
        h.staged.result()
        staged = time.perf_counter() - t0
        h.result()
        durable = time.perf_counter() - t0
        stop.set()
        t.join()
        return {
            "state_bytes": 1 << 30,
            "extra_rss_bytes": peak[0] - base,
            "cuda_host_warmup_rss_bytes": warm_cost,
            "staged_s": round(staged, 3),
            "durable_s": round(durable, 3),
        }

    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "gpu_check_ckpt.json"), "w") as f:
            json.dump(RESULTS, f, indent=1)
    print(json.dumps(RESULTS, indent=1))
    import shutil

    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
