"""transformers masked-LM encoders beyond BERT's layout, run as text denoisers through the public
text-model protocol (``diffaccel.adapters.text.protocol``): DistilBERT and ALBERT.

Each is an ``EncoderDenoiser``: the base does the protocol's bookkeeping (full and partial
steps, the per-layer key/value cache, the attention call with an optional mask), a family
says how its embeddings, projections, layer tail and head are computed, reading the
transformers module's own weights (nothing is copied). BERT, RoBERTa, XLM-RoBERTa and the
ELECTRA generator share BERT's layout and run on ``denoisers.BertDenoiser``; ModernBERT is a
model kind of its own, the worked example (``modernbert.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..sampling.model import KVCache, attend_positions
from ..sampling.positions import Positions

__all__ = ["AlbertDenoiser", "DistilBertDenoiser", "EncoderDenoiser"]


class EncoderDenoiser:
    """A masked denoiser over a transformers encoder: subclasses give ``_embed``, ``_qkv``,
    ``_tail``, ``logits`` and the layer list; ``block`` is shared. Not time-conditioned, no
    condition vector."""

    kind = "masked"
    time_conditioned = False
    cond_dim = 0
    num_timesteps = 1000

    def __init__(self, model, mask_id: int, special_ids: set[int], layers: list, heads: int, head_dim: int):
        self.model = model.eval()
        self.layers = layers
        self.n_layers = len(layers)
        self.heads, self.head_dim = heads, head_dim
        self.scale = head_dim ** -0.5
        self.vocab_size = model.config.vocab_size
        self.mask_id = mask_id
        self.max_len = model.config.max_position_embeddings
        self.special_ids = special_ids

    @staticmethod
    def layers_in(config) -> int:
        """The layers this denoiser runs for a transformers ``config`` (``diffaccel check``'s facts)."""
        return config.num_hidden_layers

    def condition(self, t, batch: int, cond=None):
        return None

    def embed(self, x: torch.Tensor, positions: Positions | None = None) -> torch.Tensor:
        """Token ids (B, N) -> (B, N, D); with ``positions``, those positions' only, (T, D)."""
        if positions is None:
            return self._embed(x, torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1))
        ids = x.reshape(-1).index_select(0, positions.flat)[None]
        return self._embed(ids, positions.pos[None])[0]  # the embeddings modules want a batch dimension

    def mask(self, i: int, n: int, device) -> torch.Tensor | None:
        """Layer i's attention mask over n positions, (n, n) bool [query, key] (None: all)."""
        return None

    def block(self, i: int, h: torch.Tensor, c, kv: KVCache, positions: Positions | None = None) -> torch.Tensor:
        """Layer i on every position (h (B, N, D); ``kv`` refilled) or on ``positions`` (h (T, D);
        their keys and values written into ``kv``, queries attending over every cached one)."""
        pos = None if positions is None else positions.pos
        q, k, v = self._qkv(i, h, pos)  # (*lead, heads, head_dim) each, rotary applied
        if positions is None:
            B, N = h.shape[:2]
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            kv.k, kv.v = k, v
            m = self.mask(i, N, h.device)
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=self.scale)
            ctx = ctx.transpose(1, 2).reshape(B, N, -1)
        else:
            ctx = attend_positions(q, k, v, kv, positions, scale=self.scale, mask=self.mask(i, kv.k.shape[2], h.device))
        return self._tail(i, h, ctx)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:-1], -1, self.head_dim)


class DistilBertDenoiser(EncoderDenoiser):
    """``DistilBertForMaskedLM``: post-norm layers, learned positions, a transform + projector head."""

    def __init__(self, model, mask_id: int, special_ids: set[int]):
        base = model.distilbert
        layers = list(base.transformer.layer)
        super().__init__(model, mask_id, special_ids, layers, model.config.n_heads, model.config.dim // model.config.n_heads)
        self.base = base

    def _embed(self, ids, pos):
        return self.base.embeddings(input_ids=ids, position_ids=pos)

    def _qkv(self, i, h, pos):
        att = self.layers[i].attention
        return self._heads(att.q_lin(h)), self._heads(att.k_lin(h)), self._heads(att.v_lin(h))

    def _tail(self, i, h, ctx):
        layer = self.layers[i]
        a = layer.sa_layer_norm(layer.attention.out_lin(ctx) + h)
        return layer.output_layer_norm(layer.ffn(a) + a)

    def logits(self, h):
        m = self.model
        return m.vocab_projector(m.vocab_layer_norm(m.activation(m.vocab_transform(h))))


class AlbertDenoiser(EncoderDenoiser):
    """``AlbertForMaskedLM``: factorised embeddings projected to the hidden size, and layers whose
    weights are shared across groups. Each application of a shared layer is a layer here, with its
    own keys and values (its inputs differ)."""

    def __init__(self, model, mask_id: int, special_ids: set[int]):
        cfg, enc = model.config, model.albert.encoder
        per_group = cfg.num_hidden_layers / cfg.num_hidden_groups
        layers = [layer for i in range(cfg.num_hidden_layers)
                  for layer in enc.albert_layer_groups[int(i / per_group)].albert_layers]
        super().__init__(model, mask_id, special_ids, layers, cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads)
        self.base = model.albert

    @staticmethod
    def layers_in(config) -> int:
        return config.num_hidden_layers * config.inner_group_num

    def _embed(self, ids, pos):
        h = self.base.embeddings(input_ids=ids, position_ids=pos, token_type_ids=torch.zeros_like(ids))
        return self.base.encoder.embedding_hidden_mapping_in(h)

    def _qkv(self, i, h, pos):
        att = self.layers[i].attention
        return self._heads(att.query(h)), self._heads(att.key(h)), self._heads(att.value(h))

    def _tail(self, i, h, ctx):
        layer = self.layers[i]
        a = layer.attention.LayerNorm(h + layer.attention.dense(ctx))
        return layer.full_layer_layer_norm(layer.ffn_output(layer.activation(layer.ffn(a))) + a)

    def logits(self, h):
        return self.model.predictions(h)
