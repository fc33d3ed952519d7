"""One interface over the text denoisers the adapter can drive.

A denoiser exposes the pieces of its forward pass so the pipeline can run them one layer at a
time, on a subset of positions, with keys and values of the other positions cached:
``condition`` -> ``embed`` -> ``block(i, ...)`` for each layer -> ``logits``.

* ``ReferenceDenoiser``: the project's ``TextDiffusionLM`` (masked or continuous).
* ``BertDenoiser``: a transformers masked LM of BERT's layout (BERT, RoBERTa, XLM-RoBERTa, the
  ELECTRA generator) used as a masked denoiser (MDLM-style, not time-conditioned); the other
  encoder families are in ``encoders.py``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .model import KVCache, TextDiffusionLM, attend_positions
from .positions import Positions


class ReferenceDenoiser:
    def __init__(self, model: TextDiffusionLM):
        self.model = model
        cfg = model.config
        self.kind = cfg.kind
        self.n_layers = cfg.n_layers
        self.vocab_size = cfg.vocab_size
        self.mask_id = cfg.mask_id
        self.max_len = cfg.max_len
        self.time_conditioned = model.uses_time
        self.num_timesteps = cfg.num_timesteps
        self.special_ids: set[int] = {cfg.mask_id, cfg.pad_id}
        self.cond_dim = cfg.cond_dim  # size of the external condition vector (0: none)
        self._c: torch.Tensor | None = None
        self._mods: list = []

    def condition(self, t, batch: int, cond=None):
        """The condition vector (B, D). When it equals the last one (a model that is not
        time-conditioned gets the same vector at every step), the last tensor itself is returned,
        so ``block`` can serve the blocks' modulation from its cache."""
        c = self.model.condition(t, batch, cond)
        if self._c is not None and self._c.shape == c.shape and torch.equal(self._c, c):
            return self._c
        self._c, self._mods = c, [None] * self.n_layers
        return c

    def _modulation(self, i: int, c):
        """Block i's ``modulation(c)``, computed once per condition vector and weights: the
        version counters of the modulation weights key the cache, so an in-place update of the
        weights (an optimiser step, ``load_state_dict``) is never served stale."""
        blk = self.model.blocks[i]
        if c is not self._c:
            return blk.modulation(c)
        key = (blk.mod.weight._version, blk.mod.bias._version)
        hit = self._mods[i]
        if hit is None or hit[0] != key:
            hit = self._mods[i] = (key, blk.modulation(c))
        return hit[1]

    def embed(self, x, positions: Positions | None = None):
        return self.model.embed(x, positions)

    def block(self, i: int, h, c, kv: KVCache, positions: Positions | None = None):
        return self.model.blocks[i](h, c, kv, positions, mods=self._modulation(i, c))

    def logits(self, h):
        return self.model.logits(h)

    def token_latents(self):
        return self.model.token_latents()

    @property
    def alphas_cumprod(self):
        return self.model.alphas_cumprod


class BertDenoiser:
    """A BERT-family masked LM, run layer by layer with a per-layer key/value cache."""

    kind = "masked"
    time_conditioned = False
    cond_dim = 0  # no condition gating

    def __init__(self, model, mask_id: int, special_ids: set[int]):
        base = model.base_model
        layers = getattr(getattr(base, "encoder", None), "layer", None)
        if layers is None or not hasattr(layers[0], "attention") or not hasattr(layers[0].attention, "self"):
            raise TypeError(f"{type(model).__name__} is not a BERT-family masked LM (no encoder.layer[i].attention.self)")
        self.model = model.eval()
        self.base = base
        self.layers = layers
        self.n_layers = len(layers)
        self.vocab_size = model.config.vocab_size
        self.mask_id = mask_id
        self.max_len = model.config.max_position_embeddings
        self.special_ids = special_ids
        # RoBERTa-style position ids start after the padding index
        self.pos_offset = (base.embeddings.padding_idx + 1) if hasattr(base.embeddings, "padding_idx") else 0
        self.num_timesteps = 1000
        self.head = getattr(model, "cls", None) or getattr(model, "lm_head", None)
        if self.head is None and hasattr(model, "generator_lm_head"):  # the ELECTRA generator's head
            self.head = torch.nn.Sequential(model.generator_predictions, model.generator_lm_head)
        if self.head is None:
            raise TypeError(f"{type(model).__name__} has no masked-LM head (cls, lm_head or generator_lm_head)")
        # ELECTRA with embeddings narrower than its layers projects them up
        self.project = getattr(base, "embeddings_project", None)

    def condition(self, t, batch: int, cond=None):
        return None

    def embed(self, x, positions: Positions | None = None):
        if positions is None:
            ids, pos = x, torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
        else:  # (1, T): the embeddings module wants a batch dimension
            ids, pos = x.reshape(-1)[positions.flat][None], positions.pos[None]
        h = self.base.embeddings(input_ids=ids, position_ids=pos + self.pos_offset, token_type_ids=torch.zeros_like(ids))
        if self.project is not None:
            h = self.project(h)
        return h if positions is None else h[0]

    def block(self, i: int, h, c, kv: KVCache, positions: Positions | None = None):
        layer = self.layers[i]
        att = layer.attention.self
        heads, dh = att.num_attention_heads, att.attention_head_size
        scale = 1.0 / math.sqrt(dh)
        lead = h.shape[:-1]  # (B, N), or (T,) with positions
        q, k, v = (f(h).view(*lead, heads, dh) for f in (att.query, att.key, att.value))
        if positions is None:
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            kv.k, kv.v = k, v
            ctx = F.scaled_dot_product_attention(q, k, v, scale=scale).transpose(1, 2).reshape(*lead, heads * dh)
        else:
            ctx = attend_positions(q, k, v, kv, positions, scale=scale)
        attn_out = layer.attention.output(ctx, h)
        return layer.output(layer.intermediate(attn_out), attn_out)

    def logits(self, h):
        return self.head(h)


__all__ = ["ReferenceDenoiser", "BertDenoiser"]
