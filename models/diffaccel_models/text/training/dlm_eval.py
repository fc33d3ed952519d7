"""Go/no-go evaluation of an adapted diffusion LM (issue 38): its samples against real held-out
WordNet lines of the same token lengths, judged by SmolLM2-135M.

    diffaccel dlm-eval CHECKPOINT --samples 64 --seed 1000

``CHECKPOINT``: a delta folder (``smollm2_dlm``) or a training run folder holding ``state.pt``
(exported to a temporary delta first). Sample ``i`` imitates held-out line ``i`` (a fixed shuffle
of the shipped held-out lines, which training never sees): ``<|endoftext|>`` then as many
positions as that line has tokens, sampled at temperature 1 with one token committed per step
(full steps), and again with half the steps; the real lines are the reference. Printed: gen_ppl
(the judge's perplexity) and distinct-2 of each set, and the three criteria of the issue:

* full steps: gen_ppl <= 2x the real lines' gen_ppl;
* full steps: distinct-2 >= 0.8x the real lines' distinct-2;
* half steps: gen_ppl <= 1.10x the full-step gen_ppl.

The judge is SmolLM2-135M-Instruct, **the base these deltas start from**: it shares the model's
weights, so absolute gen_ppl is optimistic for the samples; read the ratios.
"""

from __future__ import annotations

import json
import math
import random
import tempfile
import time
from pathlib import Path

from diffaccel.adapters.text.evaluation import metrics
from diffaccel.adapters.text.families import smollm2_dlm as dlm
from diffaccel.adapters.text.families.dispatch import load_pipeline

#: the fixed shuffle of the held-out lines that sample i imitates
SHUFFLE_SEED = 38


def heldout_targets(encode, n: int, offset: int = 0, max_tokens: int = 64) -> list[tuple[str, int]]:
    """``n`` held-out lines (text, token count), from ``offset`` of a fixed shuffle; lines longer
    than the rows the model was trained on (``max_tokens`` with the start token) are skipped."""
    lines = metrics.heldout_lines()
    order = random.Random(SHUFFLE_SEED).sample(range(len(lines)), len(lines))
    out = []
    for i in order:
        k = len(encode(lines[i]))
        if 0 < k <= max_tokens - 1:
            out.append((lines[i], k))
    if len(out) < offset + n:
        raise ValueError(f"only {len(out)} held-out lines fit; asked for {offset + n}")
    return out[offset: offset + n]


