"""Helpers for testing strategies and adapters, in this repository and in a plugin's own:
``run_with``, the adapter conformance suite ``check_adapter`` (``diffaccel.conformance``) and the
``install_distribution`` fixture (``pytest_plugins = ["diffaccel.testing"]``).

Tiny random models belong to their adapters (the core names none):
``diffaccel.adapters.text.testing`` (``tiny_text_pipeline``, ``CharTokenizer``, the
``tiny_text_pipe`` fixture) and ``diffaccel.adapters.diffusers.unet.testing`` (``tiny_digits_pipeline``).
They lived here until 0.1: the old names still work until 0.3.0, with a ``DeprecationWarning``
naming the new place (``MOVED``; CHANGELOG.md's rule for the plugin API).
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from diffaccel import apply
from diffaccel.conformance import CHECKS, check_adapter, same_output  # noqa: F401 - public here (diffaccel.testing)


def run_with(pipe, strategies: Sequence[Any] = (), **call_kwargs):
    """Run ``pipe`` once with ``strategies`` applied (and removed afterwards)."""
    call_kwargs.setdefault("progress", False)
    call_kwargs.setdefault("length", 24)
    with apply(pipe, strategies=list(strategies)):
        return pipe(**call_kwargs)


class StepClock:
    """A fake clock for a cost gate (``diffaccel.kit.paygate``): a plain step lasts ``plain`` seconds,
    a step of the strategy ``strategy``; set it as the gate's ``clock`` to force either verdict."""

    def __init__(self, gate, plain: float, strategy: float):
        self.gate, self.plain, self.strategy, self.t = gate, plain, strategy, 0.0

    def __call__(self) -> float:
        run = self.gate.current
        if run is not None and run.last_kind is not None:
            self.t += self.plain if run.last_kind == "plain" else self.strategy
        return self.t


@pytest.fixture(scope="session")
def install_distribution(tmp_path_factory):
    """``install(folder)``: ``pip install --target`` of a distribution folder (a test plugin or
    adapter) into a fresh folder, built from a copy so that building never writes into the
    source; returns the folder to put on ``sys.path`` or ``PYTHONPATH``."""
    def install(folder: Path) -> Path:
        target = tmp_path_factory.mktemp(f"{folder.name}-site")
        src = tmp_path_factory.mktemp(f"{folder.name}-src")
        shutil.copytree(folder, src, dirs_exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--target", str(target), str(src)], check=True, capture_output=True)
        return target

    return install


MOVED = {"tiny_text_pipeline": "diffaccel.adapters.text.testing", "CharTokenizer": "diffaccel.adapters.text.testing",
         "tiny_digits_pipeline": "diffaccel.adapters.diffusers.unet.testing"}
"""Names that moved to their adapter's ``testing`` module, by the module they are in now."""


def _moved(name: str, stacklevel: int) -> Any:
    where = MOVED[name]
    warnings.warn(f"diffaccel.testing.{name} moved to {where}.{name}; import it from there "
                  "(the old name is removed in 0.3.0)", DeprecationWarning, stacklevel=stacklevel + 1)
    # imported by its name when asked for: the core imports no adapter (the layer contract)
    return getattr(importlib.import_module(where), name)


def __getattr__(name: str) -> Any:
    """``from diffaccel.testing import tiny_text_pipeline`` (the 0.1 place), with a warning."""
    if name in MOVED:
        return _moved(name, stacklevel=2)
    raise AttributeError(f"module 'diffaccel.testing' has no attribute '{name}'")


@pytest.fixture
def tiny_text_pipe():
    """Deprecated here (``pytest_plugins = ["diffaccel.adapters.text.testing"]`` has it): the tiny
    random masked text pipeline. Where both modules are plugins, the later one's fixture is used."""
    return _moved("tiny_text_pipeline", stacklevel=2)("masked")
