"""The default image model: class-conditional digits, its data, its classifier and its training.

* Data: scikit-learn's ``load_digits()`` (1797 grey 8x8 digits, values 0-16), upsampled
  bilinearly to 32x32 and scaled to [-1, 1].
* Model: a ``UNet2DConditionModel`` of about 1.6M parameters (block widths 32, 64, 72, one
  layer per block, attention at the 8x8 level and in the middle), conditioned by
  cross-attention on a one-layer ``CLIPTextModel`` (width 64) over the prompt's characters
  (``"digit 7"`` or ``"7"``); the empty prompt is the null condition of classifier-free
  guidance (dropped for 10% of the training rows). Noise schedule: 1000 cosine steps, epsilon
  prediction; sampling with DDIM (``DigitsPipeline``).
* Classifier: an RBF support-vector machine on 8x8 images, fitted on ``load_digits()`` after the
  same 8 -> 32 -> 8 round trip that generated images take (32x32 average-pooled by 4), so that it
  sees the same kind of input. Used for the conditioning accuracy.

``diffaccel train digits --out DIR`` trains (time-budgeted) and writes a ``DigitsPipeline``
folder; ``python -m diffaccel.adapters.unet.digits eval`` measures the conditioning accuracy.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from functools import lru_cache
from pathlib import Path

import attrs
import numpy as np
import torch
import torch.nn.functional as F

UNET_CONFIG = dict(
    sample_size=32, in_channels=1, out_channels=1, block_out_channels=(32, 64, 72), layers_per_block=1,
    down_block_types=("DownBlock2D", "DownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "UpBlock2D", "UpBlock2D"),
    cross_attention_dim=64, attention_head_dim=2, norm_num_groups=8,
)
"""Attention (self and cross, 2 heads) only at 8x8 and in the middle: on a CPU, attention over the
256 positions of the 16x16 level cost 40% of a training step and added little."""
TEXT_CONFIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                   max_position_embeddings=16, bos_token_id=0, eos_token_id=1, pad_token_id=1)
SCHEDULER_CONFIG = dict(num_train_timesteps=1000, beta_schedule="squaredcos_cap_v2", prediction_type="epsilon",
                        clip_sample=True, set_alpha_to_one=True, timestep_spacing="trailing")


# ---- data and classifier ---------------------------------------------------------------------

def load_data() -> tuple[torch.Tensor, np.ndarray]:
    """(images (N, 1, 32, 32) in [-1, 1], labels (N,))."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32)[:, None] / 16.0
    x = F.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False)
    return x * 2 - 1, d.target.astype(np.int64)


def to_8x8(images: torch.Tensor) -> np.ndarray:
    """(B, C, H, W) in [0, 1] -> (B, 64) features on the 0-16 scale of load_digits."""
    x = images.float().mean(1, keepdim=True)
    x = F.adaptive_avg_pool2d(x, (8, 8))
    return (x * 16.0).flatten(1).cpu().numpy()


@lru_cache(maxsize=1)
def classifier():
    """An SVM fitted on the 8 -> 32 -> 8 round trip of ``load_digits()``."""
    from sklearn.svm import SVC

    x, y = load_data()
    return SVC(gamma=0.001, C=10.0).fit(to_8x8((x + 1) / 2), y)


def classify(images: torch.Tensor) -> list[int]:
    """Predicted digit per image (B, C, H, W) in [0, 1]."""
    return [int(p) for p in classifier().predict(to_8x8(images))]


# ---- model -------------------------------------------------------------------------------------

def new_pipeline(seed: int = 0):
    from diffusers import DDIMScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    from .pipeline import DigitsPipeline, char_tokenizer, char_vocab

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


def _prompt_table(tok, max_len: int) -> torch.Tensor:
    """Token ids: rows 0-9 "digit N", rows 10-19 "N", row 20 the empty prompt."""
    prompts = [f"digit {i}" for i in range(10)] + [str(i) for i in range(10)] + [""]
    return tok(prompts, padding="max_length", max_length=max_len, truncation=True, return_tensors="pt").input_ids


@torch.no_grad()
def conditioning_accuracy(pipe, per_class: int = 20, steps: int = 50, guidance: float = 2.0, seed: int = 0,
                          chunk: int = 50) -> dict[str, float]:
    """Generate ``per_class`` images of each digit (prompt "digit N", seeds seed, seed+1, ...) and
    return the classifier's accuracy per class and overall."""
    from .metrics import conditioning_accuracy as acc

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


