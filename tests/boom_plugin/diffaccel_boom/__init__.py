"""``boom``: a strategy that fails on purpose, for the core's fault tests.

``hook`` names where it fails, at step ``step`` (``setup`` fails when built). ``fail = "raise"``
raises a RuntimeError there; ``fail = "nan"`` (``layer_output`` only) returns the layer's output
multiplied by NaN instead, so the step's denoiser output is non-finite. Before failing, its
``layer_output`` serves nothing and its ``pre_step`` plans nothing: the run is the plain run.
"""

from __future__ import annotations

from typing import Any

import attrs

import diffaccel
from diffaccel.contract.validators import one_of

HOOKS = ("setup", "run_start", "pre_step", "layer_output", "denoiser_output", "post_step", "finalize", "run_end")


@attrs.frozen(kw_only=True)
class BoomConfig:
    hook: str = attrs.field(default="layer_output", validator=one_of(HOOKS))
    """The hook that fails."""
    step: int = 2
    """The step it fails at (-1: every step; ignored by setup, run_start, finalize, run_end)."""
    fail: str = attrs.field(default="raise", validator=one_of(("raise", "nan")))
    """``raise`` a RuntimeError, or (layer_output) return a NaN output."""


def _poison(x: Any) -> Any:
    if hasattr(x, "dtype") and x.dtype.is_floating_point:
        return x * float("nan")
    if isinstance(x, (tuple, list)):
        return type(x)(_poison(v) for v in x)
    return x


class Boom:
    def __init__(self, config: BoomConfig | None = None):
        self.config = config or BoomConfig()
        self.calls = 0

    def _due(self, run, hook: str) -> bool:
        c = self.config
        if c.hook != hook:
            return False
        return hook in ("run_start", "finalize", "run_end") or c.step in (-1, run.step)

    def _raise(self, run, hook: str) -> None:
        if self._due(run, hook) and self.config.fail == "raise":
            raise RuntimeError(f"boom in {hook}")

    @diffaccel.hookimpl
    def diffaccel_setup(self, info: dict[str, Any]) -> None:
        if self.config.hook == "setup":
            raise RuntimeError("boom in setup")

    @diffaccel.hookimpl
    def diffaccel_run_start(self, run) -> None:
        self._raise(run, "run_start")

    @diffaccel.hookimpl
    def diffaccel_pre_step(self, run) -> None:
        self._raise(run, "pre_step")

    @diffaccel.hookimpl
    def diffaccel_layer_output(self, run, layer, hidden) -> Any:
        self.calls += 1
        if self._due(run, "layer_output") and self.config.fail == "nan":
            return _poison(layer.compute(hidden))
        self._raise(run, "layer_output")
        return None

    @diffaccel.hookimpl
    def diffaccel_denoiser_output(self, run, output) -> None:
        self._raise(run, "denoiser_output")

    @diffaccel.hookimpl
    def diffaccel_post_step(self, run, output) -> None:
        self._raise(run, "post_step")

    @diffaccel.hookimpl
    def diffaccel_finalize(self, run, final) -> None:
        self._raise(run, "finalize")

    @diffaccel.hookimpl
    def diffaccel_run_end(self, run) -> None:
        self._raise(run, "run_end")


@diffaccel.hookimpl
def diffaccel_register(register) -> None:
    register(diffaccel.Strategy(name="boom", config=BoomConfig, factory=Boom, requires=(),
                                description="fails on purpose (tests only)"))
