"""Write a random-weights DiffusionGemma checkpoint (``save_pretrained``) to run offline.

No DiffusionGemma weights can be downloaded here, so the example configs point at checkpoints
this module builds: transformers' own ``DiffusionGemmaForBlockDiffusion`` with seeded random
weights, the shipped WordNet BPE tokenizer (4096 tokens) as its tokenizer, and a
``generation_config.json`` with transformers' defaults. Text from them is noise: they exist to
exercise loading and the sampler (``tiny``) and to time it at a shape where the decoder, not
Python, is the cost (``mid``). Quality figures measured on them mean nothing.

    diffaccel diffusion-gemma-build --size tiny --out runs/diffusion-gemma-tiny
    diffaccel diffusion-gemma-build --size mid --out runs/diffusion-gemma-mid
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion, PreTrainedTokenizerFast

from ...loading.reference import shipped_path
from ...sampling.tokenizer import MASK, PAD, SEP, UNK

#: text_config overrides per size; every layer pattern the model has (sliding and full
#: attention, grouped key/value heads, experts) is present in both
SIZES = {
    "tiny": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                 head_dim=16, moe_intermediate_size=16, num_experts=4, top_k_experts=2, sliding_window=16,
                 layer_types=["sliding_attention", "full_attention"], canvas_length=16),
    "mid": dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                head_dim=64, moe_intermediate_size=256, num_experts=4, top_k_experts=2, sliding_window=128,
                layer_types=["sliding_attention"] * 3 + ["full_attention"], canvas_length=32),
}


def tiny_config(vocab_size: int = 4096, *, pad: int = 0, bos: int = 3, eos: int | None = None, size: str = "tiny", **over):
    """A ``DiffusionGemmaConfig`` of the given size (the shape transformers' own tests use for
    ``tiny``); ``over`` overrides text_config keys, ``canvas_length`` included."""
    spec = {**SIZES[size], **over}
    canvas = spec.pop("canvas_length")
    heads_kv, head_dim = spec["num_key_value_heads"], spec["head_dim"]
    full = [i for i, t in enumerate(spec["layer_types"]) if t == "full_attention"]
    text = dict(vocab_size=vocab_size, max_position_embeddings=1024, pad_token_id=pad, bos_token_id=bos,
                eos_token_id=eos, per_layer_config={i: {"head_dim": head_dim, "num_key_value_heads": heads_kv} for i in full},
                **spec)
    vision = dict(hidden_size=16, num_key_value_heads=1, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16, patch_size=4)
    return DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=canvas)


def wordnet_tokenizer():
    """The shipped WordNet BPE tokenizer as a transformers fast tokenizer ([SEP] is BOS)."""
    return PreTrainedTokenizerFast(tokenizer_file=str(shipped_path("wordnet-masked") / "tokenizer.json"),
                                   pad_token=PAD, unk_token=UNK, mask_token=MASK, bos_token=SEP)


def build(out: str | Path, size: str = "tiny", seed: int = 0, **over) -> Path:
    """Write a random DiffusionGemma checkpoint of ``size`` to ``out``; returns the folder."""
    tok = wordnet_tokenizer()
    cfg = tiny_config(len(tok), pad=tok.pad_token_id, bos=tok.bos_token_id, size=size, **over)
    torch.manual_seed(seed)
    model = DiffusionGemmaForBlockDiffusion(cfg).eval()
    out = Path(out)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def run(args) -> int:
    """``diffaccel diffusion-gemma-build --size S --out DIR``: a random-weights checkpoint."""
    path = build(args.out, args.size, args.seed)
    n = sum(t.numel() for t in load_file(str(path / "model.safetensors")).values())
    print(f"{path}: random DiffusionGemma '{args.size}', {n / 1e6:.1f}M stored parameters, seed {args.seed}", file=sys.stderr)
    return 0
