"""``TopKLogits``: per-position logits held as the k largest (values, indices) instead of the
whole vocabulary.

A ``diffaccel_denoiser_output`` implementation on the text adapter may return one instead of a
dense (B, N, V) tensor (the ``topk`` strategy's truncation does). The samplers then work on the
k values: the masked sampler draws and ranks from a softmax over k values, the continuous
samplers take the clean estimate as a k-term sum of token latents, and ``post_step`` gets the
top-1 and its probability from the same k values. At a large vocabulary that is cheaper than a
softmax over the vocabulary; the dense form (-inf outside the k) is built only on request.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import attrs
import torch


@attrs.define
class TopKLogits:
    """Logits truncated to k per position; the rest count as -inf."""

    values: torch.Tensor
    """(B, N, k) the kept logits, largest first unless a strategy reordered them."""
    indices: torch.Tensor
    """(B, N, k) long: their token ids."""
    vocab_size: int
    """V, the size of the dense form."""

    @property
    def shape(self) -> tuple[int, int, int]:
        return (*self.values.shape[:2], self.vocab_size)

    def dense(self) -> torch.Tensor:
        """(B, N, V) with -inf outside the kept tokens."""
        out = torch.full(self.shape, -math.inf, dtype=self.values.dtype, device=self.values.device)
        return out.scatter_(-1, self.indices, self.values)

    def top1(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(probability, token) of the most probable token per position, both (B, N)."""
        p, j = self.values.float().softmax(-1).max(-1)
        return p, self.indices.gather(-1, j.unsqueeze(-1)).squeeze(-1)

    def argmax(self, dim: int = -1) -> torch.Tensor:
        """Token id of the largest kept logit per position (B, N); ``dim`` must be the last."""
        if dim not in (-1, 2):
            raise ValueError("TopKLogits.argmax works over the vocabulary (dim=-1) only")
        return self.indices.gather(-1, self.values.argmax(-1, keepdim=True)).squeeze(-1)

    def rows(self, r: int, positions: torch.Tensor) -> "TopKLogits":
        """The (M, k) slice of batch row r at ``positions``."""
        return TopKLogits(self.values[r, positions], self.indices[r, positions], self.vocab_size)


def clean_estimate(logits: "torch.Tensor | TopKLogits", latents: torch.Tensor, temperature: float) -> torch.Tensor:
    """Expected token latent under softmax(logits / T): (B, N, E) from (V, E) ``latents``."""
    if isinstance(logits, TopKLogits):
        p = (logits.values.float() / temperature).softmax(-1)
        return torch.einsum("bnk,bnke->bne", p, latents[logits.indices])
    return (logits.float() / temperature).softmax(-1) @ latents


