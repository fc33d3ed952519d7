"""The digits DiT: a small class-conditional diffusion transformer on the digits data.

Same data, prompts, text encoder, noise schedule and classifier as the UNet digits model
(``diffaccel.adapters.unet.digits``), so the conditioning accuracy of both is one measure:

* Model: ``PixArtTransformer2DModel`` (PixArt-alpha's blocks: self-attention, cross-attention
  to the prompt, feed-forward, adaLN-single timestep modulation) at 32x32, 1 channel, patch 4:
  64 tokens, one per pixel of the original 8x8 digit. Width 48 (3 heads of 16), 10 blocks.
  The prompt comes from the UNet digits model's one-layer character ``CLIPTextModel``
  (width 64), mapped to the transformer's width by PixArt's caption projection.
* Training: epsilon prediction on the 1000-step cosine schedule, 10% of rows with the empty
  prompt (the guidance null condition), AdamW with cosine decay over a time budget, an EMA of
  the weights is saved (safetensors, ``TextDiTPipeline`` folder).

``python -m diffaccel.adapters.dit.digits train --out DIR`` trains;
``python -m diffaccel.adapters.dit.digits eval`` measures the conditioning accuracy.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import attrs
import numpy as np
import torch
import torch.nn.functional as F

from diffaccel.adapters.unet.digits import SCHEDULER_CONFIG, TEXT_CONFIG, _prompt_table, load_data

DIT_CONFIG = dict(
    sample_size=32, in_channels=1, out_channels=1, patch_size=4, num_layers=10, num_attention_heads=3,
    attention_head_dim=16, cross_attention_dim=48, caption_channels=TEXT_CONFIG["hidden_size"],
    num_embeds_ada_norm=1000, norm_type="ada_norm_single", norm_elementwise_affine=False, norm_eps=1e-6,
    attention_bias=True, activation_fn="gelu-approximate",
)
"""Patch 4 on 32x32 gives 64 tokens: the digits are 8x8 images upsampled, so one token per
original pixel loses nothing and keeps attention cheap on a CPU. The width is what a 30-minute
budget on a shared 2-core machine can train (at nice 15, one thread)."""


def new_pipeline(seed: int = 0, **overrides):
    from diffusers import DDIMScheduler, PixArtTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel

    from ..unet.pipeline import char_tokenizer, char_vocab
    from .pipeline import TextDiTPipeline

    torch.manual_seed(seed)
    transformer = PixArtTransformer2DModel(**{**DIT_CONFIG, **overrides})
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
    seed: int = 0
    adaln_zero: bool = True
    """Start every block as the identity (DiT's adaLN-Zero): the timestep modulation, the blocks'
    gates and the output projection begin at zero, which made the loss fall faster in a short
    A/B on this data."""
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


@torch.no_grad()
def conditioning_accuracy(pipe, per_class: int = 20, steps: int = 50, guidance: float = 2.0, seed: int = 0,
                          chunk: int = 50) -> dict[str, float]:
    """Generate ``per_class`` images of each digit (prompt "digit N", seeds seed, seed+1, ...) and
    return the digit classifier's accuracy per class and overall (the UNet digits measure)."""
    from ..unet.digits import classify
    from ..unet.metrics import conditioning_accuracy as acc

    prompts = [f"digit {c}" for c in range(10) for _ in range(per_class)]
    labels = [c for c in range(10) for _ in range(per_class)]
    preds: list[int] = []
    pipe.set_progress_bar_config(disable=True)
    for i in range(0, len(prompts), chunk):
        gens = [torch.Generator().manual_seed(seed + j) for j in range(i, min(i + chunk, len(prompts)))]
        images = pipe(prompts[i:i + chunk], num_inference_steps=steps, guidance_scale=guidance, generator=gens,
                      output_type="pt").images
        preds += classify(images)
    return acc(preds, labels)


def train(cfg: TrainDiTConfig) -> Path:
    from copy import deepcopy

    from .pipeline import TextDiTPipeline

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    x_all, y_all = load_data()
    y_all = torch.from_numpy(y_all)
    pipe = new_pipeline(cfg.seed)
    model, text, sched = pipe.transformer, pipe.text_encoder, pipe.scheduler
    if cfg.adaln_zero:
        adaln_zero(model)
    ids_table = _prompt_table(pipe.tokenizer, TEXT_CONFIG["max_position_embeddings"])
    params = [*model.parameters(), *text.parameters()]
    ema_model, ema_text = deepcopy(model).eval(), deepcopy(text).eval()
    ema_params = [*ema_model.parameters(), *ema_text.parameters()]
    for p in ema_params:
        p.requires_grad_(False)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.01)
    warmup, started = 100, time.time()

    def progress(step: int) -> float:
        return min(1.0, max(step / cfg.steps, (time.time() - started) / (cfg.max_minutes * 60)))

    lr_sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * progress(s))))
    alphas = sched.alphas_cumprod
    gen = torch.Generator().manual_seed(cfg.seed)
    losses: list[float] = []
    evals: list[dict] = []
    next_ckpt = cfg.checkpoint_minutes * 60
    step = 0

    def save(final: bool) -> None:
        snap = TextDiTPipeline(transformer=ema_model, scheduler=sched, text_encoder=ema_text, tokenizer=pipe.tokenizer)
        entry = {"step": step, "minutes": (time.time() - started) / 60}
        if cfg.eval_per_class:
            entry["accuracy"] = conditioning_accuracy(snap, per_class=cfg.eval_per_class, steps=25, guidance=2.0)
            print(f"step {step}: quick accuracy {entry['accuracy']['overall']:.3f}", file=sys.stderr, flush=True)
        evals.append(entry)
        snap.save_pretrained(str(out), safe_serialization=True)
        meta = {"config": attrs.asdict(cfg), "steps_done": step, "minutes": (time.time() - started) / 60,
                "final": final, "loss_last_200": float(np.mean(losses[-200:])) if losses else None,
                "evals": evals, "parameters_transformer": sum(p.numel() for p in model.parameters()),
                "parameters_text_encoder": sum(p.numel() for p in text.parameters()),
                "threads": torch.get_num_threads()}
        (out / "train.json.partial").write_text(json.dumps(meta, indent=2))
        (out / "train.json.partial").replace(out / "train.json")

    while step < cfg.steps and progress(step) < 1.0:
        model.train()
        text.train()
        idx = torch.randint(0, len(x_all), (cfg.batch,), generator=gen)
        x0, y = x_all[idx], y_all[idx]
        form = torch.randint(0, 2, (cfg.batch,), generator=gen) * 10  # "digit N" or "N"
        drop = torch.rand(cfg.batch, generator=gen) < cfg.p_uncond
        rows = torch.where(drop, torch.full_like(y, 20), y + form)
        t = torch.randint(0, len(alphas), (cfg.batch,), generator=gen)
        noise = torch.randn(x0.shape, generator=gen)
        ab = alphas[t].view(-1, 1, 1, 1)
        xt = ab.sqrt() * x0 + (1 - ab).sqrt() * noise
        cond = text(ids_table[rows])[0]
        pred = model(xt, encoder_hidden_states=cond, timestep=t, return_dict=False)[0]
        loss = F.mse_loss(pred, noise)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        lr_sched.step()
        decay = min(cfg.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            torch._foreach_lerp_(ema_params, [p.detach() for p in params], 1 - decay)
        losses.append(loss.item())
        step += 1
        if step % 100 == 0:
            print(f"step {step} loss {np.mean(losses[-100:]):.4f} lr {lr_sched.get_last_lr()[0]:.2e} "
                  f"{(time.time() - started) / 60:.1f} min", file=sys.stderr, flush=True)
        if time.time() - started >= next_ckpt:
            save(final=False)
            next_ckpt += cfg.checkpoint_minutes * 60
    save(final=True)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m diffaccel.adapters.dit.digits train|eval ...``"""
    p = argparse.ArgumentParser(prog="python -m diffaccel.adapters.dit.digits")
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train the digits DiT (time-budgeted)")
    t.add_argument("--out", default="runs/dit-digits")
    t.add_argument("--max-minutes", type=float, default=29.0)
    t.add_argument("--batch", type=int, default=24)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, default=1)
    e = sub.add_parser("eval", help="conditioning accuracy of a digits DiT, per class and overall")
    e.add_argument("--checkpoint", default="dit-digits", help="'dit-digits' (shipped) or a TextDiTPipeline folder")
    e.add_argument("--per-class", type=int, default=20)
    e.add_argument("--steps", type=int, default=50)
    e.add_argument("--guidance", type=float, default=2.0)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.cmd == "train":
        train(TrainDiTConfig(out=args.out, max_minutes=args.max_minutes, batch=args.batch, seed=args.seed))
        return 0
    from .adapter import load_checkpoint

    pipe = load_checkpoint(args.checkpoint)
    t0 = time.time()
    acc = conditioning_accuracy(pipe, per_class=args.per_class, steps=args.steps, guidance=args.guidance, seed=args.seed)
    print(f"{args.checkpoint}: {args.per_class} images per class, {args.steps} DDIM steps, guidance {args.guidance}, "
          f"seeds {args.seed}..{args.seed + 10 * args.per_class - 1} ({time.time() - t0:.0f}s)")
    print("class     " + "  ".join(f"{c:>5}" for c in range(10)) + "  overall")
    print("accuracy  " + "  ".join(f"{acc.get(str(c), float('nan')):>5.2f}" for c in range(10)) + f"  {acc['overall']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
