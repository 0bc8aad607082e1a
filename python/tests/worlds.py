"""Process groups for tests: ``world`` Python processes running one worker script, each
told its rank, the world size, a rendezvous, a target and a mode, each writing a JSON report.
The worker scripts (ckpt_worker.py, dcp_worker.py, group_worker.py) take
``RANK WORLD INIT TARGET MODE OUT_JSON``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(
    script: str,
    world: int,
    target: Any,
    mode: str,
    tmp_path: Path,
    timeout: float = 240,
    tcp: bool = False,
    env: Optional[dict[str, str]] = None,
) -> tuple[list[int], list[Any]]:
    """Exit codes and reports (``None`` where a rank wrote none) of one run; every rank is
    killed if the run passes ``timeout``. A ``tcp`` rendezvous runs a TCP store in rank 0,
    as torchrun's does; otherwise a file."""
    init = f"tcp://127.0.0.1:{free_port()}" if tcp else tmp_path / f"init-{mode}-{world}"
    outs = [tmp_path / f"out-{mode}-{world}-{r}.json" for r in range(world)]
    full_env = dict(os.environ, PYTHONPATH=str(HERE), **(env or {}))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / script),
                str(r),
                str(world),
                str(init),
                str(target),
                mode,
                str(outs[r]),
            ],
            env=full_env,
        )
        for r in range(world)
    ]
    deadline = time.monotonic() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    return codes, [json.loads(o.read_text()) if o.exists() else None for o in outs]
