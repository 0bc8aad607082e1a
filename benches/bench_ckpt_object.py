"""`make bench-ckpt-object` (issue 30): checkpoints to an S3 object store, Sluice against DCP's
object-store writers and the server's parallel-PUT ceiling.

The setup (root; everything it creates is removed on exit, Ctrl-C and SIGTERM included) is
bench_remote.py's: MinIO in a network namespace of its own over a veth pair, its data under
--work-dir, and one calibrated `sluice-faultproxy` per round trip asked for (--rtts, default
0,5 ms) that every writer at that round trip goes through.

The state is bench_ckpt.py's `mixed` workload at one rank (ckpt_rank.py): 40% sharded and 30%
replicated parameters, a tied pair, 20% zero-filled optimizer moments, a step counter; --gib
of logical bytes. Each writer runs as a fresh worker process (this script with --worker) that:
1. builds the state, then saves it as `step-1` and times *staged* (the state may change
   again) and *durable* (every byte acknowledged by the server);
2. changes about 6% of the bytes (ckpt_rank.modify) and saves `step-2`, timed the same way
   (the incremental save);
3. loads `step-2` into a fresh zeroed state, timed, and checks it bit for bit.
After each save it lists what is stored under its prefix: *uploaded* is what that save added.

The writers, each at default settings unless a better one was measured (see PEERS below):
- `sluice`: sluice.ckpt.save / load, the native API (the headline);
- `sluice-dcp`: dcp.async_save / dcp.load with sluice.ckpt.StorageWriter / StorageReader;
- `sluice-w2`: the same saves and load as a group of two ranks over gloo (each rank half the
  logical bytes, the replicated parameters the same on both: each unique chunk is uploaded
  by one rank, and read back by one rank and sent to the other); times are the slower
  rank's;
- `s3torch`: dcp.async_save / dcp.load with s3torchconnector 1.5's S3StorageWriter /
  S3StorageReader (AWS CRT client; thread_count 8, path-style addressing);
- `fsspec`: dcp.async_save / dcp.load with DCP's FsspecWriter / FsspecReader over s3fs
  (thread_count 8);
- `ceiling`: the server's parallel-PUT ceiling on the state's unique bytes: presigned PUTs of
  8 MiB objects (BENCH_CEILING_OBJECT_MIB; 4 MiB, the chunks' size, measured the same) from
  one reused buffer over http.client, 16 and 32 threads, the better kept.

DCP's async_save stages with its default stager (a CPU copy of the state) for the peers, and
with Sluice's writer for `sluice-dcp`; *staged* is when async_save's staging completed. Runs
are interleaved: each round runs every (round trip, writer) pair once, rotating the orders;
the page cache is dropped before each run. The report gives medians and ranges over --runs
rounds and checks the issue's targets; it writes bench-ckpt-object.{md,json,png} under --out.

    sudo make bench-ckpt-object
    sudo .venv-ckptpeers/bin/python benches/bench_ckpt_object.py --gib 0.25 --runs 1 \
        --rtts 0 --out /tmp/bco
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_remote as br  # noqa: E402  (the MinIO, namespace and proxy set-up)
import page_cache  # noqa: E402
from minio_bench import client_env, finish, med, s3_client, servers_up  # noqa: E402

ROOT = HERE.parent
RESULT_PREFIX = "BENCH_RESULT "
MiB = 2**20
GiB = 2**30
WRITERS = ("sluice", "sluice-dcp", "sluice-w2", "s3torch", "fsspec", "ceiling")
# Peer settings: s3torchconnector's and FsspecWriter's thread_count default to 1; 8 writes
# that many files at once, which is what a user after throughput sets (both were faster with
# 8 than with 1 or 4 at a 5 ms round trip here). The ceiling's object size and threads.
PEER_THREADS = 8
CEILING_OBJECT = int(os.environ.get("BENCH_CEILING_OBJECT_MIB", "8")) * MiB
CEILING_THREADS = (16, 32)
WORKER_TIMEOUT_S = 1800


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gib", type=float, default=1.0, help="logical bytes of the state (GiB)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rtts", default="0,5", help="round trips in ms, through the proxy")
    p.add_argument("--writers", default=",".join(WRITERS))
    p.add_argument("--work-dir", type=Path, default=Path("/var/tmp/sluice-bench-ckpt-object"))
    p.add_argument("--minio", type=Path, default=br.DEFAULT_MINIO)
    p.add_argument("--proxy", type=Path, default=br.DEFAULT_PROXY)
    p.add_argument("--out", type=Path, default=ROOT / "docs")
    p.add_argument("--json-only", action="store_true", help="no markdown or plot")
    # Worker mode (internal).
    p.add_argument("--worker", choices=(*WRITERS, "sluice-rank"))
    p.add_argument("--endpoint")
    p.add_argument("--prefix")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--init")
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# Worker: one writer, one round trip


def stored_bytes(client, prefix: str) -> int:
    total = 0
    for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=br.BUCKET, Prefix=prefix + "/"
    ):
        total += sum(o["Size"] for o in page.get("Contents", []))
    return total


def unique_bytes(state: dict[str, Any]) -> int:
    """What content dedup stores of the state: each distinct tensor once, the zero-filled ones
    as one chunk between them (all zero chunks are the same), the step counter's few bytes."""
    import ckpt_rank
    import torch

    seen: dict[int, int] = {}
    zeros = 0
    for v in state.values():
        if not isinstance(v, torch.Tensor):
            continue
        key = v.untyped_storage().data_ptr()
        if key in seen:
            continue
        seen[key] = v.numel() * v.element_size()
        if not v.any():
            zeros += seen[key]
    return sum(seen.values()) - zeros + (ckpt_rank.CHUNK if zeros else 0)


