"""The readers `bench_load.py` compares, one function each, all feeding the same consumer.

The consumer stands in for a framework filling its parameters: a dict of CPU tensors allocated
and zeroed before the clock starts (so their pages are touched, as initialised parameters are),
into which every loaded tensor is copied with `copy_`. Readers that return a dict (`load_file`
style) copy after their load call returns, one shard at a time where the library works per file;
streaming readers copy each tensor as it arrives. A reader's time runs from the start of its load
call to the end of its last copy.

Each reader declares the modules it needs so the worker can import them before measuring its
baseline RSS, and whether it belongs in the cold pass, the warm pass, or both. `fio` is not here:
it is a separate process, run by `bench_load.py` itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from synth_checkpoint import TensorSpec

TORCH_DTYPES = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
}
# The stream target is stated for this limit.
STREAM_MEMORY_LIMIT_BYTES = 512 * 2**20
# Spot checks compare this many tensors with the file, in pieces of this size.
SPOT_CHECK_TENSORS = 8
SPOT_CHECK_PIECE_BYTES = 16 * 2**20


class Consumer:
    """Preallocated destination tensors, filled by `take`, checked by `verify_complete`."""

    def __init__(self, layout: list[TensorSpec]) -> None:
        self.dst = {s.name: torch.empty(s.shape, dtype=TORCH_DTYPES[s.dtype]) for s in layout}
        for tensor in self.dst.values():
            tensor.zero_()
        self.taken = 0
        self.seen: set[str] = set()

    @property
    def dest_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.dst.values())

    def take(self, name: str, tensor: torch.Tensor) -> None:
        dst = self.dst[name]
        # copy_ broadcasts, so a wrong shape would otherwise pass silently.
        if tensor.shape != dst.shape or tensor.dtype != dst.dtype:
            raise ValueError(f"{name}: got {tensor.dtype}{list(tensor.shape)}, want {dst.dtype}")
        dst.copy_(tensor)
        self.taken += 1
        self.seen.add(name)

    def take_all(self, tensors: Mapping[str, torch.Tensor]) -> None:
        for name, tensor in tensors.items():
            self.take(name, tensor)

    def verify_complete(self) -> None:
        missing = self.dst.keys() - self.seen
        if missing or self.taken != len(self.dst):
            raise AssertionError(
                f"{len(missing)} tensors never written (e.g. {sorted(missing)[:3]}), "
                f"{self.taken} copies for {len(self.dst)} tensors"
            )


@dataclass
class ReadContext:
    """What a reader gets: the checkpoint, the consumer and the Sluice pass-through options."""

    index: Path
    files: list[Path]
    layout: list[TensorSpec]
    consumer: Consumer
    sluice_opts: dict[str, Any] = field(default_factory=dict)
    scratch: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Reader:
    label: str
    run: Callable[[ReadContext], None]
    modules: tuple[str, ...]
    cold: bool = True
    warm: bool = True
    # Untimed set-up, run after the consumer is allocated.
    prepare: Callable[[ReadContext], None] | None = None
    # Whether its output is the file's bytes (the memcpy reference copies a dummy source).
    checkable: bool = True


def read_safetensors_load_file(ctx: ReadContext) -> None:
    from safetensors.torch import load_file

    for path in ctx.files:
        ctx.consumer.take_all(load_file(path))


def read_safetensors_safe_open(ctx: ReadContext) -> None:
    from safetensors import safe_open

    for path in ctx.files:
        with safe_open(path, framework="pt", device="cpu") as f:
            names = f.keys()
            for name in names:
                ctx.consumer.take(name, f.get_tensor(name))


def read_fastsafetensors(ctx: ReadContext) -> None:
    from fastsafetensors import fastsafe_open

    files = [str(p) for p in ctx.files]
    with fastsafe_open(files, framework="pt", device="cpu", nogds=True) as f:
        names = f.keys()
        for name in names:
            ctx.consumer.take(name, f.get_tensor(name))


def read_runai(ctx: ReadContext) -> None:
    from runai_model_streamer import SafetensorsStreamer

    with SafetensorsStreamer() as streamer:
        # owned=False yields views into the streamer's reused buffers: its fastest mode, and safe
        # here because every tensor is copied before the iteration advances.
        streamer.stream_files([str(p) for p in ctx.files], device="cpu", owned=False)
        for name, tensor in streamer.get_tensors():
            ctx.consumer.take(name, tensor)


def read_sluice_auto(ctx: ReadContext) -> None:
    import sluice

    ctx.consumer.take_all(sluice.load_file(ctx.index, **ctx.sluice_opts))


def read_sluice_buffered(ctx: ReadContext) -> None:
    import sluice

    ctx.consumer.take_all(sluice.load_file(ctx.index, **{**ctx.sluice_opts, "direct": "off"}))


def read_sluice_direct(ctx: ReadContext) -> None:
    import sluice

    ctx.consumer.take_all(sluice.load_file(ctx.index, **{**ctx.sluice_opts, "direct": "on"}))


def read_sluice_stream(ctx: ReadContext) -> None:
    import sluice

    opts = {"memory_limit": STREAM_MEMORY_LIMIT_BYTES, **ctx.sluice_opts}
    for name, tensor in sluice.stream(ctx.index, **opts):
        ctx.consumer.take(name, tensor)


# Options of `load_file` that `load_into` has too (it chooses its own I/O mode and engine).
INTO_OPTIONS = ("concurrency", "chunk_bytes", "memory_limit", "drop_cache")


def read_sluice_into(ctx: ReadContext) -> None:
    """`load_into`: the checkpoint read straight into the consumer's tensors, no copy."""
    import sluice

    opts = {k: v for k, v in ctx.sluice_opts.items() if k in INTO_OPTIONS}
    sluice.load_into(ctx.index, ctx.consumer.dst, **opts)
    ctx.consumer.seen.update(ctx.consumer.dst)
    ctx.consumer.taken += len(ctx.consumer.dst)


