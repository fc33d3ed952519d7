"""The offline English corpus of the default text models: WordNet glosses.

Debian's ``wordnet-base`` installs about 118k synsets in ``data.{noun,verb,adj,adv}``;
each carries a definition and often example sentences. We turn every synset into
``lemma: definition`` plus one line per example, and split train / held-out by a
hash of the synset offset so the split is stable across machines.
WordNet 3.0 is under the Princeton WordNet licence (BSD-like, attribution kept).
"""

from __future__ import annotations

import gzip
import hashlib
import re
from pathlib import Path

WORDNET_DIR = Path("/usr/share/wordnet")
#: the shipped held-out lines (gzip): the fluency model's first 90%, the bench's sources the rest
HELDOUT = Path(__file__).parents[1] / "assets" / "heldout.txt.gz"
PARTS = ("noun", "verb", "adj", "adv")
_QUOTED = re.compile(r'"([^"]+)"')


def _synset_lines(line: str) -> tuple[str, list[str]] | None:
    if line.startswith("  ") or "|" not in line:
        return None  # licence header
    head, gloss = line.split("|", 1)
    fields = head.split()
    offset, n_words = fields[0], int(fields[3], 16)
    lemma = fields[4].replace("_", " ")
    lemma = re.sub(r"\(.*\)$", "", lemma)  # adjective markers like (a)
    examples = [e.strip() for e in _QUOTED.findall(gloss)]
    definition = _QUOTED.sub("", gloss).strip().strip(";").strip()
    definition = re.sub(r"\s*;\s*(;\s*)*$", "", definition)
    lines = [f"{lemma}: {definition}"] if definition else []
    lines += [e for e in examples if len(e.split()) >= 3]
    del n_words
    return offset, lines


def read_wordnet(wordnet_dir: Path = WORDNET_DIR, heldout_percent: int = 5) -> tuple[list[str], list[str]]:
    """Return (train, heldout) lists of lines from the WordNet data files."""
    if not (wordnet_dir / "data.noun").exists():
        raise FileNotFoundError(
            f"{wordnet_dir}/data.noun not found: install Debian's wordnet-base (apt-get install wordnet-base)"
        )
    train: list[str] = []
    heldout: list[str] = []
    for part in PARTS:
        with open(wordnet_dir / f"data.{part}", encoding="utf-8", errors="replace") as f:
            for line in f:
                parsed = _synset_lines(line)
                if parsed is None:
                    continue
                offset, lines = parsed
                bucket = int(hashlib.sha1(f"{part}{offset}".encode()).hexdigest(), 16) % 100
                (heldout if bucket < heldout_percent else train).extend(lines)
    return train, heldout


def write_lines(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def read_lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line for line in f.read().split("\n") if line]


def heldout_lines() -> list[str]:
    return read_lines(HELDOUT)


def source_lines(split: str) -> list[str]:
    """Lines to condition (``diffaccel.kit.conditions``): WordNet's training lines (``train``), or the
    held-out lines that the bench's sources (the last 10% of the shipped held-out file) are not
    drawn from (``heldout``)."""
    if split == "heldout":
        lines = heldout_lines()
        return lines[: len(lines) * 9 // 10]
    if split == "train":
        return read_wordnet()[0]
    raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")


def run(args) -> int:
    """``diffaccel text-corpus --split train --out FILE``: the lines, one per line, for a strategy's
    condition encoder (bert-cond: ``diffaccel bert-cond-conditions --lines-from FILE``),
    which reads text files and no adapter."""
    lines = source_lines(args.split)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {len(lines)} {args.split} lines")
    return 0
