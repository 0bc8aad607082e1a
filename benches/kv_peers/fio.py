"""fio on the same directory and block size: the device's own numbers for the run.

- write: sequential O_DIRECT writes of a fresh file (io_uring, QD32), first 4 jobs each over a
  quarter, then (the file deleted) one job, whose file the reads use. Fresh files, since the
  peers also write to newly allocated space. Each is fio's own runtime plus a `sync()` right
  after, the same final sync the peers that never fsync get;
- randread: O_DIRECT random reads of whole blocks at every (queue depth, job count) of
  `READ_CONFIGS`, time-based, each after a page-cache drop.

The file is deleted afterwards, so the disk holds one data set at a time.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import page_cache

READ_CONFIGS = [(qd, jobs) for qd in (1, 8, 32) for jobs in (1, 4)]
COMMON = ["--direct=1", "--ioengine=io_uring", "--output-format=json"]


def _fio(args: list[str], timeout_s: float) -> dict[str, Any]:
    proc = subprocess.run(
        ["fio", *COMMON, *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"fio exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return json.loads(proc.stdout[proc.stdout.index("{") :])


def _write(base: list[str], total_bytes: int, jobs: int) -> dict[str, Any]:
    share = total_bytes // jobs
    args = ["--name=write", *base, "--rw=write", "--iodepth=32", f"--numjobs={jobs}"]
    args += [f"--size={share}", f"--offset_increment={share}", "--group_reporting"]
    doc = _fio(args, 3600)
    write = doc["jobs"][0]["write"]
    t0 = time.perf_counter()
    os.sync()
    seconds = write["runtime"] / 1000 + time.perf_counter() - t0
    return {"gbps": write["io_bytes"] / seconds / 1e9, "seconds": seconds}


def run(path: Path, block_bytes: int, total_bytes: int, runtime_s: int) -> dict[str, Any]:
    """{config: {gbps, ...}} for the write and every read config, or {config: {error}}."""
    out: dict[str, Any] = {}
    base = [f"--filename={path}", f"--bs={block_bytes}", f"--size={total_bytes}"]
    try:
        for jobs in (4, 1):
            path.unlink(missing_ok=True)
            out[f"write QD32 x{jobs}"] = _write(base, total_bytes, jobs)
        for qd, jobs in READ_CONFIGS:
            page_cache.drop()
            doc = _fio(
                [
                    "--name=randread",
                    *base,
                    "--rw=randread",
                    "--readonly",
                    f"--iodepth={qd}",
                    f"--numjobs={jobs}",
                    "--group_reporting",
                    "--norandommap",
                    "--randrepeat=0",
                    "--time_based",
                    f"--runtime={runtime_s}",
                ],
                runtime_s * 4 + 120,
            )
            read = doc["jobs"][0]["read"]
            out[f"randread QD{qd} x{jobs}"] = {
                "gbps": read["bw_bytes"] / 1e9,
                "p50_ms": read["clat_ns"]["percentile"].get("50.000000", 0) / 1e6,
                "p99_ms": read["clat_ns"]["percentile"].get("99.000000", 0) / 1e6,
            }
    except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError, KeyError) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        path.unlink(missing_ok=True)
    return out
