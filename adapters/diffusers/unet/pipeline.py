"""``DigitsPipeline``: a pixel-space, prompt-conditioned diffusers pipeline (the default image model).

Like ``StableDiffusionPipeline`` without a VAE: a CLIP text encoder embeds the prompt, the
``UNet2DConditionModel`` cross-attends to it, a scheduler (DDIM by default) runs the steps,
and classifier-free guidance batches the unconditional (empty prompt) and conditional branches
into one UNet call of 2B rows. ``cfg_batched=False`` calls the UNet twice per step instead
(unconditional first), as memory-saving pipelines do. Images are in [-1, 1] during sampling
and returned in [0, 1]. The sampling loop is ``diffaccel.adapters.diffusers.guided_pipeline``'s, shared
with the DiT's ``TextDiTPipeline``.

Saved and loaded with diffusers' ``save_pretrained`` / ``from_pretrained`` (model_index.json,
``unet/``, ``scheduler/``, ``text_encoder/``, ``tokenizer/``).
"""

from __future__ import annotations

import numpy as np
import torch
from diffusers import DiffusionPipeline, UNet2DConditionModel

from ..guided_pipeline import GuidedPipeline

CHARS = "abcdefghijklmnopqrstuvwxyz0123456789"


def char_vocab() -> dict[str, int]:
    """A character vocabulary for ``CLIPTokenizer(vocab=..., merges=[])``: with no merges, BPE
    splits each word into characters, the last one marked ``</w>``."""
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in CHARS:
        vocab[c] = len(vocab)
    for c in CHARS:
        vocab[c + "</w>"] = len(vocab)
    return vocab


def char_tokenizer(max_length: int = 16):
    from transformers import CLIPTokenizer  # transformers' CLIP takes a second to import: deferred to a build

    return CLIPTokenizer(vocab=char_vocab(), merges=[], model_max_length=max_length)


class DigitsPipeline(GuidedPipeline, DiffusionPipeline):
    """Generate 32x32 grey digits: ``pipe(["digit 3", "7"], guidance_scale=2.0).images``."""

    model_cpu_offload_seq = "text_encoder->unet"
    denoiser_name = "unet"

    def __init__(self, unet: UNet2DConditionModel, scheduler, text_encoder, tokenizer):
        super().__init__()
        self.register_modules(unet=unet, scheduler=scheduler, text_encoder=text_encoder, tokenizer=tokenizer)
        self._guidance_scale = 1.0

    def _denoise(self, x: torch.Tensor, t, cond: torch.Tensor) -> torch.Tensor:
        return self.unet(x, t, encoder_hidden_states=cond, return_dict=False)[0]


def to_numpy_grey(images: torch.Tensor) -> np.ndarray:
    """(B, C, H, W) in [0, 1] -> (B, H, W) float grey."""
    return images.float().mean(1).cpu().numpy()
