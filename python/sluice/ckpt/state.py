"""State dicts as checkpoint entries: flattening, the host memory behind tensors and arrays,
and putting loaded values back.

This is the part of ``sluice.ckpt`` that knows torch and numpy; everything about chunks,
plans and the store is in the native layer (``sluice-ckpt``).
"""

from __future__ import annotations

import ctypes
import json
import pickle
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Optional

from ..errors import ConfigError


def is_tensor(v: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(v, torch.Tensor)


def is_array(v: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(v, np.ndarray)


def flatten(state: Mapping[str, Any]) -> list[tuple[str, tuple[Any, ...], Any]]:
    """(flat key, path of keys, leaf) for every leaf of nested mappings, keys joined by
    '.'; two paths that join to one key are refused."""
    if not isinstance(state, Mapping):
        raise ConfigError(f"state_dict: expected a mapping, got {type(state).__name__}")
    out: list[tuple[str, tuple[Any, ...], Any]] = []
    seen: dict[str, tuple[Any, ...]] = {}

    def walk(prefix: tuple[Any, ...], node: Mapping[Any, Any]) -> None:
        for k, v in node.items():
            path = (*prefix, k)
            if isinstance(v, Mapping) and not is_tensor(v) and len(v) > 0:
                walk(path, v)
                continue
            key = ".".join(str(p) for p in path)
            if key in seen:
                raise ConfigError(
                    f"state_dict: {list(seen[key])!r} and {list(path)!r} both flatten to {key!r}"
                )
            seen[key] = path
            out.append((key, path, v))

    walk((), state)
    return out


def dtype_name(t: Any) -> str:
    if is_tensor(t):
        return str(t.dtype).removeprefix("torch.")
    return str(t.dtype)


def streamed(t: Any) -> bool:
    """Whether a tensor's bytes are hashed and staged through a host window rather than
    copied to host memory whole (a device tensor: CUDA, XPU, ...)."""
    return is_tensor(t) and t.device.type not in ("cpu", "meta")


def check_array(key: str, a: Any) -> None:
    """Refuses arrays whose bytes are not data: an object array holds pointers to Python
    objects, which mean nothing once saved, and writing loaded bytes over them corrupts
    the interpreter."""
    if a.dtype.hasobject:
        raise ConfigError(
            f"{key}: a numpy array of dtype {a.dtype} holds pointers to Python objects, not "
            "data; convert it to a numeric or string dtype (or save the values as a plain "
            "list, which is pickled)"
        )


def host_bytes(key: str, v: Any, stream: bool = False) -> tuple[Any, int, int]:
    """(owner, address, nbytes) of a leaf's bytes in contiguous host memory. ``owner`` keeps
    them alive: the tensor itself, or the host copy made for a device or non-contiguous
    one. With ``stream`` a device tensor stays where it is (a contiguous copy there if need
    be) and the address is -1: its bytes come over in windows. (Callers stream only
    tensors at least a pack's threshold large: small ones are copied and packed.)"""
    if is_tensor(v):
        import torch

        if v.layout != torch.strided:
            raise ConfigError(f"{key}: {v.layout} tensors are not supported; save .to_dense()")
        if v.device.type == "meta":
            raise ConfigError(f"{key}: a meta tensor has no data to save")
        if v.is_quantized:
            raise ConfigError(
                f"{key}: quantized tensors are not supported (their scale and zero point "
                "would be lost); save .int_repr() with .q_scale() and .q_zero_point(), or "
                ".dequantize()"
            )
        t = v.detach()
        if t.is_conj():
            t = t.resolve_conj()
        if t.is_neg():
            t = t.resolve_neg()
        if stream and streamed(t):
            t = t.contiguous()
            return t, -1, t.numel() * t.element_size()
        if t.device.type != "cpu":
            t = t.to("cpu")
        if not t.is_contiguous():
            t = t.contiguous()
        n = t.numel() * t.element_size()
        return t, (t.data_ptr() if n else 0), n
    import numpy as np

    check_array(key, v)
    a = np.ascontiguousarray(v)
    return a, (a.__array_interface__["data"][0] if a.nbytes else 0), a.nbytes


@dataclass
class Leaf:
    """One entry of a save: its key and description, and where its bytes are."""

    key: str
    path: tuple[Any, ...]
    kind: str  # "tensor" | "bytes"
    owner: Any
    #: Address of contiguous host memory, or -1 for a device tensor streamed in windows.
    addr: int
    nbytes: int
    dtype: Optional[str] = None
    shape: Optional[list[int]] = None
    meta: dict[str, Any] = field(default_factory=dict)


def tensor_leaf(
    key: str, v: Any, stream_from: Optional[int], path: Optional[tuple[Any, ...]] = None
) -> Leaf:
    """A tensor or array's entry; a device tensor of at least ``stream_from`` bytes is
    streamed (None: never), a smaller one copied to host memory (and packed)."""
    big = is_tensor(v) and v.numel() * v.element_size() >= (stream_from or 0)
    owner, addr, n = host_bytes(key, v, stream_from is not None and big)
    meta = {"framework": "torch" if is_tensor(v) else "numpy"}
    return Leaf(key, path or (key,), "tensor", owner, addr, n, dtype_name(v), list(v.shape), meta)


def bytes_leaf(
    key: str, raw: bytes, meta: dict[str, Any], path: Optional[tuple[Any, ...]] = None
) -> Leaf:
    import numpy as np

    blob = np.frombuffer(raw, np.uint8)
    addr = blob.__array_interface__["data"][0] if blob.nbytes else 0
    return Leaf(key, path or (key,), "bytes", blob, addr, blob.nbytes, meta=meta)


def leaves(state: Mapping[str, Any], prefix: str, stream_from: Optional[int] = None) -> list[Leaf]:
    """The entries of a state dict: tensors and arrays as they are (device tensors of at
    least ``stream_from`` bytes streamed), any other value pickled (as torch.save and DCP
    do)."""
    out = []
    for key, path, v in flatten(state):
        name = prefix + key
        if is_tensor(v) or is_array(v):
            out.append(tensor_leaf(name, v, stream_from, path))
        else:
            raw = pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)
            out.append(bytes_leaf(name, raw, {"codec": "pickle"}, path))
    return out


def heads_json(leaves: list[Leaf]) -> str:
    """The entries' descriptions, as the native layer reads them."""
    return json.dumps(
        [
            {
                "key": lf.key,
                "kind": lf.kind,
                "dtype": lf.dtype,
                "shape": lf.shape,
                "nbytes": lf.nbytes,
                "meta": lf.meta,
            }
            for lf in leaves
        ]
    )


def writable_host(v: Any) -> Any:
    """``v`` itself where it is contiguous writable host memory, else a host buffer of its
    shape and dtype to read into and copy from."""
    if is_tensor(v):
        if v.device.type == "cpu" and v.is_contiguous() and not v.is_conj() and not v.is_neg():
            return v
        import torch

        return torch.empty(v.shape, dtype=v.dtype, device="cpu")
    import numpy as np

    if v.flags.c_contiguous and v.flags.writeable:
        return v
    return np.empty(v.shape, v.dtype)


def address(buf: Any) -> tuple[int, int]:
    """(address, nbytes) of a contiguous host tensor or array (0 when empty)."""
    if is_tensor(buf):
        n = buf.numel() * buf.element_size()
        return (buf.data_ptr() if n else 0), n
    return (buf.__array_interface__["data"][0] if buf.nbytes else 0), buf.nbytes


def at(addr: int, n: int) -> Any:
    """A torch.uint8 view of ``n`` bytes of host memory at ``addr`` (owned elsewhere)."""
    import torch

    if n == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer((ctypes.c_uint8 * n).from_address(addr), dtype=torch.uint8)


def unpack(raw: bytes, meta: Mapping[str, Any]) -> Any:
    """A bytes entry's value: pickled by sluice.ckpt.save, torch.save'd by DCP."""
    if meta.get("codec") == "torch.save":
        import io

        import torch

        return torch.load(io.BytesIO(raw), weights_only=False)
    return pickle.loads(raw)


def set_path(state: MutableMapping[Any, Any], path: tuple[Any, ...], value: Any) -> None:
    node: Any = state
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
