"""`sluice ckpt`: ls, inspect, diff, verify and gc on a store saved by `sluice.ckpt`, their
JSON forms, and their exit codes for missing stores, damaged chunks and a busy store."""

from __future__ import annotations

import json
import subprocess

import pytest
import sluice.ckpt as ck
import torch
from sluice import _sluice

CHUNK = 64 << 10


def cli(sluice_bin, *args):
    return subprocess.run([str(sluice_bin), "ckpt", *args], capture_output=True, text=True)


@pytest.fixture
def saved(tmp_path):
    store = tmp_path / "ckpt"
    g = torch.Generator().manual_seed(0)
    sd = {"w": torch.randn(256, 1024, generator=g), "m": torch.zeros(256, 1024), "step": 1}
    ck.save(sd, store / "s1", chunk_bytes=CHUNK, blocking=True)
    sd["w"][:16] += 1
    sd["b"] = torch.ones(4)
    del sd["m"]
    ck.save(sd, store / "s2", chunk_bytes=CHUNK, blocking=True)
    return store


def test_ls_inspect_and_diff_describe_the_store(sluice_bin, saved):
    out = cli(sluice_bin, "ls", str(saved))
    assert out.returncode == 0, out.stderr
    assert "s1" in out.stdout and "s2" in out.stdout and "2 checkpoints" in out.stdout
    rows = json.loads(cli(sluice_bin, "ls", str(saved), "--json").stdout)
    assert [r["name"] for r in rows] == ["s1", "s2"]
    # Entries under a sixty-fourth of a chunk share packs: "step" shares one with the new
    # "b" in s2, so only w's unchanged chunks are shared between the two checkpoints.
    assert rows[1]["shared_bytes"] == (1 << 20) - CHUNK
    out = cli(sluice_bin, "inspect", str(saved / "s1"))
    assert out.returncode == 0 and "dedup ratio 1.88" in out.stdout, out.stdout
    step = next(line for line in out.stdout.splitlines() if line.startswith("step "))
    assert "in pack " in step, out.stdout  # a packed entry, not "0 chunks"
    m = json.loads(cli(sluice_bin, "inspect", str(saved / "s1"), "--json").stdout)
    assert m["entries"]["w"]["shape"] == [256, 1024]
    d = json.loads(cli(sluice_bin, "diff", str(saved / "s1"), str(saved / "s2"), "--json").stdout)
    assert d["changed"] == [["w", CHUNK]]
    assert d["added"] == ["b"] and d["removed"] == ["m"]


def test_verify_exits_1_naming_a_damaged_chunk(sluice_bin, saved):
    assert cli(sluice_bin, "verify", str(saved / "s1")).returncode == 0
    d = ck.manifest(saved / "s1")["entries"]["w"]["chunks"][3]["d"]
    path = saved / "chunks" / d[:2] / d
    raw = bytearray(path.read_bytes())
    raw[0] ^= 1
    path.write_bytes(bytes(raw))
    out = cli(sluice_bin, "verify", str(saved / "s1"))
    assert out.returncode == 1
    assert d in out.stdout and "w:" in out.stdout


def test_gc_keeps_the_newest_and_refuses_a_busy_store(sluice_bin, saved):
    held = _sluice.ckpt_open(str(saved))  # a save or load in flight holds the store
    out = cli(sluice_bin, "gc", str(saved), "--keep", "1")
    assert out.returncode == 1 and "in use" in out.stderr
    held.close()
    r = json.loads(cli(sluice_bin, "gc", str(saved), "--keep", "1", "--json").stdout)
    assert r["checkpoints_removed"] == ["s1"] and r["chunks_removed"] > 0
    assert [x["name"] for x in ck.ls(saved)] == ["s2"]
    assert cli(sluice_bin, "verify", str(saved / "s2")).returncode == 0


def test_missing_stores_and_checkpoints_exit_4_and_create_nothing(sluice_bin, tmp_path):
    for args in (["ls", str(tmp_path / "no")], ["inspect", str(tmp_path / "no" / "s1")]):
        out = cli(sluice_bin, *args)
        assert out.returncode == 4 and "not a checkpoint store" in out.stderr
    assert not (tmp_path / "no").exists()
    store = tmp_path / "ckpt"
    ck.save({"w": torch.ones(2)}, store / "s1", blocking=True)
    out = cli(sluice_bin, "verify", str(store / "s9"))
    assert out.returncode == 4 and "no checkpoint" in out.stderr
    out = cli(sluice_bin, "inspect", str(store / ".."))
    assert out.returncode != 0
