"""Where a ``text-parallel`` run's time goes: cProfile of three runs of a config (no timing ratio).

    OMP_NUM_THREADS=1 python plugins/parallel/profile_run.py configs/text-parallel.toml 14

Prints the functions with the most time of their own (the second argument: how many).
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import tomllib

import torch

import diffaccel
from diffaccel import parse_config
from diffaccel.accelerator import build_strategies
from diffaccel.adapters.text.loading import load_pipeline


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)
    with open(argv[0], "rb") as f:
        cfg = parse_config(tomllib.load(f))
    pipe = load_pipeline(cfg.model.checkpoint)
    strategies = build_strategies(cfg, info={"kind": "masked", "vocab_size": pipe.denoiser.vocab_size})

    def runs() -> None:
        for seed in (900, 901, 902):  # seeds used by no table
            with diffaccel.apply(pipe, strategies=strategies):
                pipe(None, length=128, steps=cfg.model.steps, seed=seed, progress=False)

    runs()  # warm-up
    prof = cProfile.Profile()
    prof.runcall(runs)
    pstats.Stats(prof).sort_stats("tottime").print_stats(int(argv[1]) if len(argv) > 1 else 14)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
