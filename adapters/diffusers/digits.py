"""The digits task that the UNet digits model (``diffaccel_models.unet.digits``, in diffaccel-models) and the digits DiT
(``diffaccel_models.dit.digits``) share: data, prompts, text encoder and noise schedule, the classifier and the
conditioning accuracy, the training loop and the ``eval`` command. Only the denoiser differs.

* Data: scikit-learn's ``load_digits()`` (1797 grey 8x8 digits, values 0-16), upsampled
  bilinearly to 32x32 and scaled to [-1, 1].
* Prompts: ``"digit 7"`` or ``"7"``, embedded by a one-layer character ``CLIPTextModel`` (width
  64); the empty prompt is the null condition of classifier-free guidance.
* Classifier: an RBF support-vector machine on 8x8 images, fitted on ``load_digits()`` after the
  same 8 -> 32 -> 8 round trip that generated images take (32x32 average-pooled by 4), so that it
  sees the same kind of input. Used for the conditioning accuracy (``class_accuracy`` of the
  classes that the prompts ask for, ``digit_label``).
* Training (``train_loop``): epsilon prediction on the 1000-step cosine schedule, ``p_uncond`` of
  the rows with the empty prompt, AdamW with a warm-up and a cosine decay over the time budget;
  an EMA of the weights is what is saved (safetensors), with ``train.json`` and ``curves.png``.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from copy import deepcopy
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

TEXT_CONFIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                   max_position_embeddings=16, bos_token_id=0, eos_token_id=1, pad_token_id=1)
SCHEDULER_CONFIG = dict(num_train_timesteps=1000, beta_schedule="squaredcos_cap_v2", prediction_type="epsilon",
                        clip_sample=True, set_alpha_to_one=True, timestep_spacing="trailing")


# ---- data and classifier ---------------------------------------------------------------------

def load_data() -> tuple[torch.Tensor, np.ndarray]:
    """(images (N, 1, 32, 32) in [-1, 1], labels (N,))."""
    from sklearn.datasets import load_digits  # scikit-learn is slow to import: only the classifier needs it

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
    from sklearn.svm import SVC  # scikit-learn is slow to import: only the classifier needs it

    x, y = load_data()
    return SVC(gamma=0.001, C=10.0).fit(to_8x8((x + 1) / 2), y)


def classify(images: torch.Tensor) -> list[int]:
    """Predicted digit per image (B, C, H, W) in [0, 1]."""
    return [int(p) for p in classifier().predict(to_8x8(images))]


_DIGIT = re.compile(r"^\s*(?:digit\s+)?([0-9])\s*$", re.IGNORECASE)


def digit_label(prompt: str) -> int | None:
    """The class a digits prompt asks for (``"digit 7"`` or ``"7"``), else None."""
    m = _DIGIT.match(prompt or "")
    return int(m.group(1)) if m else None


def class_accuracy(predicted: Sequence[int], labels: Sequence[int | None], classes: int = 10) -> dict[str, float]:
    """``{"overall": acc, "0": acc of class 0, ...}`` over the images with a label (None skipped)."""
    pairs = [(int(p), int(y)) for p, y in zip(predicted, labels) if y is not None]
    out: dict[str, float] = {"overall": sum(p == y for p, y in pairs) / len(pairs) if pairs else float("nan")}
    for c in range(classes):
        sel = [p == y for p, y in pairs if y == c]
        if sel:
            out[str(c)] = sum(sel) / len(sel)
    return out


def prompt_table(tok, max_len: int) -> torch.Tensor:
    """Token ids: rows 0-9 "digit N", rows 10-19 "N", row 20 the empty prompt."""
    prompts = [f"digit {i}" for i in range(10)] + [str(i) for i in range(10)] + [""]
    return tok(prompts, padding="max_length", max_length=max_len, truncation=True, return_tensors="pt").input_ids


@torch.no_grad()
def conditioning_accuracy(pipe, per_class: int = 20, steps: int = 50, guidance: float = 2.0, seed: int = 0,
                          chunk: int = 50) -> dict[str, float]:
    """Generate ``per_class`` images of each digit (prompt "digit N", seeds seed, seed+1, ...) and
    return the classifier's accuracy per class and overall."""
    prompts = [f"digit {c}" for c in range(10) for _ in range(per_class)]
    labels = [c for c in range(10) for _ in range(per_class)]
    preds: list[int] = []
    pipe.set_progress_bar_config(disable=True)
    for i in range(0, len(prompts), chunk):
        gens = [torch.Generator().manual_seed(seed + j) for j in range(i, min(i + chunk, len(prompts)))]
        images = pipe(prompts[i:i + chunk], num_inference_steps=steps, guidance_scale=guidance, generator=gens,
                      output_type="pt").images
        preds += classify(images)
    return class_accuracy(preds, labels)


