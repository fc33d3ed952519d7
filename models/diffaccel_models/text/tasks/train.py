"""The task models' training recipe (``diffaccel train task``).

A masked diffusion LM learns to fill the generation given the prompt: the prompt is never masked
and never scored; each row's generation is masked at a rate t ~ U(0, 1) (stratified over the
batch) and the loss is the cross-entropy of the masked positions. AdamW, linear warm-up, cosine
decay to 5%. ``arith`` runs a curriculum: the most operations a problem may have grows from 1 to
4 over the first ``curriculum`` share of the steps. Training problems are drawn from the training
split only (``common.training_problem``).

Every ``eval_every`` steps the model solves ``eval_n`` held-out problems (the bench's seeds 0..)
with the real sampler (masked, confidence order, greedy, full steps); the best model so far is
the folder's model.safetensors. ``ckpt.pt`` (model, optimiser, random states, history) is written
at every evaluation, so a stopped run resumes where it was.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import attrs
import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from diffaccel.adapters.text.sampling.model import TextDiffusionConfig, TextDiffusionLM
from diffaccel.adapters.text.tasks import TaskSpec, task_spec
from diffaccel.adapters.text.tasks.common import HELD_OUT_EVERY, eos_id, is_held_out, solution_ids
from diffaccel.adapters.text.tasks.evaluate import solve
from .grow import grow_from


@attrs.frozen(kw_only=True)
class TaskTrainConfig:
    task: str = "arith"
    grid: int = 9
    """sudoku: grid size (9, 6 or 4)."""
    out: str = "runs/arith"
    steps: int = 6000
    batch: int = 64
    lr: float = 2e-3
    dim: int = 128
    layers: int = 4
    heads: int = 4
    seed: int = 0
    threads: int = 1
    eval_every: int = 500
    eval_n: int = 100
    curriculum: float = 0.2
    """arith: share of the steps over which the operation cap grows from 1 to 4."""
    max_minutes: float = 0.0
    """Stop (with a checkpoint) after this many minutes of this process (0: no limit)."""
    focus: float = 0.0
    """arith: chance that each result digit (after ``=``, and the final answer's) is masked whatever
    the row's mask rate. At a low rate its operands are then visible while it is scored: with
    t ~ U(0, 1) alone a result is scored with both operands visible in about 1 row in 5."""
    init: str | None = None
    """Start from this folder's weights (a stage-one model; not its optimiser or history). A model of
    another task, length or depth is carried over by meaning (``grow.grow_from``)."""
    init_layers: tuple[int, ...] | None = None
    """With ``init`` of fewer blocks: which of the new model's blocks take the source's (default: the first)."""
    trim: bool = False
    """Cut each batch 16 positions after its longest problem (``trim``): a curriculum's short problems
    cost their own length."""
    top_share: float = 0.0
    """Chance that a training problem is drawn at the curriculum's current cap rather than uniformly
    below it (ledger: so the full-size prompt is not one draw in twelve at the end)."""
    lookup: float = 0.0
    """ledger: chance that a row's look-up tokens (``lookup_positions``: the restated facts and the
    first equation, which repeats them) are all masked whatever the row's rate. Otherwise the
    model learns to copy a fact from the equation beside it, a short-cut absent at sampling time,
    and the look-up in the prompt never forms."""
    pace: float = 0.0
    """Mastery curriculum: the level (ledger: facts / 2) rises by one when the running accuracy
    on the masked look-up digits of the training batches reaches ``pace`` (0: the step ramp of
    ``curriculum``). A curriculum by steps moved on before the look-up formed on two facts."""
    start_level: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    """The paced curriculum's first level: with ``init`` of a model that passed levels in an earlier
    run (a session's run carried to the next as weights alone), the level it had reached."""
    bf16: bool = True
    """Forward and backward under bfloat16 autocast (weights and optimiser stay float32): a
    CPU with AMX or AVX512-BF16 runs the matrix products faster."""


def result_positions(tok, ids: torch.Tensor, gen: torch.Tensor) -> torch.Tensor:
    """(B, N) bool: the generation's result digits, the two tokens after each ``=`` and the two
    after ``#### ▁`` (arith's layout; nothing in a sudoku grid)."""
    eq, answer, space = (tok.tok.token_to_id(t) for t in ("=", "####", "\u2581"))
    out = torch.zeros_like(gen)
    if eq is None or answer is None:
        return out
    after_eq = ids == eq
    after_answer = (ids == space) & F.pad(ids == answer, (1, 0))[:, :-1]
    for k in (1, 2):  # the two digits after "=" and after the final line's "▁"
        out[:, k:] |= after_eq[:, :-k] | after_answer[:, :-k]
    return out & gen


def lookup_positions(tok, ids: torch.Tensor, gen: torch.Tensor, facts_only: bool = False) -> torch.Tensor:
    """(B, N) bool: the generation's lines up to and including its first line that begins with a
    digit (ledger: the restated facts and the first equation, whose operands repeat them);
    ``facts_only``: the lines before it (the restated facts: the look-up alone, no arithmetic)."""
    digits = torch.tensor([tok.tok.token_to_id(d) for d in "0123456789"])
    line = torch.cumsum((ids == tok.sep_id) & gen, 1)  # line index within the generation
    starts = gen & (F.pad(ids == tok.sep_id, (1, 0))[:, :-1] | (gen & ~F.pad(gen, (1, 0))[:, :-1]))
    first_eq = torch.where(starts & torch.isin(ids, digits), line, torch.full_like(line, 1 << 30)).min(1).values
    last = first_eq[:, None] - 1 if facts_only else first_eq[:, None]
    return gen & (line <= last) & (ids != tok.sep_id)


def encode(spec: TaskSpec, tok, problems) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids (B, max_len), generation mask (B, max_len)): the prompt, the solution, [EOS] to the end."""
    N, eos = spec.max_len, eos_id(tok)
    ids = torch.full((len(problems), N), eos, dtype=torch.long)
    gen = torch.zeros(len(problems), N, dtype=torch.bool)
    for r, p in enumerate(problems):
        row = tok.encode(p.prompt)
        sol = solution_ids(tok, p.solution)
        if len(row) + len(sol) > N:
            raise ValueError(f"problem too long for {N} positions: {p.prompt!r}")
        ids[r, : len(row)] = torch.tensor(row)
        ids[r, len(row): len(row) + len(sol)] = torch.tensor(sol)
        gen[r, len(row):] = True
    return ids, gen


def trim(ids: torch.Tensor, gen: torch.Tensor, eos: int, slack: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch cut ``slack`` positions after its longest prompt and solution: a curriculum's short
    problems (ledger's few facts) cost their own length, not the model's; the rows keep an [EOS]
    tail as long as the task's at full size. A batch that fills the model is returned whole."""
    used = int(((ids != eos) | ~gen).long().cumsum(1).argmax(1).max()) + 1  # last non-[EOS] position + 1
    n = min(ids.shape[1], used + slack)
    return ids[:, :n], gen[:, :n]


