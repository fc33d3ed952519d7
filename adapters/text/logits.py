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


def _without_banned(logits: "torch.Tensor | TopKLogits", banned: list[int],
                    copy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(float logits with the ``banned`` ids at -inf, the kept token ids for a ``TopKLogits`` or
    None). Dense rows are written in place unless ``copy``: the sampler hands ``draw`` its own
    gathered copy, so it saves one (M, V) copy per row and step."""
    if isinstance(logits, TopKLogits):
        ban = torch.isin(logits.indices, torch.tensor(banned, device=logits.indices.device))
        return logits.values.float().masked_fill(ban, -math.inf), logits.indices
    lg = logits.float()
    if copy:
        lg = lg.clone()
    lg[:, banned] = -math.inf
    return lg, None


def draw(logits: "torch.Tensor | TopKLogits", banned: list[int], temperature: float,
         gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(confidence, token) per row of (M, V) logits or an (M, k) ``TopKLogits`` slice: the argmax at
    temperature 0, else a draw from softmax(logits / T); ``banned`` tokens never come out."""
    lg, ids = _without_banned(logits, banned, copy=False)
    if temperature <= 0:
        conf, choice = lg.softmax(-1).max(-1)
    else:
        p = (lg / temperature).softmax(-1)
        choice = torch.multinomial(p, 1, generator=gen).squeeze(1)
        conf = p.gather(1, choice[:, None]).squeeze(1)
    if ids is not None:
        choice = ids.gather(1, choice[:, None]).squeeze(1)
    return conf, choice


def _subset(rows: "torch.Tensor | TopKLogits", keep: torch.Tensor) -> "torch.Tensor | TopKLogits":
    if isinstance(rows, TopKLogits):
        return TopKLogits(rows.values[keep], rows.indices[keep], rows.vocab_size)
    return rows[keep]


def draw_cdf(logits: "torch.Tensor | TopKLogits", banned: list[int], temperature: float,
             gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Like ``draw``, from the same distribution, by inverse CDF: one uniform per row instead of
    ``torch.multinomial``'s exponential per vocabulary entry (a different random stream)."""
    if temperature <= 0:
        return draw(logits, banned, temperature, gen)
    lg, ids = _without_banned(logits, banned, copy=True)
    p = (lg / temperature).softmax(-1)
    cdf = p.cumsum(-1)
    u = torch.rand(p.shape[0], 1, generator=gen).to(p.device) * cdf[:, -1:]
    # the first entry whose cumulative mass passes u: never a zero-probability (banned) token
    choice = torch.searchsorted(cdf, u, right=True).clamp_(max=p.shape[1] - 1)
    conf = p.gather(1, choice).squeeze(1)
    if ids is not None:
        choice = ids.gather(1, choice)
    return conf, choice.squeeze(1)


def draw_mixed(logits: "torch.Tensor | TopKLogits", cheap: torch.Tensor, banned: list[int], temperature: float,
               gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``draw`` for the rows where ``cheap`` (M,) is False, ``draw_cdf`` where it is True."""
    if not bool(cheap.any()):
        return draw(logits, banned, temperature, gen)
    if bool(cheap.all()):
        return draw_cdf(logits, banned, temperature, gen)
    exact = ~cheap
    conf_e, choice_e = draw(_subset(logits, exact), banned, temperature, gen)
    conf_c, choice_c = draw_cdf(_subset(logits, cheap), banned, temperature, gen)
    conf = torch.empty(cheap.shape[0], dtype=conf_e.dtype, device=conf_e.device)
    choice = torch.empty(cheap.shape[0], dtype=torch.long, device=choice_e.device)
    conf[exact], choice[exact] = conf_e, choice_e
    conf[cheap], choice[cheap] = conf_c, choice_c
    return conf, choice
