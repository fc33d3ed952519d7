"""Solving and scoring task problems with the real sampler (training evaluations, the adapter)."""

from __future__ import annotations

import torch

from ..sampling.denoisers import ReferenceDenoiser
from ..sampling.pipeline import TextDiffusionPipeline


def generated_lines(tok, tokens: torch.Tensor, prompt_length: int) -> list[str]:
    """The generation of one row (tokens after its prompt) as text lines."""
    return tok.decode(tokens[prompt_length:].tolist()).split("\n")




@torch.no_grad()
def solve(spec, model, tok, problems, steps: int | None = None, batch: int = 50) -> list[tuple[float, float]]:
    """(acc, second metric) per problem: greedy, confidence order, ``steps`` (default: full)."""
    pipe = TextDiffusionPipeline(ReferenceDenoiser(model), tok, name=spec.key)
    scores = []
    for i in range(0, len(problems), batch):
        part = problems[i: i + batch]
        o = pipe([p.prompt for p in part], length=spec.max_len, steps=steps or spec.steps, temperature=0.0, progress=False)
        scores += [(s[spec.metrics[0]], s[spec.metrics[1]]) for s in
                   (spec.score(p, generated_lines(tok, row, n)) for p, row, n in zip(part, o.tokens, o.prompt_lengths))]
    return scores
