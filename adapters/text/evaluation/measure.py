"""What the core's measurement commands need from the text adapter (``diffaccel partial`` and
``diffaccel fluency``), behind the adapter protocol so that the core imports none of this."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from diffaccel.adapterkit import NULL
from diffaccel.contract.state import RunState, StepPlan

from . import metrics
from .judge import judge_lines
from ..sampling.pipeline import _RunContext


def time_partial_steps(pipe, config, fractions: tuple[float, ...], repeats: int) -> dict[float, list[float]]:
    """Seconds of one denoiser step at each fraction of the positions computed, interleaved
    (the order rotates each repeat); rows choose their own positions, as a strategy's rows would."""
    den, B, N = pipe.denoiser, config.model.batch, config.options.length
    gen = torch.Generator().manual_seed(0)
    if den.kind == "masked":
        x = torch.randint(4, den.vocab_size, (B, N), generator=gen)
        t = None
    else:
        x = torch.randn(B, N, den.token_latents().shape[1], generator=gen)
        t = torch.tensor(500.0)
    run = RunState(adapter="text", num_steps=1, batch_size=B)
    ctx = _RunContext(den, run)
    accel = NULL
    masks = {}
    for f in fractions:
        m = torch.zeros(B, N, dtype=torch.bool)
        for r in range(B):
            m[r, torch.randperm(N, generator=gen)[: max(1, int(N * f))]] = True
        masks[f] = m
    times: dict[float, list[float]] = {f: [] for f in fractions}
    with torch.no_grad():
        pipe._denoise(ctx, accel, x, t)  # fill the caches
        for i in range(repeats):
            k = i % len(fractions)
            for f in fractions[k:] + fractions[:k]:
                run.plan = None if f == 1.0 else StepPlan(positions=masks[f])
                t0 = time.perf_counter()
                pipe._denoise(ctx, accel, x, t)
                times[f].append(time.perf_counter() - t0)
    return times


def fluency_rows(pipe, config, seeds: int, run: Callable[..., Any], judge=None) -> Iterator[tuple[str, dict[str, Any]]]:
    """The model's samples (``seeds`` batches, each ``run(pipe, config, seed, progress=False)``: the
    adapter's run), held-out text, a unigram sampler and random tokens: (name, ``text_quality``
    dict, with ``gen_ppl`` under ``judge`` if given); the model's row also has ``samples``."""

    def quality(texts: list[str]) -> dict[str, Any]:
        q = metrics.text_quality(texts)
        if judge is not None:
            q["gen_ppl"] = judge.score(judge_lines(texts)).perplexity()
        return q

    texts = []
    for k in range(seeds):
        texts += run(pipe, config, config.model.seed + k * config.model.batch, progress=False).texts
    n_words = sum(len(metrics.words(t)) for t in texts)
    tok = pipe.tokenizer
    gen = torch.Generator().manual_seed(0)
    random_texts = [tok.decode(torch.randint(4, tok.vocab_size, (config.options.length,), generator=gen).tolist())
                    for _ in range(len(texts))]
    yield "model samples", {**quality(texts), "samples": len(texts)}
    yield "held-out text", quality(metrics.reference_lines()[:400])
    yield "unigram sampler", quality([metrics.unigram_sample(max(1, n_words // len(texts)), s) for s in range(len(texts))])
    yield "random tokens", quality(random_texts)