def sample_like(pipe, lengths: list[int], seed: int, steps_of, temperature: float = 1.0) -> list[str]:
    """One sample per length: the start token then that many positions; rows of one length run as
    one batch, row j of the whole list with seed ``seed + j`` (in the order of sorted lengths)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    texts: list[str] = [""] * len(lengths)
    j = 0
    while j < len(order):
        k = j
        while k < len(order) and lengths[order[k]] == lengths[order[j]]:
            k += 1
        n = lengths[order[j]]
        out = pipe([dlm.START_TOKEN] * (k - j), length=1 + n, steps=steps_of(n), seed=seed + j,
                   temperature=temperature, progress=False)
        for r, i in enumerate(order[j:k]):
            texts[i] = out.texts[r].strip()
        j = k
    return texts


def quality(judge, texts: list[str]) -> dict[str, float]:
    from diffaccel.adapters.text.evaluation.judge import judge_lines

    lines = judge_lines(texts)
    return {"gen_ppl": judge.score(lines).perplexity() if lines else math.inf,
            "distinct_2": metrics.distinct_n(texts, 2), "distinct_1": metrics.distinct_n(texts, 1),
            "empty": sum(1 for t in texts if not t.strip()) / len(texts)}


def confidence(pipe, targets: list[tuple[str, int]], seed: int, rate: float = 0.5) -> dict[str, float]:
    """Median top-1 probability, and top-1 accuracy, at the masked positions of the real lines
    with each token masked with chance ``rate`` (one full step of the denoiser, the head's shift
    applied): how sure the model is where the sampler has to choose."""
    import torch

    from diffaccel.adapters.text.sampling.model import KVCache

    den, tok = pipe.denoiser, pipe.tokenizer
    start = tok.encode(dlm.START_TOKEN)
    gen = torch.Generator().manual_seed(seed)
    probs, hits = [], []
    with torch.no_grad():
        for text, _ in targets:
            ids = torch.tensor([start + tok.encode(text)])
            masked = torch.rand(ids.shape, generator=gen) < rate
            masked[0, 0] = False
            if not masked.any():
                masked[0, -1] = True
            h = den.embed(torch.where(masked, torch.full_like(ids, den.mask_id), ids))
            for i in range(den.n_layers):
                h = den.block(i, h, None, KVCache())
            logits = den.logits(h)
            if den.logit_shift:
                logits = torch.cat([logits[:, :1], logits[:, :-1]], 1)
            p = logits[masked].float().softmax(-1)
            top = p.max(-1)
            probs += top.values.tolist()
            hits += (top.indices == ids[masked]).tolist()
    return {"median_top1_prob": float(torch.tensor(probs).median()), "top1_accuracy": sum(hits) / len(hits)}


def evaluate(pipe, judge, samples: int = 64, seed: int = 1000, offset: int = 0, temperature: float = 1.0) -> dict:
    targets = heldout_targets(pipe.tokenizer.encode, samples, offset)
    lengths = [k for _, k in targets]
    t0 = time.time()
    full = sample_like(pipe, lengths, seed, lambda n: n, temperature)
    t1 = time.time()
    half = sample_like(pipe, lengths, seed, lambda n: max(1, math.ceil(n / 2)), temperature)
    t2 = time.time()
    res = {"samples": samples, "seed": seed, "temperature": temperature, "mean_tokens": sum(lengths) / len(lengths),
           "real": quality(judge, [t for t, _ in targets]), "full": quality(judge, full), "half": quality(judge, half),
           "confidence": confidence(pipe, targets, seed),
           "seconds_full": t1 - t0, "seconds_half": t2 - t1, "examples_full": full[:12], "examples_half": half[:6]}
    r, f, h = res["real"], res["full"], res["half"]
    res["criteria"] = {
        "gen_ppl_full_over_real": (f["gen_ppl"] / r["gen_ppl"], 2.0, f["gen_ppl"] / r["gen_ppl"] <= 2.0),
        "distinct2_full_over_real": (f["distinct_2"] / r["distinct_2"], 0.8, f["distinct_2"] / r["distinct_2"] >= 0.8),
        "gen_ppl_half_over_full": (h["gen_ppl"] / f["gen_ppl"], 1.10, h["gen_ppl"] / f["gen_ppl"] <= 1.10),
    }
    res["pass"] = all(c[2] for c in res["criteria"].values())
    return res


def report(res: dict) -> str:
    out = [f"{res['samples']} samples (seeds {res['seed']}..{res['seed'] + res['samples'] - 1}), temperature "
           f"{res['temperature']}, {res['mean_tokens']:.1f} tokens each on average; judge SmolLM2-135M-Instruct "
           "(shares the base weights: absolute gen_ppl is optimistic, read the ratios)",
           f"{'text':<24}{'gen_ppl':>10}{'distinct-2':>12}{'distinct-1':>12}{'empty':>8}"]
    for key, label in (("real", "real held-out lines"), ("full", "samples, full steps"), ("half", "samples, half steps")):
        q = res[key]
        out.append(f"{label:<24}{q['gen_ppl']:>10.1f}{q['distinct_2']:>12.3f}{q['distinct_1']:>12.3f}{q['empty']:>8.2f}")
    for name, (value, bound, ok) in res["criteria"].items():
        rel = "<=" if "gen_ppl" in name else ">="
        out.append(f"{name:<28}{value:>7.3f}  (bound {rel} {bound})  {'pass' if ok else 'FAIL'}")
    c = res["confidence"]
    out.append(f"real lines, half their tokens masked: median top-1 probability {c['median_top1_prob']:.3f}, "
               f"top-1 accuracy {c['top1_accuracy']:.3f}")
    out.append(f"go/no-go: {'GO' if res['pass'] else 'NO-GO'}  (sampling {res['seconds_full']:.0f} s full, {res['seconds_half']:.0f} s half)")
    out.append("samples (full steps):")
    out += [f"  {t!r}" for t in res["examples_full"]]
    out.append("samples (half steps):")
    out += [f"  {t!r}" for t in res["examples_half"]]
    return "\n".join(out)


def load(checkpoint: Path):
    """A pipeline from a delta folder, a run folder's ``state.pt`` or a run's snapshot file
    (``snapshots/step-N.pt``); the last two are exported to a temporary delta first."""
    if (checkpoint / "state.pt").is_file() or checkpoint.suffix == ".pt":
        from .adapt import export

        run = checkpoint if checkpoint.is_dir() else checkpoint.parent.parent
        cfg = json.loads((run / "adapt.json").read_text())["config"] if (run / "adapt.json").is_file() else {}
        with tempfile.TemporaryDirectory() as tmp:
            return load_pipeline(str(export(checkpoint, Path(tmp) / run.name, cfg.get("base", "smollm2"))))
    return load_pipeline(str(checkpoint))


def run(args) -> int:
    """``diffaccel dlm-eval CHECKPOINT``: the go/no-go figures of an adapted diffusion LM."""
    import torch

    torch.set_num_threads(args.threads)  # set by command-line entry points only, never by library code
    from diffaccel.adapters.text.evaluation.judge import load_judge

    pipe = load(args.checkpoint)
    judge = load_judge(args.judge)
    res = evaluate(pipe, judge, args.samples, args.seed, args.offset, args.temperature)
    res["checkpoint"] = str(args.checkpoint)
    print(report(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    return 0
