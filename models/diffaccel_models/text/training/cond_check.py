"""Does the condition vector steer a conditional model? A held-out loss check, no sampling.

For each held-out line of a conditions file (``diffaccel.kit.conditions``' format, written by
``diffaccel bert-cond-conditions --lines-from`` over the lines of ``diffaccel text-corpus --split heldout``: lines neither training nor the bench's sources
use), a sequence of ``--length`` tokens starts at the line and goes on with the lines after it.
The line's tokens are all masked (as at the start of a generation), every other position with a
fixed chance ``--mask-rest``; the model's cross-entropy is read at the line's tokens, at its key terms' tokens and at the rest, with
the line's vector and without (the unconditioned run). A condition that steers lowers the
first two; the third shows what it does to the text around.

    diffaccel cond-check --conditions runs/conditions/heldout.safetensors \\
        wordnet-masked-cond runs/text-masked-cond
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from diffaccel.kit.conditions import load

from diffaccel.adapters.text.loading.corpus import source_lines
from diffaccel.adapters.text.loading.reference import SHIPPED, shipped_path
from diffaccel.adapters.text.sampling.model import TextDiffusionLM
from diffaccel.adapters.text.sampling.tokenizer import TextTokenizer
from .train import term_mask


def sequences(tok, lines: list[str], pool: list[str], terms: list, length: int):
    """(ids (n, length), line mask, term mask): each sequence is the line, [SEP], then the lines
    after it in ``pool``; term tokens are found as in running text (a leading space)."""
    where = {s: i for i, s in enumerate(pool)}
    ids, line, term = [], [], []
    for text, ts in zip(lines, terms):
        seq = tok.encode(text) + [tok.sep_id]
        n = len(seq)
        j = where[text] + 1
        while len(seq) < length:
            seq += tok.encode(pool[j % len(pool)]) + [tok.sep_id]
            j += 1
        seq = seq[:length]
        ids.append(seq)
        line.append(torch.arange(length) < n)
        term.append(term_mask(tok, seq[:n], ts, length))
    return torch.tensor(ids), torch.stack(line), torch.stack(term)


@torch.no_grad()
def check(model, ids, line, term, vectors, mask_rest: float, seed: int = 0, batch: int = 32) -> dict[str, float]:
    gen = torch.Generator().manual_seed(seed)
    masked = line | (torch.rand(ids.shape, generator=gen) < mask_rest)
    x = torch.where(masked, torch.full_like(ids, model.config.mask_id), ids)
    sums = {}
    for cond in (False, True):
        ce = []
        for b in range(0, len(ids), batch):
            logits = model(x[b:b + batch], cond=vectors[b:b + batch] if cond else None)
            ce.append(F.cross_entropy(logits.transpose(1, 2).float(), ids[b:b + batch], reduction="none"))
        ce = torch.cat(ce)
        tag = "cond" if cond else "uncond"
        sums[f"line_{tag}"] = float(ce[line].mean())
        sums[f"terms_{tag}"] = float(ce[term].mean())
        sums[f"rest_{tag}"] = float(ce[masked & ~line].mean())
    return sums


def resolve(name: str) -> Path:
    return shipped_path(name) if name in SHIPPED else Path(name)


def run(a) -> int:
    """``diffaccel cond-check MODEL... --conditions FILE``: the held-out loss check, one line per model."""
    torch.set_num_threads(a.threads)  # set by command-line entry points only, never by library code
    lines, vectors, terms = load(a.conditions, with_terms=True)
    if a.limit:
        lines, vectors, terms = lines[:a.limit], vectors[:a.limit], terms[:a.limit]
    pool = source_lines(a.split)
    print(f"{len(lines)} {a.split} lines, {sum(len(t) for t in terms)} key terms; the line masked, the rest at {a.mask_rest}")
    print("model | CE line uncond -> cond | CE key terms uncond -> cond | CE rest uncond -> cond")
    for name in a.models:
        path = resolve(name)
        model = TextDiffusionLM.load(path)
        ids, line, term = sequences(TextTokenizer.from_file(path / "tokenizer.json"), lines, pool, terms, a.length)
        r = check(model, ids, line, term, vectors, a.mask_rest)
        print(f"{name} | {r['line_uncond']:.3f} -> {r['line_cond']:.3f} | {r['terms_uncond']:.3f} -> {r['terms_cond']:.3f} | "
              f"{r['rest_uncond']:.3f} -> {r['rest_cond']:.3f}", flush=True)
    return 0
