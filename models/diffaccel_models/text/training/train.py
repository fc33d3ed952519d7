"""Training command for the reference text diffusion LM (``diffaccel train text``).

Reproduces the shipped default models from WordNet glosses (Debian's ``wordnet-base``):
the tokenizer is trained first (or reused), the corpus is packed into sequences that
start at a line, and the model is fitted for a fixed number of steps with AdamW and a
cosine learning rate. Checkpoints are safetensors; ``curves.png`` shows the loss and the
mean entropy of the predicted token distribution per noise level.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from pathlib import Path

import attrs
import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from diffaccel.kit.conditions import load as load_conditions

from diffaccel.adapters.text.loading.corpus import read_wordnet, write_lines
from diffaccel.adapters.text.sampling.model import TextDiffusionConfig, TextDiffusionLM, mask_rate
from diffaccel.adapters.text.loading.reference import shipped_path
from diffaccel.adapters.text.sampling.tokenizer import TextTokenizer, train_tokenizer
from .curves import plot_curves


@attrs.frozen(kw_only=True)
class TrainConfig:
    kind: str = "masked"
    """masked or continuous."""
    out: str = "runs/text-masked"
    """Output folder: model.safetensors, config.json, tokenizer.json, curves.png, train.json."""
    steps: int = 1400
    """Optimiser steps."""
    batch: int = 32
    """Sequences per step."""
    seq_len: int = 128
    """Tokens per training sequence."""
    lr: float = 3e-3
    """Peak learning rate."""
    dim: int = 192
    layers: int = 4
    heads: int = 4
    vocab: int = 4096
    schedule: str = "cosine"
    freq_weight: float = 0.0
    """Frequency weighting exponent: token weights ~ count^-alpha (0: plain cross-entropy)."""
    tokenizer: str | None = None
    """Reuse this tokenizer.json instead of training one."""
    seed: int = 0
    threads: int = 2
    max_minutes: float = 0.0
    """Stop early after this many minutes (0: no limit)."""
    checkpoint_every: int = 200
    latent_norm: float | None = None
    """Continuous models: norm of the token latents (default sqrt(embed_dim))."""
    init_embeddings: str | None = None
    """Masked models: a BERT folder or hub id whose word embeddings initialise a frozen table."""
    init_from: str | None = None
    """Continue from this checkpoint (a folder or a shipped model name): its weights, architecture
    and tokenizer; a condition projection it lacks starts at zero, so step 0 is that model."""
    conditions: str | None = None
    """Masked models: a file of per-line condition vectors (``diffaccel.kit.conditions``' format,
    written by ``diffaccel bert-cond-conditions``); every sequence then starts at a
    conditioned line and the model learns cond_dim = the vectors' size, fed to its per-block condition gating."""
    cond_dropout: float = 0.15
    """With ``conditions``: share of sequences trained without their vector (the model then runs
    unconditioned too, as classifier-free guidance trains it). Ignored with ``cond_only``: there
    the unconditioned model is the initial one exactly, and such rows would train nothing."""
    cond_only: bool = False
    """With ``init_from`` and ``conditions``: train the condition path alone (the condition
    projection and the weights of every block's gating layer; the gating biases, which are all an
    unconditioned run uses, stay frozen with the rest): far fewer steps teach the model to use the
    vector, and what it writes without one is exactly the initial model's."""
    cond_line_weight: float = 1.0
    """With ``conditions``: loss weight of the conditioned line's positions (its tokens and the
    [SEP] after it), against 1 for the rest of the sequence: the vector describes that line only."""
    cond_term_weight: float = 1.0
    """With ``conditions``: loss weight of the tokens of the line's key terms (those the
    conditions file lists for it), in place of ``cond_line_weight`` there."""
    cond_term_mask: float = 0.0
    """With ``conditions``: chance that each key-term token is masked (and scored) whatever the
    row's noise level, so the vector, not the visible context, has to supply those tokens."""


