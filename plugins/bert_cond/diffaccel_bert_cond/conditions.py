"""Stage-one conditions of training glosses, computed once for ``diffaccel train text --conditions``.

The conditional reference model (``wordnet-masked-cond``) learns from the condition vectors that
bert-cond's own extractor gives each training line: the same candidates, the same MiniLM, the
same MMR choice (``extract.select``), so what the model sees in training is what the strategy
feeds it at generation. Embedding every candidate of every line per training step would cost far
more than the model's step, so they are computed here once and written to a safetensors file
(the core's condition-vector format, ``diffaccel.kit.conditions``) that the text adapter's training
reads. Sources and candidates are embedded in batches, a candidate text once per file. The lines
come from a text file (one per line), which the text adapter writes from its corpus:

    diffaccel text-corpus --split train --out /tmp/cond/train-lines.txt
    diffaccel bert-cond-conditions --lines-from /tmp/cond/train-lines.txt \\
        --out /tmp/cond/wordnet-cond.safetensors --lines 12000
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch

from diffaccel.contract.errors import ConfigError
from diffaccel.kit.conditions import load, save

from .candidates import candidates
from .config import MINILM
from .extract import Encoder, select


def eligible(line: str, min_words: int, max_words: int) -> bool:
    """Lines of the length the bench's sources have (the held-out rule: 6 to 20 words)."""
    return min_words <= len(line.split()) <= max_words


def compute(lines: list[str], encoder: Encoder, *, batch: int = 64, max_terms: int = 5, ngram_max: int = 3,
            diversity: float = 0.5, minutes: float = 0.0, log=print) -> tuple[list[str], list[tuple[str, ...]], torch.Tensor]:
    """(lines kept, their terms, their vectors (n, hidden)) for ``lines`` with at least one
    candidate; stops after ``minutes`` (0: no limit) at a batch boundary."""
    cache: dict[str, torch.Tensor] = {}
    kept, terms, vectors = [], [], []
    t0 = time.time()
    for b in range(0, len(lines), batch):
        chunk = [(s, candidates(s, ngram_max)) for s in lines[b:b + batch]]
        chunk = [(s, c) for s, c in chunk if c]
        docs = encoder.embed([s for s, _ in chunk]) if chunk else None
        new = sorted({c.text for _, cs in chunk for c in cs} - cache.keys(), key=len)
        for i in range(0, len(new), 256):  # similar lengths together: little padding
            for text, e in zip(new[i:i + 256], encoder.embed(new[i:i + 256])):
                cache[text] = e
        for (s, cs), doc in zip(chunk, docs if docs is not None else []):
            cond = select(s, cs, doc, torch.stack([cache[c.text] for c in cs]), max_terms=max_terms, diversity=diversity)
            kept.append(s)
            terms.append(cond.terms)
            vectors.append(cond.vector)
        elapsed = time.time() - t0
        if (b // batch) % 20 == 0:
            log(f"{len(kept)} lines, {len(cache)} candidates embedded, {elapsed / 60:.1f} min")
        if minutes and elapsed > minutes * 60:
            break
    return kept, terms, torch.stack(vectors)


HELP = "stage-one conditions (key terms, MiniLM vectors) of training lines, for diffaccel train text --conditions"
EXAMPLES = """
examples:
  diffaccel text-corpus --split train --out /tmp/cond/train-lines.txt
  diffaccel bert-cond-conditions --lines-from /tmp/cond/train-lines.txt --out /tmp/cond/wordnet-cond.safetensors --lines 12000
  diffaccel bert-cond-conditions --out /tmp/cond/all.safetensors --merge /tmp/cond/shard0.safetensors /tmp/cond/shard1.safetensors
Draws --lines lines of 6 to 20 words from --lines-from, gives each the key terms and condition vector
bert-cond's extractor gives it at generation, and writes them (safetensors, diffaccel.kit.conditions);
--offset draws a different shard, --merge joins shards."""


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", required=True, help="safetensors file to write (keep it out of git)")
    ap.add_argument("--lines-from", metavar="FILE",
                    help="text file of the lines to draw from, one per line (diffaccel text-corpus)")
    ap.add_argument("--lines", type=int, default=12000, help="training lines to condition, drawn at random")
    ap.add_argument("--offset", type=int, default=0, help="skip this many of the drawn lines (one shard per process)")
    ap.add_argument("--min-words", type=int, default=6)
    ap.add_argument("--max-words", type=int, default=20)
    ap.add_argument("--minutes", type=float, default=0.0, help="stop after this long (0: no limit)")
    ap.add_argument("--bert", default=MINILM)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--merge", nargs="+", metavar="FILE", help="instead: join these files (shards) into --out")


def precheck(a: argparse.Namespace) -> None:
    """The options and files, before torch or MiniLM loads: one line naming the option."""
    if not a.merge and not a.lines_from:
        raise ConfigError("--lines-from: required (unless --merge): the text file of lines to draw from")
    for flag, path in [("--lines-from", a.lines_from)] + [("--merge", f) for f in a.merge or []]:
        if path and not Path(path).is_file():
            raise ConfigError(f"{flag}: {path}: no such file")
    if a.lines < 1 or a.offset < 0 or a.threads < 1:
        raise ConfigError(f"--lines, --threads: 1 or more, --offset: 0 or more; got {a.lines}, {a.threads}, {a.offset}")


def run(a: argparse.Namespace) -> int:
    """``diffaccel bert-cond-conditions``: compute (or ``--merge``) a conditions file."""
    if a.merge:
        parts = [load(f, with_terms=True) for f in a.merge]
        save(Path(a.out), [x for p in parts for x in p[0]], [x for p in parts for x in p[2]], torch.cat([p[1] for p in parts]),
             {"merged": a.merge})
        print(f"wrote {a.out}: {sum(len(p[0]) for p in parts)} lines")
        return 0
    torch.set_num_threads(a.threads)
    source = Path(a.lines_from).read_text(encoding="utf-8").split("\n")
    pool = sorted({s for s in source if eligible(s, a.min_words, a.max_words)})
    random.Random(a.seed).shuffle(pool)
    t0 = time.time()
    lines, terms, vectors = compute(pool[a.offset:a.offset + a.lines], Encoder(a.bert), minutes=a.minutes)
    recipe = {k: v for k, v in vars(a).items() if not callable(v)}  # the options (the command line's own entries are functions)
    save(Path(a.out), lines, terms, vectors, {**recipe, "eligible": len(pool), "minutes_taken": (time.time() - t0) / 60})
    print(f"wrote {a.out}: {len(lines)} lines in {(time.time() - t0) / 60:.1f} min")
    return 0


def register(commands) -> None:
    commands.add("bert-cond-conditions", help=HELP, arguments=arguments, run=run, precheck=precheck, examples=EXAMPLES)
