"""Shared fixtures: a tiny random BERT with a small WordPiece vocabulary, built on the spot (as
transformers' own tests do), and helpers to run the strategy on diffaccel's tiny text model."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

WORDS = """the a of and to in is was by for his her mother father eurasian chinese velvet smooth soft sight hearing
touch taste fine payable city boston david beat goliath biggest upset since organism depends complex organic
substances nutrition family plants relating kidneys government faced serious protest bank america new york million
euros apples""".split()
PIECES = ["##s", "##es", "##ed", "##ing", "0", "1", "2", "3", "4", "5", "$", ",", ".", "%", ":", "(", ")"]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
HIDDEN = 32


def build_tiny_bert(path, hidden: int = HIDDEN, seed: int = 0) -> str:
    from transformers import BertConfig, BertModel, BertTokenizer

    path.mkdir(parents=True, exist_ok=True)
    vocab = SPECIALS + WORDS + PIECES + [c for c in "abcdefghijklmnopqrstuvwxyz"] + ["##" + c for c in "abcdefghijklmnopqrstuvwxyz"]
    vocab = list(dict.fromkeys(vocab))
    tok = BertTokenizer(vocab={t: i for i, t in enumerate(vocab)})  # transformers 5: `vocab`, a dict or a path
    assert tok.tokenize("velvet soft")[0] == "velvet", "the tiny WordPiece vocabulary did not load"
    tok.save_pretrained(str(path))
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=2 * hidden, max_position_embeddings=64)
    BertModel(cfg).eval().save_pretrained(str(path))
    return str(path)


@pytest.fixture(scope="session")
def tiny_bert_builder():
    """``build_tiny_bert`` itself, for tests that need another size (a fixture, since test
    modules cannot import conftest under pytest's importlib mode)."""
    return build_tiny_bert


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> str:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def tiny_encoder(tiny_bert):
    from diffaccel_bert_cond import Encoder

    return Encoder(tiny_bert)