def pack(ids_per_line: list[list[int]], sep_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate lines with [SEP] after each; return the stream and the line start offsets."""
    lengths = np.array([len(x) + 1 for x in ids_per_line])
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    stream = np.fromiter((t for line in ids_per_line for t in (*line, sep_id)), dtype=np.int64, count=int(lengths.sum()))
    return stream, starts


def sample_batch(stream, starts, batch, seq_len, rng: np.random.Generator) -> torch.Tensor:
    valid = starts[starts < len(stream) - seq_len]
    s = rng.choice(valid, size=batch)
    return torch.from_numpy(np.stack([stream[i : i + seq_len] for i in s]))


def token_weights(stream: np.ndarray, vocab: int, alpha: float) -> torch.Tensor:
    counts = np.bincount(stream, minlength=vocab).astype(np.float64) + 1.0
    w = counts ** (-alpha)
    w = w / (w * counts).sum() * counts.sum()  # mean weight over corpus tokens is 1
    return torch.tensor(w, dtype=torch.float32)


def diffusion_loss(model: TextDiffusionLM, x0: torch.Tensor, weights: torch.Tensor | None, gen: torch.Generator,
                   cond: torch.Tensor | None = None, keep: torch.Tensor | None = None,
                   pos_weight: torch.Tensor | None = None, also_mask: torch.Tensor | None = None):
    """Return (loss, final hidden states, noise level per row in [0, 1], mask of positions scored).
    ``cond`` (B, cond_dim): condition vectors; rows where ``keep`` (B,) is False run without theirs,
    exactly as generation without a condition does (no projection added, not a zero vector's).
    Masked models: ``pos_weight`` (B, N) weighs each position's loss (the loss is the weighted
    mean over scored positions); ``also_mask`` (B, N) masks and scores those positions too."""
    cfg = model.config
    B, N = x0.shape
    if cfg.kind == "masked":
        t = torch.rand(B, generator=gen).clamp(min=1e-3)
        scored = torch.rand(B, N, generator=gen) < mask_rate(cfg.schedule, t)[:, None]
        if also_mask is not None:
            scored |= also_mask
        xt = torch.where(scored, torch.full_like(x0, cfg.mask_id), x0)
        time_in = t * 1000 if model.uses_time else None
    else:
        ti = torch.randint(0, cfg.num_timesteps, (B,), generator=gen)
        ab = model.alphas_cumprod[ti][:, None, None]
        z0 = model.token_latents()[x0]
        xt = ab.sqrt() * z0 + (1 - ab).sqrt() * torch.randn(z0.shape, generator=gen)
        # every position is a target; half of them, drawn at random, is an unbiased and cheaper estimate
        scored = torch.rand(B, N, generator=gen) < 0.5
        t, time_in = ti.float() / cfg.num_timesteps, ti.float()
    # the output head runs on the scored positions alone: it dominates the cost at this size
    c = model.condition(time_in, B)
    if cond is not None:
        c = c + model.cond_proj(cond) * (keep[:, None].float() if keep is not None else 1.0)
    h = model.embed(xt)
    for block in model.blocks:
        h = block(h, c)
    ce = F.cross_entropy(model.logits(h[scored]), x0[scored], reduction="none")
    if weights is not None:
        ce = ce * weights[x0[scored]]
    if pos_weight is not None and ce.numel():
        w = pos_weight[scored]
        loss = (ce * w).sum() / w.sum()
    else:
        loss = ce.mean() if ce.numel() else h.sum() * 0
    return loss, h, t, scored


@torch.no_grad()
def entropy_by_noise(model, batches, weights, gen, bins: int = 10) -> list[float]:
    """Mean entropy of the predicted distribution on scored positions, per noise-level bin."""
    sums, counts = np.zeros(bins), np.zeros(bins)
    for x0 in batches:
        _, h, t, scored = diffusion_loss(model, x0, None, gen)
        logits = model.logits(h)
        p = logits.float().log_softmax(-1)
        ent = -(p.exp() * p).sum(-1)
        n = scored.sum(1)
        per_row = (ent * scored).sum(1) / n.clamp(min=1)
        for b, e, k in zip((t * bins).long().clamp(max=bins - 1).tolist(), per_row.tolist(), n.tolist()):
            if k:  # a row with nothing masked says nothing about confidence
                sums[b] += e
                counts[b] += 1
    return (sums / np.maximum(counts, 1)).tolist()


def train(cfg: TrainConfig, lines: list[str] | None = None) -> Path:
    """Train a reference model (the command line sets ``cfg.threads`` torch threads first)."""
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    if lines is None:
        lines, heldout = read_wordnet()
        write_lines(out / "heldout.txt.gz", heldout)
    random.Random(cfg.seed).shuffle(lines)
    base = None
    if cfg.init_from:
        base = Path(cfg.init_from) if Path(cfg.init_from).is_dir() else shipped_path(cfg.init_from)
    tok = _tokenizer(cfg, lines, base)
    tok.save(out / "tokenizer.json")
    stream, starts = pack(tok.encode_lines(lines), tok.sep_id)
    weights = token_weights(stream, tok.vocab_size, cfg.freq_weight) if cfg.freq_weight > 0 else None
    mcfg = TextDiffusionConfig(
        vocab_size=tok.vocab_size, kind=cfg.kind, max_len=cfg.seq_len, dim=cfg.dim, n_layers=cfg.layers,
        n_heads=cfg.heads, schedule=cfg.schedule, mask_id=tok.mask_id, pad_id=tok.pad_id,
        time_conditioned=cfg.kind == "continuous", latent_norm=cfg.latent_norm,
    )
    cond_lines = cond_vectors = None
    if cfg.conditions:
        if cfg.kind != "masked":
            raise ValueError("conditions apply to masked models")
        cond_lines, cond_vectors, starts_c, cond_terms = _conditioned(cfg.conditions, lines, starts, len(stream) - cfg.seq_len)
        mcfg = attrs.evolve(mcfg, cond_dim=cond_vectors.shape[1])
        line_w, term_at = line_weights(stream, starts_c, cond_terms, tok, cfg.seq_len, cfg.cond_line_weight, cfg.cond_term_weight)
    if base is not None:
        mcfg = attrs.evolve(TextDiffusionConfig.from_json((base / "config.json").read_text()), cond_dim=mcfg.cond_dim)
    table = None
    if cfg.init_embeddings:
        if cfg.kind != "masked":
            raise ValueError("init_embeddings applies to masked models")
        table = bert_embedding_table(tok, cfg.init_embeddings)
        mcfg = attrs.evolve(mcfg, frozen_embed_dim=table.shape[1])
    model = _initial_model(cfg, mcfg, base, table, cond_vectors)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, cfg.steps // 20)
    started = time.time()

    def progress(step: int) -> float:
        # with a time budget, the cosine decay follows whichever runs out first: steps or minutes
        by_time = (time.time() - started) / (cfg.max_minutes * 60) if cfg.max_minutes else 0.0
        return min(1.0, max(step / cfg.steps, by_time))

    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * progress(s)))
    )
    rng = np.random.default_rng(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    eval_batches = [sample_batch(stream, starts, 32, cfg.seq_len, np.random.default_rng(10_000 + i)) for i in range(2)]
    losses: list[float] = []
    entropy_history: list[tuple[int, list[float]]] = []
    bar = tqdm(range(cfg.steps), desc=f"train {cfg.kind}", unit="step")
    for step in bar:
        model.train()
        if cond_vectors is None:
            loss, *_ = diffusion_loss(model, sample_batch(stream, starts, cfg.batch, cfg.seq_len, rng), weights, gen)
        else:
            loss = _conditioned_loss(cfg, model, stream, starts_c, rng, gen, weights, cond_vectors, line_w, term_at)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        last = step == cfg.steps - 1 or progress(step) >= 1.0
        if (step + 1) % cfg.checkpoint_every == 0 or last:
            model.eval()
            entropy_history.append((step + 1, entropy_by_noise(model, eval_batches, None, torch.Generator().manual_seed(1))))
            model.save(out)
            plot_curves(out / "curves.png", losses, entropy_history, cfg.kind)
        if last:
            break
    _write_summary(out / "train.json", cfg, losses, started, cond_lines)
    return out


def _write_summary(path: Path, cfg: TrainConfig, losses: list[float], started: float, cond_lines) -> None:
    """train.json: the config, the steps done, the minutes, the last 50 steps' mean loss."""
    path.write_text(
        json.dumps({"config": attrs.asdict(cfg), "steps_done": len(losses), "minutes": (time.time() - started) / 60,
                    "final_loss_mean_50": float(np.mean(losses[-50:])),
                    **({"conditioned_lines": cond_lines} if cond_lines else {})}, indent=2)
    )


def _tokenizer(cfg: TrainConfig, lines: list[str], base: Path | None) -> TextTokenizer:
    """``init_from``'s tokenizer, the ``tokenizer`` file, or one trained on ``lines``."""
    if base is not None:
        return TextTokenizer.from_file(base / "tokenizer.json")
    if cfg.tokenizer:
        return TextTokenizer.from_file(cfg.tokenizer)
    return TextTokenizer(train_tokenizer(lines, cfg.vocab))


def _initial_model(cfg: TrainConfig, mcfg: TextDiffusionConfig, base: Path | None, table, cond_vectors) -> TextDiffusionLM:
    """A new model, or ``init_from``'s weights; BERT's embedding ``table`` copied in; only the
    condition path trainable with ``cond_only``."""
    model = TextDiffusionLM(mcfg)
    if base is not None:
        missing, unexpected = model.load_state_dict({k: v.float() for k, v in load_file(str(base / "model.safetensors")).items()}, strict=False)
        if unexpected or any(not k.startswith("cond_proj.") for k in missing):
            raise ValueError(f"{base}: weights do not fit (missing {missing}, unexpected {unexpected})")
        if missing:
            # the condition path is dead in an unconditioned model: every block's gating weight
            # and the learned bias sit at their zero init (each one's gradient needs the other).
            # A random projection (zero bias) revives it, and step 0 is still the base model:
            # those weights are zero. A zero projection would stay zero.
            with torch.no_grad():
                model.cond_proj.bias.zero_()
    if table is not None:
        with torch.no_grad():
            model.tok_emb[0].weight.copy_(table)
    if cfg.cond_only:
        if base is None or cond_vectors is None:
            raise ValueError("cond_only needs init_from and conditions")
        for name, prm in model.named_parameters():
            prm.requires_grad_(name.startswith("cond_proj.") or name.endswith(".mod.weight"))
    return model


def _conditioned_loss(cfg: TrainConfig, model, stream, starts_c, rng, gen, weights, cond_vectors, line_w, term_at):
    """One conditioned batch's loss: sequences starting at conditioned lines, their vectors
    dropped with ``cond_dropout`` (not with ``cond_only``), key terms masked with ``cond_term_mask``."""
    pick = rng.integers(0, len(starts_c), size=cfg.batch)
    x0 = torch.from_numpy(np.stack([stream[starts_c[i]: starts_c[i] + cfg.seq_len] for i in pick]))
    dropout = 0.0 if cfg.cond_only else cfg.cond_dropout
    keep = torch.from_numpy(rng.random(cfg.batch) >= dropout)
    rows = torch.from_numpy(pick)
    also = (term_at[rows] & (torch.rand(term_at[rows].shape, generator=gen) < cfg.cond_term_mask)
            if cfg.cond_term_mask > 0 else None)
    loss, *_ = diffusion_loss(model, x0, weights, gen, cond_vectors[rows], keep, line_w[rows], also)
    return loss


def _conditioned(path: str, lines: list[str], starts: np.ndarray, last_start: int):
    """(how many of the file's lines are used, then per start: the vector (n, d), the offset in the
    stream, the key terms) for the lines of ``lines`` that the conditions file holds and a full
    sequence can start at (a line the corpus holds twice starts two sequences)."""
    cond_lines, vectors, terms = load_conditions(path, with_terms=True)
    row = {text: i for i, text in enumerate(cond_lines)}
    at = [(row[text], int(starts[i])) for i, text in enumerate(lines) if text in row and starts[i] <= last_start]
    if not at:
        raise ValueError(f"{path}: none of its lines is in the training corpus")
    idx = torch.tensor([a for a, _ in at])
    return len({a for a, _ in at}), vectors[idx], np.array([b for _, b in at]), [terms[a] for a, _ in at]


def find_run(ids: list[int], part: list[int]) -> int:
    """Start of the first run of ``part`` in ``ids``, or -1."""
    n = len(part)
    return next((i for i in range(len(ids) - n + 1) if ids[i:i + n] == part), -1) if n else -1


def term_mask(tok: TextTokenizer, line_ids: list[int], terms, length: int) -> torch.Tensor:
    """(length,) bool: the tokens of ``terms`` in ``line_ids``, each term found as the tokens it
    has in running text (a leading space, as bert-cond pins it); one the line tokenizes otherwise
    is skipped."""
    at = torch.zeros(length, dtype=torch.bool)
    for term in terms:
        ids = tok.encode(" " + term)
        i = find_run(line_ids, ids)
        if i >= 0:
            at[i:i + len(ids)] = True
    return at


def line_weights(stream: np.ndarray, starts: np.ndarray, terms: list, tok: TextTokenizer, seq_len: int,
                 line_weight: float, term_weight: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per conditioned line (the sequence that starts at it): loss weights (n, seq_len), 1 past the
    line, ``line_weight`` on its tokens and [SEP], ``term_weight`` on its key terms' tokens; and
    where those term tokens are (n, seq_len) bool. A term is found as the tokens it has in running
    text (a leading space, as bert-cond pins it); one the line tokenizes otherwise is skipped."""
    w = torch.ones(len(starts), seq_len)
    at = torch.zeros(len(starts), seq_len, dtype=torch.bool)
    for r, (s, ts) in enumerate(zip(starts, terms)):
        seq = stream[s:s + seq_len].tolist()
        end = seq.index(tok.sep_id) + 1 if tok.sep_id in seq else seq_len
        w[r, :end] = line_weight
        at[r] = term_mask(tok, seq[:end], ts, seq_len)
    w[at] = term_weight
    return w, at


def bert_embedding_table(tok: TextTokenizer, bert_path: str) -> torch.Tensor:
    """(V, H) embeddings for our tokens from a pretrained BERT: each token's text is split by the
    BERT's own tokenizer and its word-piece embeddings are averaged (special tokens keep zeros)."""
    from transformers import AutoModel, AutoTokenizer  # seconds to import: only --init-embeddings needs them

    bert_tok = AutoTokenizer.from_pretrained(bert_path)
    emb = AutoModel.from_pretrained(bert_path).get_input_embeddings().weight.detach()
    table = torch.zeros(tok.vocab_size, emb.shape[1])
    for i in range(tok.vocab_size):
        if i in tok.special_ids:
            continue
        piece = tok.tok.id_to_token(i).replace("\u2581", " ").strip()
        ids = bert_tok.encode(piece, add_special_tokens=False) if piece else []
        if ids:
            table[i] = emb[ids].mean(0)
    # rescale to the std of our own initialisation so the projection starts in a sane range
    return table / table.std().clamp(min=1e-6) * 0.02


def export_fp16(src: str | Path, dst: str | Path) -> Path:
    """Copy a trained checkpoint for shipping: weights in float16 safetensors (loaded back as float32)."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    state = load_file(str(src / "model.safetensors"))
    save_file({k: v.half().contiguous() for k, v in state.items()}, str(dst / "model.safetensors"))
    for name in ("config.json", "tokenizer.json", "train.json", "curves.png"):
        if (src / name).is_file():
            shutil.copy(src / name, dst / name)
    return dst