def masked_loss(model: TextDiffusionLM, ids: torch.Tensor, gen: torch.Tensor, g: torch.Generator,
                focus: torch.Tensor | None = None, focus_p: float = 0.0,
                lookup: torch.Tensor | None = None, lookup_p: float = 0.0,
                gauge: torch.Tensor | None = None) -> tuple[torch.Tensor, float | None]:
    """The masked cross-entropy, and the accuracy on the masked positions of ``gauge`` (B, N)
    (None without it, or when none of them is masked)."""
    B = ids.shape[0]
    t = ((torch.arange(B) + torch.rand(B, generator=g)) / B)[torch.randperm(B, generator=g)]  # stratified U(0, 1)
    masked = gen & (torch.rand(ids.shape, generator=g) < t.clamp(min=0.02)[:, None])
    if focus is not None and focus_p > 0:
        masked |= focus & (torch.rand(ids.shape, generator=g) < focus_p)
    if lookup is not None and lookup_p > 0:
        masked |= lookup & (torch.rand(B, 1, generator=g) < lookup_p)
    x = torch.where(masked, torch.full_like(ids, model.config.mask_id), ids)
    c = model.condition(None, B)
    h = model.embed(x)
    for block in model.blocks:
        h = block(h, c)
    logits = model.logits(h[masked])  # the head on the masked rows only
    acc = None
    if gauge is not None:
        scored = gauge[masked]
        if scored.any():
            acc = float((logits[scored].argmax(-1) == ids[masked][scored]).float().mean())
    return F.cross_entropy(logits, ids[masked]), acc



