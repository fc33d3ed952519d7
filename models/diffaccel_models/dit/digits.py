"""The digits DiT: a small class-conditional diffusion transformer on the digits data.

Same data, prompts, text encoder, noise schedule, classifier and training loop as the UNet
digits model (the shared digits task, ``diffaccel.adapters.diffusers.digits``), so the conditioning
accuracy of both is one measure:

* Model: ``PooledTextPixArtTransformer2DModel`` (``nets/pooled_pixart.py``: PixArt-alpha's
  blocks: self-attention, cross-attention to the prompt, feed-forward, adaLN-single timestep
  modulation, plus the prompt's mean token state added to the timestep embedding) at 32x32,
  1 channel, patch 4: 64 tokens, one per pixel of the original 8x8 digit. Width 48 (3 heads of
  16), 10 blocks. The prompt comes from the UNet digits model's one-layer character
  ``CLIPTextModel`` (width 64): its trained weights, frozen (``text_from``, ``freeze_text``),
  mapped to the transformer's width by PixArt's caption projection. Stock PixArt with a jointly
  trained encoder ignored its prompt (docs/dit.md).
* Training: epsilon prediction on the 1000-step cosine schedule, 10% of rows with the empty
  prompt (the guidance null condition), AdamW with cosine decay over a time budget, an EMA of
  the weights is saved (safetensors, ``TextDiTPipeline`` folder).

``diffaccel train dit-digits --out DIR`` trains;
``diffaccel dit-digits-accuracy`` measures the conditioning accuracy.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import torch
from diffusers import DDIMScheduler, PixArtTransformer2DModel
from transformers import CLIPTextConfig, CLIPTextModel

from diffaccel.adapters.diffusers.digits import SCHEDULER_CONFIG, TEXT_CONFIG, add_eval_arguments, run_eval, train_loop
from diffaccel.adapters.diffusers.unet.loading import load_checkpoint as load_unet
from diffaccel.adapters.diffusers.unet.pipeline import char_tokenizer, char_vocab
from diffaccel.adapters.diffusers.dit.loading import load_checkpoint
from diffaccel.adapters.diffusers.dit.nets.pooled_pixart import PooledTextPixArtTransformer2DModel
from diffaccel.adapters.diffusers.dit.pipeline import TextDiTPipeline
from diffaccel.adapters.diffusers.digits import conditioning_accuracy  # noqa: F401 - importable from here as before

DIT_CONFIG = dict(
    sample_size=32, in_channels=1, out_channels=1, patch_size=4, num_layers=10, num_attention_heads=3,
    attention_head_dim=16, cross_attention_dim=48, caption_channels=TEXT_CONFIG["hidden_size"],
    num_embeds_ada_norm=1000, norm_type="ada_norm_single", norm_elementwise_affine=False, norm_eps=1e-6,
    attention_bias=True, activation_fn="gelu-approximate",
)
"""Patch 4 on 32x32 gives 64 tokens: the digits are 8x8 images upsampled, so one token per
original pixel loses nothing and keeps attention cheap on a CPU. The width is what a 30-minute
budget on a shared 2-core machine can train (at nice 15, one thread)."""


def new_pipeline(seed: int = 0, pooled_text: bool = True, **overrides):
    """Random weights; ``pooled_text``: the ``PooledTextPixArtTransformer2DModel`` (the prompt also
    in the adaLN timestep embedding, ``nets/pooled_pixart.py``), else stock PixArt."""
    torch.manual_seed(seed)
    model = PooledTextPixArtTransformer2DModel if pooled_text else PixArtTransformer2DModel
    transformer = model(**{**DIT_CONFIG, **overrides})
    text = CLIPTextModel(CLIPTextConfig(vocab_size=len(char_vocab()), **TEXT_CONFIG))
    return TextDiTPipeline(transformer=transformer, scheduler=DDIMScheduler(**SCHEDULER_CONFIG), text_encoder=text,
                           tokenizer=char_tokenizer(TEXT_CONFIG["max_position_embeddings"]))


@attrs.frozen(kw_only=True)
class TrainDiTConfig:
    out: str = "runs/dit-digits"
    """Output folder: the TextDiTPipeline (model_index.json, transformer/, ...) and train.json."""
    max_minutes: float = 29.0
    """Training time budget (the learning rate decays over it)."""
    steps: int = 100_000
    """Optimiser steps at most."""
    batch: int = 24
    lr: float = 2e-3
    p_uncond: float = 0.1
    """Share of rows trained with the empty prompt (the guidance null condition)."""
    ema: float = 0.999
    """Decay of the weight average that is saved."""
    threads: int = 1
    """Torch threads (the project trains with one)."""
    seed: int = 0
    adaln_zero: bool = True
    """Start every block as the identity (DiT's adaLN-Zero): the timestep modulation, the blocks'
    gates and the output projection begin at zero, which made the loss fall faster in a short
    A/B on this data."""
    pooled_text: bool = True
    """The prompt's mean token state also enters the adaLN timestep embedding
    (``PooledTextPixArtTransformer2DModel``). Without it (stock PixArt, cross-attention only) the
    model ignored its prompt: conditioning accuracy at chance (docs/dit.md)."""
    text_from: str | None = "digits"
    """Start from this digits pipeline's text encoder (a checkpoint of the UNet adapter; default the
    shipped UNet ``digits`` model's) instead of random weights (None)."""
    freeze_text: bool = True
    """Keep the text encoder as it starts (no gradient). Trained jointly, the DiT drove the
    encoder's states for the ten digits together (their spread fell from 7% of their norm at
    init to under 1% in 1000 steps, while the UNet's trained encoder separates them by 62%)."""
    checkpoint_minutes: float = 12.0
    eval_per_class: int = 3
    """Images per class in the quick accuracy check at each checkpoint (0: none)."""


@torch.no_grad()
def adaln_zero(transformer) -> None:
    """DiT's adaLN-Zero initialisation on a PixArt transformer: the timestep's modulation
    projection, each block's gate rows (2: attention, 5: feed-forward, of its scale-shift table)
    and the output projection are zero, so every block starts as the identity."""
    torch.nn.init.zeros_(transformer.adaln_single.linear.weight)
    torch.nn.init.zeros_(transformer.adaln_single.linear.bias)
    for block in transformer.transformer_blocks:
        block.scale_shift_table[2].zero_()
        block.scale_shift_table[5].zero_()
    torch.nn.init.zeros_(transformer.proj_out.weight)
    torch.nn.init.zeros_(transformer.proj_out.bias)


def train(cfg: TrainDiTConfig) -> Path:
    """Train the digits DiT (``diffaccel.adapters.diffusers.digits.train_loop``) from random weights."""
    pipe = new_pipeline(cfg.seed, pooled_text=cfg.pooled_text)
    if cfg.adaln_zero:
        adaln_zero(pipe.transformer)
    if cfg.text_from:
        pipe.text_encoder.load_state_dict(load_unet(cfg.text_from).text_encoder.state_dict())
    if cfg.freeze_text:
        pipe.text_encoder.requires_grad_(False)

    def predict(model, xt, t, cond):
        return model(xt, encoder_hidden_states=cond, timestep=t, return_dict=False)[0]

    def snapshot(model, text):
        return TextDiTPipeline(transformer=model, scheduler=pipe.scheduler, text_encoder=text, tokenizer=pipe.tokenizer)

    return train_loop(cfg, pipe, pipe.transformer, predict, snapshot, name="transformer", bar=False)


def run_train(args) -> int:
    """``diffaccel train dit-digits``: train the digits DiT (time-budgeted)."""
    torch.set_num_threads(args.threads)  # set by command-line entry points only, never by library code
    train(TrainDiTConfig(out=args.out, max_minutes=args.max_minutes, batch=args.batch, seed=args.seed,
                         threads=args.threads, pooled_text=not args.stock_pixart,
                         checkpoint_minutes=args.checkpoint_minutes, lr=args.lr,
                         adaln_zero=not args.no_adaln_zero, text_from=None if args.text_from == "none" else args.text_from,
                         freeze_text=args.freeze_text))
    return 0


def run_accuracy(args) -> int:
    """``diffaccel dit-digits-accuracy``: the conditioning accuracy of a digits DiT, per class and overall."""
    torch.set_num_threads(args.threads)
    return run_eval(args, load_checkpoint)
