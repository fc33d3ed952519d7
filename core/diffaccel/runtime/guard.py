"""Reliability of a run: strategy faults, non-finite outputs and the opt-in quality guard.

* Plugin faults, blamed at the call site. The accelerator calls each strategy's implementation
  inside its own ``try`` (free unless something is raised), so it knows whose call raised; such
  an exception becomes a ``StrategyError`` (or, with the strategy's ``on_error = "disable"``,
  drops that strategy for the rest of the run). What a layer's own ``compute`` raises is marked
  as the model's where it is raised (``diffaccel.contract.state.Layer``), also when a strategy's hook
  called it, and the step sequence reports it as a ``ModelError`` naming the checkpoint and the
  step; an exception raised outside every strategy (the adapter) propagates as it is.
* Non-finite outputs. Each step's raw denoiser output is checked with one sum (``all_finite``;
  ``[guard] finite``, on by default).
* Quality guard (``[guard] every = N``): every N steps the adapter computes the full step
  beside the strategies' step, compares the two raw outputs and resets (or disables) the
  strategies past ``threshold``.

What happened goes into the run report under ``reliability`` (only when something did).
"""

from __future__ import annotations

from typing import Any

import attrs

from ..contract.errors import ConfigValueError, DiffaccelError, StrategyError
# Reliability (what the core did, kept on RunState) lives beside the run state in the contract layer
from ..contract.reliability import Reliability  # noqa: F401 - also importable here, as before
from ..contract.validators import non_negative, one_of, positive
from .registry import Registry

ON_ERROR = ("raise", "disable")
"""Values of a ``[[strategy]]`` table's ``on_error`` key."""


@attrs.frozen(kw_only=True)
class GuardConfig:
    """The ``[guard]`` table: what the core checks during a run, beside what strategies do."""

    every: int = attrs.field(default=0, validator=non_negative)
    """Quality guard: every this many steps (counted from step 0), compute the full step beside
    the strategies' step and compare their raw denoiser outputs. 0 (the default): off."""
    threshold: float = attrs.field(default=0.05, validator=positive)
    """Relative error ||accelerated - full|| / ||full|| of the denoiser output past which
    ``action`` is taken."""
    action: str = attrs.field(default="reset", validator=one_of(("reset", "disable")))
    """Past the threshold: ``reset`` drops every strategy's per-run state (caches start afresh),
    ``disable`` runs the rest of the generation without strategies."""
    finite: bool = True
    """Check each step's denoiser output for NaN and inf. With strategies active a non-finite
    step is recomputed in full without them; with none (or if it stays non-finite) the run ends
    with one line."""


def on_error_value(value: Any) -> str:
    """Validate a ``[[strategy]]`` table's ``on_error`` (raises ConfigValueError)."""
    if value not in ON_ERROR:
        raise ConfigValueError("on_error", f"must be one of {', '.join(map(repr, ON_ERROR))}, got {value!r}")
    return value


# ---- faults --------------------------------------------------------------------------------------

def origin(name: str, registry: Any = None) -> tuple[str, str]:
    """(distribution, version) of the plugin that registered strategy ``name``; ('-', '-') when
    unknown. Called on the failure path only: loading the registry there costs nothing per step."""
    try:
        if registry is None:
            registry = Registry()
        spec = registry.get(name)
        return registry.distribution(spec.plugin) if spec is not None else ("-", "-")
    except DiffaccelError:  # a plugin that no longer loads: the name alone must do
        return ("-", "-")


def strategy_error(exc: BaseException, strategy: str, hook: str, step: int | None, registry: Any = None) -> StrategyError:
    dist, version = origin(strategy, registry)
    err = StrategyError(strategy, dist, version, hook, step, exc)
    err.__cause__ = exc
    return err


def call_guarded(strategy: Any, hook: str, fn: Any, registry: Any = None) -> Any:
    """Call ``fn()`` (a per-strategy hook such as ``setup``); any exception but a DiffaccelError
    or a ConfigValueError becomes a StrategyError naming ``strategy`` and ``hook``."""
    try:
        return fn()
    except (DiffaccelError, ConfigValueError):
        raise
    except Exception as exc:
        raise strategy_error(exc, strategy.name, hook.removeprefix("diffaccel_"), None, registry) from exc


# ---- the numbers ---------------------------------------------------------------------------------

def all_finite(output: Any) -> bool:
    """Whether a raw denoiser output (a tensor) holds no NaN or inf.

    NaN and inf propagate through a sum, so a finite sum proves every element finite: one
    reduction, no temporary (``torch.isfinite(x).all()`` writes a bool tensor first and is 10 to
    40 times slower on CPU). A non-finite sum may also be an overflow of finite values: only
    then is the element-wise check run, to be sure."""
    import torch  # deferred: ``import diffaccel`` loads no torch (the CLI's checks run without it)

    if bool(torch.isfinite(output.sum())):
        return True
    return bool(torch.isfinite(output).all())


def relative_error(accelerated: Any, full: Any) -> float:
    """||accelerated - full|| / ||full|| over the whole tensor (float32)."""
    a, f = accelerated.float(), full.float()
    denom = float(f.norm())
    return float((a - f).norm()) / denom if denom > 0 else float((a - f).norm() > 0)


def describe(reliability: dict[str, Any]) -> str:
    """One line of a report's ``reliability`` entry, for ``generate``'s summary."""
    parts = [f"strategy '{d['strategy']}' disabled at step {d['step']} ({d['hook']}: {d['error']})"
             for d in reliability.get("disabled", [])]
    if reliability.get("nonfinite_recomputed"):
        parts.append(f"{reliability['nonfinite_recomputed']} non-finite steps recomputed without strategies")
    if reliability.get("guard_checks"):
        parts.append(f"guard: {reliability['guard_checks']} full steps compared, {reliability['guard_trips']} past the "
                     f"threshold, max relative error {reliability['guard_max_error']:.3g}")
    return "; ".join(parts)
