"""diffaccel's hooks inside a diffusers pipeline whose ``.unet`` is a ``UNet2DConditionModel``.

Nothing of the pipeline's code changes. ``attach`` replaces, as instance attributes (the
originals are kept and put back by ``detach``):

* ``forward`` of each UNet block, in forward order ``down_blocks.0 .. down_blocks.n-1``,
  ``mid_block``, ``up_blocks.0 .. up_blocks.m-1`` (read from ``unet.down_blocks``,
  ``unet.mid_block``, ``unet.up_blocks``): a block call becomes
  ``accelerator.layer_output(run, block, hidden)``, where ``hidden`` is a dict of the block's
  arguments by name and ``UNetBlock.compute(hidden)`` calls the original ``forward``. A strategy
  that answers with a cached output skips the block: its code never runs.
* ``forward`` of the modules inside a block (``down_blocks.1.resnets.0``,
  ``mid_block.attentions.0``, ... listed by ``module_specs`` from the blocks' ``resnets``,
  ``attentions``, ``downsamplers`` and ``upsamplers``), only those a strategy asks for through
  the ``diffaccel_hooked_modules(available) -> names`` hook: the same ``layer_output`` call, at
  the finer granularity. Unrequested modules are left alone, so the default costs nothing.
* ``unet.forward``: one UNet call is one denoiser evaluation. The first call after
  ``scheduler.step`` (or with a new timestep) starts a step: ``run.step``, ``run.timestep`` are
  set and ``pre_step`` runs. ``StepPlan.reuse_step`` returns the branch's last UNet output
  without running the UNet; ``StepPlan.skip`` serves the named blocks from their last output
  for the branch. ``denoiser_output`` sees the raw noise prediction of each UNet call.
* ``scheduler.set_timesteps``: a pipeline call begins; one ``RunState`` per pipeline call,
  created at its first UNet call (then the batch is known).
* ``scheduler.step``: the step ends; ``post_step`` gets a ``UNetStepOutput`` (the new latents
  and the guided noise prediction). At the last timestep ``finalize`` gets a ``UNetFinal``
  whose ``latents`` become the scheduler's result, then ``run_end``.

Classifier-free guidance: diffusers' pipelines batch both branches into one UNet call of 2B
rows; that call is branch ``main``. A pipeline that calls the UNet twice per step (unbatched
guidance) gets ``run.branch = "uncond"`` for the first call and ``"cond"`` for the second, so
each branch keeps its own strategy state (``run.state``) and block caches. Unbatched guidance
is recognised at the second call of the first step (the state that call 0 made under ``main``
is renamed ``uncond``) and remembered for the pipeline's next runs. In unbatched mode
``post_step`` runs once per branch (same output); ``finalize`` runs once, on ``main``.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Any

import torch

from diffaccel.contract.capabilities import BLOCK_STACK, BLOCK_TAIL, GUIDANCE_BRANCHES, INNER_MODULES, SPATIAL_FEATURES

from .. import hooks as _shared
from ..hooks import _HINTS, _SESSIONS, DenoiserBlock, DenoiserSession, UNetFinal, UNetStepOutput, _Patch, _scalar, detach, session_of
from . import tail

CAPABILITIES = frozenset({BLOCK_STACK, BLOCK_TAIL, SPATIAL_FEATURES, INNER_MODULES, GUIDANCE_BRANCHES})
"""What the UNet adapter offers strategies (``diffaccel.contract.capabilities``)."""


def depth_of(name: str, n_down: int) -> int:
    """Block depth: down_blocks.d and up_blocks.(n_down-1-d) share depth d; mid_block is n_down;
    an inner module has its block's depth."""
    m = re.match(r"(down|up)_blocks\.(\d+)", name)
    if m is None:
        return n_down
    i = int(m.group(2))
    return i if m.group(1) == "down" else n_down - 1 - i


def block_specs(unet) -> list[tuple[str, str, torch.nn.Module]]:
    """(name, kind, module) of each block of a ``UNet2DConditionModel``, in forward order."""
    specs = [(f"down_blocks.{i}", "down", b) for i, b in enumerate(unet.down_blocks)]
    if getattr(unet, "mid_block", None) is not None:
        specs.append(("mid_block", "mid", unet.mid_block))
    specs += [(f"up_blocks.{i}", "up", b) for i, b in enumerate(unet.up_blocks)]
    return specs


