"""Turn bench_load.py's raw runs into medians, ratios, target checks and report files.

Per reader and pass (cold, warm) it reports the median GB/s (GB = 1e9 bytes) over successful
runs, its range, the ratio to fio's median (cold) or to the memcpy reference (warm), the peak RSS
(worst run), the RSS over the destination (peak minus the worker's baseline after imports minus
the destination tensors: what the reader itself costs in memory) and CPU seconds per GB (all
threads, timed section only; fio's whole process). Then it checks the issue's targets and writes
`bench-load.md` (a fragment for docs/benchmarks.md), `bench-load.json` (everything, raw runs
included) and `bench-load.png` (matplotlib, imported only here and optional).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from statistics import median
from typing import Any

import synth_checkpoint

GiB = 2**30
DISTRIBUTIONS = ["torch", "numpy", "safetensors", "fastsafetensors", "runai-model-streamer"]
SLUICE_READERS = ("sluice-auto", "sluice-buffered", "sluice-direct", "sluice-stream")
FIO_READERS = ("fio", "fio-file", "fio-shards")


def device_limit(summary: dict) -> tuple[str, float] | None:
    """The best fio reading (issue 12: one file, or all shards at once), as (reader, GB/s)."""
    found = [(r, _gbps(summary, "cold", r)) for r in FIO_READERS]
    found = [(r, v) for r, v in found if v is not None]
    return max(found, key=lambda rv: rv[1]) if found else None


# ---------------------------------------------------------------------------------------------
# Statistics


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """{kind: {reader: stats}} over the runs that succeeded."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["kind"], run["reader"]), []).append(run)
    summary: dict[str, dict[str, dict[str, Any]]] = {}
    for (kind, reader), group in groups.items():
        summary.setdefault(kind, {})[reader] = reader_stats(group)
    return summary


def reader_stats(group: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in group if "error" not in r]
    stats: dict[str, Any] = {"label": group[0]["label"], "runs": len(ok)}
    stats["errors"] = len(group) - len(ok)
    if not ok:
        return stats
    gbps = [r["bytes"] / r["seconds"] / 1e9 for r in ok]
    stats.update(median_gbps=median(gbps), min_gbps=min(gbps), max_gbps=max(gbps))
    stats["median_seconds"] = median(r["seconds"] for r in ok)
    stats["bytes"] = ok[0]["bytes"]
    stats["peak_rss_gib"] = max(r["maxrss_bytes"] for r in ok) / GiB
    stats["rss_over_dest_gib"] = _max_or_none(_rss_over_dest(r) for r in ok)
    stats["cpu_s_per_gb"] = median(
        r.get("cpu_timed_s", r["cpu_proc_s"]) / (r["bytes"] / 1e9) for r in ok
    )
    return stats


def _rss_over_dest(run: dict[str, Any]) -> float | None:
    if "baseline_rss_bytes" not in run:
        return None
    return (run["maxrss_bytes"] - run["baseline_rss_bytes"] - run["dest_bytes"]) / GiB


def _max_or_none(values) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _gbps(summary: dict, kind: str, reader: str) -> float | None:
    return summary.get(kind, {}).get(reader, {}).get("median_gbps")


def best_sluice(summary: dict, kind: str) -> tuple[str, float] | None:
    found = [(r, _gbps(summary, kind, r)) for r in SLUICE_READERS]
    found = [(r, v) for r, v in found if v is not None]
    return max(found, key=lambda rv: rv[1]) if found else None


# ---------------------------------------------------------------------------------------------
# Targets (issue 2: cold cache, 4 GiB, this machine kind)


def check_targets(summary: dict) -> list[dict[str, Any]]:
    """Issue 12's targets: `load_file` with the default flags against the device limit,
    Run:ai and safetensors; the stream's and the warm path's are unchanged."""
    auto = ("sluice-auto", _gbps(summary, "cold", "sluice-auto"))
    auto = auto if auto[1] is not None else None
    device = device_limit(summary)
    warm_best = best_sluice(summary, "warm")
    stream = ("sluice-stream", _gbps(summary, "cold", "sluice-stream"))
    stream = stream if stream[1] is not None else None
    rows = [
        _ratio_target(
            f"load_file (default flags) ≥ 0.9x device limit ({device[0] if device else 'fio'})",
            auto,
            device[1] if device else None,
            0.9,
        ),
        _ratio_target(
            "load_file (default flags) ≥ 0.95x Run:ai", auto, _gbps(summary, "cold", "runai"), 0.95
        ),
        _ratio_target(
            "load_file (default flags) ≥ 1.1x safetensors load_file",
            auto,
            _gbps(summary, "cold", "st-load-file"),
            1.1,
        ),
        _ratio_target("stream ≥ 0.9x device limit", stream, device[1] if device else None, 0.9),
        _stream_rss_target(summary),
        _ratio_target(
            "warm: Sluice best ≥ 0.8x memcpy", warm_best, _gbps(summary, "warm", "memcpy"), 0.8
        ),
    ]
    return rows


