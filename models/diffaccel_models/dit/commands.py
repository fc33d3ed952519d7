"""The DiT adapter's commands (``diffaccel_register_commands``, declared in pyproject.toml):
``diffaccel train dit-digits`` and ``diffaccel dit-digits-accuracy``."""

from __future__ import annotations

import argparse

TRAIN_EXAMPLES = """
    examples:
      diffaccel train dit-digits --out runs/dit-digits --max-minutes 29 --threads 1
    Trains the digits DiT (PooledTextPixArtTransformer2DModel, time-budgeted) on scikit-learn's digits,
    its text encoder from the UNet digits model (frozen unless --train-text)."""

ACCURACY_EXAMPLES = """
    examples:
      diffaccel dit-digits-accuracy --checkpoint dit-digits --per-class 20
    The classifier's accuracy on generated digits ("digit N", seeds SEED...), per class and overall."""


def diffaccel_register_commands(commands) -> None:
    commands.add("dit-digits", group="train", help="train the digits DiT (the dit adapter's default model)",
                 arguments=_train_arguments, run=_train, examples=TRAIN_EXAMPLES)
    commands.add("dit-digits-accuracy", help="conditioning accuracy of a digits DiT, per class and overall",
                 arguments=_accuracy_arguments, run=_accuracy, examples=ACCURACY_EXAMPLES)


def _train_arguments(t: argparse.ArgumentParser) -> None:
    t.add_argument("--out", default="runs/dit-digits")
    t.add_argument("--max-minutes", type=float, default=29.0)
    t.add_argument("--batch", type=int, default=24)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, default=1)
    t.add_argument("--stock-pixart", action="store_true",
                   help="stock PixArtTransformer2DModel (prompt through cross-attention only; ignores it)")
    t.add_argument("--checkpoint-minutes", type=float, default=12.0)
    t.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default 2e-3, TrainDiTConfig's)")
    t.add_argument("--no-adaln-zero", action="store_true", help="keep diffusers' initialisation")
    t.add_argument("--text-from", default="digits",
                   help="start the text encoder from this UNet digits checkpoint ('none': random weights)")
    t.add_argument("--freeze-text", action="store_true", default=True, help="do not train the text encoder (default)")
    t.add_argument("--train-text", dest="freeze_text", action="store_false", help="train the text encoder too")


def _train(args: argparse.Namespace) -> int:
    from .digits import run_train

    return run_train(args)


def _accuracy_arguments(e: argparse.ArgumentParser) -> None:
    from diffaccel.adapters.diffusers.digits import add_eval_arguments

    add_eval_arguments(e, "dit-digits", "TextDiTPipeline")


def _accuracy(args: argparse.Namespace) -> int:
    from .digits import run_accuracy

    return run_accuracy(args)