def _without_banned(logits: "torch.Tensor | TopKLogits", banned: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(float logits with the ``banned`` ids at -inf, the kept token ids for a ``TopKLogits`` or
    None). Dense float32 rows are written in place: every caller passes its own gathered copy
    (``logits[r, cand]``), so no further (M, V) copy is made per row and step."""
    if isinstance(logits, TopKLogits):
        ban = torch.isin(logits.indices, torch.tensor(banned, device=logits.indices.device))
        return logits.values.float().masked_fill(ban, -math.inf), logits.indices
    lg = logits.float()
    lg[:, banned] = -math.inf
    return lg, None


def _block_width(V: int) -> int:
    """Width of the vocabulary blocks of the two-level searches: a divisor of V near sqrt(V)
    when there is one, else ceil(sqrt(V)) (the last block is then padded)."""
    w = math.isqrt(V - 1) + 1 if V > 1 else 1
    for d in range(w, max(w // 2, 1) - 1, -1):
        if V % d == 0:
            return d
    return w


def _blocked(x: torch.Tensor, w: int, fill: float) -> torch.Tensor:
    """(R, V) -> (R, ceil(V / w), w), padded with ``fill`` when w does not divide V."""
    R, V = x.shape
    if V % w:
        x = torch.nn.functional.pad(x, (0, w - V % w), value=fill)
    return x.reshape(R, -(-V // w), w)


def most_probable(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(probability, token) of the largest entry of each row of float logits (..., V): what
    ``logits.softmax(-1).max(-1)`` gives, without the softmax's full-size output. The argmax is
    taken per block of about sqrt(V) entries, then within the best block: on a CPU, ``max`` with
    indices over 4096 entries cost six times a plain ``amax``."""
    lead, V = logits.shape[:-1], logits.shape[-1]
    lg = logits.reshape(-1, V)
    R = lg.shape[0]
    w = _block_width(V)
    blocks = _blocked(lg, w, -math.inf)
    best, j = blocks.amax(-1).max(-1)  # the best block per row
    i = blocks[torch.arange(R, device=lg.device), j].max(-1).indices
    prob = (lg - best[:, None]).exp_().sum(-1).reciprocal_()
    return prob.view(lead), (j * w + i).view(lead)


class Cdf(NamedTuple):
    """Unnormalised cumulative distributions of R rows in two levels: the probabilities ``e``
    (R, nb, w) (up to the row's factor; 0 for banned tokens), and their cumulative sums per block
    ``C`` (R, nb). A search finds the block in C, then the entry in one block's cumsum: a full
    cumulative sum over the vocabulary is sequential per row and cost more than the softmax."""

    e: torch.Tensor
    C: torch.Tensor


def _cdf(lg: torch.Tensor, temperature: float) -> Cdf:
    """The two-level CDF of softmax(lg / T) for float logits (R, V), banned ids at -inf. ``lg``
    is overwritten: every caller passes its own gathered copy (see ``_without_banned``)."""
    lg = lg.sub_(lg.amax(-1, keepdim=True))
    if temperature != 1.0:
        lg.div_(temperature)
    e = _blocked(lg.exp_(), _block_width(lg.shape[1]), 0.0)
    return Cdf(e, e.sum(-1).cumsum_(-1))


def _last_positive(c: torch.Tensor) -> torch.Tensor:
    """Per row of a cumulative sum (R, n): the first index where it reaches its total, i.e. the
    last entry with positive mass, (R, 1)."""
    return torch.searchsorted(c, c[:, -1:].contiguous(), right=False)


def _pick(cdf: Cdf, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse CDF: (probability, index) per row for uniforms ``u`` (R, 1) in [0, 1). The first
    entry whose cumulative mass passes u * total: never a zero-probability (banned) entry, even
    where rounding puts the target at the total."""
    e, C = cdf
    R, nb, w = e.shape
    total = C[:, -1:]
    target = u * total
    # clamped: rows of a cache that were never filled (zeros) are searched too, then ignored
    j = torch.minimum(torch.searchsorted(C, target, right=True), _last_positive(C)).clamp_(max=nb - 1)  # (R, 1)
    below = torch.where(j > 0, C.gather(1, (j - 1).clamp_(min=0)), torch.zeros_like(target))
    block = e.gather(1, j[:, :, None].expand(-1, -1, w)).squeeze(1)  # (R, w)
    c = block.cumsum(-1)
    i = torch.minimum(torch.searchsorted(c, target - below, right=True), _last_positive(c)).clamp_(max=w - 1)
    return (block.gather(1, i) / total).squeeze(1), (j * w + i).squeeze(1)


def draw(logits: "torch.Tensor | TopKLogits", banned: list[int], temperature: float,
         gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(confidence, token) per row of (M, V) logits or an (M, k) ``TopKLogits`` slice: the argmax at
    temperature 0, else a draw from softmax(logits / T) by inverse CDF (one uniform per row from
    ``gen``; ``torch.multinomial`` draws an exponential per vocabulary entry, which cost a quarter
    of a step at vocabulary 4096); ``banned`` tokens never come out."""
    lg, ids = _without_banned(logits, banned)
    if temperature <= 0:
        conf, choice = most_probable(lg)
    else:
        u = torch.rand(lg.shape[0], 1, generator=gen).to(lg.device)
        conf, choice = _pick(_cdf(lg, temperature), u)
    if ids is not None:
        choice = ids.gather(1, choice[:, None]).squeeze(1)
    return conf, choice


class CdfCache:
    """The masked sampler's cumulative distributions per position, (B, N, V), kept across steps.

    A position the step did not compute keeps its logits, so its distribution is the same as at
    the last step: its draw is then two short binary searches instead of an exponential over the
    vocabulary. Draws are identical to ``draw`` (same uniforms, same arithmetic per row);
    only the work for unchanged rows is saved. Used on hooked runs, where steps may be partial.
    """

    def __init__(self, shape: tuple[int, int, int], device):
        B, N, V = shape
        w = _block_width(V)
        nb = -(-V // w)
        self.cdf = Cdf(torch.zeros(B * N, nb, w, device=device), torch.zeros(B * N, nb, device=device))
        self.valid = torch.zeros(shape[:2], dtype=torch.bool, device=device)

    def invalidate(self, computed: torch.Tensor | None) -> None:
        """Forget the positions a step computed: ``computed`` (B, M) long, or None for all."""
        if computed is None:
            self.valid.zero_()
        elif computed.numel():
            self.valid.scatter_(1, computed, False)

    def draw(self, logits: torch.Tensor, cand: torch.Tensor, banned: list[int], temperature: float,
             gens: list[torch.Generator], counts: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``draw(logits[r, cand[r]], ..., gens[r])`` for every batch row r at once (temperature > 0),
        from the cache where it is valid. ``cand`` (B, N) bool marks the candidates; returns
        (confidence, token), both (B, N), meaningful at the candidates. One exponential for the stale
        candidates of every row and one search over all rows: at batch 8 the per-row calls were
        a fifth of a partial step. ``counts``: candidates per row, when the caller has them."""
        B, N, V = logits.shape
        stale = cand & ~self.valid
        if bool(stale.any()):
            rows = stale.view(-1).nonzero().squeeze(1)
            lg, _ = _without_banned(logits.reshape(B * N, V).index_select(0, rows), banned)
            fresh = _cdf(lg, temperature)
            self.cdf.e.index_copy_(0, rows, fresh.e)
            self.cdf.C.index_copy_(0, rows, fresh.C)
            self.valid |= stale
        counts = cand.sum(1).tolist() if counts is None else counts
        u = torch.zeros(B, N, 1, device=logits.device)
        # each row's uniforms from its own generator, in position order (a boolean index is row-major)
        u[cand] = torch.cat([torch.rand(n, 1, generator=gen) for n, gen in zip(counts, gens)]).to(u.device)
        conf, choice = _pick(self.cdf, u.view(B * N, 1))  # searching every row is cheaper than copying some
        return conf.view(B, N), choice.view(B, N)
