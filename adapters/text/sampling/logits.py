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
        return torch.einsum("bnk,bnke->bne", p, latents[logits.indices].to(p.dtype))
    # float32: the continuous samplers' latents are (their updates); a bfloat16 model's table is cast
    return (logits.float() / temperature).softmax(-1) @ latents.to(torch.float32)


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
    """(probability, token) of the largest entry of each row of logits (..., V), in any float dtype: what
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
    # summed in float32, without a float32 copy of bfloat16 logits: the probability of a row
    # whose top entry is near 1 needs more than bfloat16's 8 bits
    prob = (lg - best[:, None]).exp_().sum(-1, dtype=torch.float32).reciprocal_()
    return prob.view(lead), (j * w + i).view(lead)


class Cdf(NamedTuple):
    """Two-level cumulative distributions of R rows of logits: ``C`` (R, nb), the cumulative sums
    over blocks of w entries of exp((lg - m) / T) (0 for banned tokens), relative to ``m`` (R, 1),
    each row's largest logit. A search finds the block in C, then the entry in that one block's
    cumsum (a full cumulative sum over the vocabulary is sequential per row and cost more than
    the softmax). The block's entries are recomputed from the logits when a draw needs them, so
    a cache keeps nb + 1 numbers per row, not V."""

    C: torch.Tensor
    m: torch.Tensor


def _exp_from_max_(lg: torch.Tensor, m: torch.Tensor, temperature: float) -> torch.Tensor:
    """In place exp((lg - m) / T): the unnormalised probabilities of a ``Cdf``. One function for
    the whole rows (``_cdf``) and the single blocks a cached draw recomputes (``CdfCache.draw``),
    so that both give the same numbers."""
    lg.sub_(m)
    if temperature != 1.0:
        lg.div_(temperature)
    return lg.exp_()


def _cdf(lg: torch.Tensor, temperature: float) -> tuple[Cdf, torch.Tensor]:
    """(the two-level CDF, the blocked probabilities e (R, nb, w)) of softmax(lg / T) for float
    logits (R, V), banned ids at -inf. ``lg`` is overwritten (e lives in its storage): every
    caller passes its own gathered copy (see ``_without_banned``)."""
    m = lg.amax(-1, keepdim=True)
    e = _blocked(_exp_from_max_(lg, m, temperature), _block_width(lg.shape[1]), 0.0)
    return Cdf(e.sum(-1).cumsum_(-1), m), e


def _last_positive(c: torch.Tensor) -> torch.Tensor:
    """Per row of a cumulative sum (R, n): the first index where it reaches its total, i.e. the
    last entry with positive mass, (R, 1)."""
    return torch.searchsorted(c, c[:, -1:].contiguous(), right=False)


def _find_block(C: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """For uniforms u (R, 1) in [0, 1): (block j, mass below it, total, target u * total), each
    (R, 1). j is the first block whose cumulative mass passes the target, clamped to the last
    block with mass (rounding may put the target at the total; never-filled cache rows are
    searched too, then ignored)."""
    total = C[:, -1:]
    target = u * total
    j = torch.minimum(torch.searchsorted(C, target, right=True), _last_positive(C)).clamp_(max=C.shape[1] - 1)
    below = torch.where(j > 0, C.gather(1, (j - 1).clamp_(min=0)), torch.zeros_like(target))
    return j, below, total, target


def _pick_in_block(block: torch.Tensor, j, below, total, target) -> tuple[torch.Tensor, torch.Tensor]:
    """(probability, index) from the chosen blocks' probabilities (R, w): the first entry whose
    cumulative mass passes the target, never one without mass."""
    c = block.cumsum(-1)
    i = torch.minimum(torch.searchsorted(c, target - below, right=True), _last_positive(c)).clamp_(max=block.shape[1] - 1)
    return (block.gather(1, i) / total).squeeze(1), (j * block.shape[1] + i).squeeze(1)


def _pick(cdf: Cdf, e: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse CDF of fresh rows whose blocked probabilities ``e`` (R, nb, w) are at hand."""
    j, below, total, target = _find_block(cdf.C, u)
    R, nb, w = e.shape
    block = e.view(-1, w).index_select(0, torch.arange(R, device=e.device) * nb + j.squeeze(1))
    return _pick_in_block(block, j, below, total, target)


