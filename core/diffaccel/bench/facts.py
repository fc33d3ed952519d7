"""What a bench report says it was measured on: the versions of diffaccel, its libraries and
plugins, and the machine (CPU, cores, threads, memory, load, date, commit)."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from ..contract.errors import DiffaccelError


def versions() -> dict[str, str]:
    """Versions of diffaccel, its libraries and every installed strategy distribution."""
    out = {}
    for dist in ("diffaccel", "torch", "transformers", "diffusers", "numpy", "pluggy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    try:
        from ..runtime.registry import Registry

        for row in Registry().describe():
            out.setdefault(row["distribution"], str(row["version"]))
    except DiffaccelError as exc:  # a broken plugin: say so rather than fail the report
        out["plugins"] = f"not listed ({exc})"
    return out


def machine(note: str | None = None) -> dict[str, Any]:
    """What the figures were measured on: CPU, cores, threads, memory, load, date, commit; and
    ``note`` or else the environment's ``DIFFACCEL_MACHINE_NOTE`` (e.g. that the machine was shared)."""
    import torch

    note = note or os.environ.get("DIFFACCEL_MACHINE_NOTE")
    facts: dict[str, Any] = {"date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                             "platform": platform.platform(), "python": platform.python_version(),
                             "cpu": _cpu_model(), "cpu_count": os.cpu_count(),
                             "torch_threads": torch.get_num_threads(),
                             "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "unset")}
    try:
        facts["load_average_1_5_15min"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    mem = _meminfo_gib()
    if mem:
        facts["memory_gib"] = mem
    commit = _git_commit()
    if commit:
        facts["git_commit"] = commit
    if note:
        facts["note"] = note
    return facts


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _meminfo_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _git_commit() -> str | None:
    """The commit of the diffaccel checkout (``-dirty`` with uncommitted changes), if it is one."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode:
            return None
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None
