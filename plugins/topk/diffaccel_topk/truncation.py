"""``diffaccel topk-truncation``: memory held per step and one sampling step's time, full
vocabulary against top-k truncation (``k_keep``).

One sampling step is the sampler's work on logits (positions, vocab): draw a token per position
at temperature 1 and rank by confidence (the sampler's own draw, ``run.info.tokens.draw_tokens``), plus
the top-1 and its probability that ``post_step`` gets. Two variants, interleaved:

* full: on the dense logits, as without truncation;
* truncated: this strategy's ``diffaccel_denoiser_output`` (top-k_keep, handed over as the
  adapter's truncated logits, ``run.info.tokens.truncated_logits``), then the same work on the k_keep
  values: what a run with truncation pays, the hook included.

The draw and the truncated type come from the config's model (one step of it runs, to read its
``run.info``); the logits are random, at the model's vocabulary or ``--vocab``. Whole generations
with and without the strategy are the bench's (``diffaccel bench configs/text-topk.toml``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import attrs
import torch

import diffaccel
from diffaccel import RunState, hookimpl
from diffaccel.contract.errors import ConfigError

from .strategy import TopK, TopKConfig

EXAMPLES = """
    examples:
      OMP_NUM_THREADS=1 diffaccel topk-truncation configs/text-default.toml --vocab 4096 50000
      OMP_NUM_THREADS=1 diffaccel topk-truncation configs/text-llada-small-topk.toml --k-keep 64
    Prints the values and bytes held per step by each variant and the median time of a sampling
    step, truncated over full, interleaved; the logits are random, at the model's vocabulary or
    each --vocab. k_keep: --k-keep, else the config's topk table, else 128."""


def register(commands) -> None:
    commands.add("topk-truncation", help="memory held and sampling-step time, full vocabulary against top-k truncation",
                 arguments=add_arguments, run=run, examples=EXAMPLES)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("config", help="a text config: its model's sampler draws")
    ap.add_argument("--vocab", type=int, nargs="+", help="vocabulary sizes of the random logits (default: the model's)")
    ap.add_argument("--positions", type=int, default=128, help="positions per step (default 128)")
    ap.add_argument("--k-keep", type=int, help="logits kept per position (default: the config's topk k_keep, else 128)")
    ap.add_argument("--repeats", type=int, default=30, help="timed repeats of each variant (default 30)")


class _ReadInfo:
    """Keeps the run's ``run.info`` (where the adapter hands strategies its draw)."""

    name = "read-info"

    def __init__(self) -> None:
        self.info: Any = None

    @hookimpl
    def diffaccel_run_start(self, run) -> None:
        self.info = run.info


def sampler_info(config) -> Any:
    """The ``run.info`` of one step of ``config``'s model (no strategy)."""
    probe = _ReadInfo()
    # one step, the probe alone, apply's default [guard] (as diffaccel.apply(pipe, strategies=[probe]))
    one = attrs.evolve(config, model=attrs.evolve(config.model, steps=1), strategies=(), guard=type(config.guard)())
    diffaccel.Run(config).generate(config.model.seed, config=one, strategies=[probe])
    return probe.info


def one_step(info: Any, vocab: int, positions: int, k_keep: int, repeats: int) -> dict[str, Any]:
    """Values and bytes held per step and the median seconds of each variant's sampling step."""
    logits = torch.randn(1, positions, vocab, generator=torch.Generator().manual_seed(0)) * 3
    topk = TopK(TopKConfig(k_keep=k_keep, at_finalize=False))
    run = RunState(adapter="text", num_steps=1, batch_size=1)
    run.info.set(seeds=[0], vocab_size=vocab, sampler="masked", truncated_logits=info.tokens.truncated_logits)
    topk.diffaccel_run_start(run)
    gen, every = torch.Generator().manual_seed(1), torch.arange(positions)

    def full() -> None:
        info.tokens.draw_tokens(logits[0], 1.0, gen)
        logits.float().softmax(-1).max(-1)

    def truncated() -> None:
        tk = topk.diffaccel_denoiser_output(run=run, output=logits)
        info.tokens.draw_tokens(tk.rows(0, every), 1.0, gen)
        tk.top1()

    variants = {"full": full, "truncated": truncated}
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for rep in range(repeats + 3):
        for name in names[rep % 2:] + names[: rep % 2]:  # alternate which goes first
            t0 = time.perf_counter()
            variants[name]()
            if rep >= 3:  # the first repeats warm up
                times[name].append(time.perf_counter() - t0)
    st = run.state(topk)
    return {"vocab": vocab, "held": st.held // st.steps, "held_bytes": st.held_bytes // st.steps,
            "full": st.full // st.steps, "full_bytes": st.full_bytes // st.steps,
            "seconds": {name: statistics.median(t) for name, t in times.items()}}


def run(args: argparse.Namespace) -> int:
    for name, v in (("--positions", args.positions), ("--repeats", args.repeats), ("--k-keep", args.k_keep),
                    *(("--vocab", x) for x in args.vocab or [])):
        if v is not None and v < 1:
            raise ConfigError(f"{name}: {v}; allowed: 1 or more")
    config = diffaccel.load_config(args.config)
    tables = [e.config for e in config.strategies if e.name == "topk"]
    k_keep = args.k_keep or (tables[0].k_keep if tables and tables[0].k_keep else 128)
    info = sampler_info(config)
    if info is None or info.tokens.draw_tokens is None or info.tokens.truncated_logits is None:
        raise ConfigError(f"{args.config}: its model's sampler hands strategies no draw_tokens and truncated_logits "
                          f"(text models with token-logits do)")
    for vocab in args.vocab or [info.tokens.vocab_size]:
        if k_keep > vocab:
            raise ConfigError(f"--k-keep {k_keep} is above the vocabulary ({vocab})")
        r = one_step(info, vocab, args.positions, k_keep, args.repeats)
        print(f"vocab {vocab}, {args.positions} positions, k_keep {k_keep}")
        print(f"  held per step: full {r['full']} values ({r['full_bytes'] / 1e6:.2f} MB); truncated {r['held']} values "
              f"with their indices ({r['held_bytes'] / 1e6:.3f} MB): {r['full'] / r['held']:.0f}x fewer values, "
              f"{r['full_bytes'] / r['held_bytes']:.0f}x fewer bytes")
        base = r["seconds"]["full"]
        for name, sec in r["seconds"].items():
            print(f"  sampling step {name:10s} {sec * 1e3:8.3f} ms  ({sec / base:.2f}x full)")
    return 0
