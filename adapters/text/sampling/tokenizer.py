"""A small BPE tokenizer for the default text models (HF ``tokenizers``, SentencePiece-style spaces).

Lines are separated by the ``[SEP]`` token, which decodes to a newline, so a generated
sequence of 128 tokens reads as a few gloss-like lines.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

PAD, UNK, MASK, SEP = "[PAD]", "[UNK]", "[MASK]", "[SEP]"
SPECIALS = [PAD, UNK, MASK, SEP]


def train_tokenizer(lines: list[str], vocab_size: int = 4096) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, min_frequency=2, show_progress=False)
    tok.train_from_iterator(lines, trainer=trainer)
    return tok


__all__ = ["HFTokenizer", "TextTokenizer", "train_tokenizer"]


class TextTokenizer:
    """Thin wrapper: ids <-> text, with the special ids the samplers need."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self.pad_id = tok.token_to_id(PAD)
        self.mask_id = tok.token_to_id(MASK)
        self.sep_id = tok.token_to_id(SEP)
        self.unk_id = tok.token_to_id(UNK)
        self.vocab_size = tok.get_vocab_size()
        self.special_ids = {self.pad_id, self.mask_id, self.sep_id, self.unk_id}

    @classmethod
    def from_file(cls, path: str | Path) -> "TextTokenizer":
        return cls(Tokenizer.from_file(str(path)))

    def save(self, path: str | Path) -> None:
        self.tok.save(str(path))

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_lines(self, lines: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(lines, add_special_tokens=False)]

    def decode(self, ids) -> str:
        """Decode ids; [SEP] becomes a line break, [MASK] shows as _ and [PAD] is dropped."""
        out, piece = [], []
        for i in ids:
            i = int(i)
            if i == self.sep_id or i == self.mask_id:
                out.append(self.tok.decode(piece))
                piece = []
                out.append("\n" if i == self.sep_id else " _ ")
            elif i != self.pad_id:
                piece.append(i)
        out.append(self.tok.decode(piece))
        text = "".join(out)
        return "\n".join(line.strip() for line in text.split("\n"))


class HFTokenizer:
    """A transformers tokenizer behind the small interface the pipeline uses: ``encode(text) ->
    list[int]`` (no special tokens added), ``decode(ids) -> str`` (special tokens dropped), and
    ``mask_id``, ``vocab_size`` (added tokens included), ``special_ids``."""

    def __init__(self, tok):
        self.tok = tok
        self.mask_id = tok.mask_token_id
        self.vocab_size = len(tok)
        self.special_ids = set(tok.all_special_ids)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=True)
