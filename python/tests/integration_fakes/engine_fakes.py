"""Puts this folder (tests/integration_fakes) on sys.path when the real engine is not importable, so
the adapter contract tests run against the real engine modules where a venv has them
and against the fakes (the pinned releases' shapes) everywhere else."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

FAKES = Path(__file__).parent


def use_engine(probe_module: str) -> bool:
    """Imports ``probe_module``; on failure drops what got half-imported and puts the
    fakes first on ``sys.path``. Returns True when the real engine is used."""
    try:
        importlib.import_module(probe_module)
        return True
    except Exception:
        top = probe_module.split(".")[0]
        for name in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
            del sys.modules[name]
        if str(FAKES) not in sys.path:
            sys.path.insert(0, str(FAKES))
        importlib.import_module(probe_module)
        return False


def unwritable_dir(tmp_path: Path) -> Path:
    """A directory where creating the store must fail for lack of permission. Root
    ignores mode bits, so there it is a path under /sys (EPERM on mkdir)."""
    if os.geteuid() == 0:
        return Path("/sys/sluice-kv-contract-test")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    return locked / "kv"


def flip_byte_of_block(store_dir: Path, payload: bytes) -> None:
    """Flips one byte in the middle of ``payload`` where it sits in a segment file of
    the closed store at ``store_dir`` (found by content, not by format offsets)."""
    for seg in sorted((store_dir / "segments").iterdir()):
        data = seg.read_bytes()
        at = data.find(payload)
        if at >= 0:
            with open(seg, "r+b") as f:
                f.seek(at + len(payload) // 2)
                f.write(bytes([data[at + len(payload) // 2] ^ 0xFF]))
            return
    raise AssertionError(f"block payload not found under {store_dir / 'segments'}")