def _ratio_target(
    name: str, best: tuple[str, float] | None, base: float | None, want: float
) -> dict[str, Any]:
    if best is None or not base:
        return {"target": name, "measured": "n/a (reader not run)", "status": "n/a"}
    ratio = best[1] / base
    measured = f"{ratio:.2f}x ({best[0]} {best[1]:.2f} GB/s vs {base:.2f})"
    return {"target": name, "value": ratio, "measured": measured, "status": _status(ratio >= want)}


def _stream_rss_target(summary: dict) -> dict[str, Any]:
    name = "sluice stream RSS over destination ≤ 0.7 GiB"
    over = summary.get("cold", {}).get("sluice-stream", {}).get("rss_over_dest_gib")
    if over is None:
        return {"target": name, "measured": "n/a (reader not run)", "status": "n/a"}
    return {
        "target": name,
        "value": over,
        "measured": f"{over:.2f} GiB",
        "status": _status(over <= 0.7),
    }


def _status(ok: bool) -> str:
    return "PASS" if ok else "MISS"


# ---------------------------------------------------------------------------------------------
# Machine and versions


def collect_meta(index: Path, readers: list[str], cache_dropped: bool) -> dict[str, Any]:
    stamp = json.loads((index.parent / synth_checkpoint.STAMP_NAME).read_text())
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "machine": machine(index.parent),
        "versions": versions(),
        "checkpoint": {"path": str(index), **stamp},
        "readers": readers,
        "cache_dropped": cache_dropped,
    }


def machine(data_dir: Path) -> dict[str, Any]:
    mem_kib = int(_grep_first("/proc/meminfo", "MemTotal:").split()[1])
    return {
        "nproc": os.cpu_count(),
        "cpu": _grep_first("/proc/cpuinfo", "model name").partition(":")[2].strip(),
        "ram_gib": round(mem_kib / 2**20, 1),
        "kernel": platform.release(),
        "fs": " on ".join(
            _command(["findmnt", "-n", "-o", "FSTYPE,SOURCE", "--target", str(data_dir)]).split()
        ),
    }


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in [*DISTRIBUTIONS, "sluice"]:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    out["fio"] = _command(["fio", "--version"])
    return out


def _grep_first(path: str, prefix: str) -> str:
    try:
        with open(path) as f:
            return next((ln for ln in f if ln.startswith(prefix)), "")
    except OSError:
        return ""


