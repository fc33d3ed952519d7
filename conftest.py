"""Shared by every test suite in the repository (core and plugins)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)  # tiny models: one thread is as fast and leaves the other core free

pytest_plugins = ["diffaccel.testing", "diffaccel.adapters.text.testing"]
