"""The ``sluice`` console script that ``pip install`` puts on PATH.

It runs the Rust command line inside the extension (``sluice._sluice.cli_main``), so it
must be indistinguishable from the native binary: same output, same exit status, same
logging, and the same ending on a closed pipe or Ctrl-C. Outputs are compared with the
native binary at ``$SLUICE_BIN`` (else target/release/sluice) where one is built.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path
from typing import Optional

import numpy as np
import pytest
import sluice
from safetensors.numpy import save_file

REPO = Path(__file__).resolve().parents[2]
SUBCOMMANDS = ("load", "inspect", "sim", "warm")
EXIT_OK, EXIT_USAGE, EXIT_NOT_FOUND = 0, 2, 4
# A guard against a hung child, not a timing assertion.
HANG_GUARD_S = 60


@pytest.fixture(scope="module")
def script() -> Path:
    """The console script installed next to this interpreter (by ``make develop``/``pip``)."""
    path = Path(sysconfig.get_path("scripts")) / "sluice"
    assert path.is_file(), f"no console script at {path}: run `make develop` or `pip install .`"
    return path


@pytest.fixture(scope="module")
def native() -> Optional[Path]:
    """The native binary to compare with, or None when it is not built."""
    path = Path(os.environ.get("SLUICE_BIN") or REPO / "target" / "release" / "sluice")
    return path if path.is_file() else None


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(extra)
    return env


def run(program: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(program), *args],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        env=clean_env(**env),
    )


def assert_same_as_native(
    native: Optional[Path], done: subprocess.CompletedProcess[str], *args: str
) -> None:
    if native is None:
        return
    expected = run(native, *args)
    assert (done.returncode, done.stdout, done.stderr) == (
        expected.returncode,
        expected.stdout,
        expected.stderr,
    )


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "model.safetensors"
    tensors = {
        "embed": np.arange(4096, dtype=np.float32).reshape(64, 64),
        "norm": np.ones(64, dtype=np.float16),
        "head": np.zeros((3, 5), dtype=np.int8),
    }
    save_file(tensors, str(path), metadata={"format": "np"})
    return path


def test_help_exits_0_and_lists_the_subcommands(script, native) -> None:
    done = run(script, "--help")

    assert done.returncode == EXIT_OK, done.stderr
    assert done.stdout.startswith("Move AI checkpoints")
    listed = re.findall(r"^  (\w[\w-]*) ", done.stdout, flags=re.MULTILINE)
    assert set(SUBCOMMANDS) <= set(listed), done.stdout
    assert "Usage: sluice [OPTIONS] <COMMAND>" in done.stdout
    assert done.stderr == ""
    assert_same_as_native(native, done, "--help")


def test_version_is_the_package_version(script, native) -> None:
    done = run(script, "--version")

    assert (done.returncode, done.stdout) == (EXIT_OK, f"sluice {sluice.__version__}\n")
    assert_same_as_native(native, done, "--version")


@pytest.mark.parametrize("extra", [(), ("--json",), ("--summary",)])
def test_inspect_prints_what_the_binary_prints(script, native, checkpoint, extra) -> None:
    done = run(script, "inspect", str(checkpoint), *extra)

    assert done.returncode == EXIT_OK, done.stderr
    assert str(checkpoint) in done.stdout
    assert_same_as_native(native, done, "inspect", str(checkpoint), *extra)


def test_load_reports_the_same_load_as_the_binary(script, native, checkpoint) -> None:
    args = ("load", str(checkpoint), "--json", "--direct", "off", "--engine", "threads")

    done = run(script, *args)

    assert done.returncode == EXIT_OK, done.stderr
    report = json.loads(done.stdout)
    assert (report["tensors"], report["bytes"]) == (3, 64 * 64 * 4 + 64 * 2 + 15)
    if native is not None:
        expected = json.loads(run(native, *args).stdout)
        timing = ("seconds", "gb_per_s", "peak_pool_bytes")
        strip = lambda r: {k: v for k, v in r.items() if k not in timing}  # noqa: E731
        assert strip(report) == strip(expected)


def test_missing_file_exits_4_with_one_line_naming_it(script, native, tmp_path) -> None:
    missing = tmp_path / "absent.safetensors"

    done = run(script, "inspect", str(missing))

    assert done.returncode == EXIT_NOT_FOUND
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("sluice: error:") and str(missing) in line
    assert_same_as_native(native, done, "inspect", str(missing))


@pytest.mark.parametrize(
    "args", [("inspect", "--bogus", "x"), ("load", "x", "--engine", "warp"), ()]
)
def test_usage_errors_exit_2_as_in_the_binary(script, native, args) -> None:
    done = run(script, *args)

    assert done.returncode == EXIT_USAGE
    assert done.stdout == "" and done.stderr != ""
    assert "Traceback" not in done.stderr
    assert_same_as_native(native, done, *args)


@pytest.mark.parametrize(("flags", "env"), [(("-v",), {}), ((), {"SLUICE_LOG": "info"})])
def test_verbose_flags_and_sluice_log_turn_on_logging(script, checkpoint, flags, env) -> None:
    # The extension installed its log subscriber at import, at warn: -v must still apply.
    quiet = run(script, "load", str(checkpoint), "--no-progress")
    loud = run(script, *flags, "load", str(checkpoint), "--no-progress", **env)

    assert quiet.returncode == loud.returncode == EXIT_OK
    assert quiet.stderr == ""
    assert "INFO" in loud.stderr and "load started" in loud.stderr


def test_output_into_a_closed_pipe_ends_quietly_like_the_binary(script, tmp_path) -> None:
    # Far more output than a pipe holds, so the writer must meet the closed pipe.
    path = tmp_path / "many.safetensors"
    save_file({f"layer.{i}.weight": np.ones(2, dtype=np.float32) for i in range(5000)}, str(path))
    cli = subprocess.Popen(
        [str(script), "inspect", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(),
    )
    head = subprocess.run(["head", "-n1"], stdin=cli.stdout, capture_output=True, timeout=60)
    assert cli.stdout is not None and cli.stderr is not None
    cli.stdout.close()
    stderr = cli.stderr.read().decode()
    cli.wait(timeout=HANG_GUARD_S)
    cli.stderr.close()

    assert head.stdout.decode().startswith(str(path))
    assert stderr == ""  # no traceback, no Rust panic about a broken pipe
    assert cli.returncode == -signal.SIGPIPE


def test_ctrl_c_stops_a_busy_command_like_the_binary(script, tmp_path) -> None:
    # A long workload generation runs in Rust with the GIL released; Ctrl-C must end it as
    # it ends the binary. (A FIFO used to serve here, blocking `inspect`; FIFOs are now
    # refused at once.)
    out = tmp_path / "kv.jsonl"
    cmd = [str(script), "sim", "gen-kv", "--out", str(out), "--requests", "5000000"]
    cli = subprocess.Popen(
        cmd, env=clean_env(), stdout=subprocess.DEVNULL, preexec_fn=default_sigint
    )
    try:
        wait_for_cpu_seconds(cli, 0.3)
        cli.send_signal(signal.SIGINT)
        cli.wait(timeout=HANG_GUARD_S)
    finally:
        cli.kill()
        cli.wait()

    # Killed by the signal, as the binary is; Python's handler did not swallow it, and the
    # interrupted run left no output behind (written atomically).
    assert cli.returncode == -signal.SIGINT
    assert not out.exists()


def default_sigint() -> None:
    """Starts a child with SIGINT at its default, as a terminal's foreground job has it: a
    suite launched in the background (``make test &``, nohup) inherits it ignored, and an
    ignored SIGINT stays ignored across exec, in the binary and in Python alike."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for_cpu_seconds(process: subprocess.Popen[bytes], seconds: float) -> None:
    """Waits until `process` has used `seconds` of CPU: past the interpreter's start-up, in
    the native work."""
    tick = os.sysconf("SC_CLK_TCK")
    while process.poll() is None:
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{process.pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if (int(fields[11]) + int(fields[12])) / tick >= seconds:
                return
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=0.05)
    raise AssertionError(f"the command ended before it was interrupted: {process.returncode}")


