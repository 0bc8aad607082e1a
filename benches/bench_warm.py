"""`make bench-warm`: seed 000's figures 6, 9 and 11 on this machine, plus the runtime's overhead.

An unmodified loader (benches/warm_consumer.py: index and headers first, ``--init-seconds`` of
CPU-only start-up, then every tensor through the stock safetensors mmap loader, or plain reads,
with a bfloat16→float32 cast per tensor) loads a synthetic 4-shard checkpoint under each
page-cache policy, from a cold page cache every run:

- policies: native, eager, precache, template, and the template breakdown: prefetch only
  (no affinity, no burn-after-reading), + affinity (a no-op on this one-NUMA-node machine),
  + burn-after-reading (= template);
- scenarios: enough memory (no limit), and constrained memory: the service and the runtime in
  one cgroup limited to ``--constrained-fraction`` (0.47) of the model's size on top of the
  loader's own footprint, measured per backend at the end of its initialization (importing
  torch alone puts about 1 GiB of shared libraries in the page cache, charged to the cgroup);
- rounds interleave the policies, each round starting one policy later than the last (so no
  policy always follows the same one); medians of ``--runs`` (3).

Reported per (scenario, backend, policy): end-to-end seconds (launch of `sluice warm run` to
its exit, so precache's warm-up counts) and load-phase seconds (the consumer's own timer), with
ratios to native. A PNG per scenario shows the disk's read bandwidth over time for each policy
(round 1, mmap backend), sampled from /sys/block every 100 ms, like seed 000's figure 8.

Overhead: a no-op runtime (policy native, which watches opens only) on a warm 4 GiB file, 1 MiB
sequential read() and memcpy out of an mmap, against no runtime; and, for comparison, with
pre-content events forced on (what the template policy runs with: every read waits for an
answer).

Memory: on a VM with virtio-balloon free page reporting, reporting is turned off for the run and
restored after it (``--keep-page-reporting`` leaves it on); see ``free_page_reporting_off``.

Results: ``--out``/bench-warm.{md,json} and bench-warm-*.png. Needs root (fanotify, cgroups,
drop_caches).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import page_cache

REPO = Path(__file__).resolve().parent.parent
SLUICE = REPO / "target" / "release" / "sluice"
CONSUMER = REPO / "benches" / "warm_consumer.py"
MIB = 1 << 20
GIB = 1 << 30

# A policy name with this suffix runs through --baseline-bin instead of this build.
BASELINE = " @baseline"

# name -> extra `sluice warm run` flags
POLICIES: dict[str, list[str]] = {
    "native": ["--policy", "native"],
    "eager": ["--policy", "eager"],
    "precache": ["--policy", "precache"],
    "template: prefetch only": ["--policy", "template", "--no-affinity", "--no-burn"],
    "template: + affinity": ["--policy", "template", "--no-burn"],
    "template": ["--policy", "template"],
    "template: first access": ["--policy", "template", "--start-at-first-access"],
}
# Scenario -> (memory, consumer start-up, policies run there; None: all).
SCENARIOS: dict[str, tuple[str, str, list[str] | None]] = {
    "enough": ("enough", "cpu", None),
    "constrained": ("constrained", "cpu", None),
    "enough-reads": ("enough", "reads", ["native", "eager", "template", "template: first access"]),
}
# A 'reads' start-up reads this much of a non-model file, cold (libraries, an image).
STARTUP_READ_BYTES = 1 << 30


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", default="bench-data/warm")
    p.add_argument("--size-gib", type=float, default=4.0)
    p.add_argument("--init-seconds", type=float, default=3.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--constrained-fraction", type=float, default=0.47)
    p.add_argument("--backends", default="mmap,pread")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--skip-overhead", action="store_true")
    p.add_argument(
        "--keep-page-reporting",
        action="store_true",
        help="leave the VM's free page reporting on (see free_page_reporting_off)",
    )
    p.add_argument(
        "--baseline-bin",
        help="another build's sluice binary: adds the rows 'eager @baseline' and "
        "'template @baseline', run by it in the same interleaved rounds (an A/B of builds)",
    )
    p.add_argument("--out", default="docs")
    args = p.parse_args()
    # Comma lists, parsed once.
    for name in ("backends", "policies", "scenarios"):
        setattr(args, name, [x for x in getattr(args, name).split(",") if x])
    if args.baseline_bin:
        args.policies += [f"{p}{BASELINE}" for p in ("eager", "template") if p in args.policies]
    return args


# --------------------------------------------------------------------------- model


def make_model(root: Path, size_gib: float) -> Path:
    """A Llama-like bfloat16 checkpoint of 4 shards with an index, written once."""
    model = root / f"model-bf16-{size_gib:g}g"
    if (model / "model.safetensors.index.json").exists():
        return model
    model.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    # Random bfloat16 with sane exponents: sign, exponent 120..134, mantissa.
    bits = rng.integers(0, 1 << 16, size=32 * MIB, dtype=np.uint16)
    block = (bits & 0x807F) | (rng.integers(120, 135, size=bits.size, dtype=np.uint16) << 7)
    # Per layer: q, k, v, o, gate, up, down, 2 norms (elements ~ a 4096-wide model, scaled).
    total = int(size_gib * GIB)
    layer_shapes = [
        (4096, 4096),
        (1024, 4096),
        (1024, 4096),
        (4096, 4096),
        (14336, 4096),
        (14336, 4096),
        (4096, 14336),
        (4096,),
        (4096,),
    ]
    layer_bytes = sum(2 * int(np.prod(s)) for s in layer_shapes)
    layers = max(2, (total - 2 * 2 * 32000 * 4096) // layer_bytes)
    tensors = [("model.embed_tokens.weight", (32000, 4096))]
    for i in range(layers):
        names = ["q", "k", "v", "o", "gate", "up", "down", "in_norm", "post_norm"]
        tensors += [(f"model.layers.{i}.{n}.weight", s) for n, s in zip(names, layer_shapes)]
    tensors.append(("lm_head.weight", (32000, 4096)))
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[] for _ in range(4)]
    per_shard = len(tensors) / 4
    for i, t in enumerate(tensors):
        shards[min(3, int(i / per_shard))].append(t)
    weight_map = {}
    for s, items in enumerate(shards):
        name = f"model-{s + 1:05d}-of-00004.safetensors"
        meta, offset = {}, 0
        for tname, shape in items:
            n = 2 * int(np.prod(shape))
            meta[tname] = {"dtype": "BF16", "shape": list(shape)}
            meta[tname]["data_offsets"] = [offset, offset + n]
            offset += n
            weight_map[tname] = name
        head = json.dumps(meta).encode()
        head += b" " * (-len(head) % 8)
        with open(model / name, "wb") as f:
            f.write(len(head).to_bytes(8, "little"))
            f.write(head)
            for _, shape in items:
                n = int(np.prod(shape))
                at = 0
                while at < n:
                    o = at % 977
                    k = min(n - at, len(block) - o)
                    f.write(block[o : o + k].tobytes())
                    at += k
            f.flush()
            os.fsync(f.fileno())
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    return model


def model_bytes(model: Path) -> int:
    return sum(p.stat().st_size for p in model.iterdir() if p.is_file())


# --------------------------------------------------------------------------- helpers


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3")


def block_device(path: Path) -> str | None:
    """The /sys/block name of the disk holding ``path`` (partitions map to their disk)."""
    dev = os.stat(path).st_dev
    major, minor = os.major(dev), os.minor(dev)
    link = Path(f"/sys/dev/block/{major}:{minor}")
    if not link.exists():
        return None
    real = link.resolve()
    if (real / "partition").exists():
        real = real.parent
    return real.name


class DiskSampler:
    """Disk read bandwidth every ``interval`` seconds, from /sys/block/DEV/stat."""

    def __init__(self, dev: str | None, interval: float = 0.1) -> None:
        self.dev, self.interval = dev, interval
        self.points: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sectors(self) -> int:
        if self.dev is None:
            return 0
        return int(Path(f"/sys/block/{self.dev}/stat").read_text().split()[2])

    def _run(self) -> None:
        t0, last = time.perf_counter(), self._sectors()
        while not self._stop.wait(self.interval):
            now = self._sectors()
            self.points.append((time.perf_counter() - t0, (now - last) * 512 / self.interval / 1e6))
            last = now

    def __enter__(self) -> DiskSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def consumer_cmd(
    model: Path, backend: str, init_s: float, *extra: str, startup: str = "cpu"
) -> list[str]:
    cmd = [sys.executable, str(CONSUMER), "--model", str(model), "--backend", backend,
           "--init-seconds", str(init_s), "--startup", startup, *extra]  # fmt: skip
    if startup == "reads":
        cmd += ["--startup-file", str(startup_file(model))]
    return cmd


def startup_file(model: Path) -> Path:
    """The non-model file a 'reads' start-up reads, made once beside the model."""
    path = model.parent / "startup.bin"
    if not path.exists() or path.stat().st_size != STARTUP_READ_BYTES:
        with open(path, "wb") as f:
            for _ in range(STARTUP_READ_BYTES >> 24):
                f.write(os.urandom(1 << 24))
    return path


def footprint(model: Path, backend: str, init_s: float) -> int:
    """The loader's own cgroup charge after initializing, from a cold cache (max of 2)."""
    seen = []
    for _ in range(2):
        drop_caches()
        cmd = [str(SLUICE), "warm", "run", "--policy", "native", "--memory-limit", "64GiB",
               "--model", str(model), "--json", "--no-progress", "--",
               *consumer_cmd(model, backend, init_s, "--init-only")]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        line = next(json.loads(x) for x in out.splitlines() if "baseline_bytes" in x)
        seen.append(int(line["baseline_bytes"] or 0))
    return max(seen)