def worker_main(args: argparse.Namespace) -> None:
    import ckpt_rank

    if args.worker == "sluice-w2":
        print(RESULT_PREFIX + json.dumps(run_group(args, 2)), flush=True)
        return
    nbytes = int(args.gib * GiB) // args.world
    specs = ckpt_rank.layout("mixed", args.rank, nbytes)
    state = ckpt_rank.build(specs, "mixed")
    out: dict[str, Any] = {"writer": args.worker, "unique_bytes": unique_bytes(state)}
    out["logical_bytes"] = ckpt_rank.state_bytes(state)[1]
    if args.worker == "sluice-rank":
        out.update(run_rank(args, specs, state, nbytes))
    elif args.worker == "ceiling":
        out.update(run_ceiling(args.endpoint, args.prefix, out["unique_bytes"]))
    else:
        out.update(run_writer(args, specs, state, nbytes))
    if PHASES:
        out["phases"] = PHASES
    print(RESULT_PREFIX + json.dumps(out), flush=True)


def save_twice(writer, args, specs, state, nbytes: int, barrier=None) -> dict[str, Any]:
    """`step-1`, then about 6% changed and `step-2`: each save's staged and durable times
    and the bytes it added under the prefix. `barrier` (a group's) brackets each save."""
    import ckpt_rank

    client = s3_client(args.endpoint)
    url = f"s3://{br.BUCKET}/{args.prefix}"
    out: dict[str, Any] = {}
    before = 0
    for step in (1, 2):
        if step == 2:
            out["changed_chunk_bytes"] = ckpt_rank.modify(state, specs, nbytes)
        if barrier:
            barrier()
        staged, durable = writer.save(state, f"{url}/step-{step}", args.endpoint)
        if barrier:
            barrier()
        after = stored_bytes(client, args.prefix)
        out[f"save{step}"] = {"staged_s": staged, "durable_s": durable, "uploaded": after - before}
        before = after
    return out


def run_writer(args: argparse.Namespace, specs, state, nbytes: int) -> dict[str, Any]:
    import ckpt_rank

    writer = WRITER_IMPLS[args.worker]
    url = f"s3://{br.BUCKET}/{args.prefix}"
    out = save_twice(writer, args, specs, state, nbytes)
    fresh = ckpt_rank.build(specs, "mixed", zeros=True)
    t0 = time.perf_counter()
    got = writer.load(fresh, f"{url}/step-2", args.endpoint)
    out["load_s"] = time.perf_counter() - t0
    out["mismatches"] = ckpt_rank.mismatches(got, state)[:5]
    return out


