"""``TextDiTPipeline``: a prompt-conditioned diffusers pipeline around a diffusion transformer.

The denoiser is a ``PixArtTransformer2DModel`` (any transformer taking ``hidden_states``,
``encoder_hidden_states``, ``timestep`` and returning the noise prediction works). A CLIP text
encoder over characters embeds the prompt (the transformer's caption projection maps it to its
width), a scheduler (DDIM by default) runs the steps, and classifier-free guidance batches the
unconditional (empty prompt) and conditional branches into one transformer call of 2B rows;
``cfg_batched=False`` calls the transformer twice per step (unconditional first). An optional
VAE decodes latents into images; without one the transformer works on pixels in [-1, 1].

Used by the digits DiT (``digits.py``, 1-channel 32x32 pixels) and the synthetic medium DiT
(``synthetic.py``, 4-channel latents, a tiny VAE). The sampling loop is
``diffaccel.adapters.diffusers.guided_pipeline``'s, shared with the UNet's ``DigitsPipeline``. Saved and
loaded with ``save_pretrained`` / ``from_pretrained``.
"""

from __future__ import annotations

import torch
from diffusers import DiffusionPipeline

from ..guided_pipeline import GuidedPipeline
from .nets import pooled_pixart  # noqa: F401 - imported so that from_pretrained can load a saved PooledTextPixArtTransformer2DModel


class TextDiTPipeline(GuidedPipeline, DiffusionPipeline):
    """``pipe(["digit 3", "7"], guidance_scale=2.0).images``."""

    model_cpu_offload_seq = "text_encoder->transformer->vae"
    _optional_components = ["vae"]
    denoiser_name = "transformer"

    def __init__(self, transformer, scheduler, text_encoder, tokenizer, vae=None):
        super().__init__()
        self.register_modules(transformer=transformer, scheduler=scheduler, text_encoder=text_encoder,
                              tokenizer=tokenizer, vae=vae)
        self._guidance_scale = 1.0

    def _denoise(self, x: torch.Tensor, t, cond: torch.Tensor) -> torch.Tensor:
        timestep = t.expand(x.shape[0]) if isinstance(t, torch.Tensor) else torch.full((x.shape[0],), t)
        out = self.transformer(x, encoder_hidden_states=cond, timestep=timestep, return_dict=False)[0]
        c = x.shape[1]
        return out[:, :c] if out.shape[1] == 2 * c else out  # learned-sigma models: keep the noise half
