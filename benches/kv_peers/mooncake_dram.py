"""Mooncake store 0.3.13 (`mooncake-transfer-engine-non-cuda`) as a DRAM tier: TCP, loopback.

Runs in .venv-kvpeers. `open` starts a `mooncake_master` (the wheel's binary) on free loopback
ports with its HTTP metadata server, then a `MooncakeDistributedStore` client that contributes
a global segment large enough for every block (eviction starts at 90% full). Buffers are
registered with the transfer engine once (`register_buffer`), then each request is one
`batch_put_from` or `batch_get_into` of the request's blocks, zero-copy from and into the
caller's buffers, as Mooncake's own vLLM connector and benchmarks use it. The master is a
child of this process, killed on close and, through PR_SET_PDEATHSIG, when this process dies.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import numpy as np

from .base import KvSystem, Miss
from .proc import die_with_parent
from .workload import Workload

MASTER_START_TIMEOUT_S = 20.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mooncake_master exited {proc.returncode} at start")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"mooncake_master not listening on {port} after {timeout_s:.0f} s")


class MooncakeDram(KvSystem):
    durability = "none (DRAM tier)"

    def open(self, root: Path, workload: Workload, inflight_blocks: int) -> None:
        import mooncake
        from mooncake.store import MooncakeDistributedStore

        root.mkdir(parents=True, exist_ok=True)
        self.workload = workload
        rpc, http, metrics = _free_port(), _free_port(), _free_port()
        binary = Path(mooncake.__file__).parent / "mooncake_master"
        cmd = [
            str(binary),
            f"--rpc_port={rpc}",
            "--rpc_address=127.0.0.1",
            "--enable_http_metadata_server=true",
            f"--http_metadata_server_port={http}",
            f"--metrics_port={metrics}",
        ]
        with open(root / "mooncake_master.log", "w") as log:
            self.master = subprocess.Popen(
                cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent
            )
        _wait_listening(rpc, self.master, MASTER_START_TIMEOUT_S)
        _wait_listening(http, self.master, MASTER_START_TIMEOUT_S)
        self.store_ = MooncakeDistributedStore()
        segment = int(workload.total_bytes * 1.3) + (256 << 20)
        rc = self.store_.setup(
            "127.0.0.1",
            f"http://127.0.0.1:{http}/metadata",
            segment,
            256 << 20,
            "tcp",
            "",
            f"127.0.0.1:{rpc}",
        )
        if rc != 0:
            raise RuntimeError(f"MooncakeDistributedStore.setup returned {rc}")
        self.names = [k.hex() for k in workload.keys]

    def register(self, buffer: np.ndarray) -> None:
        rc = self.store_.register_buffer(buffer.ctypes.data, buffer.nbytes)
        if rc != 0:
            raise RuntimeError(f"register_buffer returned {rc}")

    def store(self, indices: list[int], blocks: list[np.ndarray]) -> None:
        rcs = self.store_.batch_put_from(
            [self.names[i] for i in indices],
            [b.ctypes.data for b in blocks],
            [b.nbytes for b in blocks],
        )
        bad = [i for i, rc in zip(indices, rcs) if rc != 0]
        if bad:
            raise Miss(f"batch_put_from failed for {len(bad)} blocks (first rc {rcs[0]})")

    def load(self, indices: list[int], outs: list[np.ndarray]) -> list[np.ndarray]:
        got = self.store_.batch_get_into(
            [self.names[i] for i in indices],
            [o.ctypes.data for o in outs],
            [o.nbytes for o in outs],
        )
        for i, n, out in zip(indices, got, outs):
            if n != out.nbytes:
                raise Miss(f"batch_get_into returned {n} for block {i}")
        return outs

    def close(self) -> None:
        try:
            if hasattr(self, "store_"):
                self.store_.close()
        finally:
            self.master.terminate()
            try:
                self.master.wait(5)
            except subprocess.TimeoutExpired:
                self.master.kill()
                self.master.wait()
