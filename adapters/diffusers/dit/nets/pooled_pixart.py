"""``PooledTextPixArtTransformer2DModel``: PixArt with the prompt also in its timestep embedding.

Stock PixArt reads the prompt only through cross-attention (``attn2``, which in its
``ada_norm_single`` blocks sees the un-normalised hidden states). On the digits DiT those
attention weights stayed uniform over the 16 prompt tokens, so ``attn2`` returned about the same
token average for every prompt and the text changed the noise prediction by ~0.3%. DiT's standard
class conditioning goes through adaLN instead: here the mean of the prompt's token states,
projected to the model width (``adaln_single.emb.text_proj``), is added to the embedded timestep,
so it modulates every block's scale/shift/gate and the output layer. Cross-attention stays.
(On its own this doubled the prompt's effect in a short A/B; the larger part of the digits fix
was freezing a trained text encoder, see docs/dit.md.)

Same config and blocks as ``PixArtTransformer2DModel`` (the subclass adds no config keys), so
``save_pretrained`` / ``from_pretrained``, the adapter's per-block hooks and diffusers' cache
hooks (which attach to ``transformer_blocks``) work unchanged.
"""

from __future__ import annotations

import functools

import torch
from diffusers import ModelMixin, PixArtTransformer2DModel  # noqa: F401 - diffusers' pipeline loader
# looks a custom component's base class (ModelMixin) up in the component's own module


class PooledTimestepEmbedding(torch.nn.Module):
    """PixArt's timestep embedding plus a projection of the pooled prompt (``pooled_text``)."""

    def __init__(self, emb: torch.nn.Module, text_dim: int, width: int):
        super().__init__()
        self.inner = emb
        self.text_proj = torch.nn.Linear(text_dim, width)

    def forward(self, timestep, pooled_text=None, **kwargs):
        emb = self.inner(timestep, **kwargs)
        return emb if pooled_text is None else emb + self.text_proj(pooled_text.to(emb.dtype))


class PooledTextPixArtTransformer2DModel(PixArtTransformer2DModel):
    """``PixArtTransformer2DModel`` whose adaLN timestep embedding also carries the prompt (the
    mean of ``encoder_hidden_states`` over tokens, before the caption projection)."""

    @functools.wraps(PixArtTransformer2DModel.__init__)  # same signature: the config is PixArt's
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        width = self.config.num_attention_heads * self.config.attention_head_dim
        self.adaln_single.emb = PooledTimestepEmbedding(self.adaln_single.emb, self.config.caption_channels, width)

    def forward(self, hidden_states, encoder_hidden_states=None, timestep=None, added_cond_kwargs=None, **kwargs):
        added = {"resolution": None, "aspect_ratio": None, **(added_cond_kwargs or {})}
        if encoder_hidden_states is not None:
            added["pooled_text"] = encoder_hidden_states.mean(1)
        return super().forward(hidden_states, encoder_hidden_states=encoder_hidden_states, timestep=timestep,
                               added_cond_kwargs=added, **kwargs)
