"""sluice.kv from Python: round trips into numpy/torch buffers, restarts, corruption, bad input."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import sluice.kv
from sluice.errors import ConfigError, SluiceError, StoreFormatError, StoreLockedError

BLOCK = 16384


def blocks_for(keys):
    return [
        np.frombuffer(
            np.random.default_rng(int.from_bytes(k[-4:], "little")).bytes(BLOCK), np.uint8
        )
        for k in keys
    ]


def keys_for(n, start=0):
    return [b"chain-%08d" % i for i in range(start, start + n)]


@pytest.fixture
def store_dir(tmp_path):
    return tmp_path / "kv"


def open_store(path, **kw):
    args = dict(block_bytes=BLOCK, dram="256KiB", ssd="4MiB", model="m", dtype="bfloat16")
    args.update(kw)
    return sluice.kv.open(path, **args)


def test_blocks_round_trip_into_numpy_torch_and_bytearray(store_dir):
    torch = pytest.importorskip("torch")
    keys = keys_for(6)
    data = blocks_for(keys)
    with open_store(store_dir) as store:
        assert store.put_batch(keys, data) == [True] * 6
        assert store.lookup([*keys, b"absent"]) == 6
        outs = [
            np.zeros(BLOCK, np.uint8),
            torch.zeros(BLOCK // 2, dtype=torch.bfloat16),
            bytearray(BLOCK),
        ]
        assert store.get_batch_into(keys[:3], outs) == [True] * 3
        assert (outs[0] == data[0]).all()
        assert outs[1].view(torch.uint8).numpy().tobytes() == data[1].tobytes()
        assert bytes(outs[2]) == data[2].tobytes()


def test_prefix_semantics_and_reopen_recovers_blocks(store_dir):
    keys = keys_for(8)
    data = blocks_for(keys)
    store = open_store(store_dir, dram=0)
    store.put_batch(keys[:3] + keys[4:], data[:3] + data[4:])
    store.close()
    store = open_store(store_dir, dram=0)
    assert store.stats()["recovered_blocks"] == 7
    assert store.lookup(keys) == 3
    outs = [np.zeros(BLOCK, np.uint8) for _ in keys]
    assert store.get_batch_into(keys, outs) == [True] * 3 + [False] * 5
    store.close()


def test_a_corrupted_block_is_a_miss_and_fsck_finds_and_drops_it(store_dir):
    keys = keys_for(3)
    with open_store(store_dir, dram=0) as store:
        store.put_batch(keys, blocks_for(keys))
    seg = store_dir / "segments" / f"seg-{1:016x}.skv"
    with open(seg, "r+b") as f:  # one byte of the second record's payload
        f.seek(2 * (BLOCK + 4096) + 4096 + 100)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))
    report = sluice.kv.fsck(store_dir)
    assert report["bad_blocks"] == 1 and report["good_blocks"] == 2
    with open_store(store_dir, dram=0) as store:
        outs = [np.zeros(BLOCK, np.uint8) for _ in keys]
        ok = store.get_batch_into(keys, outs)
        assert ok.count(True) < 3
        # The segment was never filled (so never sealed): the open verified its payloads
        # and skipped the damaged record; a sealed one would be caught by the read.
        stats = store.stats()
        assert stats["torn_slots_skipped"] + stats["corrupt_blocks"] == 1
    assert sluice.kv.fsck(store_dir, repair=True)["bad_blocks"] == 1
    assert sluice.kv.fsck(store_dir)["bad_blocks"] == 0


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(policy="no-such-policy"), "no-such-policy"),
        (dict(write_mode="sideways"), "write_mode"),
        (dict(durability="maybe"), "durability"),
        (dict(block_bytes=0), "block_bytes"),
        (dict(dram="lots"), "dram"),
        (dict(dram=0, ssd=0), "ssd_bytes"),
        (dict(io_threads=0), "io_threads"),
    ],
)
def test_bad_options_raise_config_error_naming_them(store_dir, kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        open_store(store_dir, **kwargs)


def test_bad_keys_and_buffers_are_refused_naming_them(store_dir):
    with open_store(store_dir, key_bytes=14) as store:
        with pytest.raises(ConfigError, match="key 0"):
            store.lookup([b"short"])
        with pytest.raises(TypeError, match="key 0"):
            store.lookup(["not bytes"])
        with pytest.raises(ConfigError, match="buffer 0: 100 bytes"):
            store.put_batch(keys_for(1), [np.zeros(100, np.uint8)])
        with pytest.raises(ValueError, match="buffer 0: read-only"):
            store.get_batch_into(keys_for(1), [bytes(BLOCK)])
        with pytest.raises(ValueError, match="not C-contiguous"):
            store.put_batch(keys_for(1), [np.zeros((BLOCK, 2), np.uint8)[:, 0]])
        same = np.zeros(BLOCK, np.uint8)
        with pytest.raises(ConfigError, match="twice"):
            store.get_batch_into(keys_for(2), [same, same])
        # Two views one byte apart overlap without sharing a start address.
        wide = np.zeros(BLOCK + 1, np.uint8)
        with pytest.raises(ConfigError, match="overlaps"):
            store.get_batch_into(keys_for(2), [wide[:BLOCK], wide[1:]])


def test_a_store_open_elsewhere_or_of_another_kind_is_refused(store_dir, tmp_path):
    store = open_store(store_dir)
    with pytest.raises(StoreLockedError, match=str(os.getpid())):
        open_store(store_dir)
    store.close()
    with pytest.raises(SluiceError):
        store.lookup(keys_for(1))
    with pytest.raises(StoreFormatError, match=r"16384-byte blocks"):
        open_store(store_dir, block_bytes=8192)
    other = tmp_path / "not-a-store"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(StoreFormatError, match="not a sluice kv store"):
        open_store(other)
    assert (other / "notes.txt").read_text() == "mine"


def test_the_readme_kv_example_runs_as_written(tmp_path, monkeypatch, capsys):
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = readme.index("```python\nimport numpy as np\nimport sluice.kv\n")
    code = readme[start + len("```python\n") : readme.index("```", start + 10)]
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md (sluice.kv)", "exec"), {})
    out = capsys.readouterr().out
    assert "'good_blocks': 8" in out and "'bad_blocks': 0" in out