def level_cap(spec: TaskSpec, cfg: TaskTrainConfig, step: int, paced: int = 1) -> int:
    if spec.levels <= 1:
        return 1
    if cfg.pace:
        return min(spec.levels, paced)
    ramp = max(1, int(cfg.curriculum * cfg.steps))
    return min(spec.levels, 1 + step * spec.levels // ramp)


class Sampler:
    """Training problems: drawn from ``rng``, never a held-out one; counts what it rejected."""

    def __init__(self, spec: TaskSpec, seed: int, top_share: float = 0.0):
        self.spec, self.rng = spec, np.random.default_rng([seed, 0x7A5C])
        self.drawn = self.rejected = 0
        self.top_share = top_share

    def draw(self, cap: int):
        while True:
            level = cap if self.top_share and self.rng.random() < self.top_share else int(self.rng.integers(1, cap + 1))
            p = self.spec.generate(self.rng, level)
            self.drawn += 1
            if not is_held_out(p.prompt):
                return p
            self.rejected += 1


def _pace(cfg: TaskTrainConfig, spec: TaskSpec, history: dict, mastery: float, acc: float | None, step: int) -> float:
    """The paced curriculum's gauge (a running mean of the batches' look-up accuracy) after this
    batch; at ``cfg.pace`` the level rises by one and the gauge starts again from zero."""
    if acc is None:
        return mastery
    mastery = 0.98 * mastery + 0.02 * acc
    if cfg.pace and mastery >= cfg.pace and history["level"] < spec.levels:
        history["level"] += 1
        print(f"\nstep {step}: look-up digits {acc:.2f}, level {history['level']}", flush=True)
        return 0.0
    return mastery


def _state(model, opt, sampler, g, step, history, minutes) -> dict:
    return {"model": model.state_dict(), "opt": opt.state_dict(), "rng": sampler.rng.bit_generator.state,
            "drawn": sampler.drawn, "rejected": sampler.rejected, "torch_rng": g.get_state(), "step": step,
            "history": history, "minutes": minutes}


def _save_atomic(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".partial")
    torch.save(obj, tmp)
    tmp.replace(path)  # a stop while writing keeps the last whole checkpoint


def train_task(cfg: TaskTrainConfig) -> Path:
    spec = task_spec(cfg.task, cfg.grid)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    tok = spec.tokenizer()
    tok.save(out / "tokenizer.json")
    torch.manual_seed(cfg.seed)
    model = TextDiffusionLM(TextDiffusionConfig(vocab_size=tok.vocab_size, kind="masked", max_len=spec.max_len, dim=cfg.dim,
                                                n_layers=cfg.layers, n_heads=cfg.heads, mask_id=tok.mask_id, pad_id=tok.pad_id))
    if cfg.init:
        src = TextDiffusionLM.load(cfg.init)
        if src.config == model.config:
            model.load_state_dict(src.state_dict())
        else:  # another task's model: carried over by meaning
            print(f"grown from {cfg.init}: {grow_from(model, tok, cfg.init, list(cfg.init_layers) if cfg.init_layers else None)}")
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, cfg.steps // 50)
    began, before = time.time(), 0.0
    minutes = lambda: before + (time.time() - began) / 60  # noqa: E731

    def progress(step: int) -> float:
        # with a time budget the cosine follows whichever runs out first, steps or minutes: on a
        # shared machine the step rate is unknown in advance, and the decay must still finish
        return min(1.0, max(step / cfg.steps, minutes() / cfg.max_minutes if cfg.max_minutes else 0.0))

    def set_lr(step: int) -> None:  # linear warm-up, cosine decay to 5% of the peak
        for group in opt.param_groups:
            group["lr"] = cfg.lr * min(1.0, (step + 1) / warmup) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress(step))))
    sampler, g = Sampler(spec, cfg.seed, cfg.top_share), torch.Generator().manual_seed(cfg.seed)
    history = {"loss": [], "eval": [], "level": cfg.start_level}  # eval: (step, minutes, acc, second metric)
    start = 0
    ckpt = out / "ckpt.pt"
    if ckpt.is_file():
        st = torch.load(ckpt, weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        sampler.rng.bit_generator.state, sampler.drawn, sampler.rejected = st["rng"], st["drawn"], st["rejected"]
        g.set_state(st["torch_rng"])
        start, history, before = st["step"], st["history"], st["minutes"]
        history.setdefault("level", 1)  # a checkpoint from before the paced curriculum starts it at 1
        print(f"resumed {ckpt} at step {start}")
    problems = [spec.heldout(i) for i in range(cfg.eval_n)]
    digits = torch.tensor([tok.tok.token_to_id(d) for d in "0123456789"])
    mastery = 0.0  # running accuracy on the masked look-up digits (the paced curriculum's gauge)
    began = time.time()
    bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, desc=f"train {spec.key}", unit="step")
    for step in bar:
        model.train()
        ids, gen = encode(spec, tok, [sampler.draw(level_cap(spec, cfg, step, history["level"])) for _ in range(cfg.batch)])
        if cfg.trim:
            ids, gen = trim(ids, gen, eos_id(tok))
        focus = result_positions(tok, ids, gen) if cfg.focus else None
        lookup = lookup_positions(tok, ids, gen) if cfg.lookup else None
        # the pace's gauge: the restated facts' digits (the look-up alone, no arithmetic)
        gauge = lookup_positions(tok, ids, gen, facts_only=True) & torch.isin(ids, digits) if cfg.pace else None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            loss, lookup_acc = masked_loss(model, ids, gen, g, focus, cfg.focus, lookup, cfg.lookup, gauge)
        mastery = _pace(cfg, spec, history, mastery, lookup_acc, step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        set_lr(step)
        opt.step()
        history["loss"].append(loss.item())
        done = step + 1
        stop = progress(done) >= 1.0
        if done % cfg.eval_every == 0 or stop:
            _evaluate(spec, model, tok, problems, history, done, minutes(), out)
            _save_atomic(_state(model, opt, sampler, g, done, history, minutes()), ckpt)
            plot_curves(out / "curves.png", history, spec.key, spec.metrics[1])
            _write_json(out, cfg, spec, sampler, history, done, minutes())
            bar.set_postfix(loss=f"{np.mean(history['loss'][-50:]):.3f}", acc=f"{history['eval'][-1][2]:.2f}")
        elif done % 10 == 0:
            bar.set_postfix(loss=f"{np.mean(history['loss'][-50:]):.3f}", lookup=f"{mastery:.2f}", level=history["level"])
        if stop:
            break
    return out


def _evaluate(spec, model, tok, problems, history, step, minutes, out: Path) -> None:
    model.eval()
    scores = solve(spec, model, tok, problems)
    acc, second = float(np.mean([s[0] for s in scores])), float(np.mean([s[1] for s in scores]))
    best = max((e[2] for e in history["eval"]), default=-1.0)
    history["eval"].append((step, minutes, acc, second))
    if acc >= best:  # the shipped weights: the best held-out accuracy so far (the latest on a tie)
        model.save(out)
    print(f"\nstep {step}: held-out acc {acc:.3f}, {spec.metrics[1]} {second:.3f} ({minutes:.1f} min)", flush=True)


def _write_json(out: Path, cfg, spec, sampler, history, step, minutes) -> None:
    evals = history["eval"]
    best = max(evals, key=lambda e: (e[2], e[0])) if evals else None
    facts = {"command": " ".join(["diffaccel", *sys.argv[1:]]) if sys.argv else "", "config": attrs.asdict(cfg),
             "task": spec.key, "steps_done": step, "minutes": round(minutes, 2), "threads": torch.get_num_threads(),
             "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
             "split": {"held_out_every": HELD_OUT_EVERY, "rule": "sha256(prompt) % 8 == 0 is held out",
                       "training_problems_drawn": sampler.drawn, "held_out_rejected": sampler.rejected},
             "eval": {"problems": "held-out 0..%d (the bench's seeds)" % (cfg.eval_n - 1),
                      "sampler": "masked, confidence order, temperature 0, %d steps" % spec.steps,
                      "history": [dict(zip(("step", "minutes", "acc", spec.metrics[1]), e)) for e in evals]},
             "shipped_step": best[0] if best else None, "final_loss_mean_50": float(np.mean(history["loss"][-50:]))}
    (out / "train.json").write_text(json.dumps(facts, indent=2))


def plot_curves(path: Path, history: dict, key: str, second: str = "second metric") -> None:
    import matplotlib  # slow to import: only the curves need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    losses = history["loss"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    k = max(1, len(losses) // 100)
    a.plot(losses, alpha=0.3, label="loss")
    a.plot(np.arange(len(losses) - k + 1) + k - 1, np.convolve(losses, np.ones(k) / k, mode="valid"), label=f"mean of {k}")
    a.set(xlabel="step", ylabel="masked cross-entropy", yscale="log", title=f"{key}: training loss")
    a.legend()
    ev = np.array(history["eval"]) if history["eval"] else np.zeros((0, 4))
    b.plot(ev[:, 0], ev[:, 2], marker="o", label="acc")
    b.plot(ev[:, 0], ev[:, 3], marker=".", label=second)
    for s, m, acc, _ in history["eval"][-1:]:
        b.annotate(f"{m:.0f} min", (s, acc))
    b.set(xlabel="step", ylabel="held-out", ylim=(0, 1), title="held-out accuracy (greedy, full steps)")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
