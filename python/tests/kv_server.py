"""A `sluice kv serve` child process for the tests that need a sidecar."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path


class Server:
    """A `sluice kv serve` child; stopped (SIGKILL as a last resort) at the end."""

    def __init__(
        self, sluice_bin: Path, store: Path, socket: Path, *extra: str, block_bytes="16KiB"
    ) -> None:
        self.socket = socket
        args = [str(sluice_bin), "kv", "serve", str(store), "--socket", str(socket)]
        args += ["--block-bytes", str(block_bytes), "--dram", "1MiB", "--ssd", "16MiB", *extra]
        # SIGINT at its default: a suite started in the background inherits it ignored.
        self.proc = subprocess.Popen(
            args,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        deadline = time.monotonic() + 20
        while not socket.exists():
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}: {self.stderr()}")
            if time.monotonic() > deadline:
                raise AssertionError("server did not create its socket in 20 s")
            time.sleep(0.02)

    def stderr(self) -> str:
        return self.proc.stderr.read() if self.proc.stderr else ""

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=20)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()
