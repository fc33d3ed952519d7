"""Run import-linter (``lint-imports``) over diffaccel, its adapters, the plugin packages and the models
distribution (``diffaccel_models``).

The contracts live in pyproject.toml (``[tool.importlinter]``). ``diffaccel.adapters`` is a
subpackage of ``diffaccel`` only through setuptools' package-dir mapping (core/diffaccel and
adapters/ are separate folders), and grimp, import-linter's graph builder, reads a package from
one folder. So the packages are copied into one tree as they are installed (diffaccel/,
diffaccel/adapters/, diffaccel_<plugin>/, diffaccel_models/) and the linter runs over that copy.

``python tests/layers.py`` (``make layers``) prints the linter's report and exits with its status;
tests/test_layers.py runs the same in CI.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def stage(dest: Path) -> Path:
    """The installed package layout, copied (sources only) under ``dest``."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "assets", "figures", "*.safetensors")
    shutil.copytree(ROOT / "core" / "diffaccel", dest / "diffaccel", ignore=skip)
    shutil.copytree(ROOT / "adapters", dest / "diffaccel" / "adapters", ignore=skip)
    for pkg in sorted(ROOT.glob("plugins/*/diffaccel_*")) + [ROOT / "models" / "diffaccel_models"]:
        shutil.copytree(pkg, dest / pkg.name, ignore=skip)
    return dest


def lint_imports(dest: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` (from this interpreter's environment) over the staged copy."""
    exe = Path(sys.executable).with_name("lint-imports")
    env = {"PYTHONPATH": str(dest), "PATH": "/usr/bin:/bin", "HOME": str(dest)}
    return subprocess.run([str(exe), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
                          cwd=dest, env=env, capture_output=True, text=True)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        done = lint_imports(stage(Path(tmp)))
    print(done.stdout + done.stderr, end="")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
