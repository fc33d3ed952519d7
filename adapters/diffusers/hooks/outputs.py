"""What a diffusers hook session hands strategies: the post-step output (``UNetStepOutput``) and the
final latents (``UNetFinal``), and the scheduler facts they are read from."""

from __future__ import annotations

from typing import Any

import attrs
import torch


@attrs.define
class UNetStepOutput:
    """What ``diffaccel_post_step`` receives from a session after each scheduler step (the ``unet``,
    ``dit`` and ``unet2d`` adapters)."""

    step: int
    """Index of the step (``run.step``)."""
    timestep: Any
    """The scheduler's timestep of the step."""
    latents: torch.Tensor
    """Latents after the step (B, C, H, W): the scheduler's ``prev_sample``."""
    noise_pred: torch.Tensor
    """The model output the scheduler used (after guidance), (B, C, H, W)."""
    pred_original: torch.Tensor | None = None
    """The scheduler's estimate of the clean latents, when it gives one (DDIM, DDPM, Euler; for
    DPM-Solver++ and UniPC the data prediction of the step, which their ``step`` keeps)."""


@attrs.define
class UNetFinal:
    """What ``diffaccel_finalize`` receives after the last step: set ``latents`` to choose them."""

    draft: torch.Tensor
    """The scheduler's final latents."""
    latents: torch.Tensor | None = None
    """The latents the pipeline decodes; None until a strategy or the default sets them."""

    def apply_default(self) -> None:
        """The adapter's default, after the strategies' ``finalize``: the scheduler's latents
        unless a strategy chose others."""
        if self.latents is None:
            self.latents = self.draft


def _scalar(t: Any) -> float | None:
    if t is None:
        return None
    if isinstance(t, torch.Tensor):
        return float(t.reshape(-1)[0]) if t.numel() else None
    return float(t)


def _solver_clean_estimate(sched: Any) -> torch.Tensor | None:
    """The clean estimate a multistep solver made in its last ``step`` (its ``model_outputs[-1]``,
    the model output converted to a data prediction: DPM-Solver++'s, UniPC's with ``predict_x0``),
    which its ``step`` does not return; None for a solver that keeps noise predictions there."""
    outs, cfg = getattr(sched, "model_outputs", None), getattr(sched, "config", {})
    data = cfg.get("algorithm_type") in ("dpmsolver++", "sde-dpmsolver++") or cfg.get("predict_x0") is True
    return outs[-1] if data and outs and isinstance(outs[-1], torch.Tensor) else None
