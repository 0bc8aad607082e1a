"""sluice.kv from Python: round trips into numpy/torch buffers, restarts, corruption, bad input."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import sluice.kv
from forking import status_in_fork
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


def test_delete_frees_both_tiers_and_counts_what_was_held(store_dir):
    keys = keys_for(6)
    with open_store(store_dir) as store:
        store.put_batch(keys, blocks_for(keys))
        before = store.stats()
        assert store.delete([keys[1], b"absent", keys[1], bytearray(keys[2])]) == 2
        assert store.delete(keys[1:3]) == 0
        assert store.lookup(keys) == 1
        s = store.stats()
        assert s["deletes"] == 2
        for tier in ("dram", "ssd"):
            assert s[tier]["blocks"] == before[tier]["blocks"] - 2
        outs = [np.zeros(BLOCK, np.uint8)]
        assert store.get_batch_into(keys[2:3], outs) == [False]
        with pytest.raises(ConfigError, match="key 0"):
            store.delete([b""])
        with pytest.raises(TypeError, match="key 1: expected bytes, got str"):
            store.delete([b"ok", "not bytes"])
    with pytest.raises(SluiceError):
        store.delete(keys[:1])


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
        (dict(write_mode="sideways"), "write_mode.*write-through, write-back"),
        (dict(durability="maybe"), "durability.*batch, none"),
        (dict(direct="sometimes"), "direct.*auto, on, off"),
        (dict(recompute_tokens_per_s=0.0, block_tokens=16), "recompute_tokens_per_s"),
        (dict(recompute_tokens_per_s=1e4), "go together"),
        (dict(block_bytes=0), "block_bytes"),
        (dict(dram="lots"), "dram"),
        (dict(dram=0, ssd=0), "ssd_bytes"),
        (dict(io_threads=0), "io_threads"),
        (dict(tp_rank=5, tp_size=2), "tp_rank"),
        (dict(lease_timeout_ms=-1), "lease_timeout_ms"),
        (dict(io_threads=-3), "io_threads"),
        (dict(key_bytes=-1), "key_bytes"),
        (dict(shared_refresh_ms=1.5), "shared_refresh_ms"),
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


def test_submitted_jobs_round_trip_and_poll_reports_each_once(store_dir):
    keys = keys_for(10)
    data = blocks_for(keys)
    with open_store(store_dir) as store:
        put = store.submit_put(keys, data)
        assert put.kind == "put"
        assert put.wait(timeout=60) == [True] * 10
        outs = [np.zeros(BLOCK, np.uint8) for _ in keys]
        get = store.submit_get([*keys[:4], b"absent", keys[5]], outs[:6])
        assert get.wait() == [True] * 4 + [False, False]
        for o, d in zip(outs[:4], data):
            assert (o == d).all()
        a = store.submit_put(keys_for(2, start=100), blocks_for(keys_for(2, start=100)))
        b = store.submit_get(keys[:1], outs[:1])
        polled = []
        while len(polled) < 2:
            polled += store.poll()
        assert sorted(j.id for j in polled) == sorted([a.id, b.id])
        assert {j.id: j.result() for j in polled} == {a.id: [True, True], b.id: [True]}
        assert store.poll() == [], "each job is reported once"
        assert put.id not in [j.id for j in polled], "a waited job is not polled"


def test_a_job_keeps_its_buffers_alive_until_it_is_collected(store_dir):
    import gc
    import weakref

    keys = keys_for(4)
    with open_store(store_dir) as store:
        store.put_batch(keys, blocks_for(keys))
        outs = [np.zeros(BLOCK, np.uint8) for _ in keys]
        refs = [weakref.ref(o) for o in outs]
        job = store.submit_get(keys, outs)
        del outs
        gc.collect()
        assert all(r() is not None for r in refs), "freed while the job may write into it"
        assert job.wait() == [True] * 4
        gc.collect()
        assert all(r() is None for r in refs), "a collected job lets go of its buffers"


def test_bad_submits_raise_at_once_naming_the_value(store_dir):
    with open_store(store_dir) as store:
        with pytest.raises(ConfigError, match="buffer 0: 100 bytes"):
            store.submit_put(keys_for(1), [np.zeros(100, np.uint8)])
        with pytest.raises(ValueError, match="buffer 0: read-only"):
            store.submit_get(keys_for(1), [bytes(BLOCK)])
        same = np.zeros(BLOCK, np.uint8)
        with pytest.raises(ConfigError, match="twice"):
            store.submit_get(keys_for(2), [same, same])
        job = store.submit_get(keys_for(1), [np.zeros(BLOCK, np.uint8)])
        for bad in (-1, float("nan")):
            with pytest.raises(ConfigError, match="timeout"):
                job.wait(timeout=bad)
        # Longer than a Duration holds (a PanicException before): as long as it takes.
        assert job.wait(timeout=1e300) == [False]
        assert job.wait(timeout=float("inf")) == [False]
        assert job.wait() == [False]
    with pytest.raises(SluiceError, match="closed"):
        store.submit_put(keys_for(1), blocks_for(keys_for(1)))


def test_lookup_worth_loading_follows_the_recompute_rate(store_dir, tmp_path):
    keys = keys_for(6)
    with open_store(store_dir, recompute_tokens_per_s=1.0, block_tokens=16) as store:
        store.put_batch(keys, blocks_for(keys))
        assert store.lookup(keys, worth_loading=True) == 6
    with open_store(tmp_path / "fast", recompute_tokens_per_s=1e15, block_tokens=16) as store:
        store.put_batch(keys, blocks_for(keys))
        assert store.lookup(keys) == 6
        assert store.lookup(keys, worth_loading=True) == 0
    with open_store(tmp_path / "none") as store, pytest.raises(ConfigError, match="recompute"):
        store.lookup(keys, worth_loading=True)


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


def test_the_documented_kv_examples_run_as_written(tmp_path, monkeypatch, capsys):
    repo = Path(__file__).resolve().parents[2]
    head = "```python\nimport numpy as np\nimport sluice.kv\n"
    # The store, jobs and delete examples; the short one.
    pages = {"docs/guide/kv.md": 3, "README.md": 1}
    monkeypatch.chdir(tmp_path)
    for page, count in pages.items():
        text = (repo / page).read_text()
        starts = [i for i in range(len(text)) if text.startswith(head, i)]
        assert len(starts) == count, page
        for start in starts:
            code = text[start + len("```python\n") : text.index("```", start + 10)]
            exec(compile(code, f"{page} (sluice.kv)", "exec"), {})
            for p in tmp_path.iterdir():  # each example starts from an empty directory
                shutil.rmtree(p) if p.is_dir() else p.unlink()
    out = capsys.readouterr().out
    assert "'good_blocks': 8" in out and "'bad_blocks': 0" in out
    assert "[True, True, True, True] [7 7 7 7]" in out
    assert "4\n0 4\n" in out


def test_kv_bench_draws_its_plots_through_python(sluice_bin, tmp_path):
    import subprocess
    import sys

    trace = tmp_path / "t.jsonl"
    subprocess.run([sluice_bin, "sim", "gen-kv", "--out", trace, "--requests", "60"], check=True)
    env = dict(os.environ, SLUICE_PYTHON=sys.executable)
    env["PYTHONPATH"] = str(Path(sluice.kv.__file__).resolve().parents[1])
    tiny = "layers=1,kv_heads=1,head_dim=16,dtype_bytes=2"
    args = ["--model", tiny, "--ssd", "32MiB", "--dram", "1MiB", "--compare-sim"]
    done = subprocess.run(
        [sluice_bin, "kv", "bench", "--trace", trace, "--out", tmp_path / "out", *args],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    for png in ("latency_cdf.png", "hit_ratio_over_time.png"):
        data = (tmp_path / "out" / png).read_bytes()
        assert data.startswith(b"\x89PNG"), png


def test_two_stores_share_a_directory(tmp_path):
    """Two nodes' stores over one shared directory: what one stored, the other reads
    byte for byte once the segment is sealed and found (shared_refresh_ms)."""
    import time

    shared = tmp_path / "nfs"
    keys = keys_for(3)
    data = blocks_for(keys)
    common = dict(shared_dir=shared, shared_refresh_ms=30, dram=0)
    with open_store(tmp_path / "a", shared="4MiB", **common) as a:
        assert a.put_batch(keys, data) == [True] * 3
        with open_store(tmp_path / "b", **common) as b:
            deadline = time.monotonic() + 10
            while b.lookup(keys) < 3:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            out = [np.zeros(BLOCK, np.uint8) for _ in keys]
            assert b.get_batch_into(keys, out) == [True] * 3
            assert all((o == d).all() for o, d in zip(out, data))
            stats = b.stats()
            assert stats["hits_shared"] == 3 and stats["foreign"]["stores"] == 1
    with pytest.raises(ConfigError, match="shared_dir"):
        open_store(tmp_path / "c", shared="1GiB")
    with pytest.raises(ConfigError, match="shared"):
        open_store(tmp_path / "c", shared_dir=shared, shared="lots")


@contextlib.contextmanager
def read_only_view(path: Path, tmp_path: Path):
    """``path`` as this process cannot write it: a read-only bind mount as root (EROFS), the
    write permission bits removed otherwise (EACCES). Skips, saying why, where neither works."""
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in [path, *path.rglob("*")]}
        for p in modes:
            p.chmod(modes[p] & ~0o222)
        try:
            yield path
        finally:
            for p, mode in modes.items():
                p.chmod(mode)
        return
    view = tmp_path / "read-only-view"
    view.mkdir()
    bind = subprocess.run(["mount", "--bind", str(path), str(view)], capture_output=True, text=True)
    if bind.returncode != 0:
        pytest.skip(f"needs a bind mount (root in a container without it?): {bind.stderr.strip()}")
    try:
        ro = subprocess.run(
            ["mount", "-o", "remount,bind,ro", str(view)], capture_output=True, text=True
        )
        if ro.returncode != 0:
            pytest.skip(f"cannot remount the bind mount read-only: {ro.stderr.strip()}")
        yield view
    finally:
        subprocess.run(["umount", str(view)], check=False)


def test_stats_and_fsck_read_a_store_they_cannot_write(sluice_bin, store_dir, tmp_path):
    """Issue 27 #10: `sluice kv stats` and `fsck` (without --repair) of a read-only store,
    or as a user who may only read it, used to fail opening the lock and segments for writing."""
    keys = keys_for(5)
    with open_store(store_dir, dram=0) as store:
        assert store.put_batch(keys, blocks_for(keys)) == [True] * 5
    with read_only_view(store_dir, tmp_path) as view:
        stats = subprocess.run(
            [sluice_bin, "kv", "stats", view, "--json"], capture_output=True, text=True
        )
        assert stats.returncode == 0, stats.stderr
        assert json.loads(stats.stdout)["blocks"] == 5
        fsck = subprocess.run(
            [sluice_bin, "kv", "fsck", view, "--json"], capture_output=True, text=True
        )
        assert fsck.returncode == 0, fsck.stderr
        report = json.loads(fsck.stdout)
        assert report["good_blocks"] == 5 and report["bad_blocks"] == 0
        assert sluice.kv.fsck(view)["good_blocks"] == 5
        repair = subprocess.run([sluice_bin, "kv", "fsck", view, "--repair"], capture_output=True)
        assert repair.returncode != 0, "repairing needs write access"


def test_buffers_of_python_objects_are_refused_naming_them(store_dir):
    """Issue 27 #9: a numpy object array's memory is Python object pointers. A put stored
    the heap addresses and a get wrote block bytes over them (touching the array then
    segfaulted). Any buffer that is not plain bytes is refused, naming it."""
    import ctypes

    objects = np.empty(BLOCK // 8, dtype=object)
    record = np.zeros(BLOCK // 16, dtype=[("a", "i8"), ("b", "O")])
    pointers = (ctypes.py_object * (BLOCK // 8))()
    keys = keys_for(2)
    plain = blocks_for(keys)
    with open_store(store_dir) as store:
        for bad in (objects, record, pointers):
            with pytest.raises(ConfigError, match=r"buffer 1: .*Python objects"):
                store.put_batch(keys, [plain[0], bad])
            with pytest.raises(ConfigError, match=r"buffer 1: .*Python objects"):
                store.submit_put(keys, [plain[0], bad])
        assert store.put_batch(keys, plain) == [True, True]
        for bad in (objects, record, pointers):
            with pytest.raises(ConfigError, match=r"buffer 0: .*Python objects"):
                store.get_batch_into(keys[:1], [bad])
            with pytest.raises(ConfigError, match=r"buffer 0: .*Python objects"):
                store.submit_get(keys[:1], [bad])
        assert objects[0] is None, "the array was not written into"


def test_defaults_come_from_rust_and_reports_are_typed(store_dir):
    """Issue 27: the KV defaults lived in four places; kv_open took 17 positional
    arguments; stats and fsck crossed as JSON text."""
    import inspect

    from sluice import _sluice
    from sluice.integrations._common import StoreOptions

    defaults = _sluice.kv_defaults()
    assert defaults == sluice.kv.DEFAULTS
    assert (defaults["io_threads"], defaults["lease_timeout_ms"]) == (8, 10_000)
    params = inspect.signature(sluice.kv.open).parameters
    for name in ("policy", "write_mode", "durability", "direct", "io_threads", "engine"):
        assert params[name].default == defaults[name], name
    params = inspect.signature(sluice.kv.connect).parameters
    assert params["retry_ms"].default == defaults["retry_ms"]
    assert StoreOptions().lease_timeout_ms == defaults["lease_timeout_ms"]
    with pytest.raises(ConfigError, match='unknown option "color"'):
        _sluice.kv_open(str(store_dir), {"block_bytes": BLOCK, "ssd": "4MiB", "color": 1})
    keys = keys_for(3)
    with open_store(store_dir, dram=0, ssd_policy="fifo") as store:
        assert store.stats()["ssd"]["policy"] == "fifo"
        store.put_batch(keys, blocks_for(keys))
        report = store._native.stats()
        assert isinstance(report, _sluice.KvStatsReport)
        assert (report.puts, report.put_failures, report.put_declined) == (3, 0, 0)
        stats = store.stats()
        assert stats["puts"] == 3 and stats["ssd"]["capacity_blocks"] == 4 * 1024 // 16
        assert stats["ssd"]["disk_bytes_limit"] >= 4 << 20
    fsck = _sluice.kv_fsck(str(store_dir))
    assert isinstance(fsck, _sluice.KvFsckReport)
    assert (fsck.good_blocks, fsck.bad_blocks, fsck.lock) == (3, 0, "shared (read-only)")
    assert sluice.kv.fsck(store_dir)["good_blocks"] == 3


def test_a_full_file_system_fails_puts_and_keeps_every_acknowledged_block(tmp_path):
    """Issue 27 #4 on a real full disk: a small tmpfs under a write-through store with a
    DRAM tier. Puts past the space are not acknowledged (put_failures), and every block
    that was is found after reopening. Needs root to mount; skipped, saying why, without."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    fs = tmp_path / "small-fs"
    fs.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(fs)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        kw = dict(block_bytes=BLOCK, dram="512KiB", ssd="16MiB", model="m", direct="off")
        acked, refused = [], []
        with sluice.kv.open(fs / "kv", **kw) as store:
            for batch in range(40):
                keys = keys_for(8, start=batch * 8)
                for k, ok in zip(keys, store.put_batch(keys, blocks_for(keys))):
                    (acked if ok else refused).append(k)
            stats = store.stats()
        assert acked and refused, stats
        assert stats["put_failures"] == len(refused) and stats["write_errors"] > 0, stats
        with sluice.kv.open(fs / "kv", **kw) as store:
            out = [np.zeros(BLOCK, np.uint8) for _ in acked]
            assert store.get_batch_into(acked, out) == [True] * len(acked)
            assert all((o == d).all() for o, d in zip(out, blocks_for(acked)))
        # A closed store lets go of its files though `store` still refers to it: the
        # file system unmounts (it was "busy" before issue 27's fix).
        umount = subprocess.run(["umount", str(fs)], capture_output=True, text=True)
        assert umount.returncode == 0, umount.stderr
    finally:
        if os.path.ismount(fs):
            subprocess.run(["umount", "--lazy", str(fs)], check=False)


