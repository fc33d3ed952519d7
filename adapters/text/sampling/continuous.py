"""The continuous samplers' loop (``ddim``, ``ddpm``, ``hybrid``): diffusion in the model's normalised
embedding space, the model's predicted clean tokens giving the clean estimate; ``hybrid`` runs DDIM
for the first third of the steps, DDPM for the middle third, DDIM last (``TextDiffusionPipeline``
runs it)."""

from __future__ import annotations

from typing import Any

import torch

from diffaccel.adapterkit import RunSequence

from .logits import TopKLogits, clean_estimate, most_probable
from .outputs import CommitProposal
from .run_context import _refresh_computed


def _continuous_proposal(ctx: Any, logits: Any, fixed: torch.Tensor, temperature: float,
                        steps_left: int) -> CommitProposal:
    """A continuous sampler's step as a ``CommitProposal``: every position not yet fixed is a
    candidate with its current top-1; the sampler commits nothing on its own (``scheduled`` is
    empty). A committed position is a known token from then on, as the prompt's are."""
    prob, top1 = logits.top1() if isinstance(logits, TopKLogits) else most_probable(logits.float())
    computed = None if logits is not ctx.logits or ctx.head_sel is None else ctx.head_sel.mask()
    B = fixed.shape[0]
    return CommitProposal(candidates=~fixed, tokens=top1, confidence=prob, scheduled=torch.zeros_like(fixed),
                          logits=logits, computed=computed, temperature=temperature, steps_left=[steps_left] * B)


def continuous_loop(pipe, ctx, seq: RunSequence, base, fixed, steps, sampler, temperature, gens, bar):
    """A continuous sampler from noise; positions in ``fixed`` follow their known tokens. Returns the argmax."""
    run, den = ctx.run, ctx.den
    B, N = base.shape
    E = den.token_latents()  # (V, E)
    ab_all = den.alphas_cumprod.to(pipe.device)
    T = ab_all.shape[0]
    ts = torch.linspace(T - 1, 0, steps).round().long().tolist()
    z = torch.stack([torch.randn(N, E.shape[1], generator=g) for g in gens]).to(pipe.device)
    prefix_noise = torch.stack([torch.randn(N, E.shape[1], generator=g) for g in gens]).to(pipe.device)
    prefix_latent = E[base.clamp(min=0)]
    x0 = None
    for s, t in enumerate(ts):
        run.step, run.timestep = s, t
        ab = ab_all[t]
        # prompt positions follow the forward process of their known tokens
        z = torch.where(fixed[..., None], ab.sqrt() * prefix_latent + (1 - ab).sqrt() * prefix_noise, z)
        logits = pipe._step_model(ctx, seq, z, torch.tensor(float(t), device=pipe.device))
        x0 = _refresh_computed(ctx, logits, x0, lambda lg: clean_estimate(lg, E, max(temperature, 1e-6)))
        ab_prev = ab_all[ts[s + 1]] if s + 1 < len(ts) else torch.tensor(1.0, device=pipe.device)
        eps = (z - ab.sqrt() * x0) / (1 - ab).clamp(min=1e-8).sqrt()
        mode = sampler if sampler != "hybrid" else ("ddpm" if steps // 3 <= s < 2 * steps // 3 else "ddim")
        if mode == "ddim" or s + 1 == len(ts):
            z = ab_prev.sqrt() * x0 + (1 - ab_prev).sqrt() * eps
        else:
            sigma = ((1 - ab_prev) / (1 - ab) * (1 - ab / ab_prev)).clamp(min=0).sqrt()
            noise = torch.stack([torch.randn(N, E.shape[1], generator=g) for g in gens]).to(pipe.device)
            z = ab_prev.sqrt() * x0 + (1 - ab_prev - sigma**2).clamp(min=0).sqrt() * eps + sigma * noise
        proposed: list[CommitProposal] = []  # built only if a strategy commits
        extra = seq.commit(lambda: proposed.append(_continuous_proposal(ctx, logits, fixed, temperature, steps - s))
                           or proposed[0])
        if extra is not None:  # committed positions are known tokens from now on, like the prompt's
            newly = extra.to(fixed.device) & ~fixed
            base[newly] = proposed[0].tokens[newly]
            fixed |= newly
            prefix_latent = E[base.clamp(min=0)]
        pipe._post(ctx, seq, None, logits, None, fixed, latents=z)  # tokens: the top-1, found there
        bar.update(1)
        if seq.stopped:  # a strategy ended the run early
            break
    return logits.argmax(-1)
