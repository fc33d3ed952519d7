"""The default image model: class-conditional digits, a UNet on the shared digits task.

* Model: a ``UNet2DConditionModel`` of about 1.6M parameters (block widths 32, 64, 72, one
  layer per block, attention at the 8x8 level and in the middle), conditioned by
  cross-attention on a one-layer ``CLIPTextModel`` (width 64) over the prompt's characters
  (``"digit 7"`` or ``"7"``); the empty prompt is the null condition of classifier-free
  guidance (dropped for 10% of the training rows). Noise schedule: 1000 cosine steps, epsilon
  prediction; sampling with DDIM (``DigitsPipeline``).
* Data, classifier, conditioning accuracy and the training loop are the digits task's, shared
  with the digits DiT (``diffaccel.adapters.diffusers.digits``; re-exported here).

``diffaccel train digits --out DIR`` trains (time-budgeted) and writes a ``DigitsPipeline``
folder; ``diffaccel digits-accuracy`` measures the conditioning accuracy.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import torch
from diffusers import DDIMScheduler, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel

from diffaccel.adapters.diffusers.digits import (  # noqa: F401 - the shared digits task, importable from here as before
    SCHEDULER_CONFIG, TEXT_CONFIG, classifier, classify, conditioning_accuracy, load_data, to_8x8)
from diffaccel.adapters.diffusers.digits import add_eval_arguments, run_eval, train_loop
from diffaccel.adapters.diffusers.unet.loading import load_checkpoint
from diffaccel.adapters.diffusers.unet.pipeline import DigitsPipeline, char_tokenizer, char_vocab

UNET_CONFIG = dict(
    sample_size=32, in_channels=1, out_channels=1, block_out_channels=(32, 64, 72), layers_per_block=1,
    down_block_types=("DownBlock2D", "DownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "UpBlock2D", "UpBlock2D"),
    cross_attention_dim=64, attention_head_dim=2, norm_num_groups=8,
)
"""Attention (self and cross, 2 heads) only at 8x8 and in the middle: on a CPU, attention over the
256 positions of the 16x16 level cost 40% of a training step and added little."""

# ---- model -------------------------------------------------------------------------------------

def new_pipeline(seed: int = 0):
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(**UNET_CONFIG)
    text = CLIPTextModel(CLIPTextConfig(vocab_size=len(char_vocab()), **TEXT_CONFIG))
    return DigitsPipeline(unet=unet, scheduler=DDIMScheduler(**SCHEDULER_CONFIG), text_encoder=text,
                          tokenizer=char_tokenizer(TEXT_CONFIG["max_position_embeddings"]))


@attrs.frozen(kw_only=True)
class TrainDigitsConfig:
    out: str = "runs/digits"
    """Output folder: the DigitsPipeline (model_index.json, unet/, ...), train.json, curves.png."""
    max_minutes: float = 27.0
    """Training time budget (the learning rate decays over it); 0 means ``steps`` alone."""
    steps: int = 100_000
    """Optimiser steps at most."""
    batch: int = 32
    lr: float = 1e-3
    p_uncond: float = 0.1
    """Share of rows trained with the empty prompt (the guidance null condition)."""
    ema: float = 0.999
    """Decay of the weight average that is saved."""
    threads: int = 2
    """Threads at most; every 150 steps, 10 steps at the other setting (1 or ``threads``) decide
    which is faster now (a busy machine can make 2 threads slower than 1). Run with
    OMP_WAIT_POLICY=PASSIVE so idle threads do not spin."""
    seed: int = 0
    checkpoint_minutes: float = 7.0
    eval_per_class: int = 5
    """Images per class in the quick accuracy check at each checkpoint (0: none)."""
    init: str | None = None
    """Continue from this DigitsPipeline folder's weights (e.g. a run cut short) instead of random
    ones; the learning rate warms up and decays again over this run's budget."""


def train_digits(cfg: TrainDigitsConfig) -> Path:
    """Train the digits UNet (``diffaccel.adapters.diffusers.digits.train_loop``), from random weights or
    from ``cfg.init``; the command line set cfg.threads torch threads (the loop may probe 1)."""
    pipe = new_pipeline(cfg.seed)
    if cfg.init:
        start = load_checkpoint(cfg.init)
        pipe.unet.load_state_dict({k: v.float() for k, v in start.unet.state_dict().items()})
        pipe.text_encoder.load_state_dict({k: v.float() for k, v in start.text_encoder.state_dict().items()})

    def snapshot(unet, text):
        return DigitsPipeline(unet=unet, scheduler=pipe.scheduler, text_encoder=text, tokenizer=pipe.tokenizer)

    return train_loop(cfg, pipe, pipe.unet, lambda unet, xt, t, cond: unet(xt, t, encoder_hidden_states=cond, return_dict=False)[0],
                      snapshot, name="unet", bar=True)


def run_accuracy(args) -> int:
    """``diffaccel digits-accuracy``: the conditioning accuracy of a digits model, per class and overall."""
    torch.set_num_threads(args.threads)  # set by command-line entry points only, never by library code
    if args.classifier_check:
        from sklearn.model_selection import cross_val_score  # scikit-learn's import is slow: only for this check
        from sklearn.svm import SVC

        x, y = load_data()
        s = cross_val_score(SVC(gamma=0.001, C=10.0), to_8x8((x + 1) / 2), y, cv=5)
        print(f"classifier 5-fold accuracy on load_digits (8->32->8 round trip): {s.mean():.3f}")
    return run_eval(args, load_checkpoint)
