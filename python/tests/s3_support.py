"""A real S3 server for tests: moto's standalone server in its own process on loopback,
and the project's fault-injecting proxy (``sluice-faultproxy``) in front of it when a test
wants latency, resets, truncated bodies or a server that dies mid-load."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import pytest

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto.server")

BUCKET = "models"
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{what} did not listen on port {port} within 60 s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class S3Server:
    """moto's S3 server in a child process, with one bucket, and the environment a client
    of it needs (credentials, endpoint, plain HTTP)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", host, "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port, self.proc, "moto_server")
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.client = self.client_for(self.endpoint)
        self.client.create_bucket(Bucket=BUCKET)

    @staticmethod
    def client_for(endpoint: str) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
        )

    def env(self, endpoint: Optional[str] = None) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": endpoint or self.endpoint,
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }

    def upload_dir(self, local: Path, prefix: str) -> str:
        for f in sorted(local.iterdir()):
            self.client.upload_file(str(f), BUCKET, f"{prefix}/{f.name}")
        return f"s3://{BUCKET}/{prefix}"

    def objects(self, prefix: str) -> dict[str, int]:
        """Every object under ``prefix`` (a key prefix, or a URL in BUCKET) and its size."""
        prefix = prefix.removeprefix(f"s3://{BUCKET}/")
        out: dict[str, int] = {}
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        for page in pages:
            for o in page.get("Contents", []):
                out[o["Key"]] = o["Size"]
        return out

    def stop(self) -> None:
        _stop(self.proc)


def faultproxy_bin() -> str:
    return os.environ.get(
        "SLUICE_FAULTPROXY", str(REPO / "target" / "release" / "sluice-faultproxy")
    )


class FaultProxy:
    """``sluice-faultproxy`` between a client and ``upstream_port``; ``args`` are its flags
    (``--delay-ms``, ``--reset-after``, ``--truncate-after``, ``--stall-after``,
    ``--faulty``, ``--die-after``)."""

    def __init__(self, upstream_port: int, *args: str) -> None:
        self.proc = subprocess.Popen(
            [faultproxy_bin(), "--upstream", f"127.0.0.1:{upstream_port}", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if len(line) != 2 or line[0] != "listening":
            _stop(self.proc)
            raise RuntimeError(f"sluice-faultproxy printed {line!r}")
        self.endpoint = f"http://{line[1]}"

    def stop(self) -> None:
        _stop(self.proc)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def moto_with_auth() -> Iterator[dict[str, str]]:
    """moto's S3 server with IAM auth on (it checks signatures), one user allowed all, and
    BUCKET created; yields the environment of that user's good key (change its
    ``AWS_SECRET_ACCESS_KEY`` to be refused with 403)."""
    port = free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, proc, "moto_server")
        endpoint = f"http://127.0.0.1:{port}"
        kw = dict(
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="a",
            aws_secret_access_key="b",
        )
        iam = boto3.client("iam", **kw)
        iam.create_user(UserName="u")
        key = iam.create_access_key(UserName="u")["AccessKey"]
        policy = (
            '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*"}]}'
        )
        iam.put_user_policy(UserName="u", PolicyName="all", PolicyDocument=policy)
        good = dict(
            kw, aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"]
        )
        boto3.client("s3", **good).create_bucket(Bucket=BUCKET)
        yield {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
        }
    finally:
        proc.terminate()
        proc.wait(timeout=10)
