"""The sampling loop of diffaccel's own prompt-conditioned diffusers pipelines (``DigitsPipeline``
around a UNet, ``TextDiTPipeline`` around a diffusion transformer).

A CLIP text encoder embeds the prompt, a scheduler (DDIM by default) runs the steps, and
classifier-free guidance batches the unconditional (empty prompt) and conditional branches into
one denoiser call of 2B rows; ``cfg_batched=False`` calls the denoiser twice per step
(unconditional first), as memory-saving pipelines do. An optional VAE decodes latents into
images; without one the denoiser works on pixels in [-1, 1]. Images are returned in [0, 1].
"""

from __future__ import annotations

import inspect

import torch
from diffusers import ImagePipelineOutput
from diffusers.utils.torch_utils import randn_tensor


class GuidedPipeline:
    """Mixed into a ``DiffusionPipeline`` subclass that registers ``text_encoder``, ``tokenizer``,
    ``scheduler``, its denoiser (named by ``denoiser_name``) and optionally ``vae``, and says how
    one denoiser call is made (``_denoise``)."""

    denoiser_name = "unet"

    @property
    def guidance_scale(self) -> float:
        return self._guidance_scale

    @property
    def do_classifier_free_guidance(self) -> bool:
        return self._guidance_scale > 1.0

    @property
    def vae_scale_factor(self) -> int:
        vae = getattr(self, "vae", None)
        return 2 ** (len(vae.config.block_out_channels) - 1) if vae is not None else 1

    def encode_prompt(self, prompts: list[str], device) -> torch.Tensor:
        tok = self.tokenizer
        ids = tok(prompts, padding="max_length", max_length=tok.model_max_length, truncation=True,
                  return_tensors="pt").input_ids
        return self.text_encoder(ids.to(device))[0]

    def _denoise(self, x: torch.Tensor, t, cond: torch.Tensor) -> torch.Tensor:
        """The noise prediction for ``x`` at timestep ``t`` under the prompt embedding ``cond``."""
        raise NotImplementedError

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
        cfg = getattr(self, self.denoiser_name).config
        f = self.vae_scale_factor
        height, width = height or cfg.sample_size * f, width or cfg.sample_size * f
        cond = self.encode_prompt(prompts, device)
        uncond = self.encode_prompt([""] * B, device) if self.do_classifier_free_guidance else None
        shape = (B, cfg.in_channels, height // f, width // f)
        if latents is None:
            latents = randn_tensor(shape, generator=generator, device=device, dtype=cond.dtype)
        # timesteps first: Euler's init_noise_sigma is that of the first timestep set here (DDIM's,
        # DPM-Solver's and UniPC's is 1 whatever the steps)
        self.scheduler.set_timesteps(num_inference_steps, device=device)
        latents = latents.to(device) * self.scheduler.init_noise_sigma
        extra = {}
        step_params = set(inspect.signature(self.scheduler.step).parameters)
        if "eta" in step_params:
            extra["eta"] = eta
        if "generator" in step_params:
            extra["generator"] = generator
        both = torch.cat([uncond, cond]) if uncond is not None else None
        for t in self.progress_bar(self.scheduler.timesteps):
            if uncond is None:
                noise = self._denoise(self.scheduler.scale_model_input(latents, t), t, cond)
            elif cfg_batched:
                x = self.scheduler.scale_model_input(torch.cat([latents] * 2), t)
                noise_u, noise_c = self._denoise(x, t, both).chunk(2)
                noise = noise_u + guidance_scale * (noise_c - noise_u)
            else:
                x = self.scheduler.scale_model_input(latents, t)
                noise_u = self._denoise(x, t, uncond)
                noise_c = self._denoise(x, t, cond)
                noise = noise_u + guidance_scale * (noise_c - noise_u)
            latents = self.scheduler.step(noise, t, latents, **extra, return_dict=False)[0]
        if output_type == "latent":
            out = latents
        else:
            vae = getattr(self, "vae", None)
            images = latents if vae is None else vae.decode(latents / vae.config.scaling_factor, return_dict=False)[0]
            images = (images / 2 + 0.5).clamp(0, 1)
            if output_type == "pt":
                out = images
            else:
                arr = images.permute(0, 2, 3, 1).float().cpu().numpy()
                out = self.numpy_to_pil(arr) if output_type == "pil" else arr
        self.maybe_free_model_hooks()
        if not return_dict:
            return (out,)
        return ImagePipelineOutput(images=out)