def service(backend: str) -> str:
    return f"bench-warm consumer backend={backend}"


def warm_run(
    policy_flags: list[str],
    model: Path,
    backend: str,
    init_s: float,
    limit: int | None,
    templates: Path,
    record: bool = False,
    binary: Path = SLUICE,
    startup: str = "cpu",
) -> dict[str, Any]:
    mode = ["record"] if record else ["run", *policy_flags]
    cmd = [str(binary), "warm", *mode, "--model", str(model), "--service", service(backend),
           "--template-dir", str(templates), "--json", "--no-progress"]  # fmt: skip
    if limit is not None and not record:
        cmd += ["--memory-limit", f"{limit}B"]
    cmd += ["--", *consumer_cmd(model, backend, init_s, startup=startup)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr[-2000:]}")
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    consumer = next(x for x in lines if "load_s" in x)
    report = next(x for x in lines if "policy" in x and "exit_code" in x)
    return {"end_to_end_s": wall, **consumer, "report": report}


# --------------------------------------------------------------------------- overhead


OVERHEAD_SCRIPT = r"""
import mmap, os, sys, time, numpy as np
path = sys.argv[1]
size = os.path.getsize(path)
fd = os.open(path, os.O_RDONLY)
buf = bytearray(1 << 20)
t = time.perf_counter()
while os.readv(fd, [buf]) > 0:
    pass
read_s = time.perf_counter() - t
os.close(fd)
with open(path, "rb") as f:
    m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    src = np.frombuffer(m, dtype=np.uint8)
    dst = np.empty(64 << 20, dtype=np.uint8)
    t = time.perf_counter()
    for at in range(0, size, len(dst)):
        n = min(len(dst), size - at)
        dst[:n] = src[at : at + n]
    mmap_s = time.perf_counter() - t
    del src
    m.close()
print(size / read_s / 1e9, size / mmap_s / 1e9)
"""


