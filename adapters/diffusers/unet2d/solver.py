"""``SolverPipeline``: an unconditional ``UNet2DModel`` pipeline for any diffusers scheduler
(the ``unet2d`` adapter's ``scheduler = "dpm++2m" | "unipc" | "euler"``).

``DDPMPipeline``'s loop neither scales the input (``scale_model_input``: Euler's
``1 / sqrt(sigma^2 + 1)``) nor the starting noise (``init_noise_sigma``), and passes
``generator`` to a ``step`` that may not take it (UniPC's); this loop does all three as
diffusers' conditional pipelines do, and is otherwise ``DDPMPipeline``'s (so it saves and loads
as one)."""

from __future__ import annotations

import inspect

import torch
from diffusers import DDPMPipeline, ImagePipelineOutput
from diffusers.utils.torch_utils import randn_tensor


class SolverPipeline(DDPMPipeline):
    """``DDPMPipeline`` with a loop that any scheduler runs correctly."""

    @torch.no_grad()
    def __call__(self, batch_size: int = 1, generator=None, num_inference_steps: int = 50, output_type: str = "pil",
                 return_dict: bool = True):
        size = self.unet.config.sample_size
        size = (size, size) if isinstance(size, int) else tuple(size)
        device = self._execution_device
        image = randn_tensor((batch_size, self.unet.config.in_channels, *size), generator=generator, device=device,
                             dtype=self.unet.dtype)
        self.scheduler.set_timesteps(num_inference_steps, device=device)  # before init_noise_sigma: Euler's depends on it
        image = image * self.scheduler.init_noise_sigma
        extra = {"generator": generator} if "generator" in inspect.signature(self.scheduler.step).parameters else {}
        for t in self.progress_bar(self.scheduler.timesteps):
            model_output = self.unet(self.scheduler.scale_model_input(image, t), t).sample
            image = self.scheduler.step(model_output, t, image, **extra, return_dict=False)[0]
        image = (image / 2 + 0.5).clamp(0, 1)
        if output_type != "pt":
            image = image.cpu().permute(0, 2, 3, 1).numpy()
            if output_type == "pil":
                image = self.numpy_to_pil(image)
        self.maybe_free_model_hooks()
        return ImagePipelineOutput(images=image) if return_dict else (image,)
