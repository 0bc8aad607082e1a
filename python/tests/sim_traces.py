"""Synthetic cache traces for the simulator tests and benchmark, written with numpy alone.

They are written independently of Sluice's own trace writer, so reading them back is a test of
Sluice's reader as well. oracleGeneral records are little-endian ``u32 time, u64 id, u32 size,
i64 next``, where ``next`` is the 1-based position of the next request for the same object and
-1 means never (libCacheSim's convention).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

ORACLE_DTYPE = np.dtype([("t", "<u4"), ("id", "<u8"), ("sz", "<u4"), ("nxt", "<i8")])


def next_positions(ids: np.ndarray) -> np.ndarray:
    """0-based index of each request's next request for the same id, -1 when none."""
    n = len(ids)
    order = np.lexsort((np.arange(n), ids))
    nxt = np.full(n, -1, dtype=np.int64)
    same = ids[order[:-1]] == ids[order[1:]]
    nxt[order[:-1][same]] = order[1:][same]
    return nxt


def zipf_ids(n_req: int, n_obj: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """Ids 1..n_obj drawn with Zipf(alpha) popularity, popularity ranks shuffled over ids."""
    weights = np.arange(1, n_obj + 1, dtype=np.float64) ** -alpha
    ranks = rng.choice(n_obj, size=n_req, p=weights / weights.sum())
    return rng.permutation(n_obj)[ranks].astype(np.uint64) + 1


def scan_mix_ids(n_req: int, n_obj: int, rng: np.random.Generator) -> np.ndarray:
    """A Zipf core interleaved with one-pass scans over cold ids: separates scan-resistant
    policies (ARC, S3-FIFO, 2Q) from LRU and FIFO."""
    hot = zipf_ids(n_req, n_obj, 0.9, rng)
    out, pos, next_cold = [], 0, n_obj + 1
    while pos < n_req:
        burst = int(rng.integers(200, 2000))
        out.append(hot[pos : pos + burst])
        pos += burst
        scan = int(rng.integers(50, 500))
        out.append(np.arange(next_cold, next_cold + scan, dtype=np.uint64))
        next_cold += scan
    return np.concatenate(out)[:n_req]


def object_sizes(ids: np.ndarray, rng: np.random.Generator, unit: bool) -> np.ndarray:
    """Per-object sizes (lognormal, median 64 KiB, 1 KiB to 16 MiB), or 1 when ``unit``."""
    if unit:
        return np.ones(len(ids), dtype=np.uint32)
    uniq, inverse = np.unique(ids, return_inverse=True)
    per_obj = np.clip(rng.lognormal(np.log(64 * 1024), 1.2, len(uniq)), 1024, 16 << 20)
    return per_obj.astype(np.uint32)[inverse]


def write_oracle(path: Path, ids: np.ndarray, sizes: np.ndarray) -> Path:
    """Writes an oracleGeneral trace with next-access positions filled in."""
    rec = np.zeros(len(ids), dtype=ORACLE_DTYPE)
    rec["t"] = np.arange(len(ids)) // 1000
    rec["id"] = ids
    rec["sz"] = sizes
    nxt = next_positions(ids)
    rec["nxt"] = np.where(nxt >= 0, nxt + 1, -1)
    rec.tofile(path)
    return path


def make_trace(path: Path, kind: str, n_req: int, n_obj: int, seed: int, unit: bool = True) -> Path:
    rng = np.random.default_rng(seed)
    if kind == "scan":
        ids = scan_mix_ids(n_req, n_obj, rng)
    else:
        ids = zipf_ids(n_req, n_obj, float(kind.removeprefix("zipf")), rng)
    return write_oracle(path, ids, object_sizes(ids, rng, unit))
