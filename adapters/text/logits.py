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


def _cdf(lg: torch.Tensor, temperature: float) -> torch.Tensor:
    """Cumulative softmax(lg / T) along the vocabulary, (M, V) float32."""
    return (lg / temperature).softmax(-1).cumsum_(-1)


def _pick(cdf: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse CDF: (confidence, index) per row of ``cdf`` (M, V) for uniforms ``u`` (M, 1) in
    [0, 1). The first entry whose cumulative mass passes u * total: never a zero-probability
    (banned) entry. Its probability is the step of the CDF there."""
    u = u * cdf[:, -1:]
    choice = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[1] - 1)
    upper = cdf.gather(1, choice)
    lower = torch.where(choice > 0, cdf.gather(1, (choice - 1).clamp_(min=0)), torch.zeros_like(upper))
    return (upper - lower).squeeze(1), choice.squeeze(1)


def draw(logits: "torch.Tensor | TopKLogits", banned: list[int], temperature: float,
         gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(confidence, token) per row of (M, V) logits or an (M, k) ``TopKLogits`` slice: the argmax at
    temperature 0, else a draw from softmax(logits / T) by inverse CDF (one uniform per row from
    ``gen``; ``torch.multinomial`` draws an exponential per vocabulary entry, which cost a quarter
    of a step at vocabulary 4096); ``banned`` tokens never come out."""
    lg, ids = _without_banned(logits, banned)
    if temperature <= 0:
        conf, choice = lg.softmax(-1).max(-1)
    else:
        u = torch.rand(lg.shape[0], 1, generator=gen).to(lg.device)
        conf, choice = _pick(_cdf(lg, temperature), u)
    if ids is not None:
        choice = ids.gather(1, choice[:, None]).squeeze(1)
    return conf, choice


class CdfCache:
    """The masked sampler's cumulative distributions per position, (B, N, V), kept across steps.

    A position the step did not compute keeps its logits, so its distribution is the same as at
    the last step: its draw is then one binary search instead of a softmax and a cumulative sum
    over the vocabulary. Draws are identical to ``draw`` (same uniforms, same arithmetic per row);
    only the work for unchanged rows is saved. Used on hooked runs, where steps may be partial.
    """

    def __init__(self, shape: tuple[int, int, int], device):
        self.cdf = torch.empty(shape, dtype=torch.float32, device=device)
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
        (confidence, token), both (B, N), meaningful at the candidates. One softmax for the stale
        candidates of every row and one search over all rows: at batch 8 the per-row calls were
        a fifth of a partial step. ``counts``: candidates per row, when the caller has them."""
        B, N, V = self.cdf.shape
        flat_cdf = self.cdf.view(B * N, V)
        stale = cand & ~self.valid
        if bool(stale.any()):
            rows = stale.view(-1).nonzero().squeeze(1)
            lg, _ = _without_banned(logits.reshape(B * N, V).index_select(0, rows), banned)
            flat_cdf.index_copy_(0, rows, _cdf(lg, temperature))
            self.valid |= stale
        counts = cand.sum(1).tolist() if counts is None else counts
        u = torch.zeros(B, N, 1, device=self.cdf.device)
        # each row's uniforms from its own generator, in position order (a boolean index is row-major)
        u[cand] = torch.cat([torch.rand(n, 1, generator=gen) for n, gen in zip(counts, gens)]).to(u.device)
        conf, choice = _pick(flat_cdf, u.view(B * N, 1))  # searching every row is cheaper than copying some
        return conf.view(B, N), choice.view(B, N)
