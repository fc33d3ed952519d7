"""Quality only, no timing (no bench lock needed): PSNR, SSIM and conditioning accuracy of each
config's strategies and of the first config's DeepCache peers, against the baseline of the first
config's [model], over more seeds than a timed bench affords (each seed is one batch of ten digits).

    OMP_NUM_THREADS=2 python plugins/time_anchor/digits_quality.py configs/digits-time-anchor.toml --seeds 20
"""

from __future__ import annotations

import argparse

import diffaccel
from diffaccel.accelerator import build_strategies
from diffaccel.adapters.unet.adapter import UNetAdapter
from diffaccel.config import load_config


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="+", help="configs sharing one [model]; the first one's peers are run too")
    ap.add_argument("--seeds", type=int, default=20)
    args = ap.parse_args(argv)
    cfgs = [load_config(p) for p in args.configs]
    base = cfgs[0]
    pipe = UNetAdapter.load(base)
    info = UNetAdapter.info(pipe)
    seeds = [base.model.seed + k * base.model.batch for k in range(args.seeds)]
    ref = [UNetAdapter.run(pipe, base, s, progress=False) for s in seeds]
    print(f"{base.model.checkpoint}: {len(seeds)} seeds x {base.model.batch} images; baseline cond_acc "
          f"{UNetAdapter.quality(ref, ref)['cond_acc']:.3f}", flush=True)
    for path, c in zip(args.configs, cfgs):
        strategies = build_strategies(c, None, info)
        with diffaccel.apply(pipe, strategies=strategies):
            outs = [UNetAdapter.run(pipe, base, s, progress=False) for s in seeds]
        print(path, {k: round(v, 3) for k, v in UNetAdapter.quality(ref, outs).items()}, flush=True)
    for peer in base.peers:
        with UNetAdapter.peer_context(pipe, peer.config):
            outs = [UNetAdapter.run(pipe, base, s, progress=False) for s in seeds]
        print(UNetAdapter.peer_name(peer), {k: round(v, 3) for k, v in UNetAdapter.quality(ref, outs).items()}, flush=True)


if __name__ == "__main__":
    main()