_SUBMODULE_LISTS = (("resnets", "resnet"), ("attentions", "attention"), ("downsamplers", "downsampler"),
                    ("upsamplers", "upsampler"))
"""The module lists diffusers' UNet blocks are built from (``CrossAttnDownBlock2D.resnets`` ...),
read in this order, which is each block's forward order for down and up blocks."""


def module_specs(unet) -> list[tuple[str, str, torch.nn.Module]]:
    """(name, kind, module) of the modules inside each block: ``down_blocks.1.resnets.0``,
    ``mid_block.attentions.0``, ``up_blocks.0.upsamplers.0`` ... (the finer granularity a
    strategy may ask for), in block order."""
    specs = []
    for block_name, _, block in block_specs(unet):
        for attr, kind in _SUBMODULE_LISTS:
            mods = getattr(block, attr, None)
            if isinstance(mods, torch.nn.ModuleList):
                specs += [(f"{block_name}.{attr}.{i}", kind, m) for i, m in enumerate(mods)]
    return specs


def requested_modules(accelerator: Any, available: list[str]) -> list[str]:
    """Names of inner modules the strategies ask to be hooked (``diffaccel_hooked_modules``)."""
    ask = getattr(accelerator, "hooked_modules", None)  # the untouched path has no accelerator
    return ask(available) if ask is not None else []




class UNetBlock(DenoiserBlock):
    """The UNet adapter's layer: one UNet block (``down_blocks.i``, ``mid_block``, ``up_blocks.i``;
    kind ``down``/``mid``/``up``), or one module inside a block (``down_blocks.1.attentions.0``,
    kind ``resnet``/``attention``/``downsampler``/``upsampler``) when a strategy asked for that
    granularity.

    ``compute(hidden)`` runs the block's original ``forward`` on ``hidden`` (the dict of its
    arguments by name; positional arguments beyond the named ones, if any, under ``"*args"``).
    ``cached_output`` is its last output in the current branch (while strategies are active);
    ``depth`` its place in the stack (``block-stack``); ``module`` the diffusers module. Up blocks
    run their last layers alone (``block-tail``): ``tail_start``, ``capture_tail``,
    ``can_run_tail``, ``run_tail``.
    """

    family = "UNet"

    # -- block-tail: the last layers of an up block alone (``tail``) ------------------------------
    def tail_start(self, tail_layers: int) -> int:
        """Index of the first of the block's last ``tail_layers`` layers; ValueError naming the
        block when it has fewer."""
        return tail.tail_start(self.module, tail_layers, self.name)

    def can_run_tail(self, hidden: dict[str, Any]) -> bool:
        """Whether ``run_tail`` can stand in for the block's forward on these arguments."""
        return tail.can_run_tail(self.module, hidden)

    @contextmanager
    def capture_tail(self, hidden: dict[str, Any], start: int):
        """While the ``with`` body computes the whole block, the features entering layer ``start``
        are stored in the yielded dict under ``"h"``."""
        with tail.capture_tail_input(self.module, start, tail.skip_channels(self.module, hidden, start), {}) as got:
            yield got

    def run_tail(self, hidden: dict[str, Any], h: torch.Tensor, start: int) -> torch.Tensor:
        """Layers ``start..`` and the upsamplers, from features ``h`` entering layer ``start``."""
        return tail.run_tail(self.module, hidden, h, start)


class Session(DenoiserSession):
    """The accelerator attached to one UNet pipeline, and the state of its current run."""

    adapter = "unet"
    capabilities = CAPABILITIES
    denoiser_attr = "unet"

    def build_layers(self, accelerator: Any) -> None:
        specs = block_specs(self.denoiser)
        n_down = sum(1 for _, kind, _ in specs if kind == "down")
        self.layers = [UNetBlock(name, i, kind, mod, self, depth_of(name, n_down)) for i, (name, kind, mod) in enumerate(specs)]
        inner = module_specs(self.denoiser)
        wanted = set(requested_modules(accelerator, [name for name, _, _ in inner]))
        self.modules = [UNetBlock(name, len(self.layers) + i, kind, mod, self, depth_of(name, n_down))
                        for i, (name, kind, mod) in enumerate(spec for spec in inner if spec[0] in wanted)]


def attach(pipe: Any, accelerator: Any) -> Session:
    return _shared.attach(pipe, accelerator, Session)
