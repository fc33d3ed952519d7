"""DiffusionGemma's command (``diffaccel_register_commands``, declared in pyproject.toml):
``diffaccel diffusion-gemma-build``, a random-weights checkpoint to run offline."""

from __future__ import annotations

import argparse

EXAMPLES = """
    examples:
      diffaccel diffusion-gemma-build --size tiny --out runs/diffusion-gemma-tiny
      diffaccel diffusion-gemma-build --size mid --out runs/diffusion-gemma-mid
    Writes a random-weights DiffusionGemma checkpoint (save_pretrained: config.json, model.safetensors,
    a tokenizer), the offline stand-in the example configs point at; its text is noise."""


def diffaccel_register_commands(commands) -> None:
    commands.add("diffusion-gemma-build", help="write a random-weights DiffusionGemma checkpoint (offline stand-in)",
                 arguments=_arguments, run=_build, examples=EXAMPLES)


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size", choices=("mid", "tiny"), default="tiny", help="tiny (tests) or mid (speed runs)")
    p.add_argument("--out", required=True, help="folder to write (config.json, model.safetensors, tokenizer)")
    p.add_argument("--seed", type=int, default=0)


def _build(args: argparse.Namespace) -> int:
    from .build import run

    return run(args)
