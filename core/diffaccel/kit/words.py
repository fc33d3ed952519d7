"""Words of a text, as diffaccel's text metrics and the strategies that match terms count them.

One rule for everyone who splits text into words (the text adapter's fluency and diversity
metrics, topk's distinct-n, bert-cond's term matching), so that a word means the same thing in
each. Model-agnostic: it reads decoded text, never a tokenizer.
"""

from __future__ import annotations

import re

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?|[^\sa-z0-9]")


def words(text: str) -> list[str]:
    """Lower-cased words (with an apostrophe suffix kept: ``don't``) and single punctuation marks."""
    return _WORD.findall(text.lower())
