"""Helpers for testing strategies, in this repository and in a plugin's own.

    from diffaccel.testing import tiny_text_pipeline, run_with

    def test_my_strategy_skips_layers():
        pipe = tiny_text_pipeline()
        out = run_with(pipe, [MyStrategy(MyConfig())], seed=0)
        assert out.report["counters"]["layers_skipped"] > 0

The pytest fixture ``tiny_text_pipe`` (registered by ``pytest_plugins = ["diffaccel.testing"]``)
gives the same tiny, randomly initialised model: fast, offline, deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest


class CharTokenizer:
    """A throwaway tokenizer over lowercase letters and space; ids 0-3 are special."""

    PAD, UNK, MASK, SEP = 0, 1, 2, 3
    alphabet = " abcdefghijklmnopqrstuvwxyz"

    def __init__(self, vocab_size: int = 64):
        self.vocab_size = vocab_size
        self.mask_id = self.MASK
        self.special_ids = {0, 1, 2, 3}

    def encode(self, text: str) -> list[int]:
        return [4 + self.alphabet.index(c) if c in self.alphabet else self.UNK for c in text.lower()]

    def decode(self, ids) -> str:
        out = []
        for i in ids:
            i = int(i)
            if i == self.SEP:
                out.append("\n")
            elif 4 <= i < 4 + len(self.alphabet):
                out.append(self.alphabet[i - 4])
            elif i >= 4:
                out.append(f"<{i}>")
        return "".join(out)


def tiny_text_pipeline(kind: str = "masked", *, seed: int = 0, vocab_size: int = 64, n_layers: int = 2,
                       max_len: int = 32, time_conditioned: bool = False, dim: int = 32):
    """A ``TextDiffusionPipeline`` over a random tiny reference model (deterministic per seed)."""
    import torch

    from diffaccel.adapters.text.denoisers import ReferenceDenoiser
    from diffaccel.adapters.text.model import TextDiffusionConfig, TextDiffusionLM
    from diffaccel.adapters.text.pipeline import TextDiffusionPipeline

    torch.manual_seed(seed)
    cfg = TextDiffusionConfig(vocab_size=vocab_size, kind=kind, dim=dim, n_layers=n_layers, n_heads=2, max_len=max_len,
                              embed_dim=16, mask_id=CharTokenizer.MASK, time_conditioned=time_conditioned,
                              num_timesteps=100)
    model = TextDiffusionLM(cfg)
    # zero-initialised gates would make every block an identity: give the blocks something to do
    for block in model.blocks:
        torch.nn.init.normal_(block.mod.weight, std=0.02)
        torch.nn.init.normal_(block.mod.bias, std=0.5)
    return TextDiffusionPipeline(ReferenceDenoiser(model.eval()), CharTokenizer(vocab_size), name=f"tiny-{kind}")


def tiny_digits_pipeline(*, text_layers: int = 2):
    """A ``DigitsPipeline`` (the shipped image model's pipeline class) over a random tiny UNet (16x16,
    one channel, widths 16 and 32, cross-attention at the inner level) and a tiny CLIP text
    encoder over characters, DDIM as the shipped model uses it. Deterministic."""
    import torch
    from diffusers import DDIMScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    from diffaccel.adapters.unet.pipeline import DigitsPipeline, char_tokenizer, char_vocab

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        sample_size=16, in_channels=1, out_channels=1, block_out_channels=(16, 32), layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=16, attention_head_dim=4, norm_num_groups=8,
    ).eval()
    torch.manual_seed(0)
    text = CLIPTextModel(CLIPTextConfig(vocab_size=len(char_vocab()), hidden_size=16, intermediate_size=37,
                                        num_hidden_layers=text_layers, num_attention_heads=4, max_position_embeddings=16,
                                        bos_token_id=0, eos_token_id=1, pad_token_id=1)).eval()
    sched = DDIMScheduler(num_train_timesteps=1000, beta_schedule="squaredcos_cap_v2", clip_sample=True,
                          set_alpha_to_one=True, timestep_spacing="trailing")
    return DigitsPipeline(unet=unet, scheduler=sched, text_encoder=text, tokenizer=char_tokenizer(16))


def run_with(pipe, strategies: Sequence[Any] = (), **call_kwargs):
    """Run ``pipe`` once with ``strategies`` applied (and removed afterwards)."""
    from diffaccel import apply

    call_kwargs.setdefault("progress", False)
    call_kwargs.setdefault("length", 24)
    with apply(pipe, strategies=list(strategies)):
        return pipe(**call_kwargs)


@pytest.fixture
def tiny_text_pipe():
    """A tiny random masked text pipeline (2 layers, 64 tokens, 32 positions)."""
    return tiny_text_pipeline("masked")


@pytest.fixture(scope="session")
def install_distribution(tmp_path_factory):
    """``install(folder)``: ``pip install --target`` of a distribution folder (a test plugin or
    adapter) into a fresh folder, built from a copy so that building never writes into the
    source; returns the folder to put on ``sys.path`` or ``PYTHONPATH``."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    def install(folder: Path) -> Path:
        target = tmp_path_factory.mktemp(f"{folder.name}-site")
        src = tmp_path_factory.mktemp(f"{folder.name}-src")
        shutil.copytree(folder, src, dirs_exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--target", str(target), str(src)], check=True, capture_output=True)
        return target

    return install