def run_group(args: argparse.Namespace, world: int) -> dict[str, Any]:
    """`world` rank processes of this script on gloo; the slower rank's times."""
    import tempfile

    init = Path(tempfile.mkdtemp(prefix="bco-init-")) / "init"
    base = [sys.executable, str(Path(__file__).resolve()), "--worker", "sluice-rank"]
    base += ["--endpoint", args.endpoint, "--prefix", args.prefix, "--gib", str(args.gib)]
    base += ["--world", str(world), "--init", str(init)]
    procs = [
        subprocess.Popen([*base, "--rank", str(r)], stdout=subprocess.PIPE, text=True)
        for r in range(world)
    ]
    ranks = []
    for p in procs:
        out, _ = p.communicate(timeout=WORKER_TIMEOUT_S)
        line = [x for x in out.splitlines() if x.startswith(RESULT_PREFIX)]
        if p.returncode != 0 or not line:
            raise SystemExit(f"a rank exited {p.returncode}")
        ranks.append(json.loads(line[0][len(RESULT_PREFIX) :]))
    r0 = ranks[0]
    out: dict[str, Any] = {"writer": "sluice-w2", "ranks": world}
    out["unique_bytes"] = r0["group_unique_bytes"]
    out["logical_bytes"] = sum(r["logical_bytes"] for r in ranks)
    for k in ("save1", "save2"):
        out[k] = {m: max(r[k][m] for r in ranks) for m in ("staged_s", "durable_s")}
        out[k]["uploaded"] = r0[k]["uploaded"]
    out["load_s"] = max(r["load_s"] for r in ranks)
    out["load_read_bytes"] = sum(r["load_read_bytes"] for r in ranks)
    out["mismatches"] = sorted({m for r in ranks for m in r["mismatches"]})
    out["changed_chunk_bytes"] = sum(r["changed_chunk_bytes"] for r in ranks)
    return out


def run_rank(args: argparse.Namespace, specs, state, nbytes: int) -> dict[str, Any]:
    """One rank of `sluice-w2`: grouped saves and a grouped load."""
    import ckpt_rank
    import sluice.ckpt as ck
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{args.init}", rank=args.rank, world_size=args.world
    )
    url = f"s3://{br.BUCKET}/{args.prefix}"
    out = save_twice(SluiceWriter, args, specs, state, nbytes, dist.barrier)
    out["group_unique_bytes"] = ck.ls(url)[0]["unique_bytes"]
    fresh = ckpt_rank.build(specs, "mixed", zeros=True)
    dist.barrier()
    t0 = time.perf_counter()
    got = ck.load(fresh, f"{url}/step-2")
    out["load_s"] = time.perf_counter() - t0
    out["load_read_bytes"] = ck.last_load["read_bytes"]
    out["mismatches"] = ckpt_rank.mismatches(got, state)[:5]
    dist.barrier()
    dist.destroy_process_group()
    return out


#: The native writer's phases of each save in this process, reported with the result.
PHASES: list[dict[str, Any]] = []


class SluiceWriter:
    @staticmethod
    def save(state, path: str, endpoint: str) -> tuple[float, float]:
        import sluice.ckpt as ck

        t0 = time.perf_counter()
        h = ck.save(state, path)
        returned = time.perf_counter() - t0
        h.staged.result()
        staged = time.perf_counter() - t0
        report = h.durable.result()
        durable = time.perf_counter() - t0
        # Where the time went: save() returns once hashed and planned; the write job's own
        # clock starts there (rank_report: staged_s, durable_s, write_bytes_per_s).
        job = report["rank_report"]
        PHASES.append({"returned_s": returned, **job})
        return staged, durable

    @staticmethod
    def load(dest, path: str, endpoint: str):
        import sluice.ckpt as ck

        return ck.load(dest, path)


def _dcp_async(state, writer) -> tuple[float, float]:
    """async_save's staging and upload times; a peer's default stager resolves staging when
    async_save returns, Sluice's writer (an AsyncStager) through its response."""
    import torch.distributed.checkpoint as dcp

    t0 = time.perf_counter()
    resp = dcp.async_save(state, storage_writer=writer)
    staging = getattr(resp, "staging_completion", None)
    if staging is not None:
        staging.result()
    staged = time.perf_counter() - t0
    upload = getattr(resp, "upload_completion", resp)
    upload.result()
    return staged, time.perf_counter() - t0


