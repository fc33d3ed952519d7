"""The text adapter's training and evaluation commands (``diffaccel_register_commands``, declared in
pyproject.toml): ``diffaccel train smollm2-dlm`` and ``diffaccel smollm2-dlm-export`` (the recipe
that adapts SmolLM2-135M into a masked diffusion LM), ``diffaccel dlm-eval`` (its go/no-go) and
``diffaccel cond-check`` (does a conditional model's vector steer it). Light: each command's module
is imported when it runs."""

from __future__ import annotations

import argparse
from pathlib import Path

ADAPT_EXAMPLES = """
    examples:
      diffaccel train smollm2-dlm --out /work/runs-smollm2/run1 --lr 1e-3 --threads 1
    Adapts SmolLM2-135M-Instruct into a masked diffusion LM (a LoRA delta; resumes a run folder).
    Needs apt-get install wordnet-base and the adapt extra (peft)."""

EXPORT_EXAMPLES = """
    examples:
      diffaccel smollm2-dlm-export /work/runs-smollm2/run1 models/diffaccel_models/assets/smollm2-dlm
    Writes a smollm2-dlm run's state.pt as a delta folder (fp16 safetensors), what the loader reads."""

EVAL_EXAMPLES = """
    examples:
      diffaccel dlm-eval DELTA_FOLDER --samples 64 --seed 1000
      diffaccel dlm-eval /work/runs-smollm2/run1/snapshots/step-600.pt --samples 64 --seed 1000
    Samples the adapted diffusion LM and judges its lines against held-out WordNet lines of the same
    token lengths (SmolLM2-135M's perplexity): the go/no-go of docs/models.md."""

COND_EXAMPLES = """
    examples:
      diffaccel cond-check --conditions runs/conditions/heldout.safetensors wordnet-masked-cond
    A held-out loss check, no sampling: each held-out line masked, the rest at --mask-rest, the
    cross-entropy without and with the line's condition vector."""


def diffaccel_register_commands(commands) -> None:
    commands.add("smollm2-dlm", group="train", help="adapt SmolLM2-135M into a masked diffusion LM (a LoRA delta)",
                 arguments=_adapt_arguments, run=_adapt, examples=ADAPT_EXAMPLES)
    commands.add("smollm2-dlm-export", help="write a smollm2-dlm run as a delta folder (fp16 safetensors)",
                 arguments=_export_arguments, run=_export, examples=EXPORT_EXAMPLES)
    commands.add("dlm-eval", help="go/no-go of an adapted diffusion LM against held-out lines, judged",
                 arguments=_eval_arguments, run=_eval, examples=EVAL_EXAMPLES)
    commands.add("cond-check", help="does a conditional text model's vector steer it (held-out loss, no sampling)",
                 arguments=_cond_arguments, run=_cond, examples=COND_EXAMPLES)


def _adapt_arguments(p: argparse.ArgumentParser) -> None:
    from .adapt import add_train_arguments  # the recipe's fields (AdaptConfig), one place

    add_train_arguments(p)


def _adapt(args: argparse.Namespace) -> int:
    from .adapt import run_train

    return run_train(args)


def _export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", type=Path, help="the run folder (its state.pt)")
    p.add_argument("dst", type=Path, help="the delta folder to write")
    p.add_argument("--base", default="smollm2", help="the base: 'smollm2' (the GGUF) or a LLaMA causal LM folder")


def _export(args: argparse.Namespace) -> int:
    from .adapt import run_export

    return run_export(args)


def _eval_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", type=Path, help="a smollm2-dlm delta folder, a training run folder (state.pt) or a snapshot .pt")
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--seed", type=int, default=1000, help="first sampling seed (held-out: training never samples)")
    p.add_argument("--offset", type=int, default=0, help="first held-out line of the fixed shuffle")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--judge", default="smollm2")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path, help="also write the figures and samples here")


def _eval(args: argparse.Namespace) -> int:
    from .dlm_eval import run

    return run(args)


def _cond_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("models", nargs="+", help="conditional checkpoints: folders or shipped names")
    p.add_argument("--conditions", required=True, help="held-out conditions (conditions --split heldout)")
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--mask-rest", type=float, default=0.5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--split", choices=["heldout", "train"], default="heldout",
                   help="where the file's lines come from (train: a training conditions file, to see how much of "
                        "what the model learnt carries over to held-out lines)")
    p.add_argument("--limit", type=int, default=0, help="the first N lines of the file only (0: all)")


def _cond(args: argparse.Namespace) -> int:
    from .cond_check import run

    return run(args)
