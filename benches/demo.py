"""`make demo`: load the same checkpoint cold with safetensors and with Sluice, side by side.

It generates a 1 GiB, 4-shard synthetic checkpoint in demo-data/ (once), drops the page cache,
loads every shard with `safetensors.torch.load_file`, drops the cache again, loads the index with
`sluice.load_file`, checks that the two dicts are bit for bit the same, and prints seconds, GB/s
and the speed-up. Without root the cache cannot be dropped; it says so and both loads are warm.

safetensors maps files lazily, so its load_file returns before most bytes are read. Both timings
therefore run until every page of every tensor has been touched: the point at which a framework
could use the weights.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import page_cache
import synth_checkpoint
import torch

Tensors = dict[str, torch.Tensor]
PAGE_BYTES = 4096


def cold(step: str) -> None:
    if not page_cache.drop():
        print(f"note: cannot drop the page cache (needs root), so the {step} load is warm")


def timed(load: Callable[[], Tensors]) -> tuple[Tensors, float]:
    """Seconds from the load call until every page of the result is resident."""
    start = time.perf_counter()
    tensors = load()
    for tensor in tensors.values():
        _bytes(tensor)[::PAGE_BYTES].sum()
    return tensors, time.perf_counter() - start


def load_with_safetensors(index: Path) -> Tensors:
    from safetensors.torch import load_file

    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    tensors: Tensors = {}
    for shard in shards:
        tensors.update(load_file(index.parent / shard))
    return tensors


def differences(want: Tensors, got: Tensors) -> list[str]:
    """Names whose dtype, shape or bytes differ, plus names only one side has."""
    diffs = [f"{n}: missing from Sluice" for n in want.keys() - got.keys()]
    diffs += [f"{n}: not in the checkpoint" for n in got.keys() - want.keys()]
    for name in want.keys() & got.keys():
        a, b = want[name], got[name]
        same = a.dtype == b.dtype and a.shape == b.shape
        if not same or not torch.equal(_bytes(a), _bytes(b)):
            diffs.append(f"{name}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)} differ")
    return sorted(diffs)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def engine_note(sluice: Any) -> str | None:
    """What Sluice says it chose for the last load, where it offers `last_load_stats`."""
    stats = getattr(sluice, "last_load_stats", None)
    if not callable(stats):
        return None
    info = stats()
    if isinstance(info, dict):
        wanted = ("engine", "io_mode", "direct", "concurrency", "chunk_bytes")
        keys = [k for k in wanted if k in info]
        return ", ".join(f"{k}={info[k]}" for k in keys) or str(info)
    return str(info)


def print_table(total_bytes: int, rows: list[tuple[str, float]]) -> None:
    base = rows[0][1]
    print(f"\n{'reader':<32} {'seconds':>8} {'GB/s':>7} {'speed-up':>9}")
    for name, seconds in rows:
        gbps = total_bytes / seconds / 1e9
        print(f"{name:<32} {seconds:8.2f} {gbps:7.2f} {base / seconds:8.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="demo-data", help="checkpoint directory")
    parser.add_argument("--size-gib", type=float, default=1.0)
    parser.add_argument("--shards", type=int, default=4)
    args = parser.parse_args()
    index = synth_checkpoint.generate(args.data, int(args.size_gib * 2**30), args.shards)
    total = json.loads(index.read_text())["metadata"]["total_size"]
    print(f"checkpoint: {index} ({total / 1e9:.2f} GB, {args.shards} shards)")

    cold("safetensors")
    reference, st_seconds = timed(lambda: load_with_safetensors(index))
    # Mapped pages survive drop_caches; copy out of the mapping so Sluice's load is cold too.
    reference = {name: tensor.clone() for name, tensor in reference.items()}
    try:
        import sluice
    except ImportError as e:
        print_table(total, [("safetensors load_file", st_seconds)])
        print(f"\nSluice is not importable ({e}); build the Python package first.")
        return 2
    cold("Sluice")
    loaded, sl_seconds = timed(lambda: sluice.load_file(index))
    print_table(total, [("safetensors load_file", st_seconds), ("sluice load_file", sl_seconds)])
    if note := engine_note(sluice):
        print(f"Sluice chose: {note}")
    return report_identity(reference, loaded)


def report_identity(reference: Tensors, loaded: Tensors) -> int:
    diffs = differences(reference, loaded)
    if diffs:
        print(f"\nMISMATCH: {len(diffs)} tensors differ, e.g.:", *diffs[:5], sep="\n  ")
        return 1
    print(f"\nbit-identical: all {len(reference)} tensors match safetensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