class SluiceDcpWriter:
    @staticmethod
    def save(state, path: str, endpoint: str) -> tuple[float, float]:
        import sluice.ckpt as ck

        return _dcp_async(state, ck.StorageWriter(path))

    @staticmethod
    def load(dest, path: str, endpoint: str):
        import sluice.ckpt as ck
        import torch.distributed.checkpoint as dcp

        dcp.load(dest, storage_reader=ck.StorageReader(path))
        return dest


class S3TorchWriter:
    @staticmethod
    def config():
        from s3torchconnector import S3ClientConfig

        return S3ClientConfig(force_path_style=True)

    @classmethod
    def save(cls, state, path: str, endpoint: str) -> tuple[float, float]:
        from s3torchconnector.dcp import S3StorageWriter

        w = S3StorageWriter(br.REGION, path, cls.config(), thread_count=PEER_THREADS)
        return _dcp_async(state, w)

    @classmethod
    def load(cls, dest, path: str, endpoint: str):
        import torch.distributed.checkpoint as dcp
        from s3torchconnector.dcp import S3StorageReader

        dcp.load(dest, storage_reader=S3StorageReader(br.REGION, path, cls.config()))
        return dest


class FsspecWriter:
    @staticmethod
    def options(endpoint: str) -> dict[str, Any]:
        return {"key": br.ACCESS_KEY, "secret": br.SECRET_KEY, "endpoint_url": endpoint}

    @classmethod
    def save(cls, state, path: str, endpoint: str) -> tuple[float, float]:
        from torch.distributed.checkpoint import FsspecWriter as Writer

        w = Writer(path, thread_count=PEER_THREADS, **cls.options(endpoint))
        return _dcp_async(state, w)

    @classmethod
    def load(cls, dest, path: str, endpoint: str):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FsspecReader

        dcp.load(dest, storage_reader=FsspecReader(path, **cls.options(endpoint)))
        return dest


WRITER_IMPLS = {
    "sluice": SluiceWriter,
    "sluice-dcp": SluiceDcpWriter,
    "s3torch": S3TorchWriter,
    "fsspec": FsspecWriter,
}


def run_ceiling(endpoint: str, prefix: str, nbytes: int) -> dict[str, Any]:
    """Parallel PUTs of `nbytes` in CEILING_OBJECT objects, presigned, from one buffer."""
    client = s3_client(endpoint)
    body = os.urandom(CEILING_OBJECT)
    count = -(-nbytes // CEILING_OBJECT)
    best: dict[str, Any] = {}
    for threads in CEILING_THREADS:
        urls = [
            client.generate_presigned_url(
                "put_object",
                Params={"Bucket": br.BUCKET, "Key": f"{prefix}/t{threads}/o{i}"},
                ExpiresIn=3600,
            )
            for i in range(count)
        ]
        errors: list[str] = []
        t0 = time.perf_counter()
        put_all(urls, body, threads, errors)
        took = time.perf_counter() - t0
        if errors:
            raise SystemExit(f"ceiling PUT failed: {errors[0]}")
        rate = count * CEILING_OBJECT / took
        if not best or rate > best["put_bytes_per_s"]:
            best = {"put_bytes_per_s": rate, "threads": threads, "put_s": took}
    return best


def put_all(urls: list[str], body: bytes, threads: int, errors: list[str]) -> None:
    """PUTs `body` to every presigned URL on `threads` threads, each on one kept-alive
    connection; the first failure is appended to `errors` and stops its thread."""
    jobs = iter(urls)
    lock = threading.Lock()

    def run() -> None:
        conn: http.client.HTTPConnection | None = None
        while True:
            with lock:
                url = next(jobs, None)
            if url is None:
                break
            parts = urllib.parse.urlsplit(url)
            if conn is None:
                conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
            conn.request("PUT", f"{parts.path}?{parts.query}", body=body)
            resp = conn.getresponse()
            resp.read()
            if resp.status != 200:
                errors.append(f"{resp.status} {resp.reason}")
                break

    pool = [threading.Thread(target=run) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


# ---------------------------------------------------------------------------------------------
# Parent: the server, the proxies, the rounds


def run_worker(writer: str, endpoint: br.Endpoint, prefix: str, args) -> dict[str, Any]:
    env = dict(os.environ, **client_env(endpoint.url))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", writer]
    cmd += ["--endpoint", endpoint.url, "--prefix", prefix, "--gib", str(args.gib)]
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S, check=False
    )
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    tail = (proc.stderr or proc.stdout)[-3000:]
    return {"writer": writer, "error": f"exit {proc.returncode}: {tail}"}


def delete_prefix(client, prefix: str) -> None:
    keys: list[dict[str, str]] = []
    for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=br.BUCKET, Prefix=prefix + "/"
    ):
        keys += [{"Key": o["Key"]} for o in page.get("Contents", [])]
    for i in range(0, len(keys), 1000):
        client.delete_objects(Bucket=br.BUCKET, Delete={"Objects": keys[i : i + 1000]})


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in runs:
        if "error" in r:
            continue
        row = out.setdefault(r["rtt"], {}).setdefault(r["writer"], {"runs": []})
        row["runs"].append(r)
    for writers in out.values():
        for name, row in writers.items():
            rs = row.pop("runs")
            row["unique_bytes"] = rs[0]["unique_bytes"]
            row["logical_bytes"] = rs[0]["logical_bytes"]
            if name == "ceiling":
                row["put_bytes_per_s"] = med([r["put_bytes_per_s"] for r in rs])
                row["threads"] = [r["threads"] for r in rs]
                continue
            for k in ("save1", "save2"):
                row[k] = {
                    m: med([r[k][m] for r in rs]) for m in ("staged_s", "durable_s", "uploaded")
                }
            row["load_s"] = med([r["load_s"] for r in rs])
            row["mismatches"] = sorted({m for r in rs for m in r["mismatches"]})
            row["changed_chunk_bytes"] = rs[0]["changed_chunk_bytes"]
    return out


