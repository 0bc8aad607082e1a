"""Generate a synthetic, sharded, Llama-shaped safetensors checkpoint for benchmarks.

The shapes follow a Llama-2-7B layout (hidden 4096, intermediate 11008, vocab 32000). The number
of layers is the largest that fits the requested size, and the vocabulary then grows to take up
the remainder, so the total lands within about a MiB of the target. Sizes too small for one such
layer halve the widths until one fits.

Tensors are assigned to shards in model order, by where the middle of each tensor falls in the
byte stream, so shards come out close to equal. Each shard is written by a streaming writer: the
header first (JSON padded with spaces to a multiple of 8 bytes, as the format's own writer does),
then each tensor's bytes, produced in 64 MiB blocks so memory stays flat however large the
checkpoint. Content is random but finite: the top exponent bit of every element is cleared, so a
model built from these weights never meets NaN or inf.

A stamp file (`sluice-synth.json`) records the parameters and file sizes; a second call with the
same parameters reuses the checkpoint instead of writing it again.

    python benches/synth_checkpoint.py --out bench-data/ckpt-4g --size-gib 4 --shards 4
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

INDEX_NAME = "model.safetensors.index.json"
STAMP_NAME = "sluice-synth.json"
# Bump when the layout or content changes, so old stamps stop matching.
GENERATOR_VERSION = 1
# 64 MiB: big enough that numpy's per-call overhead vanishes, small enough to keep RSS flat.
BLOCK_BYTES = 64 * 2**20
# Safetensors dtype name -> (element bytes, mask that clears the exponent's top bit).
DTYPES = {
    "bf16": ("BF16", 2, 0xBFFF),
    "f16": ("F16", 2, 0xBFFF),
    "f32": ("F32", 4, 0xBFFFFFFF),
}


@dataclass(frozen=True)
class LlamaShape:
    """Widths and depth of the synthetic model."""

    hidden: int
    intermediate: int
    vocab: int
    layers: int


@dataclass(frozen=True)
class TensorSpec:
    """One tensor as it sits in a shard: absolute byte span inside the file."""

    name: str
    path: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def tensor_shapes(cfg: LlamaShape) -> list[tuple[str, tuple[int, ...]]]:
    """Tensor names and shapes in model order, named as Hugging Face Llama checkpoints are."""
    h, i = cfg.hidden, cfg.intermediate
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (cfg.vocab, h))]
    for layer in range(cfg.layers):
        p = f"model.layers.{layer}"
        shapes += [(f"{p}.self_attn.{x}_proj.weight", (h, h)) for x in "qkvo"]
        shapes += [(f"{p}.mlp.gate_proj.weight", (i, h)), (f"{p}.mlp.up_proj.weight", (i, h))]
        shapes += [(f"{p}.mlp.down_proj.weight", (h, i))]
        shapes += [(f"{p}.input_layernorm.weight", (h,))]
        shapes += [(f"{p}.post_attention_layernorm.weight", (h,))]
    shapes += [("model.norm.weight", (h,)), ("lm_head.weight", (cfg.vocab, h))]
    return shapes


def choose_shape(size_bytes: int, itemsize: int) -> LlamaShape:
    """The Llama-like shape whose total bytes come closest to `size_bytes` from below."""
    hidden, inter, vocab = 4096, 11008, 32000
    while _shape_bytes(LlamaShape(hidden, inter, vocab, 1), itemsize) > size_bytes and hidden > 64:
        hidden, inter, vocab = hidden // 2, inter // 2, vocab // 2
    per_layer = _shape_bytes(LlamaShape(hidden, inter, vocab, 1), itemsize) - _shape_bytes(
        LlamaShape(hidden, inter, vocab, 0), itemsize
    )
    fixed = _shape_bytes(LlamaShape(hidden, inter, vocab, 0), itemsize)
    layers = max(1, (size_bytes - fixed) // per_layer)
    spare = max(0, size_bytes - fixed - layers * per_layer)
    # Embedding and lm_head both grow by one row per extra token; keep the vocab a multiple of 64.
    extra_tokens = spare // (2 * hidden * itemsize) // 64 * 64
    return LlamaShape(hidden, inter, vocab + extra_tokens, layers)


def _shape_bytes(cfg: LlamaShape, itemsize: int) -> int:
    return sum(int(np.prod(shape)) * itemsize for _, shape in tensor_shapes(cfg))


def assign_shards(sizes: list[int], shards: int) -> list[int]:
    """Shard index per tensor, by where each tensor's midpoint falls in the whole byte stream."""
    total, offset, out = sum(sizes), 0, []
    for size in sizes:
        out.append(min(shards - 1, (offset + size // 2) * shards // max(total, 1)))
        offset += size
    empty = set(range(shards)) - set(out)
    if empty:
        raise ValueError(f"{shards} shards is too many for {len(sizes)} tensors: {empty} empty")
    return out


def shard_name(k: int, n: int) -> str:
    return f"model-{k + 1:05d}-of-{n:05d}.safetensors"


def build_header(tensors: list[tuple[str, tuple[int, ...]]], dtype: str, itemsize: int) -> bytes:
    """The header bytes (length prefix included) for tensors laid out back to back."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in tensors:
        end = offset + int(np.prod(shape)) * itemsize
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, end]}
        offset = end
    body = json.dumps(header, separators=(",", ":")).encode()
    # Pad with spaces so the data section starts 8-byte aligned, as safetensors' writer does.
    body += b" " * (-len(body) % 8)
    return struct.pack("<Q", len(body)) + body


def write_tensor_bytes(f, rng: np.random.Generator, nbytes: int, mask: int, itemsize: int) -> None:
    """Stream `nbytes` of random, finite elements to `f` in BLOCK_BYTES pieces."""
    elem = np.dtype(f"<u{itemsize}")
    remaining = nbytes
    while remaining:
        n = min(remaining, BLOCK_BYTES)
        words = rng.bit_generator.random_raw((n + 7) // 8)
        elems = words.view(elem)
        elems &= elem.type(mask)
        f.write(memoryview(words).cast("B")[:n])
        remaining -= n


def write_shard(
    path: Path, tensors: list[tuple[str, tuple[int, ...]]], dtype: str, rng: np.random.Generator
) -> int:
    """Write one shard and fsync it; returns the file size."""
    st_dtype, itemsize, mask = DTYPES[dtype]
    with open(path, "wb") as f:
        f.write(build_header(tensors, st_dtype, itemsize))
        for _, shape in tensors:
            write_tensor_bytes(f, rng, int(np.prod(shape)) * itemsize, mask, itemsize)
        f.flush()
        os.fsync(f.fileno())
    return path.stat().st_size


def _params(size_bytes: int, shards: int, seed: int, dtype: str) -> dict[str, object]:
    return {
        "version": GENERATOR_VERSION,
        "size_bytes": size_bytes,
        "shards": shards,
        "seed": seed,
        "dtype": dtype,
    }


def _stamp_matches(out: Path, params: dict[str, object]) -> bool:
    try:
        stamp = json.loads((out / STAMP_NAME).read_text())
    except (OSError, ValueError):
        return False
    if stamp.get("params") != params or not (out / INDEX_NAME).is_file():
        return False
    files = stamp.get("files", {})
    return all((out / n).is_file() and (out / n).stat().st_size == s for n, s in files.items())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def generate(
    out_dir: str | os.PathLike, size_bytes: int, shards: int, seed: int = 0, dtype: str = "bf16"
) -> Path:
    """Write (or reuse) a checkpoint in `out_dir`; returns the path of its index file."""
    out = Path(out_dir)
    params = _params(size_bytes, shards, seed, dtype)
    if _stamp_matches(out, params):
        return out / INDEX_NAME
    out.mkdir(parents=True, exist_ok=True)
    # Remove what an earlier run with other parameters left, so a directory scan sees one model.
    for stale in [*out.glob("model-*-of-*.safetensors"), out / STAMP_NAME, out / INDEX_NAME]:
        stale.unlink(missing_ok=True)
    cfg = choose_shape(size_bytes, DTYPES[dtype][1])
    print(f"generating {out}: {size_bytes / 2**30:g} GiB, {shards} shards, {cfg}", file=sys.stderr)
    files, weight_map, total = _write_shards(out, cfg, shards, seed, dtype)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    stamp = {"params": params, "shape": asdict(cfg), "total_size": total, "files": files}
    self_check(out / INDEX_NAME)
    (out / STAMP_NAME).write_text(json.dumps(stamp, indent=2) + "\n")
    _fsync_dir(out)
    return out / INDEX_NAME


def _write_shards(
    out: Path, cfg: LlamaShape, shards: int, seed: int, dtype: str
) -> tuple[dict[str, int], dict[str, str], int]:
    """Write every shard; returns file sizes, the index's weight map and the tensor bytes."""
    itemsize = DTYPES[dtype][1]
    tensors = tensor_shapes(cfg)
    sizes = [int(np.prod(shape)) * itemsize for _, shape in tensors]
    owner = assign_shards(sizes, shards)
    rng = np.random.default_rng(seed)
    files: dict[str, int] = {}
    weight_map: dict[str, str] = {}
    for k in range(shards):
        name = shard_name(k, shards)
        mine = [t for t, o in zip(tensors, owner) if o == k]
        files[name] = write_shard(out / name, mine, dtype, rng)
        weight_map.update({t: name for t, _ in mine})
    return files, weight_map, sum(sizes)


def read_header(path: Path) -> tuple[dict[str, dict], int]:
    """A shard's tensor entries and the file offset where its data section starts."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    return header, 8 + length


def read_layout(index_path: str | os.PathLike) -> list[TensorSpec]:
    """Every tensor of an indexed checkpoint, in file order and, within a file, offset order."""
    index_path = Path(index_path)
    weight_map = json.loads(index_path.read_text())["weight_map"]
    specs: list[TensorSpec] = []
    for file_name in sorted(set(weight_map.values())):
        path = index_path.parent / file_name
        header, data_start = read_header(path)
        for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            lo, hi = e["data_offsets"]
            shape = tuple(e["shape"])
            specs.append(
                TensorSpec(name, path, e["dtype"], shape, data_start + lo, data_start + hi)
            )
    return specs


def self_check(index_path: str | os.PathLike) -> int:
    """Open every shard with `safetensors.safe_open` and match it against the index.

    Returns the number of tensors checked; raises AssertionError on a mismatch.
    """
    from safetensors import safe_open

    index_path = Path(index_path)
    weight_map = json.loads(index_path.read_text())["weight_map"]
    layout = {s.name: s for s in read_layout(index_path)}
    for file_name in sorted(set(weight_map.values())):
        with safe_open(index_path.parent / file_name, framework="pt") as f:
            keys = set(f.keys())
            expected = {n for n, fn in weight_map.items() if fn == file_name}
            assert keys == expected, f"{file_name}: keys differ from the index"
            for name in keys:
                shape = tuple(f.get_slice(name).get_shape())
                assert shape == layout[name].shape, f"{file_name}: {name} has shape {shape}"
    return len(weight_map)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--size-gib", type=float, default=4.0, help="target tensor bytes, GiB")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    args = parser.parse_args()
    index = generate(args.out, int(args.size_gib * 2**30), args.shards, args.seed, args.dtype)
    stamp = json.loads((index.parent / STAMP_NAME).read_text())
    count = self_check(index)
    print(f"{index}: {count} tensors, {stamp['total_size'] / 1e9:.3f} GB in {args.shards} shards")
    print(f"shape: {stamp['shape']}")


if __name__ == "__main__":
    main()
