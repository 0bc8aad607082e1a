"""bench_kv.py's runs -> medians, ratios, the issue's targets, and bench-kv.{md,json,png}.

Per block size and system, every number is the median over the rounds that succeeded. Then:
- the device limit: the best of fio's random-read configs and every peer's load (any stream
  count), all medians from this run (issue 13's definition);
- the store baseline: the best of fio's write and every peer's durable store;
- the best peer: the fastest non-Sluice system at the same stream count.
A peer that returned wrong bytes or failed in every round takes no part in any of these.
"""

from __future__ import annotations

import json
import platform
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from statistics import median
from typing import Any

import bench_report

from . import SYSTEMS

Pair = tuple[str, float]


def _size_name(block_bytes: int) -> str:
    for unit, n in (("MiB", 2**20), ("KiB", 2**10)):
        if block_bytes % n == 0:
            return f"{block_bytes // n} {unit}"
    return f"{block_bytes} B"


def _med(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return median(present) if present else None


def _dig(run: dict[str, Any], *path: str) -> Any:
    for key in path:
        if not isinstance(run, dict) or key not in run:
            return None
        run = run[key]
    return run


# ---------------------------------------------------------------------------------------------
# Statistics


def system_stats(name: str, group: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in group if "error" not in r]
    spec = SYSTEMS[name]
    stats: dict[str, Any] = {"label": spec.label, "tier": spec.tier, "runs": len(ok)}
    stats["errors"] = [r["error"] for r in group if "error" in r]
    stats["wrong_bytes"] = any(r.get("wrong_bytes") for r in group)
    if not ok:
        return stats
    stats["durability"] = ok[0].get("durability")
    stats["store_gbps"] = _med([_dig(r, "store", "gbps") for r in ok])
    stats["load"], stats["latency"] = {}, {}
    for s in ok[0].get("load", {}):
        stats["load"][s] = {
            k: _med([_dig(r, "load", s, key) for r in ok])
            for k, key in (("gbps", "gbps"), ("req_p50_ms", "p50_ms"), ("req_p99_ms", "p99_ms"))
        }
        stats["latency"][s] = {
            k: _med([_dig(r, "latency", s, k) for r in ok]) for k in ("p50_ms", "p99_ms")
        }
        stats["latency"][s]["blocks"] = _dig(ok[0], "latency", s, "blocks")
    extra_keys = (
        "lookup_us",
        "lookup_us_p99",
        "lookup_nolease_us",
        "lookup_native_us",
        "index_bytes_per_block",
    )
    stats["extra"] = {k: _med([_dig(r, "extra", k) for r in ok]) for k in extra_keys}
    stats["extra"]["index_bytes_per_budget_block"] = _med(
        [_dig(r, "extra", "index_bytes_per_budget_block") for r in ok]
    )
    stats["cpu_s"] = _med([r.get("cpu_s") for r in ok])
    stats["maxrss_gib"] = max(r.get("maxrss_gib", 0) for r in ok)
    return stats


def fio_stats(group: list[dict[str, Any]]) -> dict[str, Any]:
    configs = dict.fromkeys(k for r in group for k in r if k.startswith(("write", "randread")))
    out: dict[str, Any] = {"errors": [r["error"] for r in group if "error" in r]}
    for c in configs:
        out[c] = {k: _med([_dig(r, c, k) for r in group]) for k in ("gbps", "p50_ms", "p99_ms")}
    return out


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    groups: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for r in runs:
        groups.setdefault(r["block_bytes"], {}).setdefault(r["system"], []).append(r)
    summary: dict[str, Any] = {}
    for block_bytes, by_system in groups.items():
        entry: dict[str, Any] = {"block_bytes": block_bytes, "systems": {}}
        for name, group in by_system.items():
            if name == "fio":
                entry["fio"] = fio_stats(group)
            else:
                entry["systems"][name] = system_stats(name, group)
                entry.setdefault("gib", {})[SYSTEMS[name].tier] = group[0].get("gib")
        entry.update(limits(entry))
        summary[_size_name(block_bytes)] = entry
    return summary


def _peers(entry: dict[str, Any], tier: str) -> dict[str, dict[str, Any]]:
    return {
        n: s
        for n, s in entry["systems"].items()
        if s["tier"] == tier and not SYSTEMS[n].is_sluice and s["runs"] and not s["wrong_bytes"]
    }


def _best(pairs: list[tuple[str, float | None]], lowest: bool = False) -> Pair | None:
    present = [(n, v) for n, v in pairs if v is not None]
    if not present:
        return None
    return (min if lowest else max)(present, key=lambda p: p[1])


def limits(entry: dict[str, Any]) -> dict[str, Any]:
    fio_runs = entry.get("fio", {})
    reads = [(f"fio {c}", v["gbps"]) for c, v in fio_runs.items() if c.startswith("randread")]
    writes = [(f"fio {c}", v["gbps"]) for c, v in fio_runs.items() if c.startswith("write")]
    peers = _peers(entry, "ssd")
    peer_loads = [
        (f"{n} ({_streams(s)})", v["gbps"]) for n, p in peers.items() for s, v in p["load"].items()
    ]
    out: dict[str, Any] = {
        "device_limit": _best(reads + peer_loads),
        "store_limit": _best(writes + [(n, p["store_gbps"]) for n, p in peers.items()]),
        "best_peer_load": {},
        "best_peer_p99": {},
    }
    streams = {s for p in peers.values() for s in p["load"]}
    for s in sorted(streams, key=int):
        out["best_peer_load"][s] = _best(
            [(n, _dig(p, "load", s, "gbps")) for n, p in peers.items()]
        )
        out["best_peer_p99"][s] = _best(
            [(n, _dig(p, "latency", s, "p99_ms")) for n, p in peers.items()], lowest=True
        )
    return out


# ---------------------------------------------------------------------------------------------
# Targets (issue 13)


def _row(name: str, value: float | None, base: Pair | None, want: float, ratio_text: str) -> dict:
    if value is None or base is None or not base[1]:
        return {"target": name, "measured": "n/a (not measured in this run)", "status": "n/a"}
    ratio = value / base[1]
    measured = f"{ratio:.2f}x ({ratio_text.format(v=value)} vs {base[1]:.2f}, {base[0]})"
    return {"target": name, "value": ratio, "measured": measured, "status": _status(ratio >= want)}


def _status(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _top_streams(entry: dict[str, Any]) -> str | None:
    s = _dig(entry, "systems", "sluice", "load")
    return max(s, key=int) if s else None


def check_targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for size, e in summary.items():
        sl = e["systems"].get("sluice", {})
        top = _top_streams(e)
        load = _dig(sl, "load", top, "gbps") if top else None
        if e["block_bytes"] >= 2 << 20:
            rows.append(
                _row(
                    f"{size}: SSD load, {top} streams ≥ 0.95x device limit",
                    load,
                    e["device_limit"],
                    0.95,
                    "{v:.2f} GB/s",
                )
            )
        if e["block_bytes"] == 256 << 10:
            rows.append(
                _row(
                    f"{size}: SSD load, {top} streams ≥ 1.5x best peer",
                    load,
                    e["best_peer_load"].get(top),
                    1.5,
                    "{v:.2f} GB/s",
                )
            )
        p99 = _dig(sl, "latency", top, "p99_ms") if top else None
        peer = e["best_peer_p99"].get(top) if top else None
        if p99 is None or peer is None:
            rows.append(
                {
                    "target": f"{size}: per-block p99 ≤ best peer's",
                    "measured": "n/a",
                    "status": "n/a",
                }
            )
        else:
            rows.append(
                {
                    "target": f"{size}: per-block load p99, {top} streams ≤ best peer's",
                    "value": p99 / peer[1],
                    "measured": f"{p99:.2f} ms vs {peer[1]:.2f} ms ({peer[0]})",
                    "status": _status(p99 <= peer[1]),
                }
            )
        rows.append(
            _row(
                f"{size}: durable store ≥ 0.9x best of fio write and peers",
                sl.get("store_gbps"),
                e["store_limit"],
                0.9,
                "{v:.2f} GB/s",
            )
        )
        rows += dram_targets(size, e)
    rows += lookup_targets(summary)
    rows.append(
        {
            "target": "live hit ratio = sluice sim's within 0.5 points",
            "measured": "n/a here: measured by `sluice kv bench --compare-sim` (README)",
            "status": "n/a",
        }
    )
    return rows


def _streams(s: str) -> str:
    return "1 stream" if s == "1" else f"{s} streams"


def _best_load(stats: dict[str, Any] | None) -> Pair | None:
    if not stats or not stats.get("runs") or stats.get("wrong_bytes"):
        return None
    return _best([(_streams(s), v["gbps"]) for s, v in stats["load"].items()])


def dram_targets(size: str, e: dict[str, Any]) -> list[dict[str, Any]]:
    sys_ = e["systems"]
    if "sluice-dram" not in sys_:
        return []
    ours = _best_load(sys_.get("sluice-dram"))
    value = ours[1] if ours else None
    rows = []
    for peer, want in (("memcpy", 0.7), ("mooncake", 2.0)):
        base = _best_load(sys_.get(peer))
        base = (f"{peer}, {base[0]}", base[1]) if base else None
        rows.append(
            _row(
                f"{size}: DRAM hit load ≥ {want}x {peer}",
                value,
                base,
                want,
                "{v:.2f} GB/s" + (f", {ours[0]}" if ours else ""),
            )
        )
    return rows


def lookup_targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    found = [
        (size, e["systems"]["sluice"]["extra"])
        for size, e in summary.items()
        if e["systems"].get("sluice", {}).get("extra")
    ]
    lookups = [(s, x["lookup_us"]) for s, x in found if x.get("lookup_us") is not None]
    index = [
        (s, x["index_bytes_per_block"], x.get("index_bytes_per_budget_block"))
        for s, x in found
        if x.get("index_bytes_per_block")
    ]
    rows = []
    if lookups:
        size, worst = max(lookups, key=lambda p: p[1])
        rows.append(
            {
                "target": "lookup of a 1,000-key chain ≤ 100 µs (median)",
                "value": worst,
                "measured": f"{worst:.1f} µs (slowest size: {size} blocks)",
                "status": _status(worst <= 100),
            }
        )
    else:
        rows.append(
            {
                "target": "lookup of a 1,000-key chain ≤ 100 µs",
                "measured": "n/a (no size with 1,000 blocks)",
                "status": "n/a",
            }
        )
    if index:
        size, worst, per_budget = max(index, key=lambda p: p[1])
        measured = f"{worst:.1f} B per stored block (worst: {size} blocks)"
        if per_budget is not None:
            # The index is sized for the SSD budget, so a store below its budget pays more.
            measured += f"; {per_budget:.1f} B per block of the budget"
        rows.append(
            {
                "target": "index memory ≤ 64 bytes per block",
                "value": worst,
                "measured": measured,
                "status": _status(worst <= 64),
            }
        )
    return rows


# ---------------------------------------------------------------------------------------------
# Machine and versions


PEER_DISTRIBUTIONS = ["lmcache", "mooncake-transfer-engine-non-cuda", "torch", "numpy"]


def collect_meta(args: Any, memory_note: str, cache_dropped: bool) -> dict[str, Any]:
    versions = {"python": platform.python_version()}
    for dist in ("numpy", "sluice"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = _sluice_version() if dist == "sluice" else "not installed"
    versions["fio"] = bench_report._command(["fio", "--version"])
    code = (
        "import json, importlib.metadata as m\n"
        "def v(d):\n try: return m.version(d)\n except Exception: return 'not installed'\n"
        f"print(json.dumps({{d: v(d) for d in {PEER_DISTRIBUTIONS!r}}}))"
    )
    peers = bench_report._command([args.peers_python, "-c", code])
    try:
        versions.update({f"peers: {k}": val for k, val in json.loads(peers).items()})
    except ValueError:
        versions["peers"] = "no .venv-kvpeers"
    return {
        "date": args.started,
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "machine": bench_report.machine(args.data.parent),
        "versions": versions,
        "cache_dropped": cache_dropped,
        "memory_note": memory_note,
        "params": {
            "batch_blocks": args.batch,
            "streams": args.streams,
            "runs": args.runs,
            "latency_blocks": args.latency_blocks,
            "dram_gib": args.dram_gib,
            "fio_runtime_s": args.fio_runtime,
        },
    }


def _sluice_version() -> str:
    try:
        import sluice

        return getattr(sluice, "__version__", "unknown (PYTHONPATH)")
    except ImportError:
        return "not installed"


# ---------------------------------------------------------------------------------------------
# Rendering


def _f(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _ratio(value: float | None, base: Pair | None) -> str:
    return "-" if value is None or not base or not base[1] else f"{value / base[1]:.2f}"


def _pair(a: float | None, b: float | None) -> str:
    return "-" if a is None else f"{a:.2f} / {_f(b)}"


def _failed(s: dict[str, Any]) -> str:
    why = "WRONG BYTES" if s["wrong_bytes"] else "failed"
    return f"{why}: {s['errors'][0] if s['errors'] else 'no result'}".replace("|", "/")


def ssd_table(e: dict[str, Any]) -> list[str]:
    streams = sorted({s for st in e["systems"].values() for s in st.get("load", {})}, key=int)
    top = streams[-1] if streams else "4"
    head = ["system", "store GB/s", "store ÷ best write"]
    head += [f"load {s} str. GB/s" for s in streams]
    head += [
        f"{top} str. ÷ device limit",
        f"{top} str. ÷ best peer",
        f"request p50 / p99 ms ({top} str.)",
    ]
    head += [f"per-block p50 / p99 ms ({s} str.)" for s in streams] + ["runs"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for s in e["systems"].values():
        if s["tier"] != "ssd":
            continue
        if not s["runs"] or s["wrong_bytes"]:
            lines.append(f"| {s['label']} | {_failed(s)} |" + " |" * (len(head) - 2))
            continue
        load = s["load"]
        top_gbps = _dig(load, top, "gbps")
        cells = [s["label"], _f(s["store_gbps"]), _ratio(s["store_gbps"], e["store_limit"])]
        cells += [_f(_dig(load, x, "gbps")) for x in streams]
        cells += [
            _ratio(top_gbps, e["device_limit"]),
            _ratio(top_gbps, e["best_peer_load"].get(top)),
        ]
        cells.append(_pair(_dig(load, top, "req_p50_ms"), _dig(load, top, "req_p99_ms")))
        cells += [
            _pair(_dig(s, "latency", x, "p50_ms"), _dig(s, "latency", x, "p99_ms")) for x in streams
        ]
        errors = f" ({len(s['errors'])} failed)" if s["errors"] else ""
        cells.append(f"{s['runs']}{errors}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def fio_table(e: dict[str, Any]) -> list[str]:
    f = e.get("fio")
    if not f:
        return []
    lines = ["| fio (O_DIRECT, io_uring) | GB/s | p50 / p99 ms |", "|---|---:|---:|"]
    for c, v in f.items():
        if c != "errors":
            lines.append(f"| {c} | {_f(v['gbps'])} | {_pair(v.get('p50_ms'), v.get('p99_ms'))} |")
    lines += [f"| failed | {err} | |" for err in f["errors"]]
    return lines


def dram_table(e: dict[str, Any]) -> list[str]:
    rows = {n: s for n, s in e["systems"].items() if s["tier"] == "dram"}
    if not rows:
        return []
    streams = sorted({s for st in rows.values() for s in st.get("load", {})}, key=int)
    memcpy, moon = _best_load(rows.get("memcpy")), _best_load(rows.get("mooncake"))
    head = ["system"] + [f"load {s} str. GB/s" for s in streams]
    head += ["best ÷ memcpy", "best ÷ Mooncake"]
    head += [f"per-block p50 / p99 ms ({s} str.)" for s in streams] + ["runs"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for s in rows.values():
        if not s["runs"] or s["wrong_bytes"]:
            lines.append(f"| {s['label']} | {_failed(s)} |" + " |" * (len(head) - 2))
            continue
        best = _best_load(s)
        cells = [s["label"]] + [_f(_dig(s, "load", x, "gbps")) for x in streams]
        cells += [
            _ratio(best[1] if best else None, memcpy),
            _ratio(best[1] if best else None, moon),
        ]
        cells += [
            _pair(_dig(s, "latency", x, "p50_ms"), _dig(s, "latency", x, "p99_ms")) for x in streams
        ]
        cells.append(str(s["runs"]))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def header_lines(meta: dict[str, Any]) -> list[str]:
    m, p = meta["machine"], meta["params"]
    return [
        f"Date: {meta['date']}. Machine: {m['nproc']} CPUs ({m['cpu']}), {m['ram_gib']} GiB RAM, "
        f"Linux {m['kernel']}, {m['fs']}.",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) + ".",
        f"Command: `{meta['command']}`.",
        f"Requests of {p['batch_blocks']} blocks; streams {p['streams']}; medians of "
        f"{p['runs']} round(s); DRAM tier on {p['dram_gib']:g} GiB; fio reads "
        f"{p['fio_runtime_s']} s per config. {meta.get('memory_note', '')}.",
    ]


DEFINITIONS = [
    "What is measured (the same calls and clocks for every system):",
    "- *store GB/s*: all bytes over the summed time of the store requests (one stream), plus a "
    "final sync for systems that do not sync themselves; blocks are generated outside the timer.",
    "- *load GB/s*: cold page cache; S threads each load a disjoint random share of the blocks "
    "in requests of `batch` blocks; all bytes over the wall time.",
    "- *request p50 / p99*: the latency of those multi-block requests.",
    "- *per-block p50 / p99*: cold again; S threads each issue single-block requests over a "
    "sample of blocks; from asking for one block to holding its bytes. Not a batch latency "
    "divided by its size.",
    "- Every loaded block's page stamps are checked; every block of the latency passes is "
    "compared byte for byte. A system that returns wrong bytes is reported, never ranked.",
]


def render_markdown(
    meta: dict[str, Any], runs: list[dict[str, Any]], summary: dict[str, Any], targets: list[dict]
) -> str:
    cold = "" if meta["cache_dropped"] else " — WARNING: page cache NOT dropped (not root)"
    lines = [f"### KV-cache block store: `make bench-kv` ({meta['date'][:10]})", ""]
    lines += [*header_lines(meta), "", *bench_report.busy_warning(meta, runs), *DEFINITIONS, ""]
    for size, e in summary.items():
        gib = e.get("gib", {})
        if "ssd" in gib:
            dl, sl = e["device_limit"], e["store_limit"]
            lines += [f"#### {size} blocks, {gib['ssd']:g} GiB, SSD tier, cold{cold}", ""]
            lines.append(
                f"Device limit: {_f(dl[1] if dl else None)} GB/s ({dl[0] if dl else 'n/a'}). "
                f"Store baseline: {_f(sl[1] if sl else None)} GB/s ({sl[0] if sl else 'n/a'})."
            )
            lines += ["", *ssd_table(e), "", *fio_table(e), ""]
            durab = [
                f"- {s['label']}: {s['durability']}"
                for s in e["systems"].values()
                if s["tier"] == "ssd" and s.get("durability")
            ]
            lines += ["Durability of an acknowledged store:", *durab, ""]
        if "dram" in gib:
            lines += [f"#### {size} blocks, {gib['dram']:g} GiB, DRAM tier (resident)", ""]
            lines += [*dram_table(e), ""]
    lines += lookup_lines(summary)
    lines += ["#### Targets (issue 13)", "", "| target | measured | result |", "|---|---|---|"]
    lines += [f"| {t['target']} | {t['measured']} | {t['status']} |" for t in targets]
    return "\n".join(lines) + "\n"


def lookup_lines(summary: dict[str, Any]) -> list[str]:
    rows = []
    for size, e in summary.items():
        x = _dig(e, "systems", "sluice", "extra")
        if x and any(v is not None for v in x.values()):
            keys = ("lookup_us", "lookup_us_p99", "lookup_nolease_us", "lookup_native_us")
            keys += ("index_bytes_per_block",)
            cells = [_f(x.get(k), ".1f") for k in (*keys, "index_bytes_per_budget_block")]
            rows.append(f"| {size} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    return [
        "#### Sluice lookup and index",
        "",
        "| block size | lookup, 1,000-key chain, median µs | p99 µs | without lease, µs "
        "| native call alone, µs | index B per stored block | index B per budget block |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
    ]


def write_png(summary: dict[str, Any], path: Path) -> bool:
    """Load GB/s per SSD system and size (bars per stream count), the device limit dashed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipping the plot", file=sys.stderr)
        return False
    sizes = [s for s, e in summary.items() if "ssd" in e.get("gib", {})]
    if not sizes:
        return False
    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 4.5), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        e = summary[size]
        names = [n for n, s in e["systems"].items() if s["tier"] == "ssd"]
        streams = sorted({s for n in names for s in e["systems"][n].get("load", {})}, key=int)
        width = 0.8 / max(1, len(streams))
        for k, s in enumerate(streams):
            values = [_dig(e["systems"][n], "load", s, "gbps") or 0 for n in names]
            xs = [x + (k - (len(streams) - 1) / 2) * width for x in range(len(names))]
            ax.bar(xs, values, width, label=f"{s} stream(s)")
        if e["device_limit"]:
            ax.axhline(
                e["device_limit"][1],
                color="black",
                linestyle="--",
                label=f"device limit {e['device_limit'][1]:.2f}",
            )
        ax.set_ylim(0, ax.get_ylim()[1] * 1.25)  # room for the legend above the bars
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        ax.set_title(f"{size} blocks, cold")
        ax.set_ylabel("load GB/s (median)")
        ax.legend(fontsize=7, loc="upper left", ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


@dataclass
class Report:
    meta: dict[str, Any]
    runs: list[dict[str, Any]]
    summary: dict[str, Any]
    targets: list[dict[str, Any]]
    markdown: str

    def write(self, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "bench-kv.md").write_text(self.markdown)
        doc = {
            "meta": self.meta,
            "summary": self.summary,
            "targets": self.targets,
            "runs": self.runs,
        }
        (out_dir / "bench-kv.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
        written = ["bench-kv.md", "bench-kv.json"]
        if write_png(self.summary, out_dir / "bench-kv.png"):
            written.append("bench-kv.png")
        print(f"wrote {', '.join(str(out_dir / w) for w in written)}", file=sys.stderr)


def build(meta: dict[str, Any], runs: list[dict[str, Any]]) -> Report:
    summary = summarize(runs)
    targets = check_targets(summary)
    return Report(meta, runs, summary, targets, render_markdown(meta, runs, summary, targets))