def overhead(root: Path, runs: int) -> dict[str, Any]:
    d = root / "overhead"
    d.mkdir(parents=True, exist_ok=True)
    f = d / "warm-4g.bin"
    if not f.exists() or f.stat().st_size != 4 * GIB:
        block = np.random.default_rng(1).integers(0, 255, size=64 * MIB, dtype=np.uint8).tobytes()
        with open(f, "wb") as out:
            for _ in range(64):
                out.write(block)
    script = d / "overhead.py"
    script.write_text(OVERHEAD_SCRIPT)
    base = [sys.executable, str(script), str(f)]
    runtime = [str(SLUICE), "warm", "run", "--policy", "native", "--model", str(d), "--json"]
    variants = {
        "no runtime": base,
        # What `sluice warm run --policy native` does: a no-op policy needs no read ranges,
        # so the runtime watches opens only.
        "runtime, no-op policy": [*runtime, "--", *base],
        # For comparison (not a target): every read waits for a pre-content answer, as
        # under the template policy.
        "runtime, no-op policy, pre-content events forced": [
            *runtime,
            "--events",
            "pre-content",
            "--",
            *base,
        ],
    }
    subprocess.run(base, capture_output=True, check=True)  # warm the page cache
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
    for _ in range(runs):
        for name, cmd in variants.items():
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            line = next(x for x in out.splitlines() if not x.startswith("{"))
            r, m = (float(v) for v in line.split())
            results[name].append((r, m))
    summary = {}
    for name, vals in results.items():
        summary[name] = {
            "read_gbps": statistics.median(v[0] for v in vals),
            "mmap_memcpy_gbps": statistics.median(v[1] for v in vals),
            "runs": vals,
        }
    return summary


# --------------------------------------------------------------------------- report


def plot_bandwidth(traces: dict[str, list[tuple[float, float]]], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, pts in traces.items():
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name, lw=1.2)
    ax.set_xlabel("seconds since launch")
    ax.set_ylabel("disk read MB/s")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def versions() -> dict[str, str]:
    from importlib.metadata import version

    kernel = platform.release()
    sl = subprocess.run([str(SLUICE), "--version"], capture_output=True, text=True).stdout.strip()
    return {
        "kernel": kernel,
        "python": platform.python_version(),
        "sluice": sl,
        "safetensors": version("safetensors"),
        "numpy": np.__version__,
    }


