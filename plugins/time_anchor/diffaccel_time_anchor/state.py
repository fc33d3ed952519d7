"""What both time-anchor policies share: the per-run state's common part and the change measure."""

from __future__ import annotations

from typing import Any

import attrs
import torch

from .cache import LatentCache


@attrs.define(eq=False)
class AnchorState:
    """One generation, one guidance branch (``run.state``): the cache and what the metrics need.
    Each policy extends it (``TokenState``, ``BlockStackState``)."""

    cache: LatentCache | None = None
    """The bounded, versioned cache of reference states; None until the first layer call."""
    keys: torch.Tensor | None = None
    """The cache key of each (layer, row, position) (tokens) or (row, block) (blocks); -1: not cached."""
    gate_open: torch.Tensor | None = None
    """With a learned gate: (L, steps) bool, where the layer's gate is open."""
    anchored: torch.Tensor | None = None
    """(L, steps) share of states served."""
    hits: Any = 0
    """States served (an int or a 0-d tensor)."""
    lookups: int = 0


def rel_change(new: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """||new - ref|| / ||ref|| over the last dimension, in ``new``'s dtype (the model's: a float16
    cache is read back into it); the norms accumulate in float32 without a float32 copy of the states."""
    ref = ref.to(new.dtype)
    f32 = torch.float32
    return torch.linalg.vector_norm(new - ref, dim=-1, dtype=f32) / torch.linalg.vector_norm(ref, dim=-1, dtype=f32).clamp(min=1e-6)
