"""What the object-store benchmarks (bench_ckpt_object.py, bench_kv_remote.py) share: a
client of the MinIO that bench_remote.py runs in its network namespace, the server and
its calibrated proxies brought up together, medians with ranges, the versions a report
records, and writing a report's JSON, markdown and plot. The scripts' names are
`benches/<report name with _ for ->.py`."""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import bench_remote as br

ROOT = Path(__file__).resolve().parents[1]


def client_env(endpoint: str) -> dict[str, str]:
    """The environment a client of the server at `endpoint` needs."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": br.ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": br.SECRET_KEY,
        "AWS_REGION": br.REGION,
        "AWS_DEFAULT_REGION": br.REGION,
        "AWS_ALLOW_HTTP": "true",
    }


def s3_client(endpoint: str):
    import botocore.session
    from botocore.config import Config

    session = botocore.session.get_session()
    return session.create_client(
        "s3",
        endpoint_url=endpoint,
        region_name=br.REGION,
        aws_access_key_id=br.ACCESS_KEY,
        aws_secret_access_key=br.SECRET_KEY,
        config=Config(s3={"addressing_style": "path"}, max_pool_connections=64),
    )


def servers_up(stack: br.Stack, args: Any, rtts: list[float]) -> tuple[str, list[br.Endpoint]]:
    """The network namespace, MinIO in it (data under args.work_dir, removed on exit) with
    the bucket created, and one calibrated proxy per round trip: (upstream URL, endpoints)."""
    br.netns_up(stack)
    stack.callback(lambda: subprocess.run(["rm", "-rf", str(args.work_dir)], check=False))
    upstream = br.start_minio(stack, args.minio, args.work_dir / "minio-data")
    s3_client(upstream).create_bucket(Bucket=br.BUCKET)
    base = br.measure_rtt(upstream)
    endpoints = [
        br.start_proxy(stack, args.proxy, upstream.removeprefix("http://"), r, base) for r in rtts
    ]
    return upstream, endpoints


def med(xs: list[float | None]) -> dict[str, float] | None:
    """Median, min, max and count of the values given (None where there are none)."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def versions(dists: tuple[str, ...]) -> dict[str, str]:
    """Python, the platform, each distribution's version, MinIO's, and this checkout's commit."""
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in dists:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    minio = subprocess.run([str(br.DEFAULT_MINIO), "--version"], capture_output=True, text=True)
    out["minio"] = (minio.stdout.splitlines() or ["?"])[0]
    git = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    out["sluice_commit"] = git.stdout.strip()
    return out


def finish(
    args: Any,
    name: str,
    dists: tuple[str, ...],
    endpoints: list[br.Endpoint],
    runs: list[dict[str, Any]],
    summary: Any,
    checks: list[dict[str, Any]],
    markdown: Callable[[dict[str, Any], Any, list[dict[str, Any]]], str],
    plot: Callable[[Any, Path], None],
) -> int:
    """Writes `<name>.json` under args.out (the run's metadata, summary, checks and every
    run), and unless --json-only `<name>.md` and `<name>.png`; prints the markdown. Returns
    the exit status: 1 if a run failed."""
    meta = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join([f"benches/{name.replace('-', '_')}.py", *sys.argv[1:]]),
        "gib": args.gib,
        "runs": args.runs,
        "versions": versions(dists),
        "endpoints": [vars(e) for e in endpoints],
    }
    doc = {"meta": meta, "summary": summary, "checks": checks, "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(doc, indent=1))
    text = markdown(meta, summary, checks)
    if not args.json_only:
        (args.out / f"{name}.md").write_text(text)
        plot(summary, args.out / f"{name}.png")
    print(text)
    return 0 if not any("error" in r for r in runs) else 1
