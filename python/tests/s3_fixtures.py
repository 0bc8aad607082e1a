"""The S3 server fixtures test modules share (a plugin conftest.py registers): ``s3``, one
moto server per module, and ``s3_env``, its environment set in this process. A test that
takes them is skipped, saying why, where boto3 or moto is not installed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    from s3_support import S3Server

    server = S3Server()
    yield server
    server.stop()


@pytest.fixture
def s3_env(s3: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    return s3
