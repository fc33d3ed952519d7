"""``pin = "model"``: each key term goes where the model itself expects it.

At every step of a masked run, for every term not placed yet, the model's probability of the
term's first token is read at each masked position still free (the term's tokens must fit in a
run of free masked positions there). The term keeps the best (probability, position) it has
had; it is placed at the step where that confidence peaks, seen one step later, when it falls
below its best (at the best step's position if it is still free, else at the current best), and
at the latest by the step ``place_by`` of the run (or as soon as few places are left where it fits). Terms are placed most confident first, so a
later one cannot take the positions of an earlier one.

A placed term is committed through the logits, not by pinning: from the next step its positions'
logits allow only its tokens (``force``), so the sampler draws them with certainty, commits them
first and never re-masks them. The rest of the text is written around them by the model.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import torch


ROOM = 4
"""A term is placed at once when no more than this many starts are left where it fits."""
LONG = 8
"""... or when its tokens are more than 1/LONG of the free positions."""


def fits(free: torch.Tensor, length: int) -> torch.Tensor:
    """(N,) bool: positions p where p .. p + length - 1 are all free."""
    n = free.shape[0]
    ok = free.clone()
    for k in range(1, length):
        ok[: n - k] &= free[k:]
        ok[n - k:] = False
    return ok


def best_spot(logp: torch.Tensor, free: torch.Tensor, length: int) -> tuple[float, int]:
    """(probability, position) of the most probable start among those where ``length`` tokens fit;
    ``logp`` (N,) is the first token's log-probability per position. (-1.0, -1) if none fits."""
    ok = fits(free, length)
    if not bool(ok.any()):
        return -1.0, -1
    p = int(logp.masked_fill(~ok, -math.inf).argmax())
    return float(logp[p].exp()), p


@attrs.define(eq=False)
class RowPlacer:
    """Placement state of one batch row."""

    terms: list[list[int]]
    """Token ids of each term (as in running text)."""
    placed: list[int] = attrs.Factory(list)
    """Start position per term, -1 until placed."""
    at_step: list[int] = attrs.Factory(list)
    """Step at which each term was placed, -1 until then."""
    best: list[tuple[float, int]] = attrs.Factory(list)
    """Best (probability, position) seen per unplaced term."""

    def __attrs_post_init__(self):
        n = len(self.terms)
        self.placed, self.at_step, self.best = [-1] * n, [-1] * n, [(-1.0, -1)] * n

    @property
    def done(self) -> bool:
        return all(p >= 0 for p in self.placed)

    def step(self, logp: torch.Tensor, masked: torch.Tensor, reserved: torch.Tensor, step: int, deadline: bool) -> list[int]:
        """One step: ``logp`` (N, V) log-probabilities, ``masked`` (N,) still masked, ``reserved``
        (N,) taken by placed terms (updated in place). Returns the terms placed now."""
        todo = [j for j, p in enumerate(self.placed) if p < 0]
        free = masked & ~reserved
        now = {j: best_spot(logp[:, self.terms[j][0]], free, len(self.terms[j])) for j in todo}
        # due: past its peak, at the deadline, or when room for it is short: few starts left, or a
        # term long beside the free positions (one commit could cut every run it fits in)
        n_free = int(free.sum())
        due = [j for j in todo if deadline or now[j][0] < self.best[j][0] or now[j][1] < 0
               or int(fits(free, len(self.terms[j])).sum()) <= ROOM or len(self.terms[j]) * LONG > n_free]
        for j in todo:
            if now[j][0] > self.best[j][0]:
                self.best[j] = now[j]
        placed_now = []
        for j in sorted(due, key=lambda j: -self.best[j][0]):
            free = masked & ~reserved
            n = len(self.terms[j])
            pos = self.best[j][1]
            if pos < 0 or not bool(fits(free, n)[pos]):
                pos = best_spot(logp[:, self.terms[j][0]], free, n)[1]
            if pos < 0:
                continue  # no room now: the deadline or a later step retries
            self.placed[j], self.at_step[j] = pos, step
            reserved[pos:pos + n] = True
            placed_now.append(j)
        return placed_now


def force(output: Any, rows: torch.Tensor, cols: torch.Tensor, ids: torch.Tensor) -> Any:
    """Logits where position (rows[i], cols[i]) allows token ids[i] only; ``output`` dense
    (B, N, V) or truncated (``values`` and ``indices``, as topk hands on). Not modified in place."""
    if isinstance(output, torch.Tensor):
        sub = torch.full((rows.shape[0], output.shape[-1]), -math.inf, dtype=output.dtype, device=output.device)
        sub[torch.arange(rows.shape[0], device=output.device), ids.to(output.device)] = 0.0
        return output.index_put((rows, cols), sub)
    k = output.values.shape[-1]
    vals = torch.full((rows.shape[0], k), -math.inf, dtype=output.values.dtype, device=output.values.device)
    vals[:, 0] = 0.0
    # the forced id in the first slot; the slot that held it (if any) takes the first slot's old
    # id, so the k ids stay distinct (the dense form scatters them)
    old = output.indices[rows, cols]
    ids = ids.to(old.device)
    idx = torch.where(old == ids[:, None], old[:, :1], old)
    idx[:, 0] = ids
    return attrs.evolve(output, values=output.values.index_put((rows, cols), vals),
                        indices=output.indices.index_put((rows, cols), idx))
