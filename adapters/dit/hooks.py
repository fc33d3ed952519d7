"""diffaccel's hooks inside a diffusers pipeline whose denoiser is a diffusion transformer.

The same wrappers as the UNet adapter's (``diffaccel.adapters.unet.hooks``: denoiser call =
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

import inspect
from typing import Any

import torch

from diffaccel.capabilities import BLOCK_STACK, GUIDANCE_BRANCHES, IMAGE_STEPS
from diffaccel.state import RunState

from ..unet import hooks as unet_hooks
from ..unet.hooks import UNetBlock, _Patch

CAPABILITIES = frozenset({BLOCK_STACK, GUIDANCE_BRANCHES, IMAGE_STEPS})
"""What the DiT adapter offers strategies (``diffaccel.capabilities``)."""

STACKS = ("transformer_blocks", "single_transformer_blocks")
"""Module lists of a diffusers transformer that hold its blocks, in forward order."""

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


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


class DiTBlock(UNetBlock):
    """The DiT adapter's layer: one transformer block (``transformer_blocks.i``; kind
    ``down``/``mid``/``up`` by its place in the stack, see the module docstring).

    ``compute(hidden)`` runs the block's original ``forward``; while strategies are active it
    keeps the block's residual. ``cached_output`` is the residual added to the block's current
    input (what the block would output if its update had not changed since it was last computed).
    """

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
        s = self.session
        run = s.run
        res = None if run is None else s.block_cache.get((run.branch, self.name))
        if res is None or self.current is None:
            return None
        return self.apply_residual(self.current, res)

    def compute(self, hidden: dict[str, Any], positions: Any = None) -> Any:
        if positions is not None:
            raise ValueError(f"{self.name}: DiT blocks compute every row; positions apply to text layers")
        s = self.session
        out = self.call(hidden)
        run = s.run
        if run is not None:
            c = run.counters
            c.layers_computed += 1
            c.positions_computed += run.positions_per_layer
            if s.keep:
                s.block_cache[(run.branch, self.name)] = self._residual(hidden, out)
        return out

    def tail_start(self, tail_layers: int) -> int:  # pragma: no cover - the DiT declares no block-tail
        raise ValueError(f"{self.name}: a transformer block has no tail layers")


class DiTSession(unet_hooks.Session):
    """The accelerator attached to one DiT pipeline, and the state of its current run."""

    def __init__(self, pipe: Any, accelerator: Any):
        self.pipe = pipe
        self.accel = accelerator
        self.keep = bool(getattr(accelerator, "active", False))
        self.unet = pipe.transformer  # the denoiser the inherited wrappers patch
        self.layers = [DiTBlock(name, i, kind, mod, self, depth)
                       for i, (name, kind, depth, mod) in enumerate(block_specs(pipe.transformer))]
        self.modules = []
        self.run: RunState | None = None
        self.last_run: RunState | None = None
        self.unbatched_hint = False
        self.next_info: dict[str, Any] = {}
        self._patches: list[_Patch] = []
        self._reset_run_state()

    def _begin_run(self, rows: int) -> RunState:
        pipe = self.pipe
        cfg = getattr(pipe, "do_classifier_free_guidance", None)
        self._reset_run_state()
        self.unbatched = self.unbatched_hint and cfg is not False
        batch = rows // 2 if cfg and not self.unbatched and rows % 2 == 0 else rows
        timesteps = getattr(pipe.scheduler, "timesteps", None)
        run = RunState(adapter="dit", num_steps=len(timesteps) if timesteps is not None else 0, batch_size=batch,
                       capabilities=CAPABILITIES)
        tcfg = self.unet.config
        run.info.update(
            layers=[layer.name for layer in self.layers], n_layers=len(self.layers), time_conditioned=True,
            depths=[layer.depth for layer in self.layers], kinds=[layer.kind for layer in self.layers], modules=[],
            sample_size=tcfg.sample_size, in_channels=tcfg.in_channels, guidance=bool(cfg),
            cfg_mode="unbatched" if self.unbatched else ("batched" if cfg else "none"),
            timesteps=[float(t) for t in timesteps] if timesteps is not None else [],
        )
        run.info.update(self.next_info)
        self.next_info = {}
        self.run = run
        self.accel.start_run(run)
        return run

    def block_forward(self, layer: DiTBlock):
        accel = self.accel
        name = layer.name

        def make(original):
            layer.forward = original
            try:
                params = inspect.signature(original).parameters.values()
                layer.arg_names = tuple(p.name for p in params if p.kind in _POSITIONAL)
            except (TypeError, ValueError):  # pragma: no cover - builtins
                layer.arg_names = ()

            def forward(*args, **kwargs):
                run = self.run
                if run is None:  # called outside a pipeline run: untouched
                    return original(*args, **kwargs)
                hidden = layer.bind(args, kwargs)
                plan = run.plan
                if plan is not None and name in plan.skip:
                    res = self.block_cache.get((run.branch, name))
                    if res is not None:
                        c = run.counters
                        c.positions_total += run.positions_per_layer
                        c.layers_skipped += 1
                        return layer.apply_residual(hidden, res)
                layer.current = hidden
                try:
                    return accel.layer_output(run, layer, hidden)
                finally:
                    layer.current = None

            return forward

        return make


_SESSIONS = unet_hooks._SESSIONS  # one table: a pipeline has one diffaccel session, whichever adapter
_HINTS = unet_hooks._HINTS


def attach(pipe: Any, accelerator: Any) -> DiTSession:
    detach(pipe)
    session = DiTSession(pipe, accelerator)
    session.unbatched_hint = _HINTS.get(pipe, False)
    session.install()
    _SESSIONS[pipe] = session
    return session


def detach(pipe: Any) -> None:
    unet_hooks.detach(pipe)


def session_of(pipe: Any) -> DiTSession | None:
    return _SESSIONS.get(pipe)
