"""Shared by every test suite in the repository (core and plugins)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# the text caches' cost gate decides from the clock (diffaccel.kit.paygate): pinned on, tests are
# the same on a busy machine and a quiet one (the gate's own tests hand it a fake clock)
os.environ.setdefault("DIFFACCEL_COST_GATE", "on")

import torch  # noqa: E402

torch.set_num_threads(1)  # tiny models: one thread is as fast and leaves the other core free

pytest_plugins = ["diffaccel.testing", "diffaccel.adapters.text.testing", "diffaccel.adapters.diffusers.unet.testing"]


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_unet2d(tmp_path_factory):
    """A folder saved by ``DDPMPipeline.save_pretrained``: a tiny seeded random ``UNet2DModel``
    (16x16 grey, two down blocks, one with attention), for the unet2d adapter's tests."""
    from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel

    torch.manual_seed(0)
    unet = UNet2DModel(sample_size=16, in_channels=1, out_channels=1, layers_per_block=1, block_out_channels=(16, 32),
                       norm_num_groups=8, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                       up_block_types=("AttnUpBlock2D", "UpBlock2D"))
    path = tmp_path_factory.mktemp("tiny-ddpm")
    DDPMPipeline(unet=unet, scheduler=DDPMScheduler(num_train_timesteps=1000)).save_pretrained(path)
    return str(path)
