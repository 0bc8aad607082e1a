"""PyTorch front end: drop-in replacements for ``safetensors.torch``.

Tensors come back as zero-copy views over Sluice's buffers. A tensor whose
offset in the file is not a multiple of its element size (legal in
safetensors, rare in practice) is copied into a fresh, aligned tensor instead.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from typing import Any, Optional, Union

import numpy as np
import torch

from . import _core, _grouped, _pinned, _sluice
from ._core import ByteSize, IncompatibleKeys, NameFilter, PathLike
from ._progress import ProgressCallback
from .errors import ConfigError, SluiceError, TensorNotFoundError

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


def torch_shape(name: str, dtype: str, shape: Any, path: Any) -> tuple[int, ...]:
    """The torch shape of a tensor: F4 packs two values per byte, so its last dimension
    halves, and an odd one cannot be represented (a TypeError naming file and tensor)."""
    shape = tuple(shape)
    if dtype != "F4" or not shape:
        return shape
    if shape[-1] % 2:
        raise TypeError(
            f"{path}: tensor {name!r} is F4 with an odd last dimension {shape[-1]}; "
            "torch's float4_e2m1fn_x2 packs two values per byte"
        )
    return (*shape[:-1], shape[-1] // 2)


def window_tensors(window: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """Yields ``(name, tensor)`` for each tensor of a window, as views where aligned."""
    base = torch.from_numpy(np.asarray(window)) if len(window) else None
    for name, dtype, shape, offset, nbytes in window.tensors:
        tdtype = torch_dtype(name, dtype)
        shape = torch_shape(name, dtype, shape, window.shard)
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


def to_device(device: Union[str, int, torch.device]) -> torch.device:
    """``"cpu"``, ``"cuda"``, ``"cuda:N"``, an int N (CUDA device N) or a
    ``torch.device`` of those; anything else (``"meta"``, ``"mps"``, another string or
    type) is a :class:`sluice.ConfigError` naming the value."""
    if isinstance(device, torch.device):
        dev = device
    elif isinstance(device, bool):
        raise ConfigError(f"device must be a string, an int or a torch.device, not {device!r}")
    elif isinstance(device, int):
        if device < 0:
            raise ConfigError(f"device index must be non-negative, not {device}")
        dev = torch.device("cuda", device)
    else:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ConfigError(f"device {device!r} is not a device torch knows: {e}") from None
    if dev.type not in ("cpu", "cuda"):
        # A meta tensor holds no bytes (a "load" would read nothing), and other
        # backends fail mid-load with torch's own errors.
        raise ConfigError(f"device {device!r} is not supported: use 'cpu', 'cuda' or 'cuda:N'")
    return dev


def usable_device(device: Union[str, int, torch.device]) -> torch.device:
    """:func:`to_device`, checked to exist here: a CUDA device on a machine without CUDA,
    or past the last GPU, is a :class:`sluice.ConfigError` before anything is read (torch
    would otherwise fail at the first copy, mid-load, with an error naming no device)."""
    dev = to_device(device)
    if dev.type != "cuda":
        return dev
    if not torch.cuda.is_available():
        raise ConfigError(f"device {str(dev)!r}: CUDA is not available on this machine")
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise ConfigError(f"device {str(dev)!r}: this machine has {count} CUDA device(s)")
    return dev


#: Windows whose copies to a device may still be running; the next reads go on meanwhile.
_IN_FLIGHT = 2


def _fenced(
    windows: Iterable[Any], copy: Callable[[str, torch.Tensor], torch.Tensor]
) -> Generator[tuple[str, torch.Tensor], None, None]:
    """For each tensor of each window, ``copy(name, host_view)`` queues its copy to a device
    (``non_blocking``: from the loader's pinned buffers the copy is asynchronous, ordered on
    the device's current stream) and its result is yielded. A window's memory goes back to
    the loader's pool, to be read into again, only once an event recorded after its copies
    on each device's current stream has completed; at most ``_IN_FLIGHT`` windows wait, so
    the reads of the next windows overlap the copies. Closing early or an error waits for
    the copies queued so far."""
    pending: deque[tuple[list[Any], Any]] = deque()  # (events, window)

    def settle(keep: int) -> None:
        while pending and (len(pending) > keep or all(e.query() for e in pending[0][0])):
            for event in pending.popleft()[0]:
                event.synchronize()

    devices: set[torch.device] = set()  # those the current window's copies went to
    try:
        for window in windows:
            for name, host in window_tensors(window):
                out = copy(name, host)
                if out.device.type == "cuda":
                    devices.add(out.device)
                yield name, out
            events = []
            for device in devices:
                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(device))
                events.append(event)
            devices = set()
            pending.append((events, window))  # the window holds the memory copied from
            del window
            settle(_IN_FLIGHT)
    finally:
        # A window left part-way (closed early, an error) has no event yet: wait for its
        # device streams before its memory can go back.
        for device in devices:
            torch.cuda.current_stream(device).synchronize()
        settle(0)


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
    allow_partial: bool = False,
    progress: bool = False,
    on_progress: Optional[ProgressCallback] = None,
    checkpoint: Any = None,
    group: Any = None,
    group_timeout: float = _grouped.DEFAULT_TIMEOUT_S,
) -> dict[str, torch.Tensor]:
    """Loads a safetensors file, a directory of shards, or a sharded index.

    Returns ``dict[str, torch.Tensor]`` bit-identical to
    ``safetensors.torch.load_file``. On CPU the tensors are views over
    Sluice's buffers (a buffer is freed when all its tensors are). For a
    CUDA device the reads land in buffers registered with CUDA once (pinned)
    and each tensor's copy is queued on the device's current stream as its
    window lands, overlapping the next reads; host memory stays under
    ``memory_limit`` (default 512 MiB). The tensors are ready for work queued
    on that stream; the call returns once every copy has run. On error nothing is
    returned: there are no partial results. A checkpoint with a shard
    missing is an error unless ``allow_partial=True``, which loads the rest
    and lists the absent files in ``last_load_stats()["missing_shards"]``.

    ``group`` (a torch.distributed process group) makes the call collective: the ranks
    read each byte once between them and each gets the tensors its ``names`` select (see
    :func:`stream`).
    """
    timeout = _grouped.check_timeout(group_timeout)
    dev = usable_device(device)
    if group is not None:
        grouped = _grouped_stream(
            filename, group, timeout, names, dev, memory_limit, allow_partial,
            direct=direct, engine=engine, concurrency=concurrency, chunk_bytes=chunk_bytes,
            drop_cache=drop_cache,
        )  # fmt: skip
        return dict(grouped)
    on_cpu = dev.type == "cpu"
    windows = _core.iter_windows(
        filename,
        names,
        bounded=not on_cpu,
        pin=dev.type == "cuda",
        progress=progress,
        on_progress=on_progress,
        direct=direct,
        engine=engine,
        concurrency=concurrency,
        chunk_bytes=chunk_bytes,
        memory_limit=memory_limit,
        drop_cache=drop_cache,
        allow_partial=allow_partial,
        checkpoint=checkpoint,
    )
    result: dict[str, torch.Tensor] = {}
    if on_cpu:
        for window in windows:
            for name, tensor in window_tensors(window):
                result[name] = tensor
        return result
    for name, tensor in _fenced(windows, lambda _, t: t.to(dev, non_blocking=True)):
        result[name] = tensor
    return result


def stream(
    filename: PathLike,
    *,
    memory_limit: ByteSize = None,
    names: NameFilter = None,
    device: Union[str, int, torch.device] = "cpu",
    direct: Optional[str] = None,
    engine: Optional[str] = None,
    concurrency: Optional[int] = None,
    chunk_bytes: ByteSize = None,
    drop_cache: Optional[bool] = None,
    allow_partial: bool = False,
    progress: bool = False,
    on_progress: Optional[ProgressCallback] = None,
    group: Any = None,
    group_timeout: float = _grouped.DEFAULT_TIMEOUT_S,
) -> Generator[tuple[str, torch.Tensor], None, None]:
    """Yields ``(name, tensor)`` as each tensor's bytes land, in completion order.

    Buffers come from a pool capped at ``memory_limit`` bytes (default: the
    ``SLUICE_MEMORY_LIMIT`` environment variable, else 512 MiB). Each yielded
    CPU tensor is a view into a pooled buffer: it stays valid for as long as
    you hold it, and its memory returns to the pool once every tensor of its
    buffer is dropped. The intended use is to copy each tensor into its
    destination (``param.copy_(t)``) and let it go. Holding more than
    ``memory_limit`` of yielded tensors raises :class:`sluice.MemoryLimitError`
    instead of waiting forever. Closing the generator early stops the reads.
    A tensor for a CUDA ``device`` is filled by a copy queued on the device's
    current stream from pinned memory: use it on that stream (or synchronize
    first).

    ``group`` (a torch.distributed process group, e.g. ``dist.group.WORLD``) makes the
    call collective: every rank of the group calls it on the same checkpoint, with its own
    ``names``, and each tensor anyone wants is read from storage by one rank that wants it
    and sent to the others that want it (over a gloo group of the same ranks, so an NCCL
    group works too). Tensors then come round by round (rounds of ``memory_limit / 2``
    bytes, in file order). Every rank raises if one fails, dies, or stops early;
    ``group_timeout`` seconds bound the wait for a rank that stalls. ``last_load_stats()``
    then has ``read_bytes``, ``sent_bytes`` and ``received_bytes`` for this rank.
    """
    timeout = _grouped.check_timeout(group_timeout)
    dev = usable_device(device)
    if group is not None:
        yield from _grouped_stream(
            filename, group, timeout, names, dev, memory_limit, allow_partial,
            direct=direct, engine=engine, concurrency=concurrency, chunk_bytes=chunk_bytes,
            drop_cache=drop_cache,
        )  # fmt: skip
        return
    windows = _core.iter_windows(
        filename,
        names,
        bounded=True,
        pin=dev.type == "cuda",
        progress=progress,
        on_progress=on_progress,
        direct=direct,
        engine=engine,
        concurrency=concurrency,
        chunk_bytes=chunk_bytes,
        memory_limit=memory_limit,
        drop_cache=drop_cache,
        allow_partial=allow_partial,
    )
    try:
        if dev.type == "cpu":
            for window in windows:
                yield from window_tensors(window)
                del window
        else:
            yield from _fenced(windows, lambda _, t: t.to(dev, non_blocking=True))
    finally:
        windows.close()


def _grouped_stream(
    filename: PathLike,
    group: Any,
    timeout: float,
    names: NameFilter,
    dev: torch.device,
    memory_limit: ByteSize,
    allow_partial: bool,
    into: Optional[dict[str, torch.Tensor]] = None,
    **options: Any,
) -> Iterator[tuple[str, torch.Tensor]]:
    """:func:`stream` with ``group``: see there (``into``: :func:`_grouped.stream`)."""
    options = {k: v for k, v in options.items() if v is not None}
    yield from _grouped.stream(
        os.fspath(filename), group, names, dev, memory_limit, timeout, allow_partial, options,
        into=into,
    )  # fmt: skip


def load_into(
    filename: PathLike,
    dest: Union[Mapping[str, torch.Tensor], torch.nn.Module],
    *,
    strict: bool = True,
    concurrency: Optional[int] = None,
    chunk_bytes: ByteSize = None,
    memory_limit: ByteSize = None,
    drop_cache: Optional[bool] = None,
    allow_partial: bool = False,
    progress: bool = False,
    on_progress: Optional[ProgressCallback] = None,
    group: Any = None,
    group_timeout: float = _grouped.DEFAULT_TIMEOUT_S,
    direct: Optional[str] = None,
) -> IncompatibleKeys:
    """Reads a checkpoint straight into tensors that already exist: a model's parameters.

    ``dest`` is a module (its ``state_dict()``) or a mapping of names to tensors.
    ``sluice.load_into(path, model)`` does what ``model.load_state_dict(load_file(path))``
    does, without holding a second copy of the model: each tensor's bytes are read from
    the file (or object store) into the parameter's own memory.

    - A contiguous CPU destination of the checkpoint's dtype is read into directly; any
      other (another device, another dtype, a non-contiguous view) is filled with
      ``copy_`` from a stream under ``memory_limit``, as ``load_state_dict`` converts.
      ``memory_limit`` defaults to ``SLUICE_MEMORY_LIMIT``, else 512 MiB.
    - A destination on the meta device (or any but cpu and cuda) is a
      :class:`sluice.ConfigError` naming it, before any tensor is read.
    - Shapes must match: a mismatch is a :class:`sluice.ConfigError` naming the tensor.
    - ``strict=True`` (the default, as in torch) refuses, before reading anything, a
      destination the checkpoint lacks or a checkpoint tensor with no destination
      (:class:`sluice.TensorNotFoundError`). ``strict=False`` loads the names both have
      and returns the rest in :class:`IncompatibleKeys`.
    - Destinations that share memory (tied weights) are read once; destinations that
      overlap otherwise are a :class:`sluice.ConfigError`.
    - On an error or Ctrl-C the reads in flight are waited for and the error raised; the
      destinations then hold a mix of old and new bytes, never a finished-looking load.
    - ``direct`` is as for :func:`load_file` (``"auto"`` by default).
    - ``group`` (a torch.distributed process group) makes the call collective, as for
      :func:`stream`: the ranks read each byte once between them, each rank receives the
      tensors its destinations need, and every rank raises if one fails.
    """
    timeout = _grouped.check_timeout(group_timeout)
    _core.check_options(
        concurrency=concurrency, chunk_bytes=chunk_bytes, memory_limit=memory_limit, direct=direct
    )
    targets = dest.state_dict() if isinstance(dest, torch.nn.Module) else dict(dest)
    for name, t in targets.items():
        if not isinstance(t, torch.Tensor):
            raise ConfigError(f"destination {name!r} is a {type(t).__name__}, not a tensor")
    ckpt = _sluice.open_checkpoint(os.fspath(filename), allow_partial=allow_partial)
    result = _core.match_names(filename, ckpt, targets, strict)
    missing = set(result.missing_keys)
    in_place: dict[str, tuple[int, int, torch.Tensor]] = {}
    copied: dict[str, torch.Tensor] = {}
    for name, t in targets.items():
        if name in missing:
            continue
        dtype, shape = ckpt.layout(name)
        tdtype = torch_dtype(name, dtype)
        shape = torch_shape(name, dtype, shape, filename)
        if tuple(t.shape) != shape:
            raise ConfigError(
                f"tensor {name!r}: the destination has shape {list(t.shape)}, "
                f"the checkpoint {list(shape)}"
            )
        if t.device.type not in ("cpu", "cuda"):
            # A meta tensor has no memory: copy_ into it "succeeds" and loads nothing.
            raise ConfigError(
                f"tensor {name!r}: the destination is on the {t.device.type} device, "
                "which holds no bytes to load into (or is not supported); use cpu or cuda"
            )
        if t.device.type == "cpu" and t.dtype == tdtype and t.is_contiguous():
            in_place[name] = (t.data_ptr(), t.numel() * t.element_size(), t)
        else:
            copied[name] = t

    if group is not None:
        # Destinations that take the bytes as they are get them read or received in place;
        # the others are filled with copy_ from what the group yields.
        into = {n: d[2] for n, d in in_place.items()}
        wanted = {**into, **copied}
        grouped = _grouped_stream(
            filename, group, timeout, list(wanted), torch.device("cpu"), memory_limit,
            allow_partial, into=into, concurrency=concurrency, chunk_bytes=chunk_bytes,
            drop_cache=drop_cache, direct=direct,
        )  # fmt: skip
        with torch.no_grad():
            for name, t in grouped:
                if name not in into:
                    wanted[name].copy_(t)
        return result

    def copy_rest(report: ProgressCallback) -> None:
        # Another device, dtype or layout: copy_ converts, as load_state_dict does. CUDA
        # destinations are filled straight from the loader's pinned windows, each copy
        # queued on the device's current stream (no CUDA tensor per checkpoint tensor).
        windows = _core.iter_windows(
            filename,
            list(copied),
            bounded=True,
            pin=any(t.device.type == "cuda" for t in copied.values()),
            on_progress=report,
            concurrency=concurrency,
            chunk_bytes=chunk_bytes,
            memory_limit=memory_limit,
            drop_cache=drop_cache,
            allow_partial=allow_partial,
            checkpoint=ckpt,
            direct=direct,
        )
        try:
            with torch.no_grad():
                for _ in _fenced(windows, lambda n, t: copied[n].copy_(t, non_blocking=True)):
                    pass
        finally:
            windows.close()

    _core.fill_destinations(
        filename,
        ckpt,
        in_place,
        sum(t.numel() * t.element_size() for t in copied.values()),
        copy_rest if copied else None,
        progress,
        on_progress,
        concurrency=concurrency,
        chunk_bytes=chunk_bytes,
        memory_limit=memory_limit,
        drop_cache=drop_cache,
        allow_partial=allow_partial,
        direct=direct,
    )
    return result


# The options of safe_open(**options) that are checked when it opens, before any read.
_CHECKED_OPTIONS = ("direct", "engine", "concurrency", "chunk_bytes", "memory_limit")


class safe_open:
    """A ``safetensors.safe_open``-compatible reader over a file, directory or index.

    The headers are validated and every shard file opened once; the handle
    keeps those descriptors until it is closed (``with`` block exit or
    :meth:`close`), so a checkpoint replaced on disk meanwhile still yields
    its own bytes, and one truncated in place raises :class:`sluice.SluiceIOError`.

    - ``get_tensor(name)`` reads that tensor into a fresh tensor (one
      ``pread``; split across threads above 32 MiB), on ``device``.
    - ``get_slice(name)[...]`` reads only the bytes of the slice, with
      torch's indexing semantics (ints, slices with steps, ``...``, ``None``).
    - ``get_tensors()`` reads everything through the loader (io_uring,
      O_DIRECT) into a dict.

    ``device`` is ``"cpu"``, ``"cuda"``, ``"cuda:N"``, an int N (CUDA device
    N) or a ``torch.device``, as for :func:`load_file`. ``allow_partial=True``
    opens a checkpoint with missing shards; other options are those of
    :func:`load_file` and apply to ``get_tensors()``.
    """

    def __init__(
        self,
        filename: PathLike,
        framework: str = "pt",
        device: Union[str, int, torch.device] = "cpu",
        *,
        allow_partial: bool = False,
        **options: Any,
    ):
        if framework not in ("pt", "torch", "pytorch"):
            raise ConfigError(f"sluice.torch.safe_open supports framework='pt', not {framework!r}")
        self._path = filename
        self._device = usable_device(device)
        _core.check_options(
            **{k: v for k, v in options.items() if k in _CHECKED_OPTIONS and v is not None}
        )
        self._options = options
        self._ckpt: Any = _sluice.open_checkpoint(os.fspath(filename), allow_partial=allow_partial)

    def __enter__(self) -> safe_open:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the shard files; later reads raise :class:`sluice.SluiceError`."""
        self._ckpt = None

    def _open(self) -> Any:
        if self._ckpt is None:
            raise SluiceError(f"{self._path}: this safe_open handle is closed")
        return self._ckpt

    def keys(self) -> list[str]:
        return sorted(self._open().keys())

    def offset_keys(self) -> list[str]:
        """Tensor names in file order."""
        return self._open().keys()

    def metadata(self) -> Optional[dict[str, str]]:
        return self._open().metadata()

    def __contains__(self, name: str) -> bool:
        return name in self._open()

    def _layout(self, name: str) -> tuple[str, list[int]]:
        layout = self._open().layout(name)
        if layout is None:
            raise TensorNotFoundError(f"tensor {name!r} is not in {self._path}")
        return layout

    def get_tensor(self, name: str) -> torch.Tensor:
        dtype, shape = self._layout(name)
        tdtype = torch_dtype(name, dtype)
        shape = torch_shape(name, dtype, shape, self._path)
        if self._device.type == "cuda":
            out = torch.empty(shape, dtype=tdtype, device=self._device)
            flat = out.reshape(-1).view(torch.uint8) if out.numel() else None
            if flat is None or _through_pinned(
                lambda off, addr, n: self._ckpt.read_tensor_into(name, off, addr, n),
                flat,
                lambda: _record_on(self._device),
                f"safe_open {name!r}",
            ):
                return out
        tensor = bytes_tensor(self._ckpt.read_tensor(name), tdtype, shape)
        return tensor if self._device.type == "cpu" else tensor.to(self._device)

    def get_slice(self, name: str) -> TensorSlice:
        dtype, shape = self._layout(name)
        return TensorSlice(self, name, dtype, shape)

    def get_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor, read by the loader from the held files."""
        return load_file(self._path, self._device, checkpoint=self._open(), **self._options)


#: The pinned windows a CUDA ``safe_open(...).get_tensor`` reads through: two, alternating,
#: so one window's read overlaps the other's copy.
_GET_WINDOW_BYTES = 16 << 20


def _record_on(device: torch.device) -> Any:
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


def _through_pinned(
    read_into: Callable[[int, int, int], None],
    dst: torch.Tensor,
    record: Callable[[], Any],
    what: str,
) -> bool:
    """Fills ``dst`` (flat bytes in device memory) window by window: ``read_into(offset,
    address, n)`` reads into a pinned window from the process's budget, and the window's
    copy is queued (``non_blocking``) on the device's current stream, with an event
    (``record()``) after it. A window is read into again only after its event; returns once
    every copy has run. ``False`` (nothing read) when the budget has no room for a window:
    the caller reads another way. An error waits for the copies queued so far, gives the
    windows back and propagates (``dst`` is then partial)."""
    nbytes = dst.numel()
    size = min(nbytes, _GET_WINDOW_BYTES)
    windows = []
    for _ in range(1 if size == nbytes else 2):
        buf = _pinned.take(size, what)
        if buf is None:
            break
        windows.append([buf, buf.tensor(), None])  # buffer, its view, its last event
    try:
        if not windows:
            return False
        for k, offset in enumerate(range(0, nbytes, size)):
            window = windows[k % len(windows)]
            if window[2] is not None:
                window[2].synchronize()  # its previous copy has run
            n = min(size, nbytes - offset)
            read_into(offset, window[0].address, n)
            dst[offset : offset + n].copy_(window[1][:n], non_blocking=True)
            window[2] = record()
        return True
    finally:
        for _, _, event in windows:
            if event is not None:
                event.synchronize()
        for buf, _, _ in windows:
            buf.release()


class TensorSlice:
    """``safe_open(...).get_slice(name)``: shape and dtype without reading, and
    ``[index]`` reading only the bytes the index selects."""

    def __init__(self, owner: safe_open, name: str, dtype: str, shape: list[int]):
        self._owner = owner
        self._name = name
        self._dtype = dtype
        self._shape = list(shape)

    def get_shape(self) -> list[int]:
        return list(self._shape)

    def get_dtype(self) -> str:
        """The safetensors dtype string, e.g. ``"BF16"``."""
        return self._dtype

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d tensor")
        return self._shape[0]

    def __getitem__(self, index: Any) -> torch.Tensor:
        tdtype = torch_dtype(self._name, self._dtype)
        ckpt = self._owner._open()
        plan = slice_plan(self._shape, index)
        if plan is None or self._dtype == "F4":
            # Advanced indexing (tensors, lists, booleans), or packed 4-bit
            # values: read the whole tensor and let torch index it.
            shape = torch_shape(self._name, self._dtype, self._shape, self._owner._path)
            whole = bytes_tensor(ckpt.read_tensor(self._name), tdtype, shape)
            out = whole[index]
        else:
            ranges, rest = plan
            block_shape = [hi - lo for lo, hi in ranges]
            block = bytes_tensor(ckpt.read_block(self._name, ranges), tdtype, block_shape)
            out = block[rest]
        device = self._owner._device
        return out if device.type == "cpu" else out.to(device)


def slice_plan(
    shape: list[int], index: Any
) -> Optional[tuple[list[tuple[int, int]], tuple[Any, ...]]]:
    """Splits a basic index into the block to read and the index into that block.

    Returns ``(ranges, rest)``: ``ranges[d]`` is the bounding ``(lo, hi)`` of
    what dimension ``d`` selects, and ``rest`` indexes the block read with
    those ranges to give exactly ``tensor[index]``. ``None`` for indices
    this cannot bound (tensors, lists, booleans), which the caller hands to
    torch whole. Out-of-range integers and too many indices raise torch's
    ``IndexError`` messages.
    """
    items: list[Any] = []
    for item in index if isinstance(index, tuple) else (index,):
        if isinstance(item, bool):
            return None  # torch treats a bool as a mask, adding a dimension
        if isinstance(item, (int, slice, type(Ellipsis), type(None))):
            items.append(item)
        elif _is_int_like(item):
            items.append(int(item))
        else:
            return None
    consuming = sum(1 for i in items if i is not Ellipsis and i is not None)
    if consuming > len(shape):
        raise IndexError(f"too many indices for tensor of dimension {len(shape)}")
    expanded: list[Any] = []
    seen_ellipsis = False
    for item in items:
        if item is Ellipsis:
            if not seen_ellipsis:
                expanded.extend([slice(None)] * (len(shape) - consuming))
            seen_ellipsis = True
        else:
            expanded.append(item)
    ranges: list[tuple[int, int]] = []
    rest: list[Any] = []
    dim = 0
    for item in expanded:
        if item is None:
            rest.append(None)
            continue
        size = shape[dim]
        if isinstance(item, int):
            i = item + size if item < 0 else item
            if not 0 <= i < size:
                raise IndexError(
                    f"index {item} is out of bounds for dimension {dim} with size {size}"
                )
            ranges.append((i, i + 1))
            rest.append(0)
        else:
            if item.step is not None and item.step <= 0:
                return None  # torch's own error ("step must be greater than zero")
            start, stop, step = item.indices(size)
            count = len(range(start, stop, step))
            if count == 0:
                ranges.append((start, start))
                rest.append(slice(None))
            else:
                ranges.append((start, start + (count - 1) * step + 1))
                rest.append(slice(None, None, step))
        dim += 1
    for size in shape[dim:]:
        ranges.append((0, size))
    return ranges, tuple(rest)


def _is_int_like(value: Any) -> bool:
    """A 0-d integer tensor or numpy integer, which indexes like an int."""
    if isinstance(value, torch.Tensor):
        return value.dim() == 0 and not value.is_floating_point() and value.dtype != torch.bool
    return isinstance(value, np.integer)


def bytes_tensor(buffer: Any, tdtype: torch.dtype, shape: Any) -> torch.Tensor:
    """A tensor of ``shape`` (torch's, see :func:`torch_shape`) over an owned byte
    buffer, without a copy."""
    if len(buffer) == 0:
        return torch.empty(shape, dtype=tdtype)
    raw = torch.from_numpy(np.asarray(buffer))
    return raw.view(tdtype).view(shape)
