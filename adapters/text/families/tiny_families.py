"""Tiny random masked LMs of each transformers family, saved with ``save_pretrained`` (weights and
a word-level tokenizer with a mask token) for tests and for a family author's own checks:
``tiny_masked_lm(folder, "modernbert")`` returns the folder and the model in eval mode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz"]
SIZE = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64, "pad_token_id": 0}


def _configs() -> dict[str, tuple[str, dict[str, Any]]]:
    """family -> (transformers class prefix, config keys): small, and reaching each family's
    particular paths (ELECTRA's and ALBERT's narrow embeddings, ALBERT's shared layers,
    ModernBERT's sliding-window layers)."""
    return {
        "bert": ("Bert", SIZE),
        "roberta": ("Roberta", {**SIZE, "max_position_embeddings": 70}),
        "xlm-roberta": ("XLMRoberta", {**SIZE, "max_position_embeddings": 70}),
        "electra": ("Electra", {**SIZE, "embedding_size": 16}),
        "distilbert": ("DistilBert", {"dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64,
                                      "max_position_embeddings": 64, "pad_token_id": 0}),
        "albert": ("Albert", {**SIZE, "embedding_size": 16, "num_hidden_layers": 3, "inner_group_num": 2}),
        "modernbert": ("ModernBert", {**SIZE, "num_hidden_layers": 3, "global_attn_every_n_layers": 3, "local_attention": 8,
                                      "bos_token_id": 2, "eos_token_id": 3, "cls_token_id": 2, "sep_token_id": 3}),
        "deberta-v2": ("DebertaV2", {**SIZE, "relative_attention": True, "pos_att_type": ["c2p", "p2c"]}),
        # v3's settings: log-bucketed distances, shared key projections, no absolute positions
        "deberta-v3": ("DebertaV2", {**SIZE, "relative_attention": True, "pos_att_type": ["p2c", "c2p"], "position_buckets": 8,
                                     "max_relative_positions": 32, "share_att_key": True, "norm_rel_ebd": "layer_norm",
                                     "position_biased_input": False}),
        "deberta-v2-conv": ("DebertaV2", {**SIZE, "relative_attention": True, "pos_att_type": ["c2p", "p2c"],
                                          "conv_kernel_size": 3}),
    }


FAMILY_NAMES = tuple(_configs())


def tiny_masked_lm(folder: Path, family: str, seed: int = 0):
    """A random ``<Family>ForMaskedLM`` and its tokenizer saved in ``folder / family``."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    prefix, keys = _configs()[family]
    vocab = {t: i for i, t in enumerate(VOCAB)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                               sep_token="[SEP]", mask_token="[MASK]")
    torch.manual_seed(seed)
    config = getattr(transformers, f"{prefix}Config")(vocab_size=len(vocab), **keys)
    model = getattr(transformers, f"{prefix}ForMaskedLM")(config).eval()
    path = Path(folder) / family
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path, model
