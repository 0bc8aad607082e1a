"""``sluice.sim`` from Python and ``sluice sim run`` with plots: rows, metrics, progress,
PNG output and the typed error of each kind of bad input."""

from __future__ import annotations

import json
import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from sim_traces import make_trace, write_oracle
from sluice import sim
from sluice.errors import ConfigError, SluiceFileNotFoundError, TraceError

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def zipf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("sim")
    return make_trace(d / "zipf.oracleGeneral", "zipf1.0", 20_000, 2_000, seed=5, unit=False)


def kv_trace(path: Path, requests: list[list[int]], input_tokens: int = 1024) -> Path:
    with open(path, "w") as f:
        for i, ids in enumerate(requests):
            line = {"timestamp": i, "input_length": input_tokens, "output_length": 1}
            f.write(json.dumps({**line, "hash_ids": ids}) + "\n")
    return path


def test_rows_cover_the_grid_and_metrics_add_up(zipf: Path) -> None:
    calls: list[tuple[int, int]] = []
    rows = sim.run(
        zipf,
        ["lru", "s3fifo(small_ratio=0.2)", "belady"],
        [0.05, 0.2],
        progress=lambda d, t: calls.append((d, t)),
    )
    assert [(r["policy"], r["fraction"]) for r in rows] == [
        (p, f) for p in ("lru", "s3fifo(small_ratio=0.2)", "belady") for f in (0.05, 0.2)
    ]
    assert calls and calls[-1] == (6, 6)
    for r in rows:
        st = r["stats"]
        assert st["requests"] == 20_000
        assert (
            st["hits"] <= st["requests"]
            and st["hit_bytes"] + st["miss_bytes"] == st["bytes_requested"]
        )
        assert r["hit_ratio"] == pytest.approx(st["hits"] / st["requests"])
        assert r["byte_hit_ratio"] == pytest.approx(st["hit_bytes"] / st["bytes_requested"])
        assert r["amplification"] == pytest.approx(st["admitted_bytes"] / st["hit_bytes"])
        assert 0.0 <= r["wasted_ratio"] <= 1.0
        assert r["capacity"] == pytest.approx(
            r["fraction"] * r["working_set_bytes"], rel=1e-6, abs=1
        )
    assert [r["oracle"] for r in rows] == [r["policy"] == "belady" for r in rows]
    by = {(r["policy"], r["fraction"]): r["hit_ratio"] for r in rows}
    for f in (0.05, 0.2):
        assert by[("belady", f)] >= by[("lru", f)]
        assert by[("lru", 0.2)] > by[("lru", 0.05)]


def test_kv_trace_sizes_blocks_from_the_model_and_scores_prefix_hits(tmp_path: Path) -> None:
    # Two requests share their first block only; the third repeats the first whole.
    path = kv_trace(tmp_path / "kv.jsonl", [[1, 2], [1, 3], [1, 2]], input_tokens=1024)
    (row,) = sim.run(path, "lru", [1.0], model="llama3-8b", block_tokens=512)
    assert row["working_set_objects"] == 3
    assert row["working_set_bytes"] == 3 * 512 * 131_072
    assert row["stats"]["hits"] == 3  # block 1 twice, block 2 once
    assert row["prefix_hit_ratio"] == pytest.approx(3 / 6)
    (count,) = sim.run(path, "lru", [1.0])  # no model: every block counts 1
    assert count["working_set_bytes"] == 3


def test_plot_writes_both_pngs(zipf: Path, tmp_path: Path) -> None:
    other = make_trace(tmp_path / "scan.oracleGeneral", "scan", 5_000, 500, seed=9)
    rows = sim.run([zipf, other], ["lru", "arc", "tinylfu"], [0.05, 0.2])
    paths = sim.plot(rows, tmp_path / "plots")
    assert [p.name for p in paths] == ["hit_ratio.png", "pareto.png"]
    for p in paths:
        assert p.read_bytes()[:8] == PNG_MAGIC and p.stat().st_size > 10_000
    with pytest.raises(ValueError, match="no rows"):
        sim.plot([], tmp_path / "empty")


def study_rows(trace: str, with_oracle_key: bool = True) -> list[dict]:
    """Hand-made rows: LRU leads at the small cache, ARC at the large one, Belady beats both."""
    points = {  # (policy, fraction): (amplification, hit ratio)
        ("lru", 0.05): (1.0, 0.3),
        ("arc", 0.05): (2.0, 0.2),
        ("belady", 0.05): (0.5, 0.5),
        ("lru", 0.2): (1.0, 0.4),
        ("arc", 0.2): (None, 0.0),  # nothing hit: amplification is null in JSON
        ("belady", 0.2): (0.5, 0.7),
        ("lru", 0.5): (1.0, 0.5),
        ("arc", 0.5): (0.8, 0.6),
        ("belady", 0.5): (0.5, 0.9),
    }
    rows = []
    for (policy, fraction), (amp, hit) in points.items():
        row = {"trace": trace, "policy": policy, "fraction": fraction}
        row |= {"amplification": amp, "hit_ratio": hit}
        if with_oracle_key:  # results.json written before rows said so lack it
            row["oracle"] = policy == "belady"
        rows.append(row)
    return rows


