"""DiffusionGemma's decoder run layer by layer (``diffusion_gemma``): ``GemmaLayer``, the layer
handle strategies compute through, whose ``decoder_layer`` runs a decoder layer on a subset of the
active canvas's positions against the encoder's cache of the finished blocks and the canvas keys
and values as of their last computation; ``_GemmaContext`` holds a run's per-layer state."""

from __future__ import annotations

from typing import Any

import torch

from diffaccel.contract.state import Layer, RunState

from ...sampling.positions import Positions


def softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """The head's final soft cap, as ``DiffusionGemmaForBlockDiffusion.forward`` applies it."""
    logits = logits.to(torch.float32)
    if cap is None:
        return logits
    return torch.tanh(logits / cap) * cap


class _Block:
    """One active canvas: the encoder prefix length and per-layer key/value buffers
    (B, kv heads, S + C, head dim), prefix copied once from the encoder cache."""

    def __init__(self, model, cache, B: int, C: int, position_ids: torch.Tensor):
        dec = model.model.decoder
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        for i, layer in enumerate(dec.layers):
            pk, pv = cache.layers[i].keys, cache.layers[i].values
            S = pk.shape[-2]  # sliding layers keep a shorter prefix
            k = pk.new_empty(pk.shape[0], pk.shape[1], S + C, pk.shape[-1])
            v = pv.new_empty(pv.shape[0], pv.shape[1], S + C, pv.shape[-1])
            k[:, :, :S] = pk
            v[:, :, :S] = pv
            self.kv.append((k, v))
        self.rope = {t: dec.rotary_emb(dec.embed_tokens.weight[:1], position_ids, t) for t in dec.unique_layer_types}


class _GemmaContext:
    """Per-generation state of the hooked decoder: the block's buffers, per-layer outputs,
    the last logits, and what the current step computes."""

    def __init__(self, model, run: RunState, mask_mapping: dict):
        self.model = model
        self.run = run
        dec = model.model.decoder
        self.types = list(dec.text_config.layer_types)
        self.mask_mapping = mask_mapping
        self.block: _Block | None = None
        self.fresh = True  # the first step of a block: every position and layer is computed
        self.out: list[torch.Tensor | None] = [None] * len(dec.layers)
        self.h0: torch.Tensor | None = None
        self.logits: torch.Tensor | None = None
        self.step_sel: Positions | None = None
        self.last_sel: Any = None
        self.layers = [GemmaLayer(i, self) for i in range(len(dec.layers))]

    def new_block(self, block: _Block) -> None:
        self.block, self.fresh = block, True
        self.out = [None] * len(self.out)
        self.h0 = self.logits = None


class GemmaLayer(Layer):
    """One decoder layer of DiffusionGemma; ``compute`` may run on a subset of canvas positions."""

    supports_positions = True

    def __init__(self, index: int, ctx: _GemmaContext):
        super().__init__(f"decoder.{index}", index, "transformer-block")
        self.ctx = ctx
        self.module = ctx.model.model.decoder.layers[index]

    @property
    def cached_output(self) -> torch.Tensor | None:
        """The layer's output at every canvas position as of its last computation in this block
        (None at a block's first step: there is none yet)."""
        return self.ctx.out[self.index]

    @property
    def step_positions(self) -> Positions | None:
        return self.ctx.step_sel

    @staticmethod
    def select(mask: torch.Tensor) -> Positions:
        """The adapter's position set for a (B, C) bool mask (``token-positions``)."""
        return Positions(mask)

    def compute(self, hidden: torch.Tensor, positions: "torch.Tensor | Positions | None" = None) -> torch.Tensor:
        ctx, i = self.ctx, self.index
        sel = ctx.step_sel if positions is None else Positions.coerce(positions, hidden.shape[1])
        if ctx.fresh or ctx.out[i] is None:
            sel = None  # no cache of this canvas yet: the whole layer
        if sel is None:
            ctx.out[i] = decoder_layer(self.module, hidden, ctx, i, None)
        else:
            self.computed_positions = sel.count  # the core counts them (0: the layer does not run)
            if sel.count:
                y = decoder_layer(self.module, sel.gather(hidden), ctx, i, sel)
                sel.scatter_(ctx.out[i], y)
        if i == len(ctx.layers) - 1:
            ctx.last_sel = sel
        return ctx.out[i]


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dim: int) -> torch.Tensor:
    from transformers.models.diffusion_gemma.modeling_diffusion_gemma import apply_rotary_pos_emb

    return apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=dim)