def targets(summary: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = []

    def check(rtt: str, what: str, value: float | None, target: str, met: bool | None) -> None:
        checks.append({"rtt": rtt, "what": what, "value": value, "target": target, "met": met})

    for rtt, w in summary.items():
        s = w.get("sluice")
        if not s:
            continue
        up = s["save1"]["uploaded"]["median"]
        check(
            rtt,
            "uploaded / unique bytes",
            up / s["unique_bytes"],
            "<= 1.01",
            up <= 1.01 * s["unique_bytes"],
        )
        peers = [w[p]["save1"]["durable_s"]["median"] for p in ("s3torch", "fsspec") if p in w]
        dur = s["save1"]["durable_s"]["median"]
        if peers:
            r = dur / min(peers)
            check(rtt, "time to durable / faster DCP peer", r, "<= 0.9", r <= 0.9)
        ceil = w.get("ceiling", {}).get("put_bytes_per_s")
        if ceil:
            r = (s["unique_bytes"] / dur) / ceil["median"]
            check(rtt, "unique bytes/s / parallel-PUT ceiling", r, ">= 0.8", r >= 0.8)
        staged = [w[p]["save1"]["staged_s"]["median"] for p in ("s3torch", "fsspec") if p in w]
        if staged:
            r = s["save1"]["staged_s"]["median"] / min(staged)
            check(rtt, "time to staged / DCP async_save staging", r, "<= 1.0", r <= 1.0)
        wrong = sorted(
            {m for name in w if name != "ceiling" for m in w[name].get("mismatches", [])}
        )
        check(rtt, "wrong bytes on load (every writer)", len(wrong), "0", not wrong)
    return checks


def fmt_s(v: dict[str, float] | None) -> str:
    if not v:
        return "-"
    return f"{v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f})"


def fmt_b(v: dict[str, float] | None) -> str:
    return "-" if not v else f"{v['median'] / GiB:.3f}"


def markdown(meta: dict[str, Any], summary, checks) -> str:
    lines = [
        "# Checkpoints to an object store (make bench-ckpt-object)",
        "",
        f"{meta['date']}, commit {meta['versions']['sluice_commit']}, `{meta['command']}`.",
        f"State: {meta['gib']} GiB logical (`mixed`), {meta['runs']} rounds, MinIO in a network "
        "namespace, round trips added by sluice-faultproxy. Seconds: median (min-max).",
        "",
        "| rtt | writer | staged s | durable s | uploaded GiB | incr. durable s "
        "| incr. uploaded GiB | load s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rtt, w in summary.items():
        for name, row in w.items():
            if name == "ceiling":
                rate = row["put_bytes_per_s"]
                lines.append(
                    f"| {rtt} | ceiling (PUT, {row['threads']} threads) | | "
                    f"{row['unique_bytes'] / rate['median']:.2f} (unique bytes at "
                    f"{rate['median'] / 1e9:.2f} GB/s) | {row['unique_bytes'] / GiB:.3f} | | | |"
                )
                continue
            s1, s2 = row["save1"], row["save2"]
            lines.append(
                f"| {rtt} | {name} | {fmt_s(s1['staged_s'])} | {fmt_s(s1['durable_s'])} | "
                f"{fmt_b(s1['uploaded'])} | {fmt_s(s2['durable_s'])} | {fmt_b(s2['uploaded'])} | "
                f"{fmt_s(row['load_s'])} |"
            )
    lines += ["", "| rtt | target | value | met |", "|---|---|---|---|"]
    for c in checks:
        v = c["value"]
        shown = f"{v:.3f}" if isinstance(v, float) else str(v)
        met = "yes" if c["met"] else "MISSED"
        lines.append(f"| {c['rtt']} | {c['what']} {c['target']} | {shown} | {met} |")
    lines += ["", "Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()), ""]
    return "\n".join(lines)


def plot(summary, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rtts = list(summary)
    names = [n for n in WRITERS if n != "ceiling" and any(n in summary[r] for r in rtts)]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(1, len(names))
    for i, n in enumerate(names):
        xs = [j + i * width for j in range(len(rtts))]
        ys = [summary[r][n]["save1"]["durable_s"]["median"] if n in summary[r] else 0 for r in rtts]
        ax.bar(xs, ys, width, label=n)
    for j, r in enumerate(rtts):
        c = summary[r].get("ceiling")
        if c:
            t = c["unique_bytes"] / c["put_bytes_per_s"]["median"]
            ax.hlines(t, j - width / 2, j + 0.8, colors="black", linestyles="dashed")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rtts))], [f"{r}" for r in rtts])
    ax.set_ylabel("seconds to durable (full save)")
    ax.set_title("Checkpoint to MinIO; dashed: parallel-PUT ceiling on unique bytes")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parent_main(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        raise SystemExit("run as root: the server runs in a network namespace of its own")
    writers = [w for w in args.writers.split(",") if w]
    bad = [w for w in writers if w not in WRITERS]
    if bad:
        raise SystemExit(f"--writers: unknown {bad}; known: {', '.join(WRITERS)}")
    rtts = [float(x) for x in args.rtts.split(",") if x]
    br.install_signal_exits()
    runs: list[dict[str, Any]] = []
    with br.Stack() as stack:
        upstream, endpoints = servers_up(stack, args, rtts)
        admin = s3_client(upstream)
        for rnd in range(args.runs):
            order_e = endpoints[rnd % len(endpoints) :] + endpoints[: rnd % len(endpoints)]
            for ep in order_e:
                k = (rnd + int(ep.rtt_ms or 0)) % len(writers)
                for w in writers[k:] + writers[:k]:
                    prefix = f"r{rnd}-{ep.key}-{w}"
                    page_cache.drop()
                    t0 = time.monotonic()
                    r = run_worker(w, ep, prefix, args)
                    r.update(rtt=ep.key, round=rnd, wall_s=time.monotonic() - t0)
                    runs.append(r)
                    delete_prefix(admin, prefix)
                    brief = r.get("error") or {
                        k2: r[k2] for k2 in ("save1", "load_s", "put_bytes_per_s") if k2 in r
                    }
                    print(f"round {rnd} {ep.key} {w}: {json.dumps(brief)[:300]}", flush=True)
    summary = summarize(runs)
    checks = targets(summary)
    dists = ("torch", "sluice", "s3torchconnector", "s3torchconnectorclient", "s3fs")
    return finish(
        args, "bench-ckpt-object", dists, endpoints, runs, summary, checks, markdown, plot
    )


def main() -> None:
    args = parse_args()
    if args.worker:
        worker_main(args)
        return
    raise SystemExit(parent_main(args))


if __name__ == "__main__":
    main()
