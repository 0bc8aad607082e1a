"""The model every real-engine test serves: a small random-weight Llama written once per run
(config.json, sharded safetensors and an index, as a Hub snapshot has), and moto's S3 server
for the tests that put weights or KV blocks in a bucket."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import pytest

HERE = Path(__file__).resolve().parent
MAIN_VENV = HERE.parents[1] / ".venv" / "bin" / "python"


@pytest.fixture(scope="session")
def model(tmp_path_factory) -> Path:
    import tiny_model

    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_model.write(str(path), max_positions=2048)  # vllm_kv_run.py's max_model_len
    assert len(list(path.glob("*.safetensors"))) > 1, "the model is sharded, with an index"
    return path


@contextmanager
def moto_s3(upload: Optional[Path] = None) -> Iterator[tuple[str, dict[str, str]]]:
    """moto's S3 server, run from the project's main venv (which has moto and boto3; this
    venv need not): the bucket's URL, or that of `upload`'s files under `tiny/` when given,
    and the environment a client of it needs. Skips where the main venv is missing."""
    if not MAIN_VENV.exists():
        pytest.skip(f"{MAIN_VENV} is missing: make develop builds it")
    script = f"""
import sys
sys.path.insert(0, {str(HERE.parent / "tests")!r})
from pathlib import Path
from s3_support import BUCKET, S3Server
server = S3Server()
upload = {str(upload) if upload else None!r}
url = server.upload_dir(Path(upload), "tiny") if upload else f"s3://{{BUCKET}}"
print(url, server.endpoint, flush=True)
sys.stdin.read()
server.stop()
"""
    proc = subprocess.Popen([str(MAIN_VENV), "-c", script], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        line = proc.stdout.readline().split()
        assert len(line) == 2, "moto did not start"
        yield (
            line[0],
            {
                "AWS_ENDPOINT_URL": line[1],
                "AWS_ACCESS_KEY_ID": "test",
                "AWS_SECRET_ACCESS_KEY": "test",
                "AWS_REGION": "us-east-1",
                "AWS_ALLOW_HTTP": "true",
            },
        )
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
