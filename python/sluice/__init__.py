"""Sluice: load safetensors checkpoints at the speed of the device.

    import sluice
    state = sluice.load_file("model.safetensors.index.json")   # like safetensors
    sluice.load_into("model/", model)   # into existing parameters, no second copy
    for name, t in sluice.stream("model/", memory_limit="512MiB"):
        params[name].copy_(t)

The torch front end (``load_file``, ``load_into``, ``stream``, ``safe_open``) is imported on
first use, so ``import sluice`` works without torch; ``sluice.numpy`` needs
only numpy.
"""

from __future__ import annotations

from typing import Any

from ._core import last_load_stats
from ._sluice import __version__
from .errors import (
    ConfigError,
    HeaderError,
    MemoryLimitError,
    SluiceError,
    SluiceFileNotFoundError,
    SluiceIOError,
    SluicePermissionError,
    TensorNotFoundError,
)

_TORCH_NAMES = ("load_file", "load_into", "stream", "safe_open")


def __getattr__(name: str) -> Any:
    if name in _TORCH_NAMES:
        from . import torch as _torch_front

        return getattr(_torch_front, name)
    raise AttributeError(f"module 'sluice' has no attribute {name!r}")


def __dir__() -> list[str]:
    # The lazily imported torch names are part of the module's surface.
    return sorted(set(globals()) | set(_TORCH_NAMES))


def inspect(path: str, *, allow_partial: bool = False) -> list[dict[str, Any]]:
    """Validates a checkpoint and lists its tensors: name, dtype, shape, bytes, shard.

    A missing shard is an error unless ``allow_partial=True``."""
    from ._sluice import open_checkpoint

    ckpt = open_checkpoint(str(path), allow_partial=allow_partial)
    rows = []
    for name in ckpt.keys():  # noqa: SIM118 - a native method, not a dict
        info = ckpt.info(name)
        if info is None:  # keys() and info() read the same headers; cannot happen
            continue
        dtype, shape, shard, nbytes = info
        rows.append({"name": name, "dtype": dtype, "shape": shape, "bytes": nbytes, "shard": shard})
    return rows


__all__ = [
    "ConfigError",
    "HeaderError",
    "MemoryLimitError",
    "SluiceError",
    "SluiceFileNotFoundError",
    "SluiceIOError",
    "SluicePermissionError",
    "TensorNotFoundError",
    "__version__",
    "inspect",
    "last_load_stats",
    "load_file",
    "safe_open",
    "stream",
]
