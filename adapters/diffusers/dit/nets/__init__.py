"""Denoiser classes of the DiT adapter (a package of its own: diffusers reads a module whose parent folder is named like one of its pipelines, ``dit``, as that pipeline's)."""
