"""`sluice mount` through the kernel (FUSE, as root): a directory and an S3 prefix mounted
read-only, unmodified `safetensors.torch.load_file` on 1 and 2 torch threads bit-exact
through it, SIGTERM unmounting cleanly even with a file mapped, a daemon killed with
SIGKILL leaving a stale mount that the next `sluice mount` reports, the disk tier serving a
restarted mount (and refetching a corrupted block), and bad options. Also hostile input:
a directory source's permissions kept (root-only files stay root-only through the mount),
S3 folder markers, empty prefixes and object URLs, a mount point whose name mountinfo
escapes, and `--daemon` exiting as the foreground would."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from conftest import assert_same_tensors, random_tensor, write_sharded
from s3_support import S3Server

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/dev/fuse"), reason="needs root and /dev/fuse"
)

BIN = os.environ.get("SLUICE_BIN", "target/release/sluice")


def mount(source: str, mnt: Path, *extra: str, env=None) -> int:
    r = subprocess.run(
        [BIN, "mount", source, str(mnt), "--daemon", "--pool", "256MiB", *extra],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    assert r.returncode == 0, r.stderr
    assert os.path.ismount(mnt)
    return int(r.stdout.split()[0])


def wait_gone(pid: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"mount daemon {pid} still running")


def force_unmount(mnt: Path) -> None:
    if os.path.ismount(mnt) or _stale(mnt):
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _stale(mnt: Path) -> bool:
    try:
        os.listdir(mnt)  # a stat may come from the kernel's cache; a listing asks the daemon
        return False
    except OSError as e:
        return e.errno == 107  # ENOTCONN


@pytest.fixture
def mnt(tmp_path):
    """An empty mount point, unmounted after the test whatever happened."""
    path = tmp_path / "mnt"
    path.mkdir()
    yield path
    force_unmount(path)


@pytest.fixture
def model(tmp_path):
    gen = torch.Generator().manual_seed(5)
    shards = {
        f"model-{i:05d}-of-00002.safetensors": {
            f"l{i}.{j}": random_tensor(torch.bfloat16, (512, 1024 + j), gen) for j in range(8)
        }
        for i in range(2)
    }
    index = write_sharded(tmp_path / "src", shards)
    return index.parent, {k: v for s in shards.values() for k, v in s.items()}


def load_through(mnt: Path, threads: int) -> dict:
    """Unmodified safetensors, in a fresh process with `threads` torch threads (the loader
    copies from the mmap on that many threads)."""
    code = (
        "import sys, torch; from safetensors.torch import load_file\n"
        f"torch.set_num_threads({threads})\n"
        "out = {}\n"
        "for p in sorted(__import__('pathlib').Path(sys.argv[1]).glob('*.safetensors')):\n"
        "    out.update({k: v.clone() for k, v in load_file(str(p)).items()})\n"
        "torch.save(out, sys.argv[2])\n"
    )
    dest = mnt.parent / f"loaded-{threads}.pt"
    subprocess.run([sys.executable, "-c", code, str(mnt), str(dest)], check=True, timeout=300)
    return torch.load(dest)


def test_directory_mount_serves_unmodified_loaders_and_unmounts_on_sigterm(model, mnt, tmp_path):
    src, want = model
    log = tmp_path / "mount.log"
    pid = mount(str(src), mnt, "--log", str(log))
    assert sorted(os.listdir(mnt)) == sorted(os.listdir(src))
    for f in src.iterdir():
        assert (mnt / f.name).stat().st_size == f.stat().st_size
        assert (mnt / f.name).read_bytes() == f.read_bytes()
    with pytest.raises(OSError):
        (mnt / "new").write_bytes(b"x")
    for threads in (1, 2):
        assert_same_tensors(load_through(mnt, threads), want)
    # SIGTERM with a file still open: the mount point is freed, the daemon exits.
    with open(mnt / "model-00001-of-00002.safetensors", "rb") as f:
        f.read(10)
        os.kill(pid, signal.SIGTERM)
        wait_gone(pid)
        assert not os.path.ismount(mnt)
    # A clean stop logs no error (fuser's own unmount on drop used to log one).
    assert "ERROR" not in log.read_text(), log.read_text()


def test_s3_prefix_mount(tmp_path, model):
    src, want = model
    server = S3Server()
    try:
        server.upload_dir(src, "mounted")
        mnt = tmp_path / "s3mnt"
        mnt.mkdir()
        pid = mount("s3://models/mounted/", mnt, env=server.env())
        try:
            assert sorted(os.listdir(mnt)) == sorted(os.listdir(src))
            assert_same_tensors(load_through(mnt, 2), want)
            os.kill(pid, signal.SIGINT)
            wait_gone(pid)
        finally:
            force_unmount(mnt)
    finally:
        server.stop()


def test_s3_folder_markers_empty_prefixes_and_object_urls(tmp_path, mnt):
    """Keys ending in `/` (folder markers, as the AWS console, s3fs and rclone make them)
    are directories, an object `x` beside `x/y` too; a prefix with nothing under it, or an
    object's URL, is a missing source (exit 4), in the foreground and as a daemon."""
    server = S3Server()
    try:
        put = server.client.put_object
        for key, body in [
            ("conf2/", b""),
            ("conf2/sub/", b""),
            ("conf2/sub/in.safetensors", b"inner"),
            ("conf2/x", b"a file"),
            ("conf2/x/y.safetensors", b"why"),
        ]:
            put(Bucket="models", Key=key, Body=body)
        env = server.env()
        pid = mount("s3://models/conf2/", mnt, env=env)
        try:
            assert sorted(os.listdir(mnt)) == ["sub", "x"]
            assert (mnt / "sub" / "in.safetensors").read_bytes() == b"inner"
            assert (mnt / "x" / "y.safetensors").read_bytes() == b"why"
        finally:
            os.kill(pid, signal.SIGTERM)
            wait_gone(pid)
        for url, says in [
            ("s3://models/nothing/", "no objects under s3://models/nothing/"),
            ("s3://models/conf2/sub/in.safetensors", "is an object"),
        ]:
            for daemon in ([], ["--daemon"]):
                r = subprocess.run(
                    [BIN, "mount", url, str(mnt), *daemon],
                    capture_output=True,
                    text=True,
                    timeout=60,
                    env={**os.environ, **env},
                )
                assert r.returncode == 4 and says in r.stderr, (url, daemon, r.stderr)
        codes = []
        for daemon in ([], ["--daemon"]):
            r = subprocess.run(
                [BIN, "mount", "s3://no-such-bucket/m/", str(mnt), *daemon],
                capture_output=True,
                text=True,
                timeout=120,
                env={**os.environ, **env},
            )
            codes.append(r.returncode)
        assert codes[0] != 0 and codes[0] == codes[1], codes
        assert not os.path.ismount(mnt)
    finally:
        server.stop()


