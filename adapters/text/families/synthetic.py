"""Real-shape speed models, built in memory at load from a seed: no weights are shipped.

``synthetic-llada-small``: a LLaDA-shaped masked denoiser (transformers ``LlamaForCausalLM`` run
bidirectionally by ``LlamaDenoiser``): 12 layers, width 768, 12 heads, SwiGLU MLP of 2048, a
32,000-token vocabulary with the head tied to the embeddings (about 110M parameters, 85M of them
in the layers), 256 positions. Its weights are transformers' own initialisation (normal, std
0.02) drawn under ``torch.manual_seed(seed)`` inside a forked RNG, so the same seed and
transformers version give the same model. It exists to time the text path at a real model's
shape; its samples are random tokens and every quality figure on it is meaningless.

Tokenizer: the shipped WordNet BPE tokenizer (4,096 tokens, its ``[MASK]`` is the mask id)
padded to the 32,000 ids: ids below 4,096 decode as that tokenizer's tokens, the others as
``<id>`` placeholders, so any id a random model draws decodes to something readable.
"""

from __future__ import annotations

import torch

from .llama import LlamaDenoiser
from ..loading.loader import Loaded, ModelFacts, Source
from ..loading.reference import shipped_path
from ..sampling.tokenizer import TextTokenizer

SPECS = {
    "synthetic-llada-small": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=12,
                                  intermediate_size=2048, vocab_size=32000, max_position_embeddings=256,
                                  tie_word_embeddings=True, rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu"),
}
SEED = 0


class PaddedTokenizer:
    """A tokenizer whose vocabulary is padded to ``vocab_size`` ids with placeholder tokens."""

    def __init__(self, base: TextTokenizer, vocab_size: int):
        self.base = base
        self.vocab_size = vocab_size
        self.mask_id = base.mask_id
        self.special_ids = set(base.special_ids)

    def encode(self, text: str) -> list[int]:
        return self.base.encode(text)

    def decode(self, ids) -> str:
        out, run = [], []
        for i in (int(i) for i in ids):
            if i < self.base.vocab_size:
                run.append(i)
                continue
            if run:
                out.append(self.base.decode(run))
                run = []
            out.append(f"<{i}>")
        if run:
            out.append(self.base.decode(run))
        return " ".join(p for p in out if p)


def build_synthetic(name: str, seed: int = SEED) -> Loaded:
    """The components of a synthetic speed model (``load_pipeline(name)`` builds its pipeline)."""
    from transformers import LlamaConfig, LlamaForCausalLM  # seconds to import: deferred to a build

    conf = LlamaConfig(**SPECS[name])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(conf)
    tok = PaddedTokenizer(TextTokenizer.from_file(shipped_path("wordnet-masked") / "tokenizer.json"), conf.vocab_size)
    return Loaded(denoiser=LlamaDenoiser(model, tok.mask_id, tok.special_ids), tokenizer=tok, name=name, weights=model,
                  where=name)


class SyntheticLoader:
    """The synthetic speed models, by name (``SPECS``)."""

    names = tuple(SPECS)

    def recognises(self, source: Source) -> bool:
        return source.checkpoint in SPECS

    def load(self, source: Source) -> Loaded:
        return build_synthetic(source.checkpoint)

    def facts(self, source: Source) -> ModelFacts:
        spec = SPECS[source.checkpoint]
        return ModelFacts("masked", spec["vocab_size"], spec["num_hidden_layers"], spec.get("max_position_embeddings", 2048))


LOADER = SyntheticLoader()