def main() -> int:
    args = parse_args()
    if os.geteuid() != 0:
        print("bench-warm needs root (fanotify, cgroups, drop_caches)", file=sys.stderr)
        return 2
    root = Path(args.data)
    model = make_model(root, args.size_gib)
    size = model_bytes(model)
    templates = root / "templates"
    dev = block_device(model)
    backends, scenarios = args.backends, args.scenarios
    share = int(size * args.constrained_fraction)
    limits = {}
    if "constrained" in scenarios:
        for backend in backends:
            base = footprint(model, backend, args.init_seconds)
            limits[backend] = base + share
            print(f"{backend}: loader footprint {base / GIB:.2f} GiB", flush=True)
    print(f"model {model}: {size / GIB:.2f} GiB; model share {share / GIB:.2f} GiB", flush=True)
    # SIGTERM unwinds like Ctrl-C, so the page-reporting setting is put back.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with page_cache.free_page_reporting_off(
        args.keep_page_reporting, prime_bytes(size)
    ) as memory_note:
        print(memory_note, flush=True)
        runs, traces, over = measure(args, model, templates, dev, limits)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pngs = []
    for scenario, tr in traces.items():
        png = out / f"bench-warm-{scenario}.png"
        plot_bandwidth(tr, f"disk read bandwidth, {scenario} memory, mmap loader", png)
        pngs.append(png.name)
    write_report(args, model, size, limits, runs, over, pngs, out, memory_note)
    return 0