@pytest.fixture
def shared_mnt():
    """An empty mount point other users can reach (pytest's own are root-only)."""
    base = Path(tempfile.mkdtemp(prefix="sluice-mnt-", dir="/tmp"))
    base.chmod(0o755)
    path = base / "mnt"
    path.mkdir()
    yield path
    force_unmount(path)
    shutil.rmtree(base, ignore_errors=True)


def test_a_directory_mount_keeps_the_sources_permissions(tmp_path, shared_mnt):
    """A root-only file or directory stays root-only through the mount (`allow_other`
    lets every user in; `default_permissions` then checks the source's own bits)."""
    src = tmp_path / "perm-src"
    (src / "private").mkdir(parents=True)
    for name, mode in [("secret.safetensors", 0o600), ("open.safetensors", 0o644)]:
        (src / name).write_bytes(b"safetensors-bytes")
        (src / name).chmod(mode)
    (src / "private" / "f").write_bytes(b"x")
    (src / "private").chmod(0o700)
    src.chmod(0o755)
    pid = mount(str(src), shared_mnt)
    try:

        def as_nobody(*cmd: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                list(cmd), user=65534, group=65534, capture_output=True, timeout=30
            )

        opened = as_nobody("head", "-c", "8", str(shared_mnt / "open.safetensors"))
        assert opened.stdout == b"safetens", opened
        denied = as_nobody("head", "-c", "8", str(shared_mnt / "secret.safetensors"))
        assert denied.returncode != 0 and denied.stdout == b"", denied
        assert b"Permission denied" in denied.stderr, denied
        assert as_nobody("ls", str(shared_mnt / "private")).returncode != 0
        st = (shared_mnt / "secret.safetensors").stat()
        assert (st.st_mode & 0o777, st.st_uid) == (
            0o400,
            (src / "secret.safetensors").stat().st_uid,
        )
        # Root still reads everything.
        assert (shared_mnt / "secret.safetensors").read_bytes() == b"safetensors-bytes"
    finally:
        os.kill(pid, signal.SIGTERM)
        wait_gone(pid)


