"""The text adapter's commands (``diffaccel_register_commands``): ``diffaccel train text``."""

from __future__ import annotations

import argparse

EXAMPLES = """
    examples:
      diffaccel train text --kind masked --out runs/text-masked
      diffaccel train text --kind continuous --tokenizer runs/text-masked/tokenizer.json --out runs/text-continuous
    Trains the reference text diffusion LM on WordNet glosses (apt-get install wordnet-base)."""


def diffaccel_register_commands(commands) -> None:
    commands.add("text", group="train", help="train the reference text diffusion LM on WordNet glosses",
                 arguments=_arguments, run=_train, examples=EXAMPLES)


def _arguments(t: argparse.ArgumentParser) -> None:
    t.add_argument("--kind", choices=["masked", "continuous"], default="masked")
    t.add_argument("--out", required=True, help="output folder")
    t.add_argument("--steps", type=int, default=1400, help="optimiser steps (default 1400)")
    t.add_argument("--max-minutes", type=float, default=0.0, help="stop after this many minutes (default 0: no limit)")
    t.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    t.add_argument("--tokenizer", help="reuse this tokenizer.json")
    t.add_argument("--freq-weight", type=float, default=0.0, help="rare-token loss weighting exponent")
    t.add_argument("--schedule", choices=["linear", "cosine", "scaled-linear"], default="cosine")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--latent-norm", type=float, help="continuous: norm of the token latents (default sqrt(64) = 8)")
    t.add_argument("--init-embeddings", metavar="BERT", help="masked: initialise frozen token embeddings from this BERT")
    t.add_argument("--init", metavar="FOLDER", help="continue from this model's weights (a folder or shipped name, its tokenizer too)")
    t.add_argument("--lr", type=float, help="peak learning rate (default 3e-3)")
    t.add_argument("--batch", type=int, help="sequences per step (default 32)")
    t.add_argument("--conditions", metavar="FILE", help="masked: per-line condition vectors (diffaccel bert-cond-conditions)")
    t.add_argument("--cond-dropout", type=float, default=0.15, help="share of sequences trained without their condition")
    t.add_argument("--cond-only", action="store_true", help="with --init and --conditions, train the condition path alone")
    t.add_argument("--cond-line-weight", type=float, default=1.0, help="loss weight of the conditioned line (1 elsewhere)")
    t.add_argument("--cond-term-weight", type=float, default=1.0, help="loss weight of the line's key-term tokens")
    t.add_argument("--cond-term-mask", type=float, default=0.0, help="chance a key-term token is masked whatever the noise level")


def _train(args: argparse.Namespace) -> int:
    # deferred: the training code is imported by 'diffaccel train' only, not by every use of the adapter
    import torch

    from .training.train import TrainConfig, train

    cfg = TrainConfig(kind=args.kind, out=args.out, steps=args.steps, max_minutes=args.max_minutes,
                      tokenizer=args.tokenizer, freq_weight=args.freq_weight, schedule=args.schedule, seed=args.seed,
                      init_embeddings=args.init_embeddings, latent_norm=args.latent_norm, threads=args.threads,
                      init_from=args.init, conditions=args.conditions, cond_dropout=args.cond_dropout, cond_only=args.cond_only,
                      cond_line_weight=args.cond_line_weight, cond_term_weight=args.cond_term_weight,
                      cond_term_mask=args.cond_term_mask,
                      **{k: v for k, v in (("lr", args.lr), ("batch", args.batch)) if v is not None})
    torch.set_num_threads(cfg.threads)  # set by command-line entry points only, never by library code
    print(f"wrote {train(cfg)}")
    return 0
