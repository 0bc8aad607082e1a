"""Cache-policy studies: replay traces through Sluice's policies, plot the results.

    from sluice import sim
    rows = sim.run("kv.jsonl", policies=["lru", "arc", "tinylfu", "belady"], model="llama3-8b")
    sim.plot(rows, "out/")          # out/hit_ratio.png, out/pareto.png

``pareto.png`` has one panel per trace and cache fraction, each with its own Pareto front of
the policies a cache can run; oracles (``row["oracle"]``) are drawn apart, off the front.

The replay runs in Rust on every core, with the GIL released, through the policy code of
``crates/sluice-policy``, which the KV store (coming) will use too. Each row is a dict with the
trace, the policy spec, whether it is an oracle, the cache fraction and capacity, and
hit_ratio, byte_hit_ratio, amplification (admitted bytes per hit byte), fetch_amplification
(miss bytes per hit byte), wasted_ratio, prefix_hit_ratio (KV traces), evictions and
mreq_per_s; ``row["stats"]`` holds the raw counters. docs/sim.md defines each.

``python -m sluice.sim plot DIR`` draws the plots for a ``sluice sim run --out DIR``.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

from . import _sluice

if TYPE_CHECKING:
    from matplotlib.figure import Figure

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
    return _sluice.sim_run(
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


# Policies that read the future; rows say so themselves (``row["oracle"]``), this is for
# results.json files written before they did.
_ORACLE_NAMES = ("belady", "belady-size")
# Markers for oracles, apart from the circles of the policies a cache can run.
_ORACLE_MARKERS = ("*", "X", "P", "D")
# Panels per line of pareto.png (one per cache fraction; more fractions wrap): 3 keep the
# image under 1,500 px wide, and the default 6 fractions in two lines.
_PANELS_PER_LINE = 3
# Legend entries per line below pareto.png's panels: 5 fit under three panels.
_LEGEND_COLUMNS = 5
# Dots per inch of the saved plots: each pareto.png panel is about 470 px wide, readable
# at 8-point labels.
_DPI = 120


def is_oracle(row: dict[str, Any]) -> bool:
    """Whether a row's policy is an offline oracle (Belady): a reference, not a contender."""
    if "oracle" in row:
        return bool(row["oracle"])
    return row["policy"].split("(", 1)[0].strip() in _ORACLE_NAMES


@dataclass
class ParetoPanel:
    """One panel of ``pareto.png``: one trace at one cache fraction.

    ``points[i]`` is ``(amplification, hit_ratio)`` of ``policies[i]``; amplification is
    infinite when nothing hit. ``front`` indexes the Pareto front of the policies a cache can
    run (oracles excluded) whose amplification is finite, sorted by amplification.
    """

    trace: str
    fraction: float
    policies: list[str]
    points: list[tuple[float, float]]
    oracle: list[bool]
    front: list[int]


def pareto_panels(rows: Sequence[dict[str, Any]]) -> list[ParetoPanel]:
    """The panels of ``pareto.png``, trace by trace and fraction by fraction (ascending).

    Each cache fraction gets its own front: averaging over fractions, as ``pareto.png`` did
    before, mixes caches of different sizes into points no cache has.
    """
    panels = []
    for trace in dict.fromkeys(r["trace"] for r in rows):
        for fraction in sorted({r["fraction"] for r in rows if r["trace"] == trace}):
            mine = [r for r in rows if r["trace"] == trace and r["fraction"] == fraction]
            points = [(_amplification(r), float(r["hit_ratio"])) for r in mine]
            oracle = [is_oracle(r) for r in mine]
            runnable = [i for i, p in enumerate(points) if not oracle[i] and math.isfinite(p[0])]
            front = [runnable[j] for j in pareto_front([points[i] for i in runnable])]
            policies = [r["policy"] for r in mine]
            panels.append(ParetoPanel(trace, fraction, policies, points, oracle, front))
    return panels