# ---- training ----------------------------------------------------------------------------------

def train_loop(cfg: Any, pipe, denoiser: torch.nn.Module, predict: Callable[..., torch.Tensor],
               snapshot: Callable[[torch.nn.Module, torch.nn.Module], Any], *, name: str, bar: bool) -> Path:
    """Train ``denoiser`` and ``pipe.text_encoder`` on the digits (see the module docstring) and
    write checkpoints to ``cfg.out``.

    ``cfg`` has the fields of both digits configs (``out``, ``max_minutes`` (0: ``steps`` alone),
    ``steps``, ``batch``, ``lr``, ``p_uncond``, ``ema``, ``threads``, ``seed``,
    ``checkpoint_minutes``, ``eval_per_class``). ``predict(denoiser, xt, t, cond)`` is one
    noise prediction; ``snapshot(ema_denoiser, ema_text)`` the pipeline that is saved and
    evaluated. ``name`` names the denoiser in train.json and the plot. ``bar``: a progress bar
    rather than a line every 100 steps. Threads: ``_Threads``.
    """
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    x_all, y_all = load_data()
    y_all = torch.from_numpy(y_all)
    text, sched = pipe.text_encoder, pipe.scheduler
    ids_table = prompt_table(pipe.tokenizer, TEXT_CONFIG["max_position_embeddings"])
    params = [*denoiser.parameters(), *text.parameters()]
    ema_denoiser, ema_text = deepcopy(denoiser).eval(), deepcopy(text).eval()
    ema_params = [*ema_denoiser.parameters(), *ema_text.parameters()]
    for p in ema_params:
        p.requires_grad_(False)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.01)
    warmup = 100
    log = _TrainLog(out, cfg, name, time.time())
    lr_sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * log.progress(s))))
    alphas = sched.alphas_cumprod
    gen = torch.Generator().manual_seed(cfg.seed)
    next_ckpt = cfg.checkpoint_minutes * 60
    progress_bar = tqdm(total=cfg.steps, desc="train digits", unit="step", mininterval=5.0, disable=not bar)
    step = 0
    threads = _Threads(cfg.threads)
    while step < cfg.steps and log.progress(step) < 1.0:
        threads.before(step)
        t_step = time.time()
        loss = _digits_loss(cfg, denoiser, text, predict, x_all, y_all, ids_table, alphas, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        lr_sched.step()
        decay = min(cfg.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            torch._foreach_lerp_(ema_params, [p.detach() for p in params], 1 - decay)
        log.losses.append(loss.item())
        threads.after(time.time() - t_step)
        step += 1
        progress_bar.update(1)
        log.report(step, progress_bar if bar else None, lr_sched.get_last_lr()[0])
        if time.time() - log.started >= next_ckpt:
            log.save(snapshot(ema_denoiser, ema_text), step, denoiser, text, final=False)
            next_ckpt += cfg.checkpoint_minutes * 60
    progress_bar.close()
    log.save(snapshot(ema_denoiser, ema_text), step, denoiser, text, final=True)
    return out


def _digits_loss(cfg: Any, denoiser: torch.nn.Module, text: torch.nn.Module, predict: Callable[..., torch.Tensor],
                 x_all: torch.Tensor, y_all: torch.Tensor, ids_table: torch.Tensor, alphas: torch.Tensor,
                 gen: torch.Generator) -> torch.Tensor:
    """One batch's loss: digits drawn, prompts ("digit N", "N" or the empty one, ``p_uncond``),
    timesteps and noise from ``gen``, the noise prediction's MSE."""
    denoiser.train()
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
    pred = predict(denoiser, xt, t, cond)
    return F.mse_loss(pred, noise)


class _Threads:
    """With ``threads`` > 1, every ``every`` steps ``window`` steps at the other setting (1 or
    ``threads``) decide which is faster now (a busy machine can make 2 threads slower than 1)."""

    def __init__(self, threads: int, every: int = 150, window: int = 10):
        self.threads, self.now, self.every, self.window = threads, threads, every, window
        self.recent: list[float] = []  # step times at self.now
        self.probe: list[float] = []  # step times at the other setting
        self.probing = False

    def before(self, step: int) -> None:
        phase = step % self.every
        other = 1 if self.now > 1 else self.threads
        self.probing = self.threads > 1 and step > 0 and phase < self.window
        torch.set_num_threads(other if self.probing else self.now)
        window = self.window
        if self.threads > 1 and step > 0 and phase == window and self.probe and len(self.recent) >= window:
            if np.median(self.probe) < np.median(self.recent[-window:]):
                self.now = other
                print(f"step {step}: {other} thread(s) are faster now ({np.median(self.probe):.2f}s vs "
                      f"{np.median(self.recent[-window:]):.2f}s per step)", file=sys.stderr, flush=True)
                self.recent = list(self.probe)
            self.probe = []
            torch.set_num_threads(self.now)

    def after(self, seconds: float) -> None:
        (self.probe if self.probing else self.recent).append(seconds)
        self.recent = self.recent[-50:]


@attrs.define
class _TrainLog:
    """A digits training's progress: its losses, its evaluations, train.json and the loss plot."""

    out: Path
    cfg: Any
    name: str
    started: float
    losses: list[float] = attrs.field(factory=list)
    evals: list[dict] = attrs.field(factory=list)

    def progress(self, step: int) -> float:
        cfg = self.cfg
        by_time = (time.time() - self.started) / (cfg.max_minutes * 60) if cfg.max_minutes else 0.0
        return min(1.0, max(step / cfg.steps, by_time))

    def report(self, step: int, bar: Any, lr: float) -> None:
        """The progress bar's loss every 20 steps, or without a bar a line every 100."""
        if bar is not None and step % 20 == 0:
            bar.set_postfix(loss=f"{np.mean(self.losses[-50:]):.4f}", lr=f"{lr:.2e}")
        if bar is None and step % 100 == 0:
            print(f"step {step} loss {np.mean(self.losses[-100:]):.4f} lr {lr:.2e} "
                  f"{(time.time() - self.started) / 60:.1f} min", file=sys.stderr, flush=True)

    def save(self, snap: Any, step: int, denoiser: torch.nn.Module, text: torch.nn.Module, final: bool) -> None:
        """Save ``snap`` (the EMA pipeline) to ``out``, evaluated if ``eval_per_class``, and train.json."""
        cfg, out, losses = self.cfg, self.out, self.losses
        entry = {"step": step, "minutes": (time.time() - self.started) / 60}
        if cfg.eval_per_class:
            entry["accuracy"] = conditioning_accuracy(snap, per_class=cfg.eval_per_class, steps=25, guidance=2.0)
            print(f"step {step}: quick accuracy {entry['accuracy']['overall']:.3f}", file=sys.stderr, flush=True)
        self.evals.append(entry)
        snap.save_pretrained(str(out), safe_serialization=True)
        meta = {"config": attrs.asdict(cfg), "steps_done": step, "minutes": (time.time() - self.started) / 60,
                "final": final, "loss_last_200": float(np.mean(losses[-200:])) if losses else None,
                "evals": self.evals, f"parameters_{self.name}": sum(p.numel() for p in denoiser.parameters()),
                "parameters_text_encoder": sum(p.numel() for p in text.parameters()),
                "threads": torch.get_num_threads()}
        (out / "train.json.partial").write_text(json.dumps(meta, indent=2))
        (out / "train.json.partial").replace(out / "train.json")
        plot_losses(out / "curves.png", losses, f"digits {self.name}: training loss")


def plot_losses(path: Path, losses: list[float], title: str) -> None:
    import matplotlib  # matplotlib is slow to import: only plotting needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not losses:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    k = max(1, len(losses) // 100)
    smooth = np.convolve(losses, np.ones(k) / k, mode="valid")
    ax.plot(losses, alpha=0.3, label="loss")
    ax.plot(np.arange(len(smooth)) + k - 1, smooth, label=f"mean of {k}")
    ax.set(xlabel="step", ylabel="noise MSE", title=title, yscale="log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ---- the eval command --------------------------------------------------------------------------

def add_eval_arguments(parser, default_checkpoint: str, what: str) -> None:
    """The options of ``diffaccel digits-accuracy`` and ``diffaccel dit-digits-accuracy``."""
    parser.add_argument("--checkpoint", default=default_checkpoint,
                        help=f"'{default_checkpoint}' (shipped) or a {what} folder")
    parser.add_argument("--per-class", type=int, default=20)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--guidance", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)


def run_eval(args, load_checkpoint: Callable[[str], Any]) -> int:
    """Print the conditioning accuracy of ``args.checkpoint``, per class and overall."""
    pipe = load_checkpoint(args.checkpoint)
    t0 = time.time()
    acc = conditioning_accuracy(pipe, per_class=args.per_class, steps=args.steps, guidance=args.guidance, seed=args.seed)
    print(f"{args.checkpoint}: {args.per_class} images per class, {args.steps} DDIM steps, guidance {args.guidance}, "
          f"seeds {args.seed}..{args.seed + 10 * args.per_class - 1} ({time.time() - t0:.0f}s)")
    print("class     " + "  ".join(f"{c:>5}" for c in range(10)) + "  overall")
    print("accuracy  " + "  ".join(f"{acc.get(str(c), float('nan')):>5.2f}" for c in range(10)) + f"  {acc['overall']:.3f}")
    return 0
