"""Cache-policy studies: replay traces through Sluice's policies, plot the results.

    from sluice import sim
    rows = sim.run("kv.jsonl", policies=["lru", "arc", "tinylfu", "belady"], model="llama3-8b")
    sim.plot(rows, "out/")          # out/hit_ratio.png, out/pareto.png

The replay runs in Rust on every core, with the GIL released, through the policy code of
``crates/sluice-policy``, which the KV store (coming) will use too. Each row is a dict with the
trace, the policy spec, the cache fraction and capacity, and hit_ratio, byte_hit_ratio,
amplification (admitted bytes per hit byte), fetch_amplification (miss bytes per hit byte),
wasted_ratio, prefix_hit_ratio (KV traces), evictions and mreq_per_s; ``row["stats"]`` holds the
raw counters. docs/sim.md defines each.

``python -m sluice.sim plot DIR`` draws the plots for a ``sluice sim run --out DIR``.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Optional, Union

from . import _sluice

PathLike = Union[str, "os.PathLike[str]"]

# A study's defaults come from the Rust StudyConfig, where ``sluice sim run`` takes its own.
_DEFAULTS = _sluice.sim_defaults()
DEFAULT_POLICIES: tuple[str, ...] = tuple(_DEFAULTS["policies"])
DEFAULT_FRACTIONS: tuple[float, ...] = tuple(_DEFAULTS["fractions"])


def run(
    traces: Union[PathLike, Sequence[PathLike]],
    policies: Union[str, Iterable[str]] = DEFAULT_POLICIES,
    fractions: Iterable[float] = DEFAULT_FRACTIONS,
    *,
    count_mode: bool = _DEFAULTS["count_mode"],
    threads: int = _DEFAULTS["threads"],
    format: str = _DEFAULTS["format"],
    csv_columns: Optional[str] = None,
    model: Optional[str] = None,
    block_tokens: int = _DEFAULTS["block_tokens"],
    progress: Optional[Callable[[int, int], None]] = None,
) -> list[dict[str, Any]]:
    """Replays each trace through each policy at each cache fraction of its working set.

    ``policies`` are specs such as ``"lru"`` or ``"s3fifo(small_ratio=0.2)"`` (a list, or one
    comma-separated string). ``count_mode`` sizes every object 1 (capacity in objects).
    ``format`` is ``auto`` (by extension), ``oracle``, ``csv`` or ``mooncake``; ``model`` and
    ``block_tokens`` size KV blocks. ``progress(done, total)`` is called after each replay.
    The defaults are the Rust ``StudyConfig``'s, which ``sluice sim run``'s flags default to too.
    Raises ``TraceError`` for a malformed trace (naming file, line and field) or an empty one,
    ``ConfigError`` for an unknown policy, a bad parameter or option (all checked before any
    trace is read), ``FileNotFoundError`` for a missing trace. ``sluice sim run`` runs the same
    Rust study function, so it accepts and rejects the same studies.
    """
    if isinstance(traces, (str, os.PathLike)):
        traces = [traces]
    specs = policies if isinstance(policies, str) else ",".join(policies)
    raw = _sluice.sim_run(
        [os.fspath(t) for t in traces],
        specs,
        [float(f) for f in fractions],
        bool(count_mode),
        int(threads),
        format,
        csv_columns,
        model,
        int(block_tokens),
        progress,
    )
    return json.loads(raw)


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats: higher hit ratio and lower amplification.

    ``points`` are ``(amplification, hit_ratio)``; the result is sorted by amplification.
    """
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best_hit = [], -math.inf
    for i in order:
        if points[i][1] > best_hit:
            front.append(i)
            best_hit = points[i][1]
    return front


def load_rows(out_dir: PathLike) -> list[dict[str, Any]]:
    """The rows of a ``sluice sim run --out DIR``."""
    with open(Path(out_dir) / "results.json") as f:
        return json.load(f)["rows"]


def plot(rows: Sequence[dict[str, Any]], out_dir: PathLike) -> list[Path]:
    """Draws ``hit_ratio.png`` and ``pareto.png`` (one panel per trace) into ``out_dir``.

    hit_ratio.png: hit ratio against cache fraction (log scale), a line per policy.
    pareto.png: each policy's mean hit ratio against its mean amplification over the
    fractions, with the Pareto front (no policy both hits more and amplifies less) marked.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rows:
        raise ValueError("sluice.sim.plot: no rows to plot")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    paths = [out / "hit_ratio.png", out / "pareto.png"]

    fig, axes = plt.subplots(1, len(traces), figsize=(6 * len(traces), 4.5), squeeze=False)
    for ax, trace in zip(axes[0], traces):
        for policy in policies:
            mine = sorted(
                (r["fraction"], r["hit_ratio"])
                for r in rows
                if r["trace"] == trace and r["policy"] == policy
            )
            ax.plot(*zip(*mine), marker="o", label=policy)
        ax.set_xscale("log")
        ax.set_xlabel("cache size (fraction of working set)")
        ax.set_ylabel("hit ratio")
        ax.set_title(Path(trace).name, fontsize=9)
        ax.grid(True, alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(paths[0], dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(traces), figsize=(6 * len(traces), 4.5), squeeze=False)
    for ax, trace in zip(axes[0], traces):
        means = []
        for policy in policies:
            mine = [r for r in rows if r["trace"] == trace and r["policy"] == policy]
            # JSON has no infinity: a row where nothing hit carries null.
            amps = [_amplification(r) for r in mine]
            finite = [a for a in amps if math.isfinite(a)]
            amp = sum(finite) / len(finite) if finite else math.inf
            means.append((amp, sum(r["hit_ratio"] for r in mine) / len(mine)))
        front = [i for i in pareto_front(means) if math.isfinite(means[i][0])]
        for i, policy in enumerate(policies):
            if not math.isfinite(means[i][0]):
                continue  # nothing ever hit: no finite amplification to place
            ax.scatter(*means[i], s=60 if i in front else 30, zorder=3)
            ax.annotate(policy, means[i], textcoords="offset points", xytext=(5, 4), fontsize=8)
        if front:
            ax.plot(*zip(*[means[i] for i in front]), "k--", lw=1, label="Pareto front")
        ax.set_xlabel("amplification (admitted bytes / hit bytes, mean over fractions)")
        ax.set_ylabel("hit ratio (mean over fractions)")
        ax.set_title(Path(trace).name, fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(paths[1], dpi=120)
    plt.close(fig)
    return paths


def _amplification(row: dict[str, Any]) -> float:
    value = row.get("amplification")
    return math.inf if value is None else float(value)


def _main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "plot":
        print("usage: python -m sluice.sim plot DIR", file=sys.stderr)
        return 2
    for path in plot(load_rows(argv[1]), argv[1]):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

__all__ = ["DEFAULT_FRACTIONS", "DEFAULT_POLICIES", "load_rows", "pareto_front", "plot", "run"]
