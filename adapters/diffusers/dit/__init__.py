"""The diffusion-transformer adapter (``adapter = "dit"``)."""
