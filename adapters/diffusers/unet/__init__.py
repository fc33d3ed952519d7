"""The UNet adapter: diffusers pipelines with a UNet2DConditionModel (Stable Diffusion, the digits model)."""