def prepare_memcpy(ctx: ReadContext) -> None:
    """An in-RAM source with every tensor's bytes back to back, its pages already touched."""
    total = sum(s.nbytes for s in ctx.layout)
    source = torch.empty(total, dtype=torch.uint8)
    source.fill_(1)
    ctx.scratch["source"] = source


def read_memcpy(ctx: ReadContext) -> None:
    """The warm-cache ceiling: the same copies into the same destination, from RAM."""
    source, offset = ctx.scratch["source"], 0
    for spec in ctx.layout:
        piece = source[offset : offset + spec.nbytes].view(TORCH_DTYPES[spec.dtype])
        ctx.consumer.take(spec.name, piece.view(spec.shape))
        offset += spec.nbytes


READERS: dict[str, Reader] = {
    "st-load-file": Reader(
        "safetensors load_file", read_safetensors_load_file, ("safetensors.torch",)
    ),
    "st-safe-open": Reader("safetensors safe_open", read_safetensors_safe_open, ("safetensors",)),
    "fastsafetensors": Reader(
        "fastsafetensors (nogds, cpu)", read_fastsafetensors, ("fastsafetensors",)
    ),
    "runai": Reader("Run:ai model streamer", read_runai, ("runai_model_streamer",)),
    "sluice-auto": Reader("Sluice load_file (default flags)", read_sluice_auto, ("sluice",)),
    "sluice-buffered": Reader("Sluice load_file (buffered)", read_sluice_buffered, ("sluice",)),
    "sluice-direct": Reader("Sluice load_file (direct)", read_sluice_direct, ("sluice",)),
    "sluice-stream": Reader("Sluice stream (512 MiB)", read_sluice_stream, ("sluice",)),
    "sluice-into": Reader("Sluice load_into (into the parameters)", read_sluice_into, ("sluice",)),
    "memcpy": Reader(
        "memcpy (RAM to destination)",
        read_memcpy,
        (),
        cold=False,
        prepare=prepare_memcpy,
        checkable=False,
    ),
}


def spot_check(consumer: Consumer, layout: list[TensorSpec]) -> int:
    """Compare a sample of destination tensors with the file's bytes; returns tensors checked.

    It reads with pread in small pieces so it adds little to the worker's peak RSS.
    """
    step = max(1, len(layout) // (SPOT_CHECK_TENSORS - 1))
    sample = {*layout[::step], layout[-1]}
    buf = bytearray(SPOT_CHECK_PIECE_BYTES)
    for spec in sample:
        dst = consumer.dst[spec.name].reshape(-1).view(torch.uint8).numpy()
        with open(spec.path, "rb", buffering=0) as f:
            for lo in range(0, spec.nbytes, SPOT_CHECK_PIECE_BYTES):
                n = min(SPOT_CHECK_PIECE_BYTES, spec.nbytes - lo)
                got = _pread_exact(f.fileno(), memoryview(buf)[:n], spec.start + lo)
                if not np.array_equal(dst[lo : lo + n], np.frombuffer(got, np.uint8)):
                    raise AssertionError(f"{spec.name}: bytes {lo}..{lo + n} differ from the file")
    return len(sample)


def _pread_exact(fd: int, view: memoryview, offset: int) -> memoryview:
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            raise EOFError(f"file ends before offset {offset + len(view)}")
        done += n
    return view
