"""The text pipeline's per-generation state: ``_RunContext`` (per-layer keys/values and outputs,
the last logits) and ``TextLayer``, the layer handle strategies compute through; and
``_refresh_computed``, which recomputes per-position results on the rows a partial step changed."""

from __future__ import annotations

from typing import Any

import torch

from diffaccel.contract.state import Layer, RunState

from .model import KVCache
from .positions import Positions


def _refresh_computed(ctx: "_RunContext", logits: torch.Tensor, prev: Any, fn):
    """``fn(logits)``, a per-position function of the logits (a tensor or a tuple of tensors, each
    (B, N, ...); ``fn`` must also take (T, V) rows). After a partial step only the logits of the
    positions whose last layer ran changed, so ``fn`` runs on those rows alone and ``prev`` (the
    last result) serves the others; a strategy's replacement logits, a full step, or no ``prev``
    get the whole computation."""
    sel = ctx.head_sel
    if prev is None or sel is None or logits is not ctx.logits:
        return fn(logits)
    if sel.count == 0:  # a reused step: nothing changed
        return prev
    part = fn(ctx.step_logits if ctx.step_logits is not None else sel.gather(logits))

    def merge(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        return sel.scatter_(old.clone(), new)

    if isinstance(part, tuple):
        return tuple(merge(o, n) for o, n in zip(prev, part))
    return merge(prev, part)


_NOT_RUN = object()  # the last layer's ``compute`` was not called at this step


class _RunContext:
    """Per-generation caches: per-layer keys/values and outputs, last logits and top-1."""

    def __init__(self, den, run: RunState):
        self.den = den
        self.run = run
        self.kv = [KVCache() for _ in range(den.n_layers)]
        self.out: list[torch.Tensor | None] = [None] * den.n_layers
        self.h0: torch.Tensor | None = None
        self.c = None
        self.step_sel: Positions | None = None  # a partial step's positions; None: every position
        self.logits: torch.Tensor | None = None
        self.step_logits: torch.Tensor | None = None  # a partial step's fresh rows of ``logits`` (T, V)
        # the positions whose logits this step recomputed (those the last layer ran on): None, all
        self.head_sel: Positions | None = None
        self.last_layer_sel: Any = _NOT_RUN  # what the last layer's ``compute`` ran on this step
        self.top1: tuple[torch.Tensor, torch.Tensor] | None = None  # (prob, token) of ``logits``, for post_step
        # exact prefix cache (masked sampler, ``prefix_cache``): positions before ``prefix_lo`` are
        # the finished blocks, attending among themselves only; ``prefix_done`` is the prefix
        # their keys and values were last computed for (once per block)
        self.prefix_lo = 0
        self.prefix_done = 0
        self.rows_done: torch.Tensor | None = None  # (B,) bool: rows with nothing left to commit, not computed
        self.step_model: Any = None  # the run's ``_TextStep`` (RunSequence.denoise)
        self.seq: Any = None  # the run's RunSequence (counts the prefix pass)
        self.layers = [TextLayer(i, self) for i in range(den.n_layers)]


class TextLayer(Layer):
    """The text adapter's layer: one transformer block; ``compute`` may run on a subset of positions.

    ``hidden`` is the hidden states (B, N, D). ``cached_output`` is the block's output at every
    position as of its last computation, ``step_positions`` the positions the step computes (None:
    all), ``select(mask)`` a ``Positions`` over a (B, N) bool mask (``.mask()``, ``.flat``, ``.pos``,
    ``.count``, ``.gather(x)``) to hand back to ``compute``."""

    supports_positions = True

    def __init__(self, index: int, ctx: _RunContext):
        super().__init__(f"block.{index}", index, "transformer-block")
        self.ctx = ctx

    @property
    def cached_output(self) -> torch.Tensor | None:
        """The layer's output at every position as of its last computation."""
        return self.ctx.out[self.index]

    @staticmethod
    def select(mask: torch.Tensor) -> Positions:
        """The positions of a (B, N) bool mask, in the form ``compute`` takes without converting."""
        return Positions(mask)

    @property
    def step_positions(self) -> Positions | None:
        """The positions the current step computes (``.mask()`` gives them as (B, N) bool), or
        None for every position."""
        return self.ctx.step_sel

    def compute(self, hidden: torch.Tensor, positions: "torch.Tensor | Positions | None" = None) -> torch.Tensor:
        """Run the block. ``positions`` narrows it further than the step's plan: a (B, N) bool mask
        (preferred), a (B, M) long index, or a ``Positions``; the other positions keep their
        cached outputs, keys and values. With no position left the block does not run."""
        ctx, i = self.ctx, self.index
        sel = ctx.step_sel if positions is None else Positions.coerce(positions, hidden.shape[1])
        if sel is None:
            ctx.out[i] = ctx.den.block(i, hidden, ctx.c, ctx.kv[i])
        else:
            self.computed_positions = sel.count  # the core counts them (0: the block does not run)
            if sel.count:
                y = ctx.den.block(i, sel.gather(hidden), ctx.c, ctx.kv[i], sel)
                # in place: copying the whole cache every layer would eat the saving at small models
                sel.scatter_(ctx.out[i], y)
        if i == len(ctx.layers) - 1:
            ctx.last_layer_sel = sel
        return ctx.out[i]
