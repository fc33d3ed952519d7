"""The two distributions' wheel sizes and the runtime's import times (issue 58), as docs/install.md
records them:

    python scripts/distributions.py                        # this tree, timed with this interpreter
    python scripts/distributions.py --tree DIR --python PY # another checkout (e.g. main's), its venv's python

Builds ``pip wheel TREE --no-deps --no-build-isolation`` and the same of ``TREE/models`` when it
exists (diffaccel-models), into a temporary folder, and prints their sizes in MB (10^6 bytes);
then the time of ``PY -c "import diffaccel"`` and of ``diffaccel generate --help`` (the console
script beside ``PY``), the median of ``--runs`` fresh processes (interpreter start included): CPU
time (user + system, of the child process: what a busy machine's other jobs change least) and wall
time. Both with their bytecode cached alike: under a fresh ``PYTHONPYCACHEPREFIX`` (a temporary
folder; no checkout is written to), filled by one untimed run first. Prints Markdown table rows:
| what | figure |.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def wheel_mb(tree: Path, python: str) -> tuple[str, float]:
    """(the wheel's file name, its size in MB) of the distribution in ``tree``."""
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([python, "-m", "pip", "wheel", str(tree), "--no-deps", "--no-build-isolation", "-q", "-w", out],
                       check=True, capture_output=True)
        (wheel,) = Path(out).glob("*.whl")
        return wheel.name, wheel.stat().st_size / 1e6


def _children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def median_seconds(cmd: list[str], runs: int) -> str:
    """``cmd``'s median CPU and wall seconds over ``runs`` fresh processes, as the table shows them,
    after one untimed run that writes the bytecode to a fresh cache folder."""
    cpu, wall = [], []
    with tempfile.TemporaryDirectory() as cache:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = cache
        subprocess.run(cmd, check=True, capture_output=True, env=env)
        for _ in range(runs):
            start, start_cpu = time.perf_counter(), _children_cpu()
            subprocess.run(cmd, check=True, capture_output=True, env=env)
            wall.append(time.perf_counter() - start)
            cpu.append(_children_cpu() - start_cpu)
    return f"{statistics.median(cpu):.2f} s CPU, {statistics.median(wall):.2f} s wall"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose wheels are built (default this one)")
    p.add_argument("--python", default=sys.executable, help="the interpreter whose installed diffaccel is timed")
    p.add_argument("--runs", type=int, default=5, help="processes per timing; the median is printed (default 5)")
    args = p.parse_args(argv)
    rows = []
    for tree in (args.tree, args.tree / "models"):
        if (tree / "pyproject.toml").is_file():
            name, mb = wheel_mb(tree, args.python)
            rows.append((f"wheel {name.split('-')[0].replace('_', '-')}", f"{mb:.2f} MB ({name})"))
    cli = str(Path(args.python).with_name("diffaccel"))
    rows.append(("import diffaccel", median_seconds([args.python, "-c", "import diffaccel"], args.runs)))
    rows.append(("diffaccel generate --help", median_seconds([cli, "generate", "--help"], args.runs)))
    for what, figure in rows:
        print(f"| {what} | {figure} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
