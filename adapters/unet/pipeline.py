"""``DigitsPipeline``: a pixel-space, prompt-conditioned diffusers pipeline (the default image model).

Like ``StableDiffusionPipeline`` without a VAE: a CLIP text encoder embeds the prompt, the
``UNet2DConditionModel`` cross-attends to it, a scheduler (DDIM by default) runs the steps,
and classifier-free guidance batches the unconditional (empty prompt) and conditional branches
into one UNet call of 2B rows. ``cfg_batched=False`` calls the UNet twice per step instead
(unconditional first), as memory-saving pipelines do. Images are in [-1, 1] during sampling
and returned in [0, 1].

Saved and loaded with diffusers' ``save_pretrained`` / ``from_pretrained`` (model_index.json,
``unet/``, ``scheduler/``, ``text_encoder/``, ``tokenizer/``).
"""

from __future__ import annotations

import inspect
import re

import numpy as np
import torch
from diffusers import DiffusionPipeline, ImagePipelineOutput, UNet2DConditionModel
from diffusers.utils.torch_utils import randn_tensor

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
    from transformers import CLIPTokenizer

    return CLIPTokenizer(vocab=char_vocab(), merges=[], model_max_length=max_length)


_DIGIT = re.compile(r"^\s*(?:digit\s+)?([0-9])\s*$", re.IGNORECASE)


def digit_label(prompt: str) -> int | None:
    """The class a digits prompt asks for (``"digit 7"`` or ``"7"``), else None."""
    m = _DIGIT.match(prompt or "")
    return int(m.group(1)) if m else None


class DigitsPipeline(DiffusionPipeline):
    """Generate 32x32 grey digits: ``pipe(["digit 3", "7"], guidance_scale=2.0).images``."""

    model_cpu_offload_seq = "text_encoder->unet"

    def __init__(self, unet: UNet2DConditionModel, scheduler, text_encoder, tokenizer):
        super().__init__()
        self.register_modules(unet=unet, scheduler=scheduler, text_encoder=text_encoder, tokenizer=tokenizer)
        self._guidance_scale = 1.0

    @property
    def guidance_scale(self) -> float:
        return self._guidance_scale

    @property
    def do_classifier_free_guidance(self) -> bool:
        return self._guidance_scale > 1.0

    def encode_prompt(self, prompts: list[str], device) -> torch.Tensor:
        tok = self.tokenizer
        ids = tok(prompts, padding="max_length", max_length=tok.model_max_length, truncation=True, return_tensors="pt").input_ids
        return self.text_encoder(ids.to(device))[0]

    @torch.no_grad()
    def __call__(
        self,
        prompt: str | list[str] = "",
        num_inference_steps: int = 50,
        guidance_scale: float = 2.0,
        generator: torch.Generator | list[torch.Generator] | None = None,
        height: int | None = None,
        width: int | None = None,
        eta: float = 0.0,
        latents: torch.Tensor | None = None,
        output_type: str = "pil",
        return_dict: bool = True,
        cfg_batched: bool = True,
    ):
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        B = len(prompts)
        device = self._execution_device
        self._guidance_scale = guidance_scale
        size = self.unet.config.sample_size
        height, width = height or size, width or size
        cond = self.encode_prompt(prompts, device)
        uncond = self.encode_prompt([""] * B, device) if self.do_classifier_free_guidance else None
        shape = (B, self.unet.config.in_channels, height, width)
        if latents is None:
            latents = randn_tensor(shape, generator=generator, device=device, dtype=cond.dtype)
        latents = latents.to(device) * self.scheduler.init_noise_sigma
        self.scheduler.set_timesteps(num_inference_steps, device=device)
        extra = {}
        step_params = set(inspect.signature(self.scheduler.step).parameters)
        if "eta" in step_params:
            extra["eta"] = eta
        if "generator" in step_params:
            extra["generator"] = generator
        both = torch.cat([uncond, cond]) if uncond is not None else None
        for t in self.progress_bar(self.scheduler.timesteps):
            if uncond is None:
                x = self.scheduler.scale_model_input(latents, t)
                noise = self.unet(x, t, encoder_hidden_states=cond, return_dict=False)[0]
            elif cfg_batched:
                x = self.scheduler.scale_model_input(torch.cat([latents] * 2), t)
                noise_u, noise_c = self.unet(x, t, encoder_hidden_states=both, return_dict=False)[0].chunk(2)
                noise = noise_u + guidance_scale * (noise_c - noise_u)
            else:
                x = self.scheduler.scale_model_input(latents, t)
                noise_u = self.unet(x, t, encoder_hidden_states=uncond, return_dict=False)[0]
                noise_c = self.unet(x, t, encoder_hidden_states=cond, return_dict=False)[0]
                noise = noise_u + guidance_scale * (noise_c - noise_u)
            latents = self.scheduler.step(noise, t, latents, **extra, return_dict=False)[0]
        images = (latents / 2 + 0.5).clamp(0, 1)
        if output_type == "pt":
            out = images
        elif output_type == "latent":
            out = latents
        else:
            arr = images.permute(0, 2, 3, 1).float().cpu().numpy()
            out = self.numpy_to_pil(arr) if output_type == "pil" else arr
        self.maybe_free_model_hooks()
        if not return_dict:
            return (out,)
        return ImagePipelineOutput(images=out)


def to_numpy_grey(images: torch.Tensor) -> np.ndarray:
    """(B, C, H, W) in [0, 1] -> (B, H, W) float grey."""
    return images.float().mean(1).cpu().numpy()