def train_digits(cfg: TrainDigitsConfig) -> Path:
    from copy import deepcopy

    from tqdm.auto import tqdm

    out = Path(cfg.out)  # the command line set cfg.threads torch threads; the loop below may probe 1
    out.mkdir(parents=True, exist_ok=True)
    x_all, y_all = load_data()
    y_all = torch.from_numpy(y_all)
    pipe = new_pipeline(cfg.seed)
    unet, text, sched = pipe.unet, pipe.text_encoder, pipe.scheduler
    if cfg.init:
        from .adapter import load_checkpoint

        start = load_checkpoint(cfg.init)
        unet.load_state_dict({k: v.float() for k, v in start.unet.state_dict().items()})
        text.load_state_dict({k: v.float() for k, v in start.text_encoder.state_dict().items()})
    ids_table = _prompt_table(pipe.tokenizer, TEXT_CONFIG["max_position_embeddings"])
    params = [*unet.parameters(), *text.parameters()]
    ema_unet, ema_text = deepcopy(unet).eval(), deepcopy(text).eval()
    ema_params = [*ema_unet.parameters(), *ema_text.parameters()]
    for p in ema_params:
        p.requires_grad_(False)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.01)
    warmup = 100
    started = time.time()

    def progress(step: int) -> float:
        by_time = (time.time() - started) / (cfg.max_minutes * 60) if cfg.max_minutes else 0.0
        return min(1.0, max(step / cfg.steps, by_time))

    lr_sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * progress(s))))
    alphas = sched.alphas_cumprod
    gen = torch.Generator().manual_seed(cfg.seed)
    losses: list[float] = []
    evals: list[dict] = []
    next_ckpt = cfg.checkpoint_minutes * 60
    bar = tqdm(total=cfg.steps, desc="train digits", unit="step", mininterval=5.0)
    step = 0

    def save(final: bool) -> None:
        from .pipeline import DigitsPipeline

        snap = DigitsPipeline(unet=ema_unet, scheduler=sched, text_encoder=ema_text, tokenizer=pipe.tokenizer)
        entry = {"step": step, "minutes": (time.time() - started) / 60}
        if cfg.eval_per_class:
            entry["accuracy"] = conditioning_accuracy(snap, per_class=cfg.eval_per_class, steps=25, guidance=2.0)
            print(f"step {step}: quick accuracy {entry['accuracy']['overall']:.3f}", file=sys.stderr, flush=True)
        evals.append(entry)
        snap.save_pretrained(str(out), safe_serialization=True)
        meta = {"config": attrs.asdict(cfg), "steps_done": step, "minutes": (time.time() - started) / 60,
                "final": final, "loss_last_200": float(np.mean(losses[-200:])) if losses else None,
                "evals": evals, "parameters_unet": sum(p.numel() for p in unet.parameters()),
                "parameters_text_encoder": sum(p.numel() for p in text.parameters())}
        (out / "train.json.partial").write_text(json.dumps(meta, indent=2))
        (out / "train.json.partial").replace(out / "train.json")
        _plot(out / "curves.png", losses)

    threads_now, probe_every, window = cfg.threads, 150, 10
    recent: list[float] = []  # step times at threads_now
    probe: list[float] = []  # step times at the other setting
    while step < cfg.steps and progress(step) < 1.0:
        phase = step % probe_every
        other = 1 if threads_now > 1 else cfg.threads
        probing = cfg.threads > 1 and step > 0 and phase < window
        torch.set_num_threads(other if probing else threads_now)
        if cfg.threads > 1 and step > 0 and phase == window and probe and len(recent) >= window:
            if np.median(probe) < np.median(recent[-window:]):
                threads_now = other
                print(f"step {step}: {other} thread(s) are faster now ({np.median(probe):.2f}s vs "
                      f"{np.median(recent[-window:]):.2f}s per step)", file=sys.stderr, flush=True)
                recent = list(probe)
            probe = []
            torch.set_num_threads(threads_now)
        t_step = time.time()
        unet.train()
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
        pred = unet(xt, t, encoder_hidden_states=cond, return_dict=False)[0]
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
        (probe if probing else recent).append(time.time() - t_step)
        recent = recent[-50:]
        step += 1
        bar.update(1)
        if step % 20 == 0:
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}", lr=f"{lr_sched.get_last_lr()[0]:.2e}")
        if time.time() - started >= next_ckpt:
            save(final=False)
            next_ckpt += cfg.checkpoint_minutes * 60
    bar.close()
    save(final=True)
    return out


def _plot(path: Path, losses: list[float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not losses:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    k = max(1, len(losses) // 100)
    smooth = np.convolve(losses, np.ones(k) / k, mode="valid")
    ax.plot(losses, alpha=0.3, label="loss")
    ax.plot(np.arange(len(smooth)) + k - 1, smooth, label=f"mean of {k}")
    ax.set(xlabel="step", ylabel="noise MSE", title="digits UNet: training loss", yscale="log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """``python -m diffaccel.adapters.unet.digits eval [--checkpoint digits] [--per-class 20] ...``"""
    p = argparse.ArgumentParser(prog="python -m diffaccel.adapters.unet.digits")
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("eval", help="conditioning accuracy of a digits model, per class and overall")
    e.add_argument("--checkpoint", default="digits", help="'digits' (shipped) or a DigitsPipeline folder")
    e.add_argument("--per-class", type=int, default=20)
    e.add_argument("--steps", type=int, default=50)
    e.add_argument("--guidance", type=float, default=2.0)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--threads", type=int, default=1)
    e.add_argument("--classifier-check", action="store_true", help="also print the classifier's 5-fold accuracy on load_digits")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from .adapter import load_checkpoint

    if args.classifier_check:
        from sklearn.model_selection import cross_val_score
        from sklearn.svm import SVC

        x, y = load_data()
        s = cross_val_score(SVC(gamma=0.001, C=10.0), to_8x8((x + 1) / 2), y, cv=5)
        print(f"classifier 5-fold accuracy on load_digits (8->32->8 round trip): {s.mean():.3f}")
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
