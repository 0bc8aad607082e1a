"""``sluice sim run`` and ``sluice.sim.run`` accept and reject the same studies.

Both fronts hand their arguments to one Rust function (``sluice_sim::study::run``). Each case
below feeds the same bad input to the CLI and to the Python API and requires the same failure:
the exit status the README documents (2 bad option, 3 malformed trace, 4 missing file) and the
matching ``sluice.errors`` exception, with the same message.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sim_traces import write_oracle
from sluice import sim
from sluice.errors import ConfigError, SluiceError, SluiceFileNotFoundError, TraceError

REPO = Path(__file__).resolve().parents[2]
# The README's exit statuses and the exception each one stands for in Python.
EXCEPTION_OF_STATUS = {2: ConfigError, 3: TraceError, 4: SluiceFileNotFoundError}
KV_LINE = '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}\n'


@dataclass
class Case:
    """One bad study: the trace file (a name under ``traces``), the options and the status."""

    trace: str
    status: int
    options: dict[str, Any] = field(default_factory=dict)


CASES = {
    "empty_kv_trace": Case("empty.jsonl", 3),
    "empty_oracle_trace": Case("empty.oracleGeneral", 3),
    "empty_csv_trace": Case("empty.csv", 3),
    "malformed_kv_trace": Case("bad.jsonl", 3),
    "missing_file": Case("nope.jsonl", 4),
    "unknown_policy": Case("good.oracleGeneral", 2, {"policies": "lru,nosuch"}),
    "bad_policy_parameter": Case("good.oracleGeneral", 2, {"policies": "s3fifo(small_ratio=2)"}),
    "no_policies": Case("good.oracleGeneral", 2, {"policies": ""}),
    "zero_fraction": Case("good.oracleGeneral", 2, {"fractions": [0.0]}),
    "fraction_above_one": Case("good.oracleGeneral", 2, {"fractions": [0.5, 1.5]}),
    "bad_csv_columns_on_a_csv_trace": Case("good.csv", 2, {"csv_columns": "id-col=0"}),
    "bad_csv_columns_on_a_kv_trace": Case("good.jsonl", 2, {"csv_columns": "bogus=1"}),
    "csv_header_given_over_a_first_row_of_numbers": Case(
        "headerless.csv", 3, {"csv_columns": "time-col=1,id-col=2,size-col=3,has-header=true"}
    ),
    "csv_header_undecidable_with_string_ids_alone": Case(
        "keys.csv", 3, {"csv_columns": "id-col=1,id-is-num=false"}
    ),
    "unknown_format": Case("good.oracleGeneral", 2, {"format": "parquet"}),
    "unknown_model_on_a_kv_trace": Case("good.jsonl", 2, {"model": "llama-9000"}),
    "unknown_model_on_an_oracle_trace": Case("good.oracleGeneral", 2, {"model": "llama-9000"}),
    "zero_block_tokens": Case("good.oracleGeneral", 2, {"block_tokens": 0}),
    "bad_options_are_reported_before_missing_files": Case("nope.jsonl", 2, {"fractions": [0.0]}),
    "bad_options_are_reported_before_malformed_traces": Case(
        "bad.jsonl", 2, {"policies": "nosuch"}
    ),
}


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fronts")
    (d / "empty.jsonl").write_text("")
    (d / "empty.oracleGeneral").write_bytes(b"")
    (d / "empty.csv").write_text("time,id,size\n")
    (d / "bad.jsonl").write_text(KV_LINE + '{"timestamp": 1}\n')
    (d / "good.jsonl").write_text(KV_LINE * 3)
    (d / "good.csv").write_text("time,id,size\n0,1,10\n1,2,10\n2,1,10\n")
    (d / "headerless.csv").write_text("0,1,10\n1,2,10\n")
    (d / "keys.csv").write_text("alpha\nbeta\n")
    ids = np.array([1, 2, 1, 3, 1], dtype=np.uint64)
    write_oracle(d / "good.oracleGeneral", ids, np.full(len(ids), 10, np.uint32))
    return d


def cli_flags(options: dict[str, Any]) -> list[str]:
    """The CLI flags that say what ``options`` (``sim.run`` keywords) say."""
    flags = []
    for key, value in options.items():
        text = ",".join(str(v) for v in value) if isinstance(value, list) else str(value)
        flags += [f"--{key.replace('_', '-')}", text]
    return flags


def cli_failure(binary: Path, trace: Path, options: dict[str, Any], out: Path) -> tuple[int, str]:
    args = [str(binary), "sim", "run", "--trace", str(trace), "--out", str(out), "--no-plots"]
    done = subprocess.run(
        args + cli_flags(options), capture_output=True, text=True, timeout=60, check=False
    )
    lines = done.stderr.strip().splitlines()
    return done.returncode, lines[-1] if lines else ""


def python_failure(trace: Path, options: dict[str, Any]) -> SluiceError:
    with pytest.raises(SluiceError) as caught:
        sim.run(trace, **options)
    return caught.value


@pytest.mark.parametrize("name", CASES)
def test_cli_and_python_fail_the_same_way(
    name: str, sluice_bin: Path, traces: Path, tmp_path: Path
) -> None:
    case = CASES[name]
    trace = traces / case.trace
    status, line = cli_failure(sluice_bin, trace, case.options, tmp_path / "out")
    err = python_failure(trace, case.options)
    assert status == case.status, f"CLI: {line}"
    assert type(err) is EXCEPTION_OF_STATUS[case.status], f"Python: {type(err).__name__}: {err}"
    assert line == f"sluice: error: {err}", "the two fronts word the failure differently"
    assert not (tmp_path / "out" / "results.json").exists(), "no results from a failed study"


def test_empty_traces_are_rejected_naming_the_file(traces: Path) -> None:
    for name in ("empty.jsonl", "empty.oracleGeneral", "empty.csv"):
        with pytest.raises(TraceError, match=rf"{name}: .*no requests"):
            sim.run(traces / name)


def test_defaults_come_from_the_rust_study_config(sluice_bin: Path, traces: Path) -> None:
    rows = sim.run(traces / "good.oracleGeneral")
    assert [(r["policy"], r["fraction"]) for r in rows] == [
        (p, f) for p in sim.DEFAULT_POLICIES for f in sim.DEFAULT_FRACTIONS
    ]
    help_text = subprocess.run(
        [str(sluice_bin), "sim", "run", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert f"[default: {','.join(sim.DEFAULT_POLICIES)}]" in help_text
    assert f"[default: {','.join(str(f) for f in sim.DEFAULT_FRACTIONS)}]" in help_text
