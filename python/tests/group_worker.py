"""One rank of grouped model loads (``sluice.stream(..., group=)``, ``sluice.load_into(...,
group=)``) on gloo, for test_grouped_load.py.

    python group_worker.py RANK WORLD INIT_FILE CHECKPOINT MODE OUT_JSON

MODE ``all``: a sequence of grouped loads over one group, each reporting to OUT_JSON:
``full`` (every rank every tensor, bit-exact, the bytes read between the ranks), ``load_file``,
``subsets`` (rank r wants its own tensors and the shared ones), ``load_into`` (into
destinations of other dtypes too), ``bad_read`` (rank 1's reads fail: every rank raises),
``mismatch`` (rank 1 opens another checkpoint), ``closed`` (rank 1 stops after one tensor),
then ``again`` (a full load still works on the same group).
MODE ``remote``: a full grouped load from an object URL.
MODE ``kill``: rank 1 SIGKILLs itself after its first tensor; the others must raise.
MODE ``stall``: rank 1 sleeps 20 s at its first tensor (group_timeout=4): the others must raise.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback

import torch

SHARED = 6  # tensors every rank wants in ``subsets``


def make_tensors() -> dict[str, torch.Tensor]:
    """The checkpoint: about 6 MiB of mixed dtypes, several rounds at a 1 MiB limit."""
    g = torch.Generator().manual_seed(30)
    dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.int64, torch.bool]
    out: dict[str, torch.Tensor] = {}
    for i in range(24):
        dt = dtypes[i % len(dtypes)]
        shape = (37 + 13 * i, 64)
        if dt == torch.bool:
            t = torch.rand(shape, generator=g) > 0.5
        elif dt in (torch.int8, torch.int64):
            t = torch.randint(-100, 100, shape, generator=g).to(dt)
        else:
            t = torch.randn(shape, generator=g).to(dt)
        out[f"layer{i:02d}.w"] = t
    for i in range(SHARED):
        out[f"shared.{i}"] = torch.randn(300, 256, generator=g)
    out["empty"] = torch.empty(0, 8)
    out["scalar"] = torch.tensor(2.5)
    return out


def mine(name: str, rank: int, world: int) -> bool:
    """``subsets``: the shared tensors, and every (world + 1)-th layer from this rank's (so
    some layers are nobody's)."""
    if name.startswith("shared.") or name in ("empty", "scalar"):
        return True
    return int(name[5:7]) % (world + 1) == rank


def exact(got: dict, want: dict) -> list[str]:
    bad = [k for k in want if k not in got]
    for k, v in got.items():
        w = want[k]
        if v.dtype != w.dtype or v.shape != w.shape or not torch.equal(v, w):
            bad.append(k)
    return bad


def error_of(fn) -> str:
    try:
        fn()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def main() -> None:
    rank, world, init, ckpt, mode, out = sys.argv[1:7]
    rank, world = int(rank), int(world)
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    import sluice
    from sluice import _grouped

    want = make_tensors()
    report: dict = {}
    try:
        if mode == "all":
            t0 = time.perf_counter()
            got = dict(sluice.stream(ckpt, group=dist.group.WORLD, memory_limit="1MiB"))
            report["full"] = {
                "bad": exact(got, want),
                "stats": sluice.last_load_stats(),
                "seconds": time.perf_counter() - t0,
            }
            names = [k for k in want if mine(k, rank, world)]
            got = dict(
                sluice.stream(ckpt, names=names, group=dist.group.WORLD, memory_limit="1MiB")
            )
            report["subsets"] = {
                "bad": exact(got, {k: want[k] for k in names}),
                "names": len(got),
                "stats": sluice.last_load_stats(),
                "wanted_bytes": sum(want[k].numel() * want[k].element_size() for k in names),
            }
            got = sluice.load_file(ckpt, group=dist.group.WORLD, memory_limit="1MiB")
            report["load_file"] = {"bad": exact(got, want)}
            dest = {k: torch.zeros_like(v) for k, v in want.items()}
            dest["shared.0"] = torch.zeros(300, 256, dtype=torch.float64)  # converted
            result = sluice.load_into(ckpt, dest, group=dist.group.WORLD, memory_limit="1MiB")
            conv = {**want, "shared.0": want["shared.0"].to(torch.float64)}
            report["load_into"] = {
                "bad": exact(dest, conv),
                "missing": list(result.missing_keys),
                "stats": sluice.last_load_stats(),
            }
            if rank == 1:
                real = _grouped.local_stream

                def failing(*a, **k):
                    raise sluice.SluiceIOError(f"{ckpt}: injected read failure on rank 1")

                _grouped.local_stream = failing
            report["bad_read"] = error_of(
                lambda: dict(sluice.stream(ckpt, group=dist.group.WORLD, memory_limit="1MiB"))
            )
            if rank == 1:
                _grouped.local_stream = real
            other = os.path.join(os.path.dirname(ckpt), "other.safetensors")
            path = other if rank == 1 else ckpt
            report["mismatch"] = error_of(lambda: dict(sluice.stream(path, group=dist.group.WORLD)))

            def closed():
                gen = sluice.stream(ckpt, group=dist.group.WORLD, memory_limit="1MiB")
                for _ in gen:
                    if rank == 1:
                        gen.close()
                        return

            report["closed"] = error_of(closed)
            got = dict(sluice.stream(ckpt, group=dist.group.WORLD, memory_limit="1MiB"))
            report["again"] = {"bad": exact(got, want)}
        elif mode == "remote":
            # The checkpoint is an object URL (the parent set the store's environment, a
            # fault proxy with latency and broken connections in front of it).
            got = dict(sluice.stream(ckpt, group=dist.group.WORLD, memory_limit="1MiB"))
            report["remote"] = {"bad": exact(got, want), "stats": sluice.last_load_stats()}
        elif mode in ("kill", "stall"):
            t0 = time.perf_counter()

            def run():
                loads = sluice.stream(
                    ckpt, group=dist.group.WORLD, memory_limit="1MiB", group_timeout=4
                )
                for n, _ in enumerate(loads):
                    if rank == 1 and mode == "kill":
                        os.kill(os.getpid(), signal.SIGKILL)
                    if rank == 1 and mode == "stall" and n == 0:
                        time.sleep(20)  # well past group_timeout

            report[mode] = error_of(run)
            report["seconds"] = time.perf_counter() - t0
    except BaseException:
        report["crash"] = traceback.format_exc()
    with open(out, "w") as f:
        json.dump(report, f, default=str)
    os._exit(0)  # a dead peer may leave gloo's threads waiting: do not wait for them


if __name__ == "__main__":
    main()
