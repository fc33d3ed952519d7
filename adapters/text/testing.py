"""A tiny random text model for testing strategies, in this repository and in a plugin's own.

    from diffaccel.adapters.text.testing import tiny_text_pipeline
    from diffaccel.testing import run_with

    def test_my_strategy_skips_layers():
        pipe = tiny_text_pipeline()
        out = run_with(pipe, [MyStrategy(MyConfig())], seed=0)
        assert out.report["counters"]["layers_skipped"] > 0

The pytest fixture ``tiny_text_pipe`` (registered by
``pytest_plugins = ["diffaccel.adapters.text.testing"]``) gives the same model: fast, offline,
deterministic.
"""

from __future__ import annotations

import pytest
import torch

from .sampling.denoisers import ReferenceDenoiser
from .sampling.model import TextDiffusionConfig, TextDiffusionLM
from .sampling.pipeline import TextDiffusionPipeline


class CharTokenizer:
    """A throwaway tokenizer over lowercase letters and space; ids 0-3 are special."""

    PAD, UNK, MASK, SEP = 0, 1, 2, 3
    alphabet = " abcdefghijklmnopqrstuvwxyz"

    def __init__(self, vocab_size: int = 64):
        self.vocab_size = vocab_size
        self.mask_id = self.MASK
        self.special_ids = {0, 1, 2, 3}

    def encode(self, text: str) -> list[int]:
        return [4 + self.alphabet.index(c) if c in self.alphabet else self.UNK for c in text.lower()]

    def decode(self, ids) -> str:
        out = []
        for i in ids:
            i = int(i)
            if i == self.SEP:
                out.append("\n")
            elif 4 <= i < 4 + len(self.alphabet):
                out.append(self.alphabet[i - 4])
            elif i >= 4:
                out.append(f"<{i}>")
        return "".join(out)


def tiny_text_pipeline(kind: str = "masked", *, seed: int = 0, vocab_size: int = 64, n_layers: int = 2,
                       max_len: int = 32, time_conditioned: bool = False, dim: int = 32) -> TextDiffusionPipeline:
    """A ``TextDiffusionPipeline`` over a random tiny reference model (deterministic per seed)."""
    torch.manual_seed(seed)
    cfg = TextDiffusionConfig(vocab_size=vocab_size, kind=kind, dim=dim, n_layers=n_layers, n_heads=2, max_len=max_len,
                              embed_dim=16, mask_id=CharTokenizer.MASK, time_conditioned=time_conditioned,
                              num_timesteps=100)
    model = TextDiffusionLM(cfg)
    # zero-initialised gates would make every block an identity: give the blocks something to do
    for block in model.blocks:
        torch.nn.init.normal_(block.mod.weight, std=0.02)
        torch.nn.init.normal_(block.mod.bias, std=0.5)
    return TextDiffusionPipeline(ReferenceDenoiser(model.eval()), CharTokenizer(vocab_size), name=f"tiny-{kind}")


@pytest.fixture
def tiny_text_pipe():
    """A tiny random masked text pipeline (2 layers, 64 tokens, 32 positions)."""
    return tiny_text_pipeline("masked")


def tiny_llama_folder(path) -> str:
    """A tiny random LLaMA causal LM saved as a masked-DLM folder (the LLaDA-class loader reads it:
    ``mask_token_id`` in its config); returns the folder."""
    import json
    from pathlib import Path

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *[f"w{i}" for i in range(27)]]
    tk = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64))
    path = Path(path)
    model.save_pretrained(path)
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]", mask_token="[MASK]").save_pretrained(path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["mask_token_id"] = 4
    (path / "config.json").write_text(json.dumps(cfg))
    return str(path)
