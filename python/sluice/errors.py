"""Exceptions raised by Sluice.

Each class derives from :class:`SluiceError` and from the builtin a caller
would already catch, so ``except FileNotFoundError`` keeps working when a
script switches from safetensors to Sluice.
"""

from __future__ import annotations


class SluiceError(Exception):
    """Base class of every Sluice error."""


class HeaderError(SluiceError, ValueError):
    """A safetensors file or index is malformed; the message names the file and value."""


class TensorNotFoundError(SluiceError, KeyError):
    """A requested tensor name is not in the checkpoint."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class SluiceIOError(SluiceError, OSError):
    """Reading a file failed or it changed while being read."""


class SluiceFileNotFoundError(SluiceIOError, FileNotFoundError):
    """A file, shard or directory does not exist."""


class SluicePermissionError(SluiceIOError, PermissionError):
    """A file could not be opened for lack of permission."""


class MemoryLimitError(SluiceError, MemoryError):
    """A stream's memory limit cannot hold what was asked of it."""


class ConfigError(SluiceError, ValueError):
    """An option value is out of range."""


class NoRuntimeError(SluiceError, RuntimeError):
    """No ``sluice warm`` runtime is running, or several are and none was chosen (``pid=``)."""


class TraceError(SluiceError, ValueError):
    """A cache trace is malformed; the message names the file, line and field."""


class StoreFormatError(SluiceError, ValueError):
    """A KV store or checkpoint store is not of this format, version or block size, or its
    manifest does not decode (the message names the file)."""


class ChunkCorruptError(SluiceIOError):
    """A checkpoint chunk's bytes do not match its digest (damaged after it was written);
    the message names the chunk, the entry and the file."""


class StoreLockedError(SluiceError, RuntimeError):
    """The KV store is open in another process (the message names its pid)."""


__all__ = [
    "ChunkCorruptError",
    "ConfigError",
    "HeaderError",
    "MemoryLimitError",
    "NoRuntimeError",
    "SluiceError",
    "SluiceFileNotFoundError",
    "SluiceIOError",
    "SluicePermissionError",
    "StoreFormatError",
    "StoreLockedError",
    "TensorNotFoundError",
    "TraceError",
]
