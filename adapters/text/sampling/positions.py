"""``Positions``: the (row, position) pairs a partial step computes, held ragged.

Rows of a batch rarely need the same number of positions. Padding every row to the longest (as
a (B, M) index does) made a quarter of a batch-8 partial step's rows padding, run through every
linear layer and the head for nothing. Here the T pairs are one flat list: per-position work
(linears, the head, the sampler's per-row maths) runs on exactly T rows, and only attention,
whose queries must sit in their own row, sees a padded (L, M) layout for the length of one call,
L the rows that have a position at all: a row with nothing to compute (a finished row of an
early-committing sampler) is left out of attention too, so it costs nothing.
"""

from __future__ import annotations

import torch

__all__ = ["Positions"]


class Positions:
    """T (row, position) pairs of a (B, N) batch, row-major. Built once per step (or per layer,
    when a strategy narrows a layer further) and shared by everything that gathers or scatters."""

    __slots__ = ("B", "N", "flat", "rows", "pos", "M", "live", "slot", "_mask", "_kv")

    def __init__(self, mask: torch.Tensor):
        """From a (B, N) bool mask of the positions to compute (kept, not copied: see ``mask``)."""
        self._mask = mask
        self.B, self.N = mask.shape
        self.flat = mask.reshape(-1).nonzero().squeeze(1)  # (T,) indices into the B * N rows
        self.rows = torch.div(self.flat, self.N, rounding_mode="floor")
        self.pos = self.flat - self.rows * self.N
        counts = mask.sum(1)
        self.M = int(counts.max()) if self.B else 0
        # the rows attention runs on (None: all B); a row with no position is not padded in
        has = counts > 0
        self.live = None if bool(has.all()) else has.nonzero().squeeze(1)
        rank = torch.cumsum(has, 0) - 1  # a row's index among the live rows
        # where each pair sits in the padded (L, M) layout of attention: its rank within its row
        start = torch.cumsum(counts, 0) - counts
        self.slot = rank.index_select(0, self.rows) * self.M + (torch.arange(self.flat.numel(), device=mask.device)
                                                                - start.index_select(0, self.rows))
        self._kv: dict[int, torch.Tensor] = {}

    @classmethod
    def from_index(cls, idx: torch.Tensor, n: int) -> "Positions":
        """From a (B, M) long index of positions in rows of length n (repeats allowed)."""
        return cls(torch.zeros(idx.shape[0], n, dtype=torch.bool, device=idx.device).scatter_(1, idx, True))

    @classmethod
    def coerce(cls, positions: "Positions | torch.Tensor", n: int) -> "Positions":
        """A ``Positions`` from itself, a (B, n) bool mask or a (B, M) long index."""
        if isinstance(positions, Positions):
            return positions
        if positions.dtype == torch.bool:
            return cls(positions)
        return cls.from_index(positions, n)

    @property
    def count(self) -> int:
        """T, the number of pairs."""
        return self.flat.numel()

    def mask(self) -> torch.Tensor:
        """(B, N) bool: the mask these positions were built from, shared, so read it, don't
        write it."""
        return self._mask

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, N, ...) -> (T, ...)."""
        return x.reshape(self.B * self.N, *x.shape[2:]).index_select(0, self.flat)

    def scatter_(self, dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        """In place ``dst[row, pos] = src`` for dst (B, N, ...) contiguous, src (T, ...); returns dst."""
        dst.view(self.B * self.N, *dst.shape[2:]).index_copy_(0, self.flat, src)
        return dst

    @property
    def L(self) -> int:
        """The rows with at least one pair: the batch attention runs on."""
        return self.B if self.live is None else self.live.numel()

    def live_rows(self, cache: torch.Tensor) -> torch.Tensor:
        """cache (B, ...) -> (L, ...): the rows of a key or value cache that attention reads."""
        return cache if self.live is None else cache.index_select(0, self.live)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """x (T, ...) -> (L, M, ...), zeros where a row has fewer than M pairs; rows without a
        pair are left out (``live_rows`` gives the matching keys and values)."""
        if self.B == 1:
            return x.unsqueeze(0)
        out = x.new_zeros(self.L * self.M, *x.shape[1:])
        return out.index_copy_(0, self.slot, x).view(self.L, self.M, *x.shape[1:])

    def unpad(self, y: torch.Tensor) -> torch.Tensor:
        """y (L, M, ...) -> (T, ...), the inverse of ``pad``."""
        if self.B == 1:
            return y.squeeze(0)
        return y.reshape(self.L * self.M, *y.shape[2:]).index_select(0, self.slot)

    def kv_index(self, heads: int) -> torch.Tensor:
        """(T * heads,) rows of a (B, heads, N, dh) key or value cache seen as (B * heads * N, dh),
        in the order of a (T, heads, dh) tensor: where this step's keys and values go."""
        hit = self._kv.get(heads)
        if hit is None:
            h = torch.arange(heads, device=self.flat.device)
            hit = self._kv[heads] = ((self.rows[:, None] * heads + h) * self.N + self.pos[:, None]).reshape(-1)
        return hit
