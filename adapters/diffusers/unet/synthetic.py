"""Stable Diffusion pipelines built offline from configs, with seeded random weights (speed models).

``synthetic-sd-medium`` (``configs/sd-medium.toml``): a ``StableDiffusionPipeline`` whose UNet
has Stable Diffusion 1.x's layout at reduced width: block widths 128, 256, 512, 512, two layers
per block, cross-attention blocks in the first three levels (dimension 768, 8 heads), 142M
parameters. It runs at **64x64**: the UNet denoises 4x64x64 latents, the geometry SD 1.x
works at for 512x512 images, so the UNet's cost per step and its split between blocks are those
of a real (narrower) SD UNet. The VAE is a tiny ``AutoencoderKL`` with a single block, i.e. a
downsampling factor of 1, so the images are 64x64 as well and decoding costs little. The text
encoder is a one-layer ``CLIPTextModel`` of width 768 over a character vocabulary
(``CLIPTokenizer(vocab=..., merges=[], model_max_length=77)``, no files needed), the scheduler
DDIM. Weights are random (seeded), so images are noise patterns: the model measures speed and
the agreement between accelerated and unaccelerated runs, not image quality.

``synthetic-sd-tiny``: the same recipe at toy size (for tests and quick runs).
"""

from __future__ import annotations

import torch

from .pipeline import char_vocab

SYNTHETIC = ("synthetic-sd-medium", "synthetic-sd-tiny")

_SPECS = {
    "synthetic-sd-medium": dict(
        widths=(128, 256, 512, 512), layers=2, cross=768, heads=8, size=64, groups=32,
        vae_widths=(32,), text_layers=1, text_heads=12, text_ff=1024,
    ),
    "synthetic-sd-tiny": dict(
        widths=(32, 64), layers=1, cross=32, heads=2, size=16, groups=8,
        vae_widths=(8,), text_layers=1, text_heads=2, text_ff=37,
    ),
}


def build(name: str, seed: int = 0):
    """The named synthetic ``StableDiffusionPipeline``; the same weights for the same seed."""
    # seconds to import (the SD pipeline, the VAE, CLIP): deferred to a build
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    s = _SPECS[name]
    n = len(s["widths"])
    gen_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        unet = UNet2DConditionModel(
            sample_size=s["size"], in_channels=4, out_channels=4, block_out_channels=s["widths"],
            layers_per_block=s["layers"], norm_num_groups=s["groups"], cross_attention_dim=s["cross"],
            attention_head_dim=s["heads"],
            down_block_types=("CrossAttnDownBlock2D",) * (n - 1) + ("DownBlock2D",),
            up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * (n - 1),
        )
        torch.manual_seed(seed + 1)
        vae = AutoencoderKL(
            in_channels=3, out_channels=3, latent_channels=4, block_out_channels=s["vae_widths"],
            down_block_types=("DownEncoderBlock2D",) * len(s["vae_widths"]),
            up_block_types=("UpDecoderBlock2D",) * len(s["vae_widths"]), norm_num_groups=min(8, s["vae_widths"][0]),
            sample_size=s["size"],
        )
        torch.manual_seed(seed + 2)
        vocab = char_vocab()
        text = CLIPTextModel(CLIPTextConfig(
            vocab_size=len(vocab), hidden_size=s["cross"], intermediate_size=s["text_ff"],
            num_hidden_layers=s["text_layers"], num_attention_heads=s["text_heads"], max_position_embeddings=77,
            bos_token_id=0, eos_token_id=1, pad_token_id=1,
        ))
    finally:
        torch.random.set_rng_state(gen_state)
    tokenizer = CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77)
    scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
                              set_alpha_to_one=False, steps_offset=1)
    pipe = StableDiffusionPipeline(vae=vae.eval(), text_encoder=text.eval(), tokenizer=tokenizer, unet=unet.eval(),
                                   scheduler=scheduler, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)
    return pipe
