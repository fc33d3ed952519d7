"""diffaccel's hooks inside a diffusers pipeline whose denoiser is a diffusion transformer.

The same wrappers as the UNet adapter's (``diffaccel.adapters.diffusers.unet.hooks``: denoiser call =
one step, ``scheduler.set_timesteps`` / ``scheduler.step``, guidance branches ``main`` or
``uncond``/``cond``), on ``pipe.transformer`` and on each of its blocks, read in forward order
from ``transformer_blocks`` (then ``single_transformer_blocks``, Flux's second stack).

A transformer is a flat stack of residual blocks, so what a skipped block returns differs from
the UNet's: a block's cache is its **residual** (output minus input, per stream: the hidden
states and, for dual-stream blocks, the text states), and ``layer.cached_output`` is that
residual added to the block's *current* input. A run of skipped middle blocks thus adds their
cached residuals to the fresh output of the computed blocks before them, as FirstBlockCache and
DBCache do, and none of the skipped blocks' code runs. Where each stream sits in a block's
arguments and outputs comes from diffusers' own ``TransformerBlockRegistry`` (the table its cache
hooks use); unregistered block classes are treated as ``hidden_states`` in, one tensor out.

``block-stack`` view: block k of N has depth ``min(k, N-1-k)`` and kind ``down`` in the first
half, ``up`` in the second (``mid`` for the middle block of an odd N), so a strategy that skips
"every block of depth >= d" skips the contiguous middle ``d .. N-1-d`` and computes the first and
last d blocks.
"""

from __future__ import annotations

from typing import Any

import torch

from diffaccel.contract.capabilities import BLOCK_STACK, GUIDANCE_BRANCHES, IMAGE_STEPS
from diffaccel.contract.state import RunState

from .. import hooks as _shared
from ..hooks import DenoiserBlock, DenoiserSession, detach, session_of  # noqa: F401

CAPABILITIES = frozenset({BLOCK_STACK, GUIDANCE_BRANCHES, IMAGE_STEPS})
"""What the DiT adapter offers strategies (``diffaccel.contract.capabilities``)."""

STACKS = ("transformer_blocks", "single_transformer_blocks")
"""Module lists of a diffusers transformer that hold its blocks, in forward order."""

def block_specs(transformer) -> list[tuple[str, str, int, torch.nn.Module]]:
    """(name, kind, depth, module) of each block, in forward order."""
    mods = []
    for stack in STACKS:
        blocks = getattr(transformer, stack, None)
        if isinstance(blocks, torch.nn.ModuleList):
            mods += [(f"{stack}.{i}", b) for i, b in enumerate(blocks)]
    n = len(mods)
    out = []
    for k, (name, mod) in enumerate(mods):
        depth = min(k, n - 1 - k)
        kind = "mid" if k == n - 1 - k else ("down" if k < n - 1 - k else "up")
        out.append((name, kind, depth, mod))
    return out


def stream_layout(module: torch.nn.Module) -> tuple[int | None, int | None, str, str]:
    """(output index of hidden states, output index of text states, their argument names) of a
    block class, from diffusers' TransformerBlockRegistry; (None, None, ...) for one-tensor outputs."""
    try:
        from diffusers.hooks._helpers import TransformerBlockRegistry

        meta = TransformerBlockRegistry.get(type(module))
    except (ImportError, ValueError):
        return None, None, "hidden_states", "encoder_hidden_states"
    return (meta.return_hidden_states_index, meta.return_encoder_hidden_states_index,
            meta.hidden_states_argument_name, meta.encoder_hidden_states_argument_name)


class DiTBlock(DenoiserBlock):
    """The DiT adapter's layer: one transformer block (``transformer_blocks.i``; kind
    ``down``/``mid``/``up`` by its place in the stack, see the module docstring).

    ``compute(hidden)`` runs the block's original ``forward``; while strategies are active it
    keeps the block's residual. ``cached_output`` is the residual added to the block's current
    input (what the block would output if its update had not changed since it was last computed).
    """

    family = "DiT"

    def __init__(self, name, index, kind, module, session, depth=0):
        super().__init__(name, index, kind, module, session, depth)
        self.out_h, self.out_e, self.arg_h, self.arg_e = stream_layout(module)
        self.current: dict[str, Any] | None = None
        """The arguments of the block's call in progress."""

    def _inputs(self, hidden: dict[str, Any]) -> tuple[Any, Any]:
        return hidden.get(self.arg_h), hidden.get(self.arg_e)

    def _residual(self, hidden: dict[str, Any], out: Any) -> Any:
        h_in, e_in = self._inputs(hidden)
        if not isinstance(out, tuple):
            return out - h_in
        res = [None] * len(out)
        for idx, x_in in ((self.out_h, h_in), (self.out_e, e_in)):
            if idx is not None and out[idx] is not None and x_in is not None:
                res[idx] = out[idx] - x_in
        return tuple(res)

    def apply_residual(self, hidden: dict[str, Any], res: Any) -> Any:
        h_in, e_in = self._inputs(hidden)
        if not isinstance(res, tuple):
            return h_in + res
        out = [None] * len(res)
        for idx, x_in in ((self.out_h, h_in), (self.out_e, e_in)):
            if idx is not None and res[idx] is not None:
                out[idx] = x_in + res[idx]
        return tuple(out)

    @property
    def cached_output(self) -> Any:
        res = self.kept
        if res is None or self.current is None:
            return None
        return self.apply_residual(self.current, res)

    def to_cache(self, hidden: dict[str, Any], out: Any) -> Any:
        return self._residual(hidden, out)

    def served(self, cached: Any, args: tuple, kwargs: dict) -> Any:
        return self.apply_residual(self.bind(args, kwargs), cached)

    def hooked(self, accel: Any, run: RunState, args: tuple, kwargs: dict) -> Any:
        self.current = self.bind(args, kwargs)
        try:
            return accel.layer_output(run, self, self.current)
        finally:
            self.current = None


class DiTSession(DenoiserSession):
    """The accelerator attached to one DiT pipeline, and the state of its current run."""

    adapter = "dit"
    capabilities = CAPABILITIES
    denoiser_attr = "transformer"

    def build_layers(self, accelerator: Any) -> None:
        self.layers = [DiTBlock(name, i, kind, mod, self, depth)
                       for i, (name, kind, depth, mod) in enumerate(block_specs(self.denoiser))]


def attach(pipe: Any, accelerator: Any) -> DiTSession:
    return _shared.attach(pipe, accelerator, DiTSession)
