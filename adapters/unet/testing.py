"""A tiny random image pipeline for testing strategies on the UNet adapter (see
``diffaccel.adapters.text.testing`` for the text one)."""

from __future__ import annotations

import torch
from diffusers import DDIMScheduler, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel

from .pipeline import DigitsPipeline, char_tokenizer, char_vocab


def tiny_digits_pipeline(*, text_layers: int = 2) -> DigitsPipeline:
    """A ``DigitsPipeline`` (the shipped image model's pipeline class) over a random tiny UNet (16x16,
    one channel, widths 16 and 32, cross-attention at the inner level) and a tiny CLIP text
    encoder over characters, DDIM as the shipped model uses it. Deterministic."""
    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        sample_size=16, in_channels=1, out_channels=1, block_out_channels=(16, 32), layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=16, attention_head_dim=4, norm_num_groups=8,
    ).eval()
    torch.manual_seed(0)
    text = CLIPTextModel(CLIPTextConfig(vocab_size=len(char_vocab()), hidden_size=16, intermediate_size=37,
                                        num_hidden_layers=text_layers, num_attention_heads=4, max_position_embeddings=16,
                                        bos_token_id=0, eos_token_id=1, pad_token_id=1)).eval()
    sched = DDIMScheduler(num_train_timesteps=1000, beta_schedule="squaredcos_cap_v2", clip_sample=True,
                          set_alpha_to_one=True, timestep_spacing="trailing")
    return DigitsPipeline(unet=unet, scheduler=sched, text_encoder=text, tokenizer=char_tokenizer(16))