def hit_ratio_figure(rows: Sequence[dict[str, Any]]) -> Figure:
    """``hit_ratio.png``: hit ratio against cache fraction (log scale), a line per policy,
    oracles dashed; one panel per trace."""
    plt = _pyplot()
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    oracles = _oracle_policies(rows)
    markers = _point_styles(policies, oracles)
    fig, axes = plt.subplots(1, len(traces), figsize=(6 * len(traces), 4.5), squeeze=False)
    for ax, trace in zip(axes[0], traces):
        for policy in policies:
            mine = sorted(
                (r["fraction"], r["hit_ratio"])
                for r in rows
                if r["trace"] == trace and r["policy"] == policy
            )
            style: dict[str, Any] = {"marker": "o", "label": policy}
            if policy in oracles:
                style = {
                    "marker": markers[policy]["marker"],
                    "ls": "--",
                    "color": "0.3",
                    "label": _label(policy, oracles),
                }
            ax.plot(*zip(*mine), **style)
        ax.set_xscale("log")
        ax.set_xlabel("cache size (fraction of working set)")
        ax.set_ylabel("hit ratio")
        ax.set_title(Path(trace).name, fontsize=9)
        ax.grid(True, alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    return fig


def pareto_figure(rows: Sequence[dict[str, Any]]) -> Figure:
    """``pareto.png``: hit ratio against amplification, one panel per trace and cache fraction
    (a trace's fractions left to right, three a line), each with its own Pareto front (see
    :func:`pareto_panels`).

    Policies keep one colour across panels and are named in one legend below the panels, not
    by labels beside their points, which overlapped. Oracles are drawn apart (grey stars or
    crosses, "(oracle)" in the legend) and kept off the front: no cache can run them.
    """
    plt = _pyplot()
    panels = pareto_panels(rows)
    traces = list(dict.fromkeys(p.trace for p in panels))
    fractions = sorted({p.fraction for p in panels})
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    oracles = _oracle_policies(rows)
    styles = _point_styles(policies, oracles)
    handles = _legend_handles(policies, oracles, styles)
    legend_rows = math.ceil(len(handles) / _LEGEND_COLUMNS)
    legend_inches = 0.3 * legend_rows + 0.2
    # Each trace takes as many lines of panels as its fractions need, _PANELS_PER_LINE a line.
    columns = min(len(fractions), _PANELS_PER_LINE)
    lines_per_trace = math.ceil(len(fractions) / columns)
    height = 3.4 * lines_per_trace * len(traces) + legend_inches
    fig, axes = plt.subplots(
        lines_per_trace * len(traces), columns, figsize=(3.9 * columns, height), squeeze=False
    )
    drawn = set()
    for panel in panels:
        line, column = divmod(fractions.index(panel.fraction), columns)
        ax = axes[traces.index(panel.trace) * lines_per_trace + line][column]
        _draw_pareto_panel(ax, panel, styles)
        drawn.add(id(ax))
    for ax in axes.flat:
        if id(ax) not in drawn:
            ax.remove()  # past the last fraction, or a trace without it (hand-made rows)
    fig.legend(
        handles=handles,
        loc="lower center",
        ncol=min(len(handles), _LEGEND_COLUMNS),
        fontsize=8,
        frameon=False,
    )
    fig.tight_layout(rect=(0, legend_inches / height, 1, 1))
    return fig


def _oracle_policies(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The oracle policies among the rows, in first-seen order."""
    return list(dict.fromkeys(r["policy"] for r in rows if is_oracle(r)))


def _label(policy: str, oracles: list[str]) -> str:
    return f"{policy} (oracle)" if policy in oracles else policy


def _point_styles(policies: list[str], oracles: list[str]) -> dict[str, dict[str, Any]]:
    """Marker and colour of each policy: circles in the colour cycle, oracles grey."""
    styles, colour = {}, 0
    for policy in policies:
        if policy in oracles:
            marker = _ORACLE_MARKERS[oracles.index(policy) % len(_ORACLE_MARKERS)]
            styles[policy] = {"marker": marker, "color": "0.35", "s": 120}
        else:
            styles[policy] = {"marker": "o", "color": f"C{colour % 10}", "s": 45}
            colour += 1
    return styles


def _legend_handles(
    policies: list[str], oracles: list[str], styles: dict[str, dict[str, Any]]
) -> list[Any]:
    from matplotlib.lines import Line2D

    handles = []
    for policy in policies:
        style = styles[policy]
        handles.append(
            Line2D(
                [],
                [],
                ls="",
                marker=style["marker"],
                color=style["color"],
                label=_label(policy, oracles),
            )
        )
    handles.append(Line2D([], [], ls="--", color="k", lw=1, label="Pareto front (no oracles)"))
    return handles


def _draw_pareto_panel(ax: Any, panel: ParetoPanel, styles: dict[str, dict[str, Any]]) -> None:
    unplaced = []
    for i, (policy, (amp, hit)) in enumerate(zip(panel.policies, panel.points)):
        if not math.isfinite(amp):
            unplaced.append(policy)  # nothing hit: no finite amplification to place
            continue
        on_front = i in panel.front
        ax.scatter(
            amp,
            hit,
            alpha=0.85,  # policies that tie stay visible under one another
            zorder=4 if panel.oracle[i] else 3,
            edgecolors="k" if on_front else "none",
            linewidths=1.2,
            **styles[policy],
        )
    if panel.front:
        ax.plot(*zip(*[panel.points[i] for i in panel.front]), "k--", lw=1, zorder=2)
    if unplaced:
        note = "nothing hit: " + ", ".join(unplaced)
        ax.text(0.98, 0.02, note, transform=ax.transAxes, ha="right", va="bottom", fontsize=7)
    ax.set_title(f"{Path(panel.trace).name}, cache {panel.fraction:g} of working set", fontsize=9)
    ax.set_xlabel("amplification (admitted bytes / hit bytes)", fontsize=8)
    ax.set_ylabel("hit ratio", fontsize=8)
    ax.tick_params(labelsize=8)
    ax.grid(True, alpha=0.3)


def plot(rows: Sequence[dict[str, Any]], out_dir: PathLike) -> list[Path]:
    """Draws ``hit_ratio.png`` (:func:`hit_ratio_figure`) and ``pareto.png``
    (:func:`pareto_figure`) into ``out_dir``; returns their paths."""
    if not rows:
        raise ValueError("sluice.sim.plot: no rows to plot")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "hit_ratio.png", out / "pareto.png"]
    plt = _pyplot()
    for path, draw in zip(paths, (hit_ratio_figure, pareto_figure)):
        fig = draw(rows)
        fig.savefig(path, dpi=_DPI)
        plt.close(fig)
    return paths


def _pyplot() -> Any:
    """matplotlib.pyplot on the file-only Agg backend (plots are written, never shown)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _amplification(row: dict[str, Any]) -> float:
    # JSON has no infinity: a row where nothing hit carries null.
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

__all__ = [
    "DEFAULT_FRACTIONS",
    "DEFAULT_POLICIES",
    "ParetoPanel",
    "hit_ratio_figure",
    "is_oracle",
    "load_rows",
    "pareto_figure",
    "pareto_front",
    "pareto_panels",
    "plot",
    "run",
]