def prime_bytes(model_size: int) -> int:
    """Memory to touch before the runs: twice the model, at most half of what is available."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return min(2 * model_size, int(line.split()[1]) * 1024 // 2)
    return 0


def measure(
    args: argparse.Namespace,
    model: Path,
    templates: Path,
    dev: str | None,
    limits: dict[str, int],
) -> tuple[list[dict[str, Any]], dict[str, dict[str, list[tuple[float, float]]]], Any]:
    """Records the templates, runs every round, then the overhead benchmark."""
    backends, policies, scenarios = args.backends, args.policies, args.scenarios
    for backend in backends:
        drop_caches()
        warm_run([], model, backend, args.init_seconds, None, templates, record=True)
    runs: list[dict[str, Any]] = []
    traces: dict[str, dict[str, list[tuple[float, float]]]] = {s: {} for s in scenarios}
    for rnd in range(args.runs):
        for scenario in scenarios:
            memory, startup, only = SCENARIOS[scenario]
            here = [p for p in policies if only is None or p.removesuffix(BASELINE) in only]
            for backend in backends:
                # Each round starts one policy later: no policy always runs right after
                # the same one (measured: the run after native's full cold read was favoured).
                turn = rnd % len(here)
                for policy in here[turn:] + here[:turn]:
                    drop_caches()
                    lim = limits[backend] if memory == "constrained" else None
                    with DiskSampler(dev) as sampler:
                        flags = POLICIES[policy.removesuffix(BASELINE)]
                        binary = Path(args.baseline_bin) if BASELINE in policy else SLUICE
                        r = warm_run(
                            flags,
                            model,
                            backend,
                            args.init_seconds,
                            lim,
                            templates,
                            binary=binary,
                            startup=startup,
                        )
                    r.update(scenario=scenario, backend=backend, policy=policy, round=rnd)
                    runs.append(r)
                    if rnd == 0 and backend == "mmap":
                        traces[scenario][policy] = sampler.points
                    print(
                        f"[{rnd + 1}/{args.runs}] {scenario:<11} {backend:<5} {policy:<24}"
                        f" end-to-end {r['end_to_end_s']:6.2f} s  load {r['load_s']:6.2f} s",
                        flush=True,
                    )
    over = None if args.skip_overhead else overhead(Path(args.data), 5)
    return runs, traces, over


def write_report(args, model, size, limits, runs, over, pngs, out: Path, memory_note: str) -> None:
    def med(sc: str, be: str, po: str, key: str) -> float:
        vals = [r[key] for r in runs if (r["scenario"], r["backend"], r["policy"]) == (sc, be, po)]
        return statistics.median(vals) if vals else float("nan")

    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    v = versions()
    lines = [
        f"### Warm page cache ({now[:10]})",
        "",
        f"Date: {now}. Machine: {platform.machine()}, kernel {v['kernel']}, 1 NUMA node.",
        f"Model: {size / GIB:.2f} GiB bfloat16, 4 shards ({model});"
        f" consumer init {args.init_seconds} s; constrained limits "
        + ", ".join(f"{b} {x / GIB:.2f} GiB" for b, x in limits.items())
        + f" (loader footprint + {args.constrained_fraction} of the model).",
        f"Versions: {', '.join(f'{k} {x}' for k, x in v.items())}.",
        f"Memory: {memory_note}.",
        f"Command: `python benches/bench_warm.py --runs {args.runs}`. Medians of {args.runs}"
        " interleaved runs, cold page cache each.",
        "",
    ]
    scenarios = sorted({r["scenario"] for r in runs}, key=list(SCENARIOS).index)
    backends = sorted({r["backend"] for r in runs})
    policies = list(dict.fromkeys(r["policy"] for r in runs))
    for sc in scenarios:
        for be in backends:
            memory, startup, _ = SCENARIOS[sc]
            lines += [
                f"#### {memory} memory, {startup} start-up, {be} loader",
                "",
                "| policy | end-to-end s | load phase s | end-to-end vs native | load vs native |",
                "|---|---:|---:|---:|---:|",
            ]
            n_e2e, n_load = med(sc, be, "native", "end_to_end_s"), med(sc, be, "native", "load_s")
            for po in policies:
                if not any(r["policy"] == po and r["scenario"] == sc for r in runs):
                    continue
                e2e, load = med(sc, be, po, "end_to_end_s"), med(sc, be, po, "load_s")
                lines.append(
                    f"| {po} | {e2e:.2f} | {load:.2f} | {n_e2e / e2e:.2f}x | {n_load / load:.2f}x |"
                )
            lines.append("")
    targets = []

    def target(name: str, ok: bool, measured: str) -> None:
        targets.append(f"| {name} | {measured} | {'PASS' if ok else 'MISS'} |")

    for be in backends:
        for sc, need in (("enough", 1.8), ("constrained", 1.3)):
            if sc not in scenarios:
                continue
            nl, tl = med(sc, be, "native", "load_s"), med(sc, be, "template", "load_s")
            ratio = nl / tl
            target(f"{sc}, {be}: template load ≥ {need}x native", ratio >= need, f"{ratio:.2f}x")
            te = med(sc, be, "template", "end_to_end_s")
            others = ("native", "eager") if sc == "enough" else ("eager", "precache")
            oe = [med(sc, be, o, "end_to_end_s") for o in others]
            shown = " / ".join(f"{x:.2f}" for x in oe)
            target(
                f"{sc}, {be}: template end-to-end < {' and '.join(others)}",
                all(te < x for x in oe),
                f"{te:.2f} vs {shown} s",
            )
        if "enough-reads" in scenarios:
            # A start-up that reads must not pay for replay from launch.
            te = med("enough-reads", be, "template", "end_to_end_s")
            ne = med("enough-reads", be, "native", "end_to_end_s")
            name = f"enough-reads, {be}: template end-to-end < native"
            target(name, te < ne, f"{te:.2f} vs {ne:.2f} s")
    if over:
        base = over["no runtime"]
        lines += ["#### Runtime overhead (warm 4 GiB file, GB/s, median of 5)", "",
                  "| variant | 1 MiB read() | mmap + memcpy |", "|---|---:|---:|"]  # fmt: skip
        for name, o in over.items():
            lines.append(f"| {name} | {o['read_gbps']:.2f} | {o['mmap_memcpy_gbps']:.2f} |")
            if name == "runtime, no-op policy":
                rr = o["read_gbps"] / base["read_gbps"]
                mm = o["mmap_memcpy_gbps"] / base["mmap_memcpy_gbps"]
                ok = rr >= 0.95 and mm >= 0.95
                target(f"{name}: ≤ 5% cost", ok, f"read {rr:.2f}x, mmap {mm:.2f}x")
        lines.append("")
    tpl = sorted((Path(args.data) / "templates").glob("*.sluicetpl"))
    if tpl:
        worst = max(p.stat().st_size for p in tpl) / (size / GIB)
        target("template ≤ 1 KiB per GiB of model", worst <= 1024, f"{worst:.0f} B/GiB")
    lines += ["#### Targets", "", "| target | measured | result |", "|---|---|---|", *targets, ""]
    lines += [f"Bandwidth over time: {', '.join(pngs)}.", ""]
    text = "\n".join(lines)
    (out / "bench-warm.md").write_text(text)
    blob = {"runs": runs, "overhead": over, "limits": limits, "memory": memory_note}
    (out / "bench-warm.json").write_text(json.dumps(blob, indent=1))
    print(text)


if __name__ == "__main__":
    sys.exit(main())
