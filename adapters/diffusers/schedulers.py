"""``[model] scheduler`` of the diffusers adapters (unet, dit, unet2d): diffusers' own scheduler
classes built from the pipeline's scheduler config, so the noise schedule and prediction type
are the checkpoint's and only the solver changes.

* ``ddim``: ``DDIMScheduler`` (deterministic with eta 0);
* ``dpm++2m``: ``DPMSolverMultistepScheduler``, DPM-Solver++ of order 2 (multistep);
* ``unipc``: ``UniPCMultistepScheduler`` (order 2, its bh2 variant);
* ``euler``: ``EulerDiscreteScheduler`` (it scales the model input: ``scale_model_input``);
* ``checkpoint``: the scheduler the pipeline ships, untouched.

Every solver calls the denoiser once per step, as DDIM does, so the strategies' step-indexed
logic holds under each; the diffusers hook session reads the step from ``scheduler.step``.
"""

from __future__ import annotations

import weakref
from typing import Any

import attrs

from diffaccel.contract.errors import ConfigError
from diffaccel.contract.validators import one_of, positive

SCHEDULERS = ("ddim", "dpm++2m", "unipc", "euler", "checkpoint")
"""``[model] scheduler`` names of the unet and dit adapters (unet2d adds ``ddpm``)."""
SOLVERS = ("ddim", "dpm++2m", "unipc", "euler")
"""The scheduler names built here (``checkpoint`` keeps the pipeline's own)."""

PREDICTIONS = {
    "ddim": ("epsilon", "sample", "v_prediction"),
    "dpm++2m": ("epsilon", "sample", "v_prediction", "flow_prediction"),
    "unipc": ("epsilon", "sample", "v_prediction", "flow_prediction"),
    "euler": ("epsilon", "sample", "v_prediction"),
}
"""The model prediction types each scheduler converts (diffusers 0.42's ``step``/``convert_model_output``)."""

ZERO_SIGNAL = 1e-6
"""``alphas_cumprod`` below this at the last training timestep: the schedule ends where the
signal is zero (a capped cosine schedule ends at 2.4e-9)."""


@attrs.frozen(kw_only=True)
class StepsPeer:
    """Keys of ``[[peer]] use = "steps"``: the same pipeline with fewer steps, under the config's
    scheduler or another one (``diffaccel.adapters.diffusers.peers``; here, with
    the scheduler names, so that the adapters' light option modules can name it): the fewer-steps and solver
    line every image strategy must sit above (``bench --solver-line`` adds a set of them)."""

    steps: int = attrs.field(validator=positive)
    """Denoising steps of this entry."""
    scheduler: str | None = attrs.field(default=None, validator=one_of(SCHEDULERS))
    """The scheduler of this entry (default: the config's)."""
    name: str | None = None
    """Entry name in bench (default: steps-<steps>, or <scheduler>-<steps> with a scheduler)."""


def scheduler_class(name: str) -> Any:
    from diffusers import DDIMScheduler, DPMSolverMultistepScheduler, EulerDiscreteScheduler, UniPCMultistepScheduler

    return {"ddim": DDIMScheduler, "dpm++2m": DPMSolverMultistepScheduler, "unipc": UniPCMultistepScheduler,
            "euler": EulerDiscreteScheduler}[name]


def _extra(name: str) -> dict[str, Any]:
    if name == "dpm++2m":
        return {"algorithm_type": "dpmsolver++", "solver_order": 2}
    if name == "unipc":
        return {"solver_order": 2}
    return {}


def build_scheduler(name: str, current: Any, checkpoint: str, source: str = "") -> Any:
    """The scheduler ``name`` for a pipeline whose scheduler is ``current`` (``checkpoint``: the
    pipeline's name, said in errors). ``checkpoint`` and a scheduler already of the class asked
    for return ``current`` itself (so a DDIM checkpoint under ``ddim`` runs exactly as shipped).
    A checkpoint whose prediction type the scheduler cannot convert, or whose scheduler has no
    noise schedule to build one from (flow matching), is one ``ConfigError`` line naming both."""
    if name == "checkpoint":
        return current
    cls = scheduler_class(name)
    if type(current) is cls and name in ("ddim", "euler"):
        return current
    cfg = dict(current.config)
    where = f"{source + ': ' if source else ''}[model] key 'scheduler': '{name}' cannot run checkpoint '{checkpoint}'"
    if "beta_schedule" not in cfg and "trained_betas" not in cfg:
        raise ConfigError(f"{where}: its scheduler {type(current).__name__} has no beta schedule to build one from; "
                          f"use scheduler = \"checkpoint\"")
    prediction = cfg.get("prediction_type", "epsilon")
    if prediction not in PREDICTIONS[name]:
        ok = [n for n in SOLVERS if prediction in PREDICTIONS[n]]
        raise ConfigError(f"{where}: the model predicts '{prediction}', which {name} does not take "
                          f"({', '.join(PREDICTIONS[name])}); allowed here: {', '.join([*ok, 'checkpoint'])}")
    sched = cls.from_config(cfg, **_extra(name))
    if name in ("dpm++2m", "unipc", "euler") and _starts_without_signal(sched, cfg):
        # With "trailing" spacing the first timestep is the last training one; on a schedule that
        # ends with zero signal (the shipped digits models' capped cosine: alphas_cumprod 2.4e-9
        # there) the multistep solvers' data prediction x0 = (x - sigma * eps) / alpha divides by
        # ~0 and, unlike DDIM, nothing clips it: every step count gave noise (7.5 dB against
        # DDIM-50). "leading" spacing starts one stride below, where the signal is not zero.
        sched = cls.from_config(cfg, **_extra(name), timestep_spacing="leading")
    return sched


def _starts_without_signal(sched: Any, cfg: dict[str, Any]) -> bool:
    alphas = getattr(sched, "alphas_cumprod", None)
    return (cfg.get("timestep_spacing") in ("trailing", "linspace") and alphas is not None
            and float(alphas[-1]) < ZERO_SIGNAL)


_SHIPPED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""pipeline -> the scheduler it was loaded with, for schedulers built later (the bench's steps peers)."""


def set_scheduler(pipe: Any, name: str, checkpoint: str, source: str = "") -> None:
    """Put the scheduler ``name`` into ``pipe`` (``build_scheduler``; ``source``: the config file, said in errors)."""
    _SHIPPED.setdefault(pipe, pipe.scheduler)
    sched = build_scheduler(name, pipe.scheduler, checkpoint, source)
    if sched is not pipe.scheduler:
        pipe.scheduler = sched


def shipped_scheduler(pipe: Any) -> Any:
    """The scheduler ``pipe`` was loaded with (its own, when ``set_scheduler`` never ran on it)."""
    return _SHIPPED.get(pipe, pipe.scheduler)
