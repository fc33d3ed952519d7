"""Memory held per step and sampling time, full vocabulary vs top-k truncation (``k_keep``).

    python plugins/topk/bench_truncation.py [--vocab 4096 50000] [--positions 128] [--k-keep 128] [--repeats 30]

Per step the sampler sees logits (positions, vocab). Three ways of taking the sampler's
decision (argmax token and its probability, as the masked sampler at temperature 0):

* full: softmax over the whole vocabulary;
* hook (dense): the ``topk`` strategy's ``diffaccel_denoiser_output`` (top-k_keep, the rest
  -inf, a dense tensor as the hook contract requires), then the same softmax: what a run pays today;
* compact: top-k_keep (values, indices), softmax over k_keep values, index lookup: what a
  sampler or strategy reading the held (values, indices) pays.

Timings are interleaved (each repeat runs every variant, in rotating order), one thread, median.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from diffaccel.state import RunState
from diffaccel_topk import TopK, TopKConfig


def full(logits, _):
    return logits.softmax(-1).max(-1)


def hook(logits, ctx):
    return ctx["topk"].diffaccel_denoiser_output(run=ctx["run"], output=logits).softmax(-1).max(-1)


def compact(logits, ctx):
    vals, idx = logits.topk(ctx["k_keep"], dim=-1)
    conf, j = vals.softmax(-1).max(-1)
    return conf, idx.gather(-1, j[..., None])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, nargs="+", default=[4096, 50000])
    ap.add_argument("--positions", type=int, default=128)
    ap.add_argument("--k-keep", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(1)
    variants = {"full": full, "hook (dense)": hook, "compact": compact}
    for vocab in args.vocab:
        logits = torch.randn(1, args.positions, vocab, generator=torch.Generator().manual_seed(0)) * 3
        topk = TopK(TopKConfig(k_keep=args.k_keep, at_finalize=False))
        run = RunState(adapter="text", num_steps=1, batch_size=1)
        run.info.update(seeds=[0], vocab_size=vocab, sampler="masked")
        topk.diffaccel_run_start(run)
        ctx = {"topk": topk, "run": run, "k_keep": args.k_keep}
        times = {name: [] for name in variants}
        names = list(variants)
        for rep in range(args.repeats + 3):
            for name in names[rep % 3:] + names[: rep % 3]:
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
            print(f"  sampling time {name:13s} {med * 1e3:8.3f} ms  ({med / base:.2f}x full)")


if __name__ == "__main__":
    main()
