"""The simulator against libCacheSim on the same traces (object-count mode).

libCacheSim (GPL-3.0) is a test-only dependency. Miss ratios must agree within 0.5 percentage
points for LRU, FIFO, ARC, S3-FIFO, SIEVE and Belady, on Zipf traces of two skews and on a
Zipf-plus-scans mix, at cache sizes from 1% to 30% of the distinct objects. CLOCK-Pro and
W-TinyLFU are compared with Sluice's own reference models in the Rust tests instead (libCacheSim's
versions are known to misbehave: see docs/sim.md).
"""

from __future__ import annotations

from pathlib import Path

import libcachesim as lcs
import numpy as np
import pytest
from sim_traces import ORACLE_DTYPE, make_trace
from sluice import sim

TOLERANCE = 0.005
FRACTIONS = (0.01, 0.05, 0.1, 0.3)
# Sluice policy name -> libCacheSim class.
POLICIES = {
    "lru": "LRU",
    "fifo": "FIFO",
    "arc": "ARC",
    "s3fifo": "S3FIFO",
    "sieve": "Sieve",
    "belady": "Belady",
}
TRACES = {"zipf0.8": 11, "zipf1.0": 12, "scan": 13}


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("traces")
    return {
        kind: make_trace(d / f"{kind}.oracleGeneral", kind, 60_000, 6_000, seed)
        for kind, seed in TRACES.items()
    }


def lcs_miss_ratio(path: Path, policy: str, capacity: int) -> float:
    reader = lcs.TraceReader(
        trace=str(path),
        trace_type=lcs.TraceType.ORACLE_GENERAL_TRACE,
        reader_init_params=lcs.ReaderInitParam(ignore_obj_size=True),
    )
    cache = getattr(lcs, POLICIES[policy])(capacity, hashpower=20)
    miss_ratio, _byte_miss_ratio = cache.process_trace(reader)
    return miss_ratio


@pytest.mark.parametrize("kind", TRACES)
@pytest.mark.parametrize("policy", POLICIES)
def test_miss_ratio_matches_libcachesim(traces: dict[str, Path], kind: str, policy: str) -> None:
    path = traces[kind]
    distinct = len(np.unique(np.fromfile(path, dtype=ORACLE_DTYPE)["id"]))
    capacities = [max(1, round(distinct * f)) for f in FRACTIONS]
    rows = sim.run(path, [policy], [c / distinct for c in capacities], count_mode=True, threads=2)
    assert [r["capacity"] for r in rows] == capacities
    for row, capacity in zip(rows, capacities):
        ours = 1.0 - row["hit_ratio"]
        theirs = lcs_miss_ratio(path, policy, capacity)
        assert abs(ours - theirs) <= TOLERANCE, (
            f"{policy} on {kind} at {capacity} objects: sluice {ours:.4f}, libCacheSim {theirs:.4f}"
        )