def test_the_default_daemon_log_is_named_after_the_daemon(model, mnt):
    src, _ = model
    r = subprocess.run(
        [BIN, "mount", str(src), str(mnt), "--daemon"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    pid = int(r.stdout.split()[0])
    try:
        log = Path(tempfile.gettempdir()) / f"sluice-mount-{pid}.log"
        assert f"(log {log})" in r.stderr and "mounted" in log.read_text(), r.stderr
    finally:
        os.kill(pid, signal.SIGTERM)
        wait_gone(pid)


def test_a_mount_point_named_with_escaped_characters(model, tmp_path):
    """A mount point with a newline, a tab, a space and a backslash (mountinfo writes them
    as octal escapes): the daemon's parent returns, and a second mount there is refused."""
    src, _ = model
    mnt = tmp_path / "a\nb\tc d\\e"
    mnt.mkdir()
    try:
        r = subprocess.run(
            [BIN, "mount", str(src), str(mnt), "--daemon"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode == 0 and os.path.ismount(mnt), r.stderr
        pid = int(r.stdout.split()[0])
        r = subprocess.run(
            [BIN, "mount", str(src), str(mnt)], capture_output=True, text=True, timeout=30
        )
        assert r.returncode == 3 and "already mounted" in r.stderr, r.stderr
        os.kill(pid, signal.SIGTERM)
        wait_gone(pid)
        assert not os.path.ismount(mnt)
    finally:
        for _ in range(3):  # (a failed check may leave mounts stacked here)
            force_unmount(mnt)


def test_a_killed_daemon_leaves_a_stale_mount_that_is_reported(model, mnt):
    src, _ = model
    pid = mount(str(src), mnt)
    os.kill(pid, signal.SIGKILL)
    wait_gone(pid)
    assert _stale(mnt)
    r = subprocess.run([BIN, "mount", str(src), str(mnt)], capture_output=True, text=True)
    assert r.returncode == 3 and "stale mount" in r.stderr, r.stderr
    force_unmount(mnt)
    assert not _stale(mnt)


@pytest.fixture
def full(tmp_path):
    """A mount point that is not empty, unmounted after the test should one mount there."""
    path = tmp_path / "full"
    path.mkdir()
    (path / "kept").write_bytes(b"hidden by a mount")
    yield path
    force_unmount(path)


def test_bad_mounts_are_refused(model, mnt, full, tmp_path):
    src, _ = model
    cases = [
        ([str(src), str(mnt), "--pool", "1MiB"], 2, "pool"),
        ([str(src), str(mnt), "--block", "lots"], 2, "--block"),
        ([str(tmp_path / "missing"), str(mnt)], 4, "missing"),
        ([str(src), str(tmp_path / "nodir")], 3, "nodir"),
        ([str(src), str(src / "model.safetensors.index.json")], 3, "not a directory"),
        ([str(src), str(mnt), "--cache-dir", str(src)], 2, "other files"),
        ([str(src), str(mnt), "--cache-size", "1GiB"], 2, "--cache-dir"),
        ([str(src), str(mnt), "--no-passthrough"], 2, "--cache-dir"),
        ([str(src), str(mnt), "--cache-dir", str(mnt / "c")], 2, "under the mount point"),
        (
            [str(src), str(mnt), "--cache-dir", str(tmp_path / "c"), "--cache-size", "1KiB"],
            2,
            "4 blocks",
        ),
        ([str(src), str(full)], 3, "not empty"),
        ([str(src), str(mnt), "--log", str(tmp_path / "x.log")], 2, "--log"),
        ([str(src), str(mnt), "--streams", "0"], 2, "streams"),
    ]
    for args, code, says in cases:
        r = subprocess.run([BIN, "mount", *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == code and says in r.stderr, (args, r.returncode, r.stderr)
    assert not os.path.ismount(mnt)
    # The same failures in a --daemon's child: the parent exits as the foreground did.
    regular = src / "model.safetensors.index.json"
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    daemon_cases = [
        ([str(src), str(mnt), "--cache-dir", str(regular)], 2, "cache"),
        ([str(src), str(mnt), "--log", str(tmp_path / "none" / "x.log")], 2, "--log"),
        ([str(src), str(mnt), "--log", str(fifo)], 2, "a FIFO"),
        ([str(tmp_path / "missing"), str(mnt)], 4, "missing"),
        ([str(src), str(full)], 3, "not empty"),
    ]
    for args, code, says in daemon_cases:
        r = subprocess.run(
            [BIN, "mount", "--daemon", *args], capture_output=True, text=True, timeout=60
        )
        assert r.returncode == code and says in r.stderr, (args, r.returncode, r.stderr)
    assert not os.path.ismount(mnt)


def passed_through(log: str) -> int:
    """The opens the last summary in a mount's log says were passed through."""
    summary = log.split("disk cache")[-1]
    return int(summary.split(" opens passed through")[0].rsplit(" ", 1)[-1])


def test_disk_cache_passes_whole_files_through_serves_a_restart_and_refetches_a_corrupt_block(
    model, mnt, tmp_path
):
    src, want = model
    cache = tmp_path / "cache"
    log = tmp_path / "mount.log"
    shards = sorted(src.glob("*.safetensors"))
    blocks = sum(-(-p.stat().st_size // (8 << 20)) for p in shards)

    def session(loads: int) -> str:
        pid = mount(str(src), mnt, "--cache-dir", str(cache), "--log", str(log))
        for _ in range(loads):
            assert_same_tensors(load_through(mnt, 2), want)
        os.kill(pid, signal.SIGTERM)
        wait_gone(pid)
        return log.read_text()

    # The second load finds every shard whole in the tier: each open is passed through
    # (the kernel reads the local copy), and the bytes are the same.
    first = session(loads=2)
    assert "0 hits" in first.split("disk cache")[-1], first
    # (safetensors opens each file twice)
    assert passed_through(first) >= len(shards), first
    datas = sorted(cache.glob("*/*.data"))
    assert len(datas) == len(shards), first
    # One bit flipped in a block's data: after a restart nothing is trusted unchecked, so
    # the first load reads through the daemon, the block fails its check and is fetched
    # again.
    with open(datas[0], "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 1]))
    second = session(loads=1)
    summary = second.split("disk cache")[-1]
    assert "1 corrupt blocks refetched" in summary, second
    assert f"{blocks - 1} hits" in summary, second
    assert passed_through(second) == 0, second


@pytest.fixture
def deep_dir(tmp_path):
    """A writable directory on an overlay whose lower layer is itself an overlay (stack
    depth 2), where the kernel refuses FUSE backing files; unmounted after the test."""
    base = tmp_path / "stack"
    dirs = {n: base / n for n in ("l1", "u1", "w1", "o1", "u2", "w2", "o2")}
    for d in dirs.values():
        d.mkdir(parents=True)
    (dirs["l1"] / "l2").mkdir()
    mounted = []
    for lower, upper, work, at in (("l1", "u1", "w1", "o1"), ("o1/l2", "u2", "w2", "o2")):
        opts = f"lowerdir={base / lower},upperdir={dirs[upper]},workdir={dirs[work]}"
        r = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(dirs[at])])
        if r.returncode != 0:
            for m in reversed(mounted):
                subprocess.run(["umount", "-l", str(m)], check=False)
            pytest.skip("cannot stack two overlays here")
        mounted.append(dirs[at])
    yield dirs["o2"] / "cache"
    for m in reversed(mounted):
        subprocess.run(["umount", "-l", str(m)], check=False)


def test_passthrough_refused_by_the_kernel_falls_back_to_the_daemon(model, mnt, tmp_path, deep_dir):
    """A cache directory stacked too deep for the kernel: it refuses the backing file, and
    the mount says so once and reads every file through the daemon, bit-exact."""
    src, want = model
    log = tmp_path / "mount.log"
    pid = mount(str(src), mnt, "--cache-dir", str(deep_dir), "--log", str(log))
    try:
        for _ in range(2):
            assert_same_tensors(load_through(mnt, 2), want)
    finally:
        os.kill(pid, signal.SIGTERM)
        wait_gone(pid)
    text = log.read_text()
    assert text.count("refused a backing file") == 1, text
    assert passed_through(text) == 0, text
    assert "refused by the kernel" in text.split("disk cache")[-1], text
