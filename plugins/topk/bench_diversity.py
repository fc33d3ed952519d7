"""Diversity and fluency of top-k sampling against argmax decoding, with self-similarity.

    python plugins/topk/bench_diversity.py CHECKPOINT [--seed 100] [--samples 8] [--temperature 0.5 0.7] [--rank model gumbel]

Generates ``--samples`` unconditional samples (seeds seed, seed+1, ...) per variant with the
masked sampler at temperature 0 (argmax, the baseline) and with ``topk`` (k = 5, k_keep = 128,
at_steps) at each temperature and rank, and prints n-gram perplexity, distinct-1/2 over all
samples and their self-similarity (mean pairwise Jaccard of word-bigram sets; 1: all alike).
``diffaccel bench configs/text-topk.toml --seeds 8`` reports the same except self-similarity.
"""

from __future__ import annotations

import argparse

import torch

import diffaccel
from diffaccel.adapters.text.loading import load_pipeline
from diffaccel.adapters.text.metrics import text_quality
from diffaccel_topk import TopK, TopKConfig, self_similarity


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", help="a masked text model: wordnet-masked or a saved model folder")
    ap.add_argument("--seed", type=int, default=100, help="first seed (default 100: not the bench's 0..7)")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--temperature", type=float, nargs="+", default=[0.5])
    ap.add_argument("--rank", nargs="+", default=["model"], choices=["model", "gumbel"])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pipe = load_pipeline(args.checkpoint)
    variants = [("argmax", None)] + [(f"topk k={args.k} T={t} rank={r}", TopKConfig(k=args.k, temperature=t, at_steps=True, rank=r))
                                     for r in args.rank for t in args.temperature]
    base = None
    for name, cfg in variants:
        texts = []
        for s in range(args.seed, args.seed + args.samples):
            with diffaccel.apply(pipe, strategies=[TopK(cfg)] if cfg else []):
                texts += pipe(length=128, steps=128, seed=s, temperature=0.0, progress=False).texts
        q = text_quality(texts)
        base = base or q
        print(f"{name:30s} perplexity {q['perplexity']:7.1f} ({q['perplexity'] / base['perplexity']:.2f}x)  "
              f"distinct_1 {q['distinct_1']:.3f}  distinct_2 {q['distinct_2']:.3f} ({q['distinct_2'] / base['distinct_2']:.1f}x)  "
              f"self_similarity {self_similarity(texts):.3f}", flush=True)


if __name__ == "__main__":
    main()