def _command(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# ---------------------------------------------------------------------------------------------
# Rendering


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _ratio(value: float | None, base: float | None) -> str:
    return "-" if value is None or not base else f"{value / base:.2f}"


def table(summary: dict, kind: str, base_reader: str, base_name: str) -> list[str]:
    rows = summary.get(kind, {})
    base = rows.get(base_reader, {}).get("median_gbps")
    lines = [
        (
            f"| reader | GB/s (median) | range | ratio to {base_name} | peak RSS GiB "
            "| RSS over destination GiB | CPU s/GB | runs |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in rows.values():
        gbps = s.get("median_gbps")
        spread = f"{s['min_gbps']:.2f}-{s['max_gbps']:.2f}" if gbps is not None else "failed"
        peak = "-" if s.get("rss_over_dest_gib") is None else _fmt(s.get("peak_rss_gib"))
        runs = f"{s['runs']}" + (f" ({s['errors']} failed)" if s["errors"] else "")
        lines.append(
            f"| {s['label']} | {_fmt(gbps)} | {spread} | {_ratio(gbps, base)} | {peak} "
            f"| {_fmt(s.get('rss_over_dest_gib'))} | {_fmt(s.get('cpu_s_per_gb'))} | {runs} |"
        )
    return lines


def header_lines(meta: dict[str, Any]) -> list[str]:
    m, v, ck = meta["machine"], meta["versions"], meta["checkpoint"]
    shape = ck["shape"]
    machine_line = (
        f"Date: {meta['date']}. Machine: {m['nproc']} CPUs ({m['cpu']}), {m['ram_gib']} GiB RAM, "
        f"Linux {m['kernel']}, {m['fs']}."
    )
    checkpoint_line = (
        f"Checkpoint: {ck['total_size'] / 1e9:.2f} GB in {ck['params']['shards']} shards, "
        f"{ck['params']['dtype']}, Llama-like (hidden {shape['hidden']}, intermediate "
        f"{shape['intermediate']}, vocab {shape['vocab']}, layers {shape['layers']})."
    )
    opts = meta.get("sluice_opts")
    command_line = f"Command: `{meta['command']}`" + (f", Sluice options {opts}." if opts else ".")
    versions_line = "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + "."
    memory = [f"Memory: {meta['memory_note']}."] if meta.get("memory_note") else []
    return [machine_line, checkpoint_line, versions_line, command_line, *memory]


def busy_warning(meta: dict[str, Any], runs: list[dict[str, Any]]) -> list[str]:
    """A warning line when the 1-minute load average exceeded half the CPUs during the runs."""
    peak = max((r.get("loadavg_1m", 0.0) for r in runs), default=0.0)
    if peak <= meta["machine"]["nproc"] / 2:
        return []
    return [
        f"**WARNING: the machine was busy (1-minute load average up to {peak:.1f} on "
        f"{meta['machine']['nproc']} CPUs); these numbers are noisy.**",
        "",
    ]


def render_markdown(
    meta: dict[str, Any], runs: list[dict[str, Any]], summary: dict, targets: list[dict[str, Any]]
) -> str:
    cold_note = "" if meta["cache_dropped"] else " — WARNING: page cache NOT dropped (not root)"
    lines = [f"### Load throughput ({meta['date'][:10]})", "", *header_lines(meta), ""]
    lines += busy_warning(meta, runs)
    if "cold" in summary:
        device = device_limit(summary)
        base = device[0] if device else "fio"
        lines += [f"#### Cold page cache{cold_note}", "", f"Device limit: {base}.", ""]
        lines += [*table(summary, "cold", base, "device limit"), ""]
    if "warm" in summary:
        lines += ["#### Warm page cache", "", *table(summary, "warm", "memcpy", "memcpy"), ""]
    lines += ["#### Targets", "", "| target | measured | result |", "|---|---|---|"]
    lines += [f"| {t['target']} | {t['measured']} | {t['status']} |" for t in targets]
    return "\n".join(lines) + "\n"


def write_png(summary: dict, path: Path) -> bool:
    """Median GB/s per reader, cold and warm side by side, fio as a line; False if no matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipping the plot (pip install matplotlib)")
        return False
    both = dict.fromkeys([*summary.get("cold", {}), *summary.get("warm", {})])
    readers = [r for r in both if r not in FIO_READERS]
    fig, ax = plt.subplots(figsize=(10, 5))
    for i, kind in enumerate(["cold", "warm"]):
        values = [_gbps(summary, kind, r) or 0 for r in readers]
        ax.bar([x + (i - 0.5) * 0.4 for x in range(len(readers))], values, 0.4, label=kind)
    if (device := device_limit(summary)) is not None:
        ax.axhline(
            device[1],
            color="black",
            linestyle="--",
            label=f"device limit ({device[0]}) {device[1]:.2f} GB/s",
        )
    labels = [_label(summary, r) for r in readers]
    ax.set_xticks(range(len(readers)), labels, rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("GB/s (median)")
    ax.set_title("Checkpoint load throughput into preallocated CPU tensors")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _label(summary: dict, reader: str) -> str:
    for kind in ("cold", "warm"):
        if reader in summary.get(kind, {}):
            return summary[kind][reader]["label"]
    return reader


# ---------------------------------------------------------------------------------------------
# The report


@dataclass
class Report:
    meta: dict[str, Any]
    runs: list[dict[str, Any]]
    summary: dict
    targets: list[dict[str, Any]]
    markdown: str

    def write(self, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "bench-load.md").write_text(self.markdown)
        doc = {"meta": self.meta, "summary": self.summary, "targets": self.targets}
        doc["runs"] = self.runs
        (out_dir / "bench-load.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
        written = ["bench-load.md", "bench-load.json"]
        if write_png(self.summary, out_dir / "bench-load.png"):
            written.append("bench-load.png")
        print(f"wrote {', '.join(str(out_dir / w) for w in written)}")


def build(meta: dict[str, Any], runs: list[dict[str, Any]]) -> Report:
    summary = summarize(runs)
    targets = check_targets(summary)
    return Report(meta, runs, summary, targets, render_markdown(meta, runs, summary, targets))