def _logit_blocks(logits: torch.Tensor, rows: torch.Tensor, j: torch.Tensor, w: int) -> torch.Tensor:
    """(R, w): block j[r] of row rows[r] of logits (Rx, V) contiguous, -inf past the last id."""
    V = logits.shape[1]
    if V % w == 0:
        return logits.view(-1, w).index_select(0, rows * (V // w) + j.squeeze(1))
    cols = j * w + torch.arange(w, device=logits.device)
    out = logits.reshape(-1)[rows[:, None] * V + cols.clamp(max=V - 1)]
    return out.masked_fill_(cols >= V, -math.inf)


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
        conf, choice = _pick(*_cdf(lg, temperature), u)
    if ids is not None:
        choice = ids.gather(1, choice[:, None]).squeeze(1)
    return conf, choice


class CdfCache:
    """The masked sampler's two-level distributions per position (``Cdf`` of B * N rows), kept
    across steps.

    A position the step did not compute keeps its logits, so its distribution is the same as at
    the last step: its draw is then two short binary searches and the exponentials of one block
    instead of an exponential over the vocabulary. Draws are identical to ``draw`` (same
    uniforms, same arithmetic per row); only the work for unchanged rows is saved. Used on
    hooked runs, where steps may be partial.
    """

    def __init__(self, shape: tuple[int, int, int], device):
        B, N, V = shape
        self.w = _block_width(V)
        self.cdf = Cdf(torch.zeros(B * N, -(-V // self.w), device=device), torch.zeros(B * N, 1, device=device))
        self.valid = torch.zeros(B, N, dtype=torch.bool, device=device)
        self._ban: tuple[tuple[int, ...], torch.Tensor] | None = None

    def invalidate(self, computed: torch.Tensor | None) -> None:
        """Forget the positions a step computed: ``computed`` (T,) long indices into the B * N
        rows (``Positions.flat``), or None for all."""
        if computed is None:
            self.valid.zero_()
        elif computed.numel():
            self.valid.view(-1).index_fill_(0, computed, False)

    def _banned_blocks(self, banned: list[int], V: int, device) -> torch.Tensor:
        """(nb, w) bool: the banned ids and the padding past the last id, in the block layout."""
        key = tuple(banned)
        if self._ban is None or self._ban[0] != key:
            ban = torch.zeros(self.cdf.C.shape[1] * self.w, dtype=torch.bool, device=device)
            ban[V:] = True
            ban[list(banned)] = True
            self._ban = (key, ban.view(-1, self.w))
        return self._ban[1]

    def draw(self, logits: torch.Tensor, cand: torch.Tensor, banned: list[int], temperature: float,
             gens: list[torch.Generator], counts: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``draw(logits[r, cand[r]], ..., gens[r])`` for every batch row r at once (temperature > 0),
        from the cache where it is valid. ``cand`` (B, N) bool marks the candidates; returns
        (confidence, token), both (B, N), meaningful at the candidates. One exponential for the stale
        candidates of every row and one search over all candidates: at batch 8 the per-row calls were
        a fifth of a partial step. ``counts``: candidates per row, when the caller has them."""
        B, N, V = logits.shape
        flat_logits = logits.reshape(B * N, V)
        stale = cand & ~self.valid
        if bool(stale.any()):
            rows = stale.view(-1).nonzero().squeeze(1)
            lg, _ = _without_banned(flat_logits.index_select(0, rows), banned)
            fresh, _ = _cdf(lg, temperature)
            self.cdf.C.index_copy_(0, rows, fresh.C)
            self.cdf.m.index_copy_(0, rows, fresh.m)
            self.valid |= stale
        counts = cand.sum(1).tolist() if counts is None else counts
        rows = cand.view(-1).nonzero().squeeze(1)  # row-major: each batch row's candidates in order
        # each row's uniforms from its own generator, in position order
        u = torch.cat([torch.rand(n, 1, generator=gen) for n, gen in zip(counts, gens)]).to(logits.device)
        j, below, total, target = _find_block(self.cdf.C.index_select(0, rows), u)
        # the chosen block's probabilities, recomputed from the logits as ``_cdf`` computed them
        # in float32 as ``_without_banned`` gave ``_cdf`` its rows (a no-op for float32 logits; a
        # (rows, w) copy for bfloat16 ones), so that the draw is the unhooked run's in every dtype
        block = _exp_from_max_(_logit_blocks(flat_logits, rows, j, self.w).float(), self.cdf.m.index_select(0, rows), temperature)
        block.masked_fill_(self._banned_blocks(banned, V, logits.device)[j.squeeze(1)], 0.0)
        conf, choice = _pick_in_block(block, j, below, total, target)
        confs = torch.zeros(B * N, device=logits.device).index_copy_(0, rows, conf)
        choices = torch.zeros(B * N, dtype=torch.long, device=logits.device).index_copy_(0, rows, choice)
        return confs.view(B, N), choices.view(B, N)