def decoder_layer(layer, h: torch.Tensor, ctx: _GemmaContext, i: int, sel: Positions | None) -> torch.Tensor:
    """``DiffusionGemmaDecoderTextLayer.forward``, op for op, on every canvas position (``sel``
    None, h (B, C, D)) or on the T positions of ``sel`` (h (T, D)); the canvas keys and values
    computed are written into the block's buffer, which the queries attend over."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    attn = layer.self_attn
    cos, sin = ctx.block.rope[ctx.types[i]]
    kbuf, vbuf = ctx.block.kv[i]
    S = kbuf.shape[-2] - (ctx.out[i].shape[1] if sel is not None else h.shape[1])
    residual = h
    x = layer.input_layernorm(h)
    shape = (*x.shape[:-1], -1, attn.head_dim)
    if sel is None:
        unsq = 2
    else:  # (T, heads, dh): the rotary tables of each pair's canvas position
        cos, sin, unsq = cos[0].index_select(0, sel.pos), sin[0].index_select(0, sel.pos), 1
    q = _rope(attn.q_norm(attn.q_proj(x).view(shape)), cos, sin, unsq)
    k = attn.k_proj(x).view(shape)
    v = attn.v_proj(x).view(shape) if attn.v_proj is not None else k
    k = _rope(attn.k_norm(k), cos, sin, unsq)
    v = attn.v_norm(v)
    interface = ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation, sdpa_attention_forward)
    if sel is None:
        kbuf[:, :, S:] = k.transpose(1, 2)
        vbuf[:, :, S:] = v.transpose(1, 2)
        out, _ = interface(attn, q.transpose(1, 2), kbuf, vbuf, ctx.mask_mapping[ctx.types[i]], dropout=0.0,
                           scaling=attn.scaling, sliding_window=attn.sliding_window, is_causal=False)
        out = attn.o_proj(out.reshape(*h.shape[:-1], -1).contiguous())
    else:
        T, Hk, dh = k.shape
        N = kbuf.shape[-2]
        heads = torch.arange(Hk, device=k.device)
        rows = ((sel.rows[:, None] * Hk + heads) * N + S + sel.pos[:, None]).reshape(-1)
        kbuf.view(-1, dh).index_copy_(0, rows, k.reshape(T * Hk, dh))
        vbuf.view(-1, dh).index_copy_(0, rows, v.reshape(T * Hk, dh))
        out, _ = interface(attn, sel.pad(q).transpose(1, 2), sel.live_rows(kbuf), sel.live_rows(vbuf), None, dropout=0.0,
                           scaling=attn.scaling, sliding_window=attn.sliding_window, is_causal=False)
        out = attn.o_proj(sel.unpad(out).reshape(T, -1))
    h = residual + layer.post_attention_layernorm(out)
    return _feed_forward(layer, h)


def _feed_forward(layer, h: torch.Tensor) -> torch.Tensor:
    """The second half of ``DiffusionGemmaDecoderTextLayer.forward``: dense MLP plus experts."""
    residual = h
    h1 = layer.post_feedforward_layernorm_1(layer.mlp(layer.pre_feedforward_layernorm(h)))
    flat = residual.reshape(-1, residual.shape[-1])
    _, weights, index = layer.router(flat)
    h2 = layer.experts(layer.pre_feedforward_layernorm_2(flat), index, weights).reshape(residual.shape)
    h2 = layer.post_feedforward_layernorm_2(h2)
    h = residual + layer.post_feedforward_layernorm(h1 + h2)
    h *= layer.layer_scalar
    return h
