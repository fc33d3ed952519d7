"""The UNet adapter's commands (``diffaccel_register_commands``): ``diffaccel train digits`` and
``diffaccel digits-accuracy``."""

from __future__ import annotations

import argparse

EXAMPLES = """
    examples:
      diffaccel train digits --out runs/digits --max-minutes 27
      diffaccel train digits --out runs/digits-more --init runs/digits --max-minutes 10
    Trains the default image model (a 1.7M-parameter class-conditional UNet) on scikit-learn's digits."""


ACCURACY_EXAMPLES = """
    examples:
      diffaccel digits-accuracy --checkpoint digits --per-class 50 --steps 50 --guidance 2.0 --threads 2
    The classifier's accuracy on generated digits ("digit N", seeds SEED...), per class and overall."""


def diffaccel_register_commands(commands) -> None:
    commands.add("digits", group="train", help="train the digits UNet (the unet adapter's default model)",
                 arguments=_arguments, run=_train, examples=EXAMPLES)
    commands.add("digits-accuracy", help="conditioning accuracy of a digits model, per class and overall",
                 arguments=_accuracy_arguments, run=_accuracy, examples=ACCURACY_EXAMPLES)


def _arguments(t: argparse.ArgumentParser) -> None:
    t.add_argument("--out", required=True, help="output folder")
    t.add_argument("--steps", type=int, help="optimiser steps at most (default: as many as --max-minutes allow)")
    t.add_argument("--max-minutes", type=float, help="stop after this many minutes (default 27)")
    t.add_argument("--threads", type=int, default=2, help="torch threads at most (default 2)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--init", metavar="FOLDER", help="continue from this model's weights")
    t.add_argument("--lr", type=float, help="peak learning rate (default 1e-3)")


def _train(args: argparse.Namespace) -> int:
    # deferred: the training code is imported by 'diffaccel train' only, not by every use of the adapter
    import torch

    from .digits import TrainDigitsConfig, train_digits

    given = {k: v for k, v in (("lr", args.lr), ("steps", args.steps), ("max_minutes", args.max_minutes)) if v is not None}
    cfg = TrainDigitsConfig(out=args.out, seed=args.seed, threads=args.threads, init=args.init, **given)
    torch.set_num_threads(cfg.threads)  # set by command-line entry points only, never by library code
    print(f"wrote {train_digits(cfg)}")
    return 0


def _accuracy_arguments(e: argparse.ArgumentParser) -> None:
    from diffaccel.adapters.diffusers.digits import add_eval_arguments

    add_eval_arguments(e, "digits", "DigitsPipeline")
    e.add_argument("--classifier-check", action="store_true", help="also print the classifier's 5-fold accuracy on load_digits")


def _accuracy(args: argparse.Namespace) -> int:
    from .digits import run_accuracy

    return run_accuracy(args)
