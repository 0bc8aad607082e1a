"""PyTorch front end: drop-in replacements for ``safetensors.torch``.

Tensors come back as zero-copy views over Sluice's buffers. A tensor whose
offset in the file is not a multiple of its element size (legal in
safetensors, rare in practice) is copied into a fresh, aligned tensor instead.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any, Optional, Union

import numpy as np
import torch

from . import _core, _sluice
from ._core import ByteSize, NameFilter, PathLike
from ._progress import ProgressCallback
from .errors import TensorNotFoundError

_DTYPES: dict[str, Any] = {
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
    "C64": torch.complex64,
    "U16": getattr(torch, "uint16", None),
    "U32": getattr(torch, "uint32", None),
    "U64": getattr(torch, "uint64", None),
    "F8_E4M3": getattr(torch, "float8_e4m3fn", None),
    "F8_E5M2": getattr(torch, "float8_e5m2", None),
    "F8_E4M3FNUZ": getattr(torch, "float8_e4m3fnuz", None),
    "F8_E5M2FNUZ": getattr(torch, "float8_e5m2fnuz", None),
    "F8_E8M0": getattr(torch, "float8_e8m0fnu", None),
    # Two 4-bit values per byte; torch's shape counts bytes, so the last dim halves.
    "F4": getattr(torch, "float4_e2m1fn_x2", None),
}


def torch_dtype(name: str, dtype: str) -> torch.dtype:
    """The torch dtype for a safetensors dtype string, or a TypeError naming the tensor."""
    found = _DTYPES.get(dtype)
    if found is None:
        raise TypeError(
            f"tensor {name!r} has dtype {dtype}, which torch {torch.__version__} cannot represent"
        )
    return found


def window_tensors(window: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """Yields ``(name, tensor)`` for each tensor of a window, as views where aligned."""
    base = torch.from_numpy(np.asarray(window)) if len(window) else None
    for name, dtype, shape, offset, nbytes in window.tensors:
        tdtype = torch_dtype(name, dtype)
        if dtype == "F4" and shape:
            shape = (*shape[:-1], shape[-1] // 2)
        if nbytes == 0 or base is None:
            yield name, torch.empty(shape, dtype=tdtype)
            continue
        raw = base[offset : offset + nbytes]
        if offset % tdtype.itemsize == 0:
            yield name, raw.view(tdtype).view(shape)
        else:
            out = torch.empty(shape, dtype=tdtype)
            out.view(-1).view(torch.uint8).copy_(raw)
            yield name, out


def load_file(
    filename: PathLike,
    device: Union[str, int, torch.device] = "cpu",
    *,
    names: NameFilter = None,
    direct: Optional[str] = None,
    engine: Optional[str] = None,
    concurrency: Optional[int] = None,
    chunk_bytes: ByteSize = None,
    memory_limit: ByteSize = None,
    drop_cache: Optional[bool] = None,
    progress: bool = False,
    on_progress: Optional[ProgressCallback] = None,
) -> dict[str, torch.Tensor]:
    """Loads a safetensors file, a directory of shards, or a sharded index.

    Returns ``dict[str, torch.Tensor]`` bit-identical to
    ``safetensors.torch.load_file``. On CPU the tensors are views over
    Sluice's buffers (a buffer is freed when all its tensors are). For any
    other device each tensor is copied there as it lands, and host memory
    stays under ``memory_limit`` (default 512 MiB). On error nothing is
    returned: there are no partial results.
    """
    dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    on_cpu = dev.type == "cpu"
    windows = _core.iter_windows(
        filename,
        names,
        bounded=not on_cpu,
        progress=progress,
        on_progress=on_progress,
        direct=direct,
        engine=engine,
        concurrency=concurrency,
        chunk_bytes=chunk_bytes,
        memory_limit=memory_limit,
        drop_cache=drop_cache,
    )
    result: dict[str, torch.Tensor] = {}
    for window in windows:
        for name, tensor in window_tensors(window):
            result[name] = tensor if on_cpu else tensor.to(dev)
    return result


def stream(
    filename: PathLike,
    *,
    memory_limit: ByteSize = 512 * 2**20,
    names: NameFilter = None,
    device: Union[str, int, torch.device] = "cpu",
    direct: Optional[str] = None,
    engine: Optional[str] = None,
    concurrency: Optional[int] = None,
    chunk_bytes: ByteSize = None,
    drop_cache: Optional[bool] = None,
    progress: bool = False,
    on_progress: Optional[ProgressCallback] = None,
) -> Generator[tuple[str, torch.Tensor], None, None]:
    """Yields ``(name, tensor)`` as each tensor's bytes land, in completion order.

    Buffers come from a pool capped at ``memory_limit`` bytes. Each yielded
    CPU tensor is a view into a pooled buffer: it stays valid for as long as
    you hold it, and its memory returns to the pool once every tensor of its
    buffer is dropped. The intended use is to copy each tensor into its
    destination (``param.copy_(t)``) and let it go. Holding more than
    ``memory_limit`` of yielded tensors raises :class:`sluice.MemoryLimitError`
    instead of waiting forever. Closing the generator early stops the reads.
    """
    dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    windows = _core.iter_windows(
        filename,
        names,
        bounded=True,
        progress=progress,
        on_progress=on_progress,
        direct=direct,
        engine=engine,
        concurrency=concurrency,
        chunk_bytes=chunk_bytes,
        memory_limit=memory_limit,
        drop_cache=drop_cache,
    )
    try:
        for window in windows:
            for name, tensor in window_tensors(window):
                yield name, (tensor if dev.type == "cpu" else tensor.to(dev))
            del window
    finally:
        windows.close()


class safe_open:
    """A ``safetensors.safe_open``-compatible reader over a file, directory or index.

    ``keys()`` and ``metadata()`` come from the validated headers; each
    ``get_tensor(name)`` reads just that tensor (an owned CPU tensor, or on
    ``device``). Options are those of :func:`load_file`.
    """

    def __init__(
        self,
        filename: PathLike,
        framework: str = "pt",
        device: Union[str, int] = "cpu",
        **options: Any,
    ):
        if framework not in ("pt", "torch", "pytorch"):
            raise ValueError(f"sluice.torch.safe_open supports framework='pt', not {framework!r}")
        self._path = filename
        self._device = device
        self._options = options
        self._ckpt = _sluice.open_checkpoint(str(filename))

    def __enter__(self) -> safe_open:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def keys(self) -> list[str]:
        return sorted(self._ckpt.keys())

    def offset_keys(self) -> list[str]:
        """Tensor names in file order."""
        return self._ckpt.keys()

    def metadata(self) -> Optional[dict[str, str]]:
        return self._ckpt.metadata()

    def __contains__(self, name: str) -> bool:
        return name in self._ckpt

    def get_tensor(self, name: str) -> torch.Tensor:
        if name not in self._ckpt:
            raise TensorNotFoundError(f"tensor {name!r} is not in {self._path}")
        # Reads with the layout validated at open: a file changed since then
        # fails as an I/O error rather than being silently re-parsed.
        windows = _core.iter_windows(
            self._path, [name], bounded=False, checkpoint=self._ckpt, **self._options
        )
        dev = torch.device(self._device) if not isinstance(self._device, int) else None
        for window in windows:
            for tname, tensor in window_tensors(window):
                if tname == name:
                    return tensor if dev is None or dev.type == "cpu" else tensor.to(dev)
        raise TensorNotFoundError(f"tensor {name!r} is not in {self._path}")
