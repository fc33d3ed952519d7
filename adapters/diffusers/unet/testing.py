"""Tiny random image pipelines for testing strategies on the UNet adapter (see
``diffaccel.adapters.text.testing`` for the text one), and the pytest fixtures ``tiny_sd`` and
``tiny_digits`` (module-scoped) that diffaccel's tests use (``pytest_plugins``)."""

from __future__ import annotations

import pytest
import torch
from diffusers import DDIMScheduler, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

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


def tiny_clip(hidden: int, max_len: int) -> CLIPTextModel:
    """A tiny random CLIP text encoder over characters (``char_vocab``)."""
    torch.manual_seed(0)
    return CLIPTextModel(CLIPTextConfig(vocab_size=len(char_vocab()), hidden_size=hidden, intermediate_size=37,
                                        num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=max_len,
                                        bos_token_id=0, eos_token_id=1, pad_token_id=1)).eval()


def tiny_sd_pipeline(mid: bool = True):
    """A tiny random ``StableDiffusionPipeline`` (16x16 latents, widths 32 and 64, a mid block
    unless ``mid`` is False), built the way diffusers' own tests build theirs. Deterministic."""
    # deferred: importing StableDiffusionPipeline pulls in transformers' image processors (and
    # their torchvision warning) for every test session, not only the ones that build one
    from diffusers import AutoencoderKL, StableDiffusionPipeline

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(32, 64), layers_per_block=2, sample_size=16, in_channels=4, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32, norm_num_groups=8, mid_block_type="UNetMidBlock2DCrossAttn" if mid else None,
    ).eval()
    torch.manual_seed(0)
    vae = AutoencoderKL(block_out_channels=[32, 64], in_channels=3, out_channels=3, latent_channels=4, norm_num_groups=8,
                        down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2).eval()
    sched = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
                          set_alpha_to_one=False, steps_offset=1)
    tok = CLIPTokenizer(vocab=char_vocab(), merges=[], model_max_length=77)
    return StableDiffusionPipeline(vae=vae, text_encoder=tiny_clip(32, 77), tokenizer=tok, unet=unet, scheduler=sched,
                                   safety_checker=None, feature_extractor=None, requires_safety_checker=False)


def sd_images(pipe, seed: int = 0, steps: int = 4, guidance: float = 7.5, prompt: str = "a red cube") -> torch.Tensor:
    """Images of one prompt from ``pipe`` (a Stable Diffusion pipeline), as a tensor."""
    return pipe([prompt], num_inference_steps=steps, guidance_scale=guidance, output_type="pt",
                generator=[torch.Generator().manual_seed(seed)]).images


def digit_images(pipe, batched: bool = True, steps: int = 4, guidance: float = 2.0, prompts=("digit 3", "7")) -> torch.Tensor:
    """Images of ``prompts`` from a ``DigitsPipeline``, row i seeded with i."""
    gens = [torch.Generator().manual_seed(i) for i in range(len(prompts))]
    pipe.set_progress_bar_config(disable=True)
    return pipe(list(prompts), num_inference_steps=steps, guidance_scale=guidance, generator=gens, output_type="pt",
                cfg_batched=batched).images


@pytest.fixture(scope="module")
def tiny_sd():
    """``tiny_sd_pipeline()``, once per test module."""
    return tiny_sd_pipeline()


@pytest.fixture(scope="module")
def tiny_digits():
    """``tiny_digits_pipeline()``, once per test module."""
    return tiny_digits_pipeline()
