"""Memory held per step and sampling time, full vocabulary vs top-k truncation (``k_keep``).

    python plugins/topk/bench_truncation.py [--vocab 4096 50000] [--positions 128] [--k-keep 128]
                                            [--repeats 30] [--runs 6]

Part 1, one sampling step. The sampler's work per step on logits (positions, vocab): draw a
token per position at temperature 1 and rank by confidence (the masked sampler's ``draw``), plus
the top-1 and its probability that ``post_step`` gets. Two variants, interleaved, one thread:

* full: on the dense logits, as without truncation;
* truncated: the ``topk`` strategy's ``diffaccel_denoiser_output`` (top-k_keep, handed to the
  sampler as ``TopKLogits`` (values, indices)), then the same work on the k_keep values: what a run
  with truncation pays, the hook included.

Part 2 (``--runs``), whole generations: a reference masked model with random weights (the shipped
model's shape: 4 layers, width 192) at each vocabulary size, 128 tokens, 32 steps, temperature 1,
with and without the strategy, interleaved, same seeds; the ratio of total times.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from diffaccel.adapters.text.logits import draw
from diffaccel.state import RunState
from diffaccel_topk import TopK, TopKConfig

BANNED = [0, 1, 2]


def full(logits, ctx):
    draw(logits[0], BANNED, 1.0, ctx["gen"])
    return logits.float().softmax(-1).max(-1)


def truncated(logits, ctx):
    tk = ctx["topk"].diffaccel_denoiser_output(run=ctx["run"], output=logits)
    draw(tk.rows(0, ctx["all"]), BANNED, 1.0, ctx["gen"])
    return tk.top1()


def one_step(vocab: int, args) -> None:
    logits = torch.randn(1, args.positions, vocab, generator=torch.Generator().manual_seed(0)) * 3
    topk = TopK(TopKConfig(k_keep=args.k_keep, at_finalize=False))
    run = RunState(adapter="text", num_steps=1, batch_size=1)
    run.info.set(seeds=[0], vocab_size=vocab, sampler="masked")
    topk.diffaccel_run_start(run)
    ctx = {"topk": topk, "run": run, "gen": torch.Generator().manual_seed(1), "all": torch.arange(args.positions)}
    variants = {"full": full, "truncated": truncated}
    times = {name: [] for name in variants}
    names = list(variants)
    for rep in range(args.repeats + 3):
        for name in names[rep % 2:] + names[: rep % 2]:
            t0 = time.perf_counter()
            variants[name](logits, ctx)
            if rep >= 3:  # the first repeats warm up
                times[name].append(time.perf_counter() - t0)
    st = run.state(topk)
    held, held_bytes = st["held"] // st["steps"], st["held_bytes"] // st["steps"]
    full_n, full_bytes = st["full"] // st["steps"], st["full_bytes"] // st["steps"]
    print(f"vocab {vocab}, {args.positions} positions, k_keep {args.k_keep}")
    print(f"  held per step: full {full_n} values ({full_bytes / 1e6:.2f} MB float32); "
          f"truncated {held} values + {held} int64 indices ({held_bytes / 1e6:.3f} MB)")
    print(f"  ratio: {full_n / held:.0f}x fewer values, {full_bytes / held_bytes:.0f}x fewer bytes")
    base = statistics.median(times["full"])
    for name in names:
        med = statistics.median(times[name])
        print(f"  sampling step {name:10s} {med * 1e3:8.3f} ms  ({med / base:.2f}x full)")


def whole_runs(vocab: int, args) -> None:
    import diffaccel
    from diffaccel.adapters.text.testing import tiny_text_pipeline

    pipe = tiny_text_pipeline("masked", vocab_size=vocab, n_layers=4, dim=192, max_len=args.positions)
    topk = TopK(TopKConfig(k_keep=args.k_keep, at_finalize=False))
    kw = dict(length=args.positions, steps=32, temperature=1.0, progress=False)
    pipe(seed=0, **kw)  # warm-up
    times = {"plain": [], "truncated": []}
    for i in range(args.runs):
        order = ["plain", "truncated"] if i % 2 == 0 else ["truncated", "plain"]
        for name in order:
            strategies = [topk] if name == "truncated" else []
            with diffaccel.apply(pipe, strategies=strategies):
                t0 = time.perf_counter()
                pipe(seed=i, **kw)
                times[name].append(time.perf_counter() - t0)
    ratio = sum(times["truncated"]) / sum(times["plain"])
    print(f"  whole runs (random-weight model, vocab {vocab}, {args.positions} tokens, 32 steps, {args.runs} interleaved pairs): "
          f"truncated / plain total time {ratio:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, nargs="+", default=[4096, 50000])
    ap.add_argument("--positions", type=int, default=128)
    ap.add_argument("--k-keep", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--runs", type=int, default=0, help="also time this many interleaved pairs of whole generations")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for vocab in args.vocab:
        one_step(vocab, args)
        if args.runs:
            whole_runs(vocab, args)


if __name__ == "__main__":
    main()
