"""safe_open per-call cost: Sluice against safetensors, side by side, warm page cache.

Two measurements, each over interleaved rounds (safetensors, then Sluice, per round) with the
median reported:

- `get_tensor`: every tensor of a file of N small tensors (64x32 F32, 8 KiB) read through one
  open handle, in key order, and copied into an allocated parameter; microseconds per call.
  The issue's target is Sluice at most 2x safetensors on the 10,000-tensor file.
- `get_slice`: a tensor-parallel split of one 4096x4096 F32 weight (64 MiB) into 4 column
  shards and 4 row shards, each rank's slice read through `get_slice(...)[...]` and copied into
  that rank's allocated parameter; milliseconds for all 4 ranks.

Usage: python benches/bench_safe_open.py [--counts 10000,200000] [--rounds 5] [--dir DIR]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import safetensors
import sluice
import torch
from safetensors.torch import save_file


def per_call_us(opener: Callable[..., Any], path: Path) -> float:
    with opener(str(path), framework="pt") as f:
        keys = list(f.keys())
        params = {key: torch.zeros(64, 32) for key in keys}
        start = time.perf_counter()
        for key in keys:
            params[key].copy_(f.get_tensor(key))
        return (time.perf_counter() - start) / len(keys) * 1e6


def split_ms(opener: Callable[..., Any], path: Path, columns: bool) -> float:
    # Each rank's parameter exists and is touched before the clock starts, and
    # the slice is copied into it, as a tensor-parallel loader does: a reader
    # that returns a lazy view over its mapping pays for the pages here.
    params = [torch.zeros(4096, 1024) if columns else torch.zeros(1024, 4096) for _ in range(4)]
    with opener(str(path), framework="pt") as f:
        start = time.perf_counter()
        for rank in range(4):
            part = slice(rank * 1024, (rank + 1) * 1024)
            params[rank].copy_(f.get_slice("w")[:, part] if columns else f.get_slice("w")[part])
        return (time.perf_counter() - start) * 1e3


def compare(name: str, rounds: int, measure: Callable[[Callable[..., Any]], float], unit: str):
    theirs, ours = [], []
    for _ in range(rounds):
        theirs.append(measure(safetensors.safe_open))
        ours.append(measure(sluice.safe_open))
    a, b = statistics.median(theirs), statistics.median(ours)
    print(f"| {name} | {a:.1f} {unit} | {b:.1f} {unit} | {b / a:.2f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="10000,200000")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        versions = f"safetensors {safetensors.__version__}, sluice {sluice.__version__}"
        print(f"{versions}, rounds {args.rounds}")
        print("| measurement | safetensors | Sluice | Sluice / safetensors |")
        print("|---|---|---|---|")
        for count in (int(c) for c in args.counts.split(",")):
            path = root / f"many-{count}.safetensors"
            save_file({f"t.{i}": torch.randn(64, 32) for i in range(count)}, str(path))
            per_call_us(safetensors.safe_open, path)  # page cache warm for both
            compare(
                f"get_tensor, {count:,} tensors (per call)",
                args.rounds,
                lambda opener, p=path: per_call_us(opener, p),
                "us",
            )
        path = root / "tp.safetensors"
        save_file({"w": torch.randn(4096, 4096)}, str(path))
        for columns in (True, False):
            kind = "columns" if columns else "rows"
            compare(
                f"get_slice, 64 MiB weight into 4 {kind} (all ranks)",
                args.rounds,
                lambda opener, c=columns: split_ms(opener, path, c),
                "ms",
            )


if __name__ == "__main__":
    main()
