"""The ``sluice`` binary end to end: output, exit codes and one-line errors on stderr."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import write_raw, write_sharded
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parents[2]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INVALID, EXIT_NOT_FOUND = 0, 1, 2, 3, 4


def run(binary: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    return subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=60, env=env)


@pytest.fixture
def checkpoint(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    tensors = {
        "embed": torch.arange(4096, dtype=torch.float32).reshape(64, 64),
        "norm": torch.ones(64, dtype=torch.bfloat16),
        "head": torch.zeros(3, 5, dtype=torch.int8),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path, tensors


def nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def test_load_prints_tensors_bytes_speed_and_engine(sluice_bin, checkpoint) -> None:
    path, tensors = checkpoint

    done = run(sluice_bin, "load", str(path))

    assert done.returncode == EXIT_OK, done.stderr
    assert f"loaded {len(tensors)} tensors" in done.stdout
    assert "GB/s" in done.stdout and "engine " in done.stdout
    assert done.stderr == ""


def test_load_json_reports_every_field(sluice_bin, checkpoint) -> None:
    path, tensors = checkpoint

    done = run(sluice_bin, "load", str(path), "--json", "--direct", "off", "--engine", "threads")

    assert done.returncode == EXIT_OK, done.stderr
    report = json.loads(done.stdout)
    assert report["tensors"] == len(tensors)
    assert report["bytes"] == nbytes(tensors)
    assert report["seconds"] >= 0 and report["gb_per_s"] >= 0
    assert (report["engine"], report["io_mode"]) == ("threads", "buffered")
    assert report["files"] == [
        {"path": str(path), "direct": False, "buffered_reason": "direct=off"}
    ]


def test_load_names_loads_only_those(sluice_bin, checkpoint) -> None:
    path, tensors = checkpoint

    done = run(sluice_bin, "load", str(path), "--json", "--names", "norm,head")

    assert done.returncode == EXIT_OK, done.stderr
    report = json.loads(done.stdout)
    assert report["tensors"] == 2
    assert report["bytes"] == nbytes({n: tensors[n] for n in ("norm", "head")})


def test_load_of_a_sharded_index(sluice_bin, tmp_path: Path) -> None:
    shards = {f"m-{i}.safetensors": {f"w{i}": torch.ones(100 + i)} for i in range(3)}
    index = write_sharded(tmp_path / "ckpt", shards)

    done = run(sluice_bin, "load", str(index), "--json")

    assert done.returncode == EXIT_OK, done.stderr
    report = json.loads(done.stdout)
    assert report["tensors"] == 3 and len(report["files"]) == 3


def test_inspect_lists_each_tensor_and_validates(sluice_bin, checkpoint) -> None:
    path, tensors = checkpoint

    done = run(sluice_bin, "inspect", str(path))

    assert done.returncode == EXIT_OK, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(str(path)) and f"{len(tensors)} tensors" in lines[0]
    for name in tensors:
        assert any(line.split()[:1] == [name] for line in lines[1:]), name
    assert "BF16" in done.stdout and "[64, 64]" in done.stdout
    assert lines[-1].startswith("valid:")


def test_inspect_json_matches_the_header(sluice_bin, checkpoint) -> None:
    path, tensors = checkpoint

    done = run(sluice_bin, "inspect", str(path), "--json")

    assert done.returncode == EXIT_OK, done.stderr
    report = json.loads(done.stdout)
    assert report["valid"] is True
    assert (report["tensor_count"], report["tensor_bytes"]) == (len(tensors), nbytes(tensors))
    [shard] = report["shards"]
    assert shard["metadata"] == {"format": "pt"}
    assert shard["file_bytes"] == path.stat().st_size
    listed = {t["name"]: (t["dtype"], t["shape"], t["bytes"]) for t in shard["tensors"]}
    assert listed == {
        "embed": ("F32", [64, 64], 16384),
        "norm": ("BF16", [64], 128),
        "head": ("I8", [3, 5], 15),
    }


def test_inspect_summary_omits_tensors(sluice_bin, checkpoint) -> None:
    path, tensors = checkpoint

    text = run(sluice_bin, "inspect", str(path), "--summary")
    as_json = run(sluice_bin, "inspect", str(path), "--summary", "--json")

    assert text.returncode == as_json.returncode == EXIT_OK
    assert "embed" not in text.stdout
    assert len(text.stdout.splitlines()) == 2
    [shard] = json.loads(as_json.stdout)["shards"]
    assert "tensors" not in shard and shard["tensor_count"] == len(tensors)


def assert_one_line_error(done: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert done.returncode == code, (done.returncode, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("sluice: error:"), lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    assert done.stdout == ""


@pytest.mark.parametrize("command", ["load", "inspect"])
def test_missing_path_exits_4_naming_it(sluice_bin, tmp_path: Path, command: str) -> None:
    missing = tmp_path / "absent.safetensors"

    done = run(sluice_bin, command, str(missing))

    assert_one_line_error(done, EXIT_NOT_FOUND, str(missing))


@pytest.mark.parametrize("command", ["load", "inspect"])
def test_corrupt_header_exits_3_naming_the_file(sluice_bin, tmp_path: Path, command: str) -> None:
    path = write_raw(tmp_path / "bad.safetensors", '{"w": {"dtype": "F32",', bytes(16))

    done = run(sluice_bin, command, str(path))

    assert_one_line_error(done, EXIT_INVALID, str(path), "JSON")


def test_unknown_names_entry_exits_3_naming_it(sluice_bin, checkpoint) -> None:
    path, _ = checkpoint

    done = run(sluice_bin, "load", str(path), "--names", "norm,nope")

    assert_one_line_error(done, EXIT_INVALID, '"nope"', str(path))


@pytest.mark.parametrize(
    ("flag", "value"), [("--direct", "sideways"), ("--engine", "warp"), ("--chunk-bytes", "lots")]
)
def test_bad_option_value_exits_2_naming_the_value(
    sluice_bin, checkpoint, flag: str, value: str
) -> None:
    path, _ = checkpoint

    done = run(sluice_bin, "load", str(path), flag, value)

    assert_one_line_error(done, EXIT_USAGE, value)


def test_no_arguments_exits_2_with_usage(sluice_bin) -> None:
    done = run(sluice_bin)

    assert done.returncode == EXIT_USAGE
    assert "Usage" in done.stderr
    assert done.stdout == ""


def test_unknown_flag_exits_2(sluice_bin, checkpoint) -> None:
    path, _ = checkpoint

    done = run(sluice_bin, "load", str(path), "--warp-speed")

    assert done.returncode == EXIT_USAGE
    assert "--warp-speed" in done.stderr


def test_load_off_a_terminal_draws_no_progress_bar(sluice_bin, checkpoint) -> None:
    path, _ = checkpoint

    done = run(sluice_bin, "load", str(path))

    assert done.returncode == EXIT_OK
    assert "\r" not in done.stdout + done.stderr


def test_io_failure_exits_1_naming_the_file(sluice_bin, ramfs: Path, checkpoint) -> None:
    source, _ = checkpoint
    path = ramfs / source.name
    shutil.copyfile(source, path)

    done = run(sluice_bin, "load", str(path), "--direct", "on")

    assert_one_line_error(done, EXIT_FAILED, str(path))


def test_permission_denied_exits_4_naming_the_file(
    sluice_bin, world_readable_dir: Path, checkpoint
) -> None:
    source, _ = checkpoint
    path = world_readable_dir / "secret.safetensors"
    shutil.copyfile(source, path)
    path.chmod(0)

    # Root reads any file, so run the CLI as 'nobody'.
    drop = (lambda: os.setuid(65534)) if os.geteuid() == 0 else None
    try:
        done = subprocess.run(
            [str(sluice_bin), "load", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=drop,
        )
    except subprocess.SubprocessError as e:
        pytest.skip(f"cannot switch to an unprivileged user here: {e}")

    assert_one_line_error(done, EXIT_NOT_FOUND, str(path), "ermission")


def logged_stderr(binary: Path, path: Path, *, tty: bool, no_color: bool = False) -> str:
    """stderr of an info-level `sluice load`, written to a pipe or to a pseudo-terminal."""
    import pty

    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_") and k != "NO_COLOR"}
    env["SLUICE_LOG"] = "info"
    if no_color:
        env["NO_COLOR"] = "1"
    args = [str(binary), "load", "--no-progress", "--direct", "off", str(path)]
    if not tty:
        return subprocess.run(args, capture_output=True, text=True, timeout=60, env=env).stderr
    leader, follower = pty.openpty()
    try:
        subprocess.run(args, stdout=subprocess.DEVNULL, stderr=follower, timeout=60, env=env)
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's other side is closed
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")
    finally:
        os.close(leader)


def test_logs_are_plain_off_a_terminal_and_coloured_on_one(sluice_bin, checkpoint) -> None:
    path, _ = checkpoint
    piped = logged_stderr(sluice_bin, path, tty=False)
    assert "INFO" in piped
    assert "\x1b[" not in piped

    on_terminal = logged_stderr(sluice_bin, path, tty=True)
    assert "INFO" in on_terminal
    assert "\x1b[" in on_terminal

    assert "\x1b[" not in logged_stderr(sluice_bin, path, tty=True, no_color=True)
