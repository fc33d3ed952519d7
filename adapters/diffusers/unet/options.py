"""The UNet adapter's ``[model]`` keys and its ``[[peer]]`` keys, apart from the adapter.

This module imports attrs and the core's validators only (no torch, no diffusers): the command
line reads it through the ``diffaccel.adapters.options`` entry point to check a config's options
and ``--out`` before the adapter, and with it diffusers, is imported (``diffaccel.runtime.adapters_registry``).
"""

from __future__ import annotations

import attrs

from diffaccel.contract.validators import in_range, non_negative, one_of, positive

from ..schedulers import SCHEDULERS, StepsPeer  # noqa: F401 - StepsPeer: importable from here too


@attrs.frozen(kw_only=True)
class UNetOptions:
    """Keys of ``[model]`` that only the UNet adapter reads."""

    size: int | None = attrs.field(default=None, validator=positive)
    """Image height and width in pixels (default: the model's own, e.g. 32 for digits, 64 for synthetic-sd-medium)."""
    guidance_scale: float = attrs.field(default=7.5, validator=in_range(0.0, None))
    """Classifier-free guidance scale; 1 or less turns guidance off (one branch per step)."""
    prompts: list[str] = attrs.Factory(list)
    """Prompt per batch row (repeated if shorter than the batch); empty: the empty prompt."""
    negative_prompt: str | None = None
    """Prompt of the unconditional branch (Stable Diffusion pipelines only; default: empty)."""
    scheduler: str = attrs.field(default="ddim", validator=one_of(SCHEDULERS))
    """ddim (DDIM, eta 0), dpm++2m (DPM-Solver++ 2M), unipc (UniPC) or euler (Euler), each built from the checkpoint's
    noise schedule and prediction type, or checkpoint (the scheduler it ships)."""
    eta: float = attrs.field(default=0.0, validator=in_range(0.0, 1.0))
    """DDIM eta: 0 is deterministic DDIM, 1 is DDPM-like noise."""
    grid_columns: int = attrs.field(default=8, validator=positive)
    """Images per row in the PNG grid that ``generate --out`` writes."""
    grid_scale: int = attrs.field(default=1, validator=in_range(1, 16))
    """Nearest-neighbour enlargement of each image in the written grid (1: native size)."""


@attrs.frozen(kw_only=True)
class DeepCachePeer:
    """Keys of ``[[peer]] use = "deepcache"``: DeepCache 0.1.1 (``pip install diffaccel[deepcache]``)."""

    cache_interval: int = attrs.field(default=3, validator=positive)
    """Run the full UNet every this many steps; in between, only the shallow branch runs."""
    cache_branch_id: int = attrs.field(default=0, validator=non_negative)
    """The skip branch whose deeper features are cached: 3 x down block + layer (0: the shallowest)."""
    name: str | None = None
    """Entry name in bench (default: deepcache-i<interval>, with -b<branch> when the branch is not 0)."""


class UNetSpec:
    """What the command line checks before importing the adapter (``adapters_registry.adapter_spec``)."""

    name = "unet"
    Options = UNetOptions
    output_suffix = ".png"