def test_pareto_panels_are_per_fraction_with_oracles_off_the_front() -> None:
    rows = study_rows("/t/a.oracleGeneral") + study_rows("/t/b.csv", with_oracle_key=False)
    panels = sim.pareto_panels(rows)
    assert [(Path(p.trace).name, p.fraction) for p in panels] == [
        (name, f) for name in ("a.oracleGeneral", "b.csv") for f in (0.05, 0.2, 0.5)
    ]
    for panel in panels:
        assert panel.oracle == [False, False, True]
    fronts = [[panels[0].policies[i] for i in p.front] for p in panels[:3]]
    # Belady beats every policy but is no contender; each fraction has its own leader.
    assert fronts == [["lru"], ["lru"], ["arc"]]
    assert [p.front for p in panels[3:]] == [p.front for p in panels[:3]]


def test_pareto_png_has_a_panel_per_trace_and_fraction_and_one_legend(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    rows = study_rows("/t/a.oracleGeneral") + study_rows("/t/b.csv")
    fig = sim.pareto_figure(rows)
    assert len(fig.axes) == 2 * 3
    assert [ax.get_title() for ax in fig.axes[:3]] == [
        f"a.oracleGeneral, cache {f} of working set" for f in ("0.05", "0.2", "0.5")
    ]
    # Policies are named once, in the legend, not by labels beside points that overlap.
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == ["lru", "arc", "belady (oracle)", "Pareto front (no oracles)"]
    for ax in fig.axes:
        assert [t.get_text() for t in ax.texts] in ([], ["nothing hit: arc"])
    width, height = fig.get_size_inches()
    plt.close(fig)
    (_, pareto) = sim.plot(rows, tmp_path)
    image = plt.imread(pareto)
    assert image.shape[:2] == (round(height * 120), round(width * 120))
    assert image.shape[1] > 1000 and image.shape[0] > 700


def test_pareto_front_keeps_only_undominated_points() -> None:
    points = [(0.2, 0.8), (0.1, 0.6), (0.3, 0.7), (0.1, 0.5), (0.25, 0.85)]
    assert sim.pareto_front(points) == [1, 0, 4]
    assert sim.pareto_front([]) == []


def test_bad_input_raises_typed_errors_naming_the_problem(tmp_path: Path) -> None:
    with pytest.raises(SluiceFileNotFoundError, match=r"nope\.jsonl"):
        sim.run(tmp_path / "nope.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n'
        '{"timestamp": 1}\n'
    )
    with pytest.raises(TraceError, match=r"bad\.jsonl:2"):
        sim.run(bad)
    short = tmp_path / "short.oracleGeneral"
    short.write_bytes(struct.pack("<IQIq", 0, 1, 10, -1) + b"\x00" * 7)
    with pytest.raises(TraceError, match=r"short\.oracleGeneral"):
        sim.run(short)
    good = write_oracle(
        tmp_path / "g.oracleGeneral", np.array([1, 2, 1], dtype=np.uint64), np.ones(3, np.uint32)
    )
    with pytest.raises(ConfigError, match="nosuch"):
        sim.run(good, ["lru", "nosuch"])
    with pytest.raises(ConfigError, match="window"):
        sim.run(good, ["wtinylfu(window=2.0)"])
    with pytest.raises(ConfigError):
        sim.run(good, "lru", [0.0])
    with pytest.raises(ConfigError, match="llama-9000"):
        sim.run(good, "lru", format="mooncake", model="llama-9000")


def test_a_raising_progress_callback_stops_the_run(zipf: Path) -> None:
    calls = []

    def boom(done: int, total: int) -> None:
        calls.append(done)
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        sim.run(zipf, ["lru", "arc", "2q", "fifo"], [0.01, 0.1, 0.5], threads=1, progress=boom)
    assert calls == [1], "one worker stops after the replay whose callback raised"


def test_cli_run_writes_results_and_plots(tmp_path: Path) -> None:
    binary = Path(os.environ.get("SLUICE_BIN") or REPO / "target" / "release" / "sluice")
    if not binary.is_file():
        pytest.skip(f"sluice CLI not built ({binary})")
    trace = tmp_path / "kv.jsonl"
    env = {**os.environ, "SLUICE_PYTHON": str(Path(os.sys.executable))}
    gen = subprocess.run(
        [str(binary), "sim", "gen-kv", "--out", str(trace), "--requests", "1500", "--seed", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    )
    assert "1500 requests" in gen.stdout
    out = tmp_path / "res"
    done = subprocess.run(
        [
            str(binary),
            "sim",
            "run",
            "--trace",
            str(trace),
            "--model",
            "deepseek-v3",
            "--policies",
            "lru,arc,2q,s3fifo,sieve,tinylfu,belady",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    for name in ("results.json", "results.csv", "hit_ratio.png", "pareto.png"):
        assert (out / name).is_file(), (
            f"{name} missing; stdout: {done.stdout} stderr: {done.stderr}"
        )
    rows = sim.load_rows(out)
    assert len(rows) == 7 * 6
    assert {r["fraction"] for r in rows} == {0.01, 0.02, 0.05, 0.1, 0.2, 0.5}
