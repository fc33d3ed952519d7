"""Quality only, no timing (so no bench lock): each config's strategies and the first config's
peers against the baseline of the first config's ``[model]``, over more seeds than a timed bench
can afford, with the share of block calls computed. For the digits DiT the configs' batch of 10
asks for each digit once per seed, so ``cond_acc`` over ``--seeds 10`` reads 100 images.

    OMP_NUM_THREADS=1 python -m diffaccel.adapters.dit.quality configs/dit-digits-time-anchor.toml configs/dit-digits-dct.toml --seeds 10
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    import torch

    import diffaccel
    from diffaccel.accelerator import build_strategies
    from diffaccel.adapters_registry import get_adapter
    from diffaccel.config import load_config

    p = argparse.ArgumentParser(prog="python -m diffaccel.adapters.dit.quality")
    p.add_argument("configs", nargs="+")
    p.add_argument("--seeds", type=int, default=10, help="batches per entry")
    p.add_argument("--seed", type=int, default=None, help="the first seed (default: the config's)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfgs = [load_config(c) for c in args.configs]
    base = cfgs[0]
    adapter = get_adapter(base.model.adapter)
    pipe = adapter.load(base)
    info = adapter.info(pipe)
    first = base.model.seed if args.seed is None else args.seed
    seeds = [first + k * base.model.batch for k in range(args.seeds)]
    ref = [adapter.run(pipe, base, s, progress=False) for s in seeds]

    def line(name: str, outs, computed: str = "-") -> None:
        q = adapter.quality(ref, outs)
        print(f"{name:<28} computed {computed:>4}  " + "  ".join(f"{k} {v:.3f}" for k, v in q.items()), flush=True)

    print(f"{base.model.checkpoint}: seeds {seeds[0]}..{seeds[-1] + base.model.batch - 1} "
          f"({args.seeds} batches of {base.model.batch}), {base.model.steps} steps")
    line("baseline", ref, "100%")
    for path, cfg in zip(args.configs, cfgs):
        if not cfg.strategies:
            continue
        with diffaccel.apply(pipe, strategies=build_strategies(cfg, None, info)):
            outs = [adapter.run(pipe, base, s, progress=False) for s in seeds]
        done = [o.report["counters"] for o in outs]
        frac = sum(c["layers_computed"] for c in done) / max(1, sum(c["layers_computed"] + c["layers_skipped"] for c in done))
        line(path.rsplit("/", 1)[-1].removesuffix(".toml"), outs, f"{frac:.0%}")
    for peer in base.peers:
        with adapter.peer_context(pipe, peer.config):
            outs = [adapter.run(pipe, base, s, progress=False) for s in seeds]
        line(adapter.peer_name(peer), outs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
