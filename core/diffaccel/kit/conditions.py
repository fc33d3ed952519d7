"""Condition-vector files: per text line, the vector an external condition encoder gave it.

A model with a condition input (``run.info.tokens.cond_dim`` > 0, the ``pinned-tokens``
capability's ``run.condition``) is trained on the vectors a strategy's encoder gives its training
lines, so that what it sees in training is what the strategy feeds it at generation. The
strategy writes them (bert-cond: ``diffaccel bert-cond-conditions``), the adapter's
training reads them (``diffaccel train text --conditions FILE``); this module is the format both
share, so neither imports the other.

A file is safetensors: ``vectors`` (n, d) float32, and in its metadata ``lines`` (the n lines, a
JSON list), ``terms`` (per line the terms its vector came from, a JSON list of lists) and
``recipe`` (how it was made, a JSON object).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file


def save(path: str | Path, lines: Sequence[str], terms: Sequence[Sequence[str]], vectors: torch.Tensor, meta: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"vectors": vectors.float().contiguous()}, str(path),
              metadata={"lines": json.dumps(list(lines)), "terms": json.dumps([list(t) for t in terms]),
                        "recipe": json.dumps(meta)})


def load(path: str | Path, with_terms: bool = False) -> tuple:
    """(lines, vectors (n, d)) of a file written by ``save``, and the terms if ``with_terms``."""
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
        vectors = f.get_tensor("vectors")
    lines = json.loads(meta["lines"])
    if len(lines) != vectors.shape[0]:
        raise ValueError(f"{path}: {len(lines)} lines but {vectors.shape[0]} vectors")
    return (lines, vectors, json.loads(meta["terms"])) if with_terms else (lines, vectors)
