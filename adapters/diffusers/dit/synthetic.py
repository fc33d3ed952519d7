"""Diffusion-transformer pipelines built offline from configs, with seeded random weights (speed models).

``synthetic-dit-medium`` (``configs/dit-medium.toml``): a ``TextDiTPipeline`` around a
``PixArtTransformer2DModel`` with PixArt-alpha's block layout (self-attention, cross-attention
to the prompt, feed-forward, adaLN-single) at CPU size: 16 blocks of width 192 (3 heads of 64),
patch 2 on 4x16x16 latents (64 tokens), a one-layer character CLIP text encoder of width 192
(77 tokens) under PixArt's caption projection, DDIM. A tiny ``AutoencoderKL`` with one block
(downsampling factor 1) turns the latents into 16x16 RGB images. Sized so that a bench at batch
8 fits a few minutes of a shared 2-core machine. Weights are random (seeded), so images are noise patterns: the
model measures speed and the agreement of accelerated and unaccelerated runs, not quality.

``synthetic-dit-tiny``: the same recipe at toy size (4 blocks of width 32; tests, quick runs).
"""

from __future__ import annotations

import torch

from ..unet.pipeline import char_vocab
from .pipeline import TextDiTPipeline

SYNTHETIC = ("synthetic-dit-medium", "synthetic-dit-tiny")

_SPECS = {
    "synthetic-dit-medium": dict(layers=16, heads=3, head_dim=64, size=16, patch=2, text=192, text_ff=768,
                                 text_heads=3, vae=(32,)),
    "synthetic-dit-tiny": dict(layers=4, heads=2, head_dim=16, size=8, patch=2, text=32, text_ff=37,
                               text_heads=2, vae=(8,)),
}


def build(name: str, seed: int = 0):
    """The named synthetic ``TextDiTPipeline``; the same weights for the same seed."""
    # seconds to import (PixArt, the VAE, CLIP): deferred to a build
    from diffusers import AutoencoderKL, DDIMScheduler, PixArtTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    s = _SPECS[name]
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        width = s["heads"] * s["head_dim"]
        transformer = PixArtTransformer2DModel(
            sample_size=s["size"], in_channels=4, out_channels=4, patch_size=s["patch"], num_layers=s["layers"],
            num_attention_heads=s["heads"], attention_head_dim=s["head_dim"], cross_attention_dim=width,
            caption_channels=s["text"], num_embeds_ada_norm=1000,
        )
        torch.manual_seed(seed + 1)
        vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=s["vae"],
                            down_block_types=("DownEncoderBlock2D",) * len(s["vae"]),
                            up_block_types=("UpDecoderBlock2D",) * len(s["vae"]), norm_num_groups=min(8, s["vae"][0]),
                            sample_size=s["size"])
        torch.manual_seed(seed + 2)
        vocab = char_vocab()
        text = CLIPTextModel(CLIPTextConfig(
            vocab_size=len(vocab), hidden_size=s["text"], intermediate_size=s["text_ff"], num_hidden_layers=1,
            num_attention_heads=s["text_heads"], max_position_embeddings=77, bos_token_id=0, eos_token_id=1,
            pad_token_id=1))
    finally:
        torch.random.set_rng_state(state)
    scheduler = DDIMScheduler(beta_start=0.0001, beta_end=0.02, beta_schedule="linear", clip_sample=False,
                              set_alpha_to_one=False, steps_offset=1)
    return TextDiTPipeline(transformer=transformer.eval(), scheduler=scheduler, text_encoder=text.eval(),
                           tokenizer=CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77), vae=vae.eval())