def test_a_forked_child_neither_uses_nor_keeps_locked_its_parents_store(store_dir):
    # Issue 27: a child forked after open wrote into the slots its parent reserves too, its
    # close() and its garbage collection panicked (joining the parent's threads), and it
    # kept the store locked after the parent closed it ("this process already has it open").
    keys = keys_for(4)
    later = keys_for(1, 100)
    store = open_store(store_dir)
    assert store.put_batch(keys, blocks_for(keys)) == [True] * 4

    def child():
        calls = [
            lambda: store.lookup(keys),
            lambda: store.put_batch(later, blocks_for(later)),
            lambda: store.get_batch_into(keys[:1], [np.empty(BLOCK, np.uint8)]),
            lambda: store.submit_put(later, blocks_for(later)),
            store.sync,
        ]
        forked = f"this process \\({os.getpid()}\\) is a fork"
        for call in calls:
            with pytest.raises(StoreLockedError, match=forked):
                call()
        store.close()  # lets go of the child's copy only

    assert status_in_fork(child) == 0
    assert store.lookup(keys) == 4
    assert store.lookup(later) == 0
    assert store.put_batch(later, blocks_for(later)) == [True]

    # A child forked while the store is open, alive after the parent closed it, does not
    # keep it locked.
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # waits until the parent says go
        os.read(go_r, 1)
        os._exit(0)
    try:
        store.close()
        with open_store(store_dir) as again:
            assert again.lookup(keys + later) == 5
    finally:
        os.write(go_w, b"x")
        os.waitpid(pid, 0)
        os.close(go_r)
        os.close(go_w)
