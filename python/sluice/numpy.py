"""numpy front end, for users without torch: ``sluice.numpy.load_file`` and ``load_into``.

Arrays are zero-copy views where the tensor's offset suits its dtype. numpy
has no bfloat16 or float8; those load if the ``ml_dtypes`` package is
installed (``pip install ml_dtypes``) and otherwise raise a TypeError naming
the tensor, before anything is read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any, Optional

import numpy as np

from . import _core, _sluice
from ._core import ByteSize, IncompatibleKeys, NameFilter, PathLike
from ._progress import ProgressCallback
from .errors import ConfigError

_NATIVE = {
    "BOOL": np.bool_,
    "U8": np.uint8,
    "I8": np.int8,
    "U16": np.uint16,
    "I16": np.int16,
    "U32": np.uint32,
    "I32": np.int32,
    "U64": np.uint64,
    "I64": np.int64,
    "F16": np.float16,
    "F32": np.float32,
    "F64": np.float64,
    "C64": np.complex64,
}
_ML_DTYPES = {
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu",
}


def numpy_dtype(name: str, dtype: str) -> np.dtype:
    """The numpy dtype for a safetensors dtype string, or a TypeError naming the tensor."""
    if dtype in _NATIVE:
        return np.dtype(_NATIVE[dtype])
    if dtype in _ML_DTYPES:
        try:
            import ml_dtypes
        except ImportError:
            raise TypeError(
                f"tensor {name!r} has dtype {dtype}; numpy needs the ml_dtypes package for it"
            ) from None
        return np.dtype(getattr(ml_dtypes, _ML_DTYPES[dtype]))
    raise TypeError(f"tensor {name!r} has dtype {dtype}, which numpy cannot represent")


def window_arrays(window: Any) -> Iterator[tuple[str, np.ndarray]]:
    """Yields ``(name, array)`` for each tensor of a window."""
    base = np.asarray(window) if len(window) else np.empty(0, dtype=np.uint8)
    for name, dtype, shape, offset, nbytes in window.tensors:
        ndtype = numpy_dtype(name, dtype)
        raw = base[offset : offset + nbytes]
        if nbytes and offset % ndtype.itemsize != 0:
            raw = raw.copy()
        yield name, raw.view(ndtype).reshape(shape)


def load_file(
    filename: PathLike,
    *,
    names: NameFilter = None,
    direct: Optional[str] = None,
    engine: Optional[str] = None,
    concurrency: Optional[int] = None,
    chunk_bytes: ByteSize = None,
    drop_cache: Optional[bool] = None,
    allow_partial: bool = False,
    progress: bool = False,
    on_progress: Optional[ProgressCallback] = None,
) -> dict[str, np.ndarray]:
    """Like :func:`sluice.load_file`, returning numpy arrays.

    Every selected tensor's dtype is checked before reading: a bf16 or fp8
    tensor without ``ml_dtypes`` installed is a TypeError up front, not
    after the whole checkpoint was read.
    """
    _core.check_options(
        direct=direct, engine=engine, concurrency=concurrency, chunk_bytes=chunk_bytes
    )
    checkpoint = _sluice.open_checkpoint(os.fspath(filename), allow_partial=allow_partial)
    selected = _core.resolve_names(filename, names, checkpoint)
    for name in checkpoint.keys() if selected is None else selected:
        layout = checkpoint.layout(name)
        if layout is not None:
            numpy_dtype(name, layout[0])
    windows = _core.iter_windows(
        filename,
        selected,  # resolved once: a predicate runs once per name, a generator is read once
        bounded=False,
        progress=progress,
        on_progress=on_progress,
        direct=direct,
        engine=engine,
        concurrency=concurrency,
        chunk_bytes=chunk_bytes,
        drop_cache=drop_cache,
        checkpoint=checkpoint,
    )
    return {name: array for window in windows for name, array in window_arrays(window)}


def load_into(
    filename: PathLike,
    dest: Mapping[str, np.ndarray],
    *,
    strict: bool = True,
    concurrency: Optional[int] = None,
    chunk_bytes: ByteSize = None,
    memory_limit: ByteSize = None,
    drop_cache: Optional[bool] = None,
    allow_partial: bool = False,
    progress: bool = False,
    on_progress: Optional[ProgressCallback] = None,
) -> IncompatibleKeys:
    """Like :func:`sluice.load_into`, into numpy arrays that already exist.

    Each array must have the checkpoint's dtype and shape and be writeable (else a
    :class:`sluice.ConfigError` naming it, before any read); numpy does not convert
    silently. A C-contiguous array is read into directly, any other through a copy.
    Names, strictness, aliases and errors are as for the torch function.
    """
    _core.check_options(concurrency=concurrency, chunk_bytes=chunk_bytes, memory_limit=memory_limit)
    targets = dict(dest)
    for name, a in targets.items():
        if not isinstance(a, np.ndarray):
            raise ConfigError(f"destination {name!r} is a {type(a).__name__}, not an array")
    ckpt = _sluice.open_checkpoint(os.fspath(filename), allow_partial=allow_partial)
    result = _core.match_names(filename, ckpt, targets, strict)
    missing = set(result.missing_keys)
    direct: dict[str, tuple[int, int, np.ndarray]] = {}
    copied: dict[str, np.ndarray] = {}
    for name, a in targets.items():
        if name in missing:
            continue
        dtype, shape = ckpt.layout(name)
        want = numpy_dtype(name, dtype)
        if a.dtype != want or tuple(a.shape) != tuple(shape):
            raise ConfigError(
                f"tensor {name!r}: the destination is {a.dtype}{list(a.shape)}, "
                f"the checkpoint {want}{list(shape)}"
            )
        if not a.flags.writeable:
            raise ConfigError(f"tensor {name!r}: the destination array is not writeable")
        if a.flags.c_contiguous:
            direct[name] = (a.ctypes.data, a.nbytes, a)
        else:
            copied[name] = a
    options = {
        "concurrency": concurrency,
        "chunk_bytes": chunk_bytes,
        "drop_cache": drop_cache,
        "allow_partial": allow_partial,
    }

    def copy_rest(report: ProgressCallback) -> None:
        # Strided destinations: read whole, then copied into place.
        loaded = load_file(filename, names=list(copied), on_progress=report, **options)
        for name, array in loaded.items():
            np.copyto(copied[name], array)

    _core.fill_destinations(
        filename,
        ckpt,
        direct,
        sum(a.nbytes for a in copied.values()),
        copy_rest if copied else None,
        progress,
        on_progress,
        memory_limit=memory_limit,
        **options,
    )
    return result
