"""Pieces every engine adapter shares: store options (parsed from an engine's config
with unknown keys rejected), a writable directory check, and buffers over raw pointers."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, fields
from typing import Any, Union

import numpy as np

import sluice.kv
from sluice.errors import ConfigError, SluicePermissionError

ByteSize = Union[int, str]


@dataclass
class StoreOptions:
    """The ``sluice.kv.open`` options an engine's config may set. Namespace fields
    (model, dtype, ranks, layout) come from the engine, never from this config, so two
    deployments cannot be configured into reading each other's blocks."""

    path: str = ""
    # A `sluice kv serve` socket. When set, every process of the engine (TP ranks, DP
    # replicas, other engines) shares the sidecar's store through `sluice.kv.connect`
    # instead of opening its own directory; `path` and the tier options are then the
    # server's. Their namespaces still keep their blocks apart.
    socket: str = ""
    # 0: no DRAM tier. Engines keep their own host tier in front of us (vLLM's primary,
    # SGLang's host pool, LMCache's L1), so a second DRAM copy is opt-in.
    dram: ByteSize = 0
    # 10 GiB: enough for a smoke run of an 8B model (5k chunks of 2 MiB); set it to the
    # disk budget in production.
    ssd: ByteSize = "10GiB"
    policy: str = sluice.kv.DEFAULTS["policy"]
    # Bumped by the operator to invalidate every block (a new engine build, a new
    # tokenizer) without deleting the directory.
    salt: str = ""
    durability: str = sluice.kv.DEFAULTS["durability"]
    direct: str = sluice.kv.DEFAULTS["direct"]
    # A directory other nodes mount too (NFS, Lustre): the shared tier. Each node writes
    # `shared` bytes of segments there and reads those other nodes sealed.
    shared_dir: str = ""
    shared: ByteSize = 0
    # Or the shared tier in an object store ("s3://bucket/prefix", gs://, az://): each node
    # uploads its sealed segments there and reads the others' by ranged GETs; credentials
    # and endpoint from the environment (AWS_*, GOOGLE_*, AZURE_*).
    remote: str = ""
    remote_timeout_ms: int = sluice.kv.DEFAULTS["remote_timeout_ms"]
    io_threads: int = sluice.kv.DEFAULTS["io_threads"]
    lease_timeout_ms: int = sluice.kv.DEFAULTS["lease_timeout_ms"]

    @classmethod
    def from_config(cls, config: dict[str, Any], engine: str, extra: tuple[str, ...] = ()):
        """Splits ``config`` into our options and the engine keys listed in ``extra``.
        An unknown key raises :class:`ConfigError` naming it; so does a missing path."""
        known = {f.name for f in fields(cls)}
        ours, rest = {}, {}
        for key, value in config.items():
            if key in known:
                ours[key] = value
            elif key in extra:
                rest[key] = value
            else:
                allowed = ", ".join(sorted(known | set(extra)))
                raise ConfigError(f"{engine}: unknown config key {key!r} (known: {allowed})")
        options = cls(**ours)
        if not options.path and not options.socket:
            raise ConfigError(
                f"{engine}: config key 'path' (the store directory) or 'socket' (a "
                "`sluice kv serve` sidecar) is required"
            )
        return options, rest

    def open(self, path: str, block_bytes: int, **namespace: Any) -> sluice.kv.KvStore:
        """Opens the store at ``path`` (a per-process subdirectory of ``self.path``), or
        connects to the sidecar on ``self.socket``."""
        if self.socket:
            return self._connect(block_bytes, **namespace)
        ensure_writable_dir(path)
        return sluice.kv.open(
            path,
            block_bytes=block_bytes,
            dram=self.dram,
            ssd=self.ssd,
            policy=self.policy,
            salt=self.salt,
            durability=self.durability,
            direct=self.direct,
            io_threads=self.io_threads,
            lease_timeout_ms=self.lease_timeout_ms,
            shared_dir=self.shared_dir or None,
            shared=self.shared,
            remote=self.remote or None,
            remote_timeout_ms=self.remote_timeout_ms,
            **namespace,
        )

    def _connect(self, block_bytes: int, **namespace: Any) -> sluice.kv.KvStore:
        store = sluice.kv.connect(self.socket, salt=self.salt, **namespace)
        if store.block_bytes != block_bytes:
            store.close()
            raise ConfigError(
                f"the kv server on {self.socket!r} stores {store.block_bytes}-byte blocks; "
                f"this engine's blocks are {block_bytes} bytes (start the server with "
                f"--block-bytes {block_bytes})"
            )
        return store


def ensure_writable_dir(path: str) -> None:
    """Creates ``path`` and checks we may write there, so a permission problem is named
    at startup rather than as the first failed put."""
    try:
        os.makedirs(path, exist_ok=True)
    except PermissionError as e:
        raise SluicePermissionError(f"KV store directory {path!r}: cannot create it ({e})") from e
    if not os.access(path, os.W_OK | os.X_OK):
        raise SluicePermissionError(f"KV store directory {path!r}: not writable")


def pointer_buffer(address: int, nbytes: int) -> np.ndarray:
    """A writable uint8 view of ``nbytes`` at ``address`` (memory the engine owns and
    keeps alive, such as SGLang's pinned host pool)."""
    return np.frombuffer((ctypes.c_ubyte * nbytes).from_address(address), dtype=np.uint8)


def leading_true(flags: list[bool]) -> int:
    """How many entries, from the first, are True."""
    n = 0
    for ok in flags:
        if not ok:
            break
        n += 1
    return n