def test_cli_main_gives_pythons_signal_handling_back(tmp_path) -> None:
    # In process: after cli_main, Ctrl-C is a KeyboardInterrupt and a closed pipe an
    # exception again, not the binary's defaults.
    program = textwrap.dedent(
        """
        import os, signal, sys
        from sluice._sluice import cli_main
        assert cli_main(["sluice", "--version"]) == 0
        r, w = os.pipe()
        os.close(r)
        try:
            os.write(w, b"x")
        except BrokenPipeError:
            print("pipe: exception")
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the handler runs at the next check
                pass
        except KeyboardInterrupt:
            print("sigint: KeyboardInterrupt")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        preexec_fn=default_sigint,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"sluice {sluice.__version__}",
        "pipe: exception",
        "sigint: KeyboardInterrupt",
    ]


def test_warm_python_policies_run_under_the_scripts_interpreter(script, tmp_path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    save_file({"w": np.ones(16, dtype=np.float32)}, str(model / "m.safetensors"))
    (tmp_path / "where.py").write_text(
        textwrap.dedent(
            """
            import sys
            from sluice.warm import Policy

            class Where(Policy):
                def init(self, ctx):
                    print("policy python:", sys.executable, file=sys.stderr)
                    return []
            """
        )
    )
    args = ("warm", "run", "--policy", "where:Where", "--model", str(model), "--events")

    done = run(script, *args, "explicit", "--no-progress", "--", "true", PYTHONPATH=str(tmp_path))

    # Explicit events need no fanotify, so this runs without root. Unfixed, the runtime would
    # look for `python3` on PATH, or a .venv beside the interpreter's real path.
    assert done.returncode == EXIT_OK, done.stderr
    assert f"policy python: {sys.executable}\n" in done.stderr
