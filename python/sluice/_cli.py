"""The ``sluice`` console script: the Rust command line, run in this interpreter.

``pip install`` puts a ``sluice`` script on PATH whose entry point is :func:`main`.
It passes the arguments to ``sluice._sluice.cli_main``, which runs the same entry
as the native binary (``sluice_cli::main_with_args`` in crates/sluice-cli), so
both print the same output and exit with the same status. ``cli_main`` also
gives the command the signal dispositions of the binary and releases the GIL
while it runs.
"""

from __future__ import annotations

import os
import sys

from ._sluice import cli_main

# The program name clap prints in usage lines, as the binary's is.
_PROGRAM = "sluice"


def main() -> None:
    """Runs ``sluice`` with ``sys.argv[1:]`` and exits with its status."""
    # `sluice warm` starts Python policies with an interpreter it searches for
    # (`python3` on PATH, or a checkout's .venv): under this script, use this
    # interpreter, which has this sluice package.
    if sys.executable and "SLUICE_PYTHON" not in os.environ:
        os.environ["SLUICE_PYTHON"] = sys.executable
    sys.exit(cli_main([_PROGRAM, *sys.argv[1:]]))


if __name__ == "__main__":
    main()
