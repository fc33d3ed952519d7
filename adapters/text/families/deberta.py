"""DeBERTa-v2/v3 (``DebertaV2ForMaskedLM``) as a masked denoiser: disentangled attention.

Each layer's attention score between query position i and key position j is
``(q_i . k_j + q_i . PK[r] + k_j . PQ[r]) / sqrt(dh * f)``, r the (bucketed) relative distance
``i - j`` shifted into the table, PK and PQ the layer's projections of the shared relative
embeddings (content-to-position and position-to-content terms; ``f`` counts the terms). A partial
step needs the position-to-content term of every cached key, so it is computed from the cache
for the queried positions' rows only. Checked against transformers' own forward to 1e-5 and
partial steps against full ones (tests/test_text_families.py). The convolution some DeBERTa-v2
checkpoints add after the first layer (``conv_kernel_size``) mixes neighbouring positions outside
attention: such checkpoints are refused in one line.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..sampling.model import KVCache, write_positions
from ..sampling.positions import Positions

__all__ = ["DebertaV2Denoiser"]


def _buckets(rel: torch.Tensor, buckets: int, max_position: int) -> torch.Tensor:
    """transformers' ``make_log_bucket_position``: distances beyond half the buckets on a log scale."""
    if buckets <= 0 or max_position <= 0:
        return rel
    sign, mid = torch.sign(rel), buckets // 2
    abs_pos = torch.where((rel < mid) & (rel > -mid), torch.tensor(mid - 1).type_as(rel), rel.abs())
    log_pos = torch.ceil(torch.log(abs_pos / mid) / torch.log(torch.tensor((max_position - 1) / mid)) * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, rel.type_as(log_pos), log_pos * sign).long()


class DebertaV2Denoiser:
    """A ``DebertaV2ForMaskedLM`` run layer by layer, not time-conditioned."""

    kind = "masked"
    time_conditioned = False
    cond_dim = 0
    num_timesteps = 1000

    @staticmethod
    def refuses(config: dict) -> str | None:
        """Why a DeBERTa-v2 config.json cannot run here, or None."""
        if config.get("conv_kernel_size", 0):
            return ("conv_kernel_size > 0: its first layer's convolution mixes neighbouring positions outside attention, "
                    "which partial steps cannot serve")
        return None

    def __init__(self, model, mask_id: int, special_ids: set[int]):
        cfg = model.config
        self.model = model.eval()
        self.base = model.deberta
        self.layers = list(self.base.encoder.layer)
        self.n_layers = len(self.layers)
        self.vocab_size, self.max_len = cfg.vocab_size, cfg.max_position_embeddings
        self.mask_id, self.special_ids = mask_id, special_ids
        att = self.layers[0].attention.self
        self.heads, self.head_dim = att.num_attention_heads, att.attention_head_size
        self.types = att.pos_att_type if att.relative_attention else []
        self.scale = 1.0 / math.sqrt(self.head_dim * (1 + len(self.types)))
        if att.relative_attention:
            self.span = att.pos_ebd_size
            self.buckets, self.max_rel = att.position_buckets, att.max_relative_positions
        self._idx: dict[tuple[int, str], torch.Tensor] = {}

    def condition(self, t, batch: int, cond=None):
        return None

    def embed(self, x: torch.Tensor, positions: Positions | None = None) -> torch.Tensor:
        if positions is None:
            ids, pos = x, torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
        else:
            ids, pos = x.reshape(-1).index_select(0, positions.flat)[None], positions.pos[None]
        h = self.base.embeddings(input_ids=ids, position_ids=pos, token_type_ids=torch.zeros_like(ids))
        return h if positions is None else h[0]

    def _table_index(self, n: int, device) -> torch.Tensor:
        """(n, n) index into the relative tables: bucketed ``i - j`` shifted by the span, clamped."""
        key = (n, str(device))
        if key not in self._idx:
            idx = torch.arange(n, device=device)
            rel = _buckets(idx[:, None] - idx[None, :], self.buckets, self.max_rel)
            self._idx[key] = (rel + self.span).clamp(0, 2 * self.span - 1)
        return self._idx[key]

    def _pos_tables(self, att):
        """PK (c2p) and PQ (p2c): the relative embeddings projected, (2 * span, heads, dh) each."""
        rel = self.base.encoder.get_rel_embedding()[: 2 * self.span]
        pk = (att.key_proj if att.share_att_key else getattr(att, "pos_key_proj", None))
        pq = (att.query_proj if att.share_att_key else getattr(att, "pos_query_proj", None))
        shape = (2 * self.span, self.heads, self.head_dim)
        return (pk(rel).view(shape) if "c2p" in self.types else None, pq(rel).view(shape) if "p2c" in self.types else None)

    def _bias(self, att, q, keys, idx):
        """The disentangled terms for queries q (L, H, M, dh) over keys (L, H, N, dh); idx (L, M, N)
        the table index of each (query, key) pair. Returns (L, H, M, N), unscaled."""
        pk, pq = self._pos_tables(att)
        L, H, M, N = q.shape[0], q.shape[1], q.shape[2], keys.shape[2]
        bias = q.new_zeros(L, H, M, N)
        if pk is not None:  # q_i . PK[r(i, j)]
            c2p = torch.einsum("lhmd,rhd->lhmr", q, pk)
            bias = bias + torch.gather(c2p, -1, idx[:, None].expand(L, H, M, N))
        if pq is not None:  # k_j . PQ[r(i, j)]
            p2c = torch.einsum("lhnd,rhd->lhnr", keys, pq)
            bias = bias + torch.gather(p2c[:, :, None].expand(L, H, M, N, p2c.shape[-1]), -1,
                                       idx[:, None, :, :, None].expand(L, H, M, N, 1)).squeeze(-1)
        return bias

    def block(self, i: int, h: torch.Tensor, c, kv: KVCache, positions: Positions | None = None) -> torch.Tensor:
        layer = self.layers[i]
        att = layer.attention.self
        q, k, v = (f(h).view(*h.shape[:-1], self.heads, self.head_dim) for f in (att.query_proj, att.key_proj, att.value_proj))
        if positions is None:
            B, N = h.shape[:2]
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            kv.k, kv.v = k, v
            bias = None
            if self.types:
                bias = self._bias(att, q, k, self._table_index(N, h.device).expand(B, N, N)) * self.scale
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=self.scale).transpose(1, 2).reshape(B, N, -1)
        else:
            write_positions(k, v, kv, positions)
            keys, values = positions.live_rows(kv.k), positions.live_rows(kv.v)
            qp = positions.pad(q).transpose(1, 2)  # (L, H, M, dh)
            bias = None
            if self.types:
                idx = self._table_index(kv.k.shape[2], h.device).index_select(0, positions.pos)  # (T, N)
                bias = self._bias(att, qp, keys, positions.pad(idx)) * self.scale
            a = F.scaled_dot_product_attention(qp, keys, values, attn_mask=bias, scale=self.scale)
            ctx = positions.unpad(a.transpose(1, 2)).reshape(h.shape[0], -1)
        a = layer.attention.output(ctx, h)
        return layer.output(layer.intermediate(a), a)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        m = self.model
        if m.legacy:
            return m.cls(h)
        return m.lm_predictions(h, self.base.embeddings.word_embeddings)
