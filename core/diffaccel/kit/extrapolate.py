"""First-order extrapolation of what a skipped block keeps, shared by the block-reusing strategies
(dct-anchor and time-anchor, key ``extrapolate``).

A block that is reused between refreshes normally serves the value it kept at its last computed
step (a DiT block: its residual; a UNet block: its output). Keeping the last two instead and
extending the line through them is TaylorSeer's first-order idea applied to whole blocks: the
block's update keeps drifting the way it drifted between its last two computations.
"""

from __future__ import annotations

from typing import Any

import torch


def extrapolated(kept: list[tuple[int, Any]], step: int, reach: float | None = None) -> Any:
    """``v2 + (v2 - v1) * (step - s2) / (s2 - s1)`` for ``kept = [(s1, v1), (s2, v2)]`` (s1 < s2),
    element by element for a tuple (entries that are not tensors in both are taken from v2).

    ``reach``: extend the line at most this many times its measured span ``s2 - s1`` past s2, and
    hold it there (None: no bound). A slope measured between two adjacent steps (the last two of
    a warm-up) and carried a whole refresh interval ahead multiplies the early, fast change by the
    interval: with reach 1 a slope is never used further than the span it was measured over."""
    (s1, v1), (s2, v2) = kept
    k = (step - s2) / (s2 - s1)
    if reach is not None:
        k = min(k, reach)

    def one(a, b):
        return b + (b - a) * k if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) else b

    if isinstance(v2, tuple):
        return tuple(one(a, b) for a, b in zip(v1, v2))
    return one(v1, v2)


def keep(kept: list[tuple[int, Any]], step: int, value: Any) -> list[tuple[int, Any]]:
    """The last two (step, value) pairs after a computation at ``step``."""
    return [*kept[-1:], (step, value)]
