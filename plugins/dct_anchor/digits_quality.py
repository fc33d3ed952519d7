"""Quality only, no timing (no bench lock needed): each config's strategies and the first config's
DeepCache peers against the baseline of the first config's [model], 4 seeds, with the number of
steps the deep path was computed (dct-anchor entries).

    OMP_NUM_THREADS=1 python plugins/dct_anchor/digits_quality.py configs/digits-dct.toml configs/digits-dct-fast.toml configs/digits-dct-input.toml
"""
import sys, json
import diffaccel
from diffaccel.accelerator import build_strategies
from diffaccel.config import load_config
from diffaccel.adapters.unet.adapter import UNetAdapter
paths = sys.argv[1:]
cfgs = [load_config(p) for p in paths]
base = cfgs[0]
pipe = UNetAdapter.load(base); info = UNetAdapter.info(pipe)
seeds = [base.model.seed + k * base.model.batch for k in range(4)]
ref = [UNetAdapter.run(pipe, base, s, progress=False) for s in seeds]
def full(outs):
    v = [sum(c != "R" for c in next(iter(br.values()))["decisions"]) for o in outs for br in o.report["strategies"]["dct-anchor"]["branches"].values()]
    return sum(v) / len(v)
for p, c in zip(paths, cfgs):
    st = build_strategies(c, None, info)
    with diffaccel.apply(pipe, strategies=st):
        outs = [UNetAdapter.run(pipe, base, s, progress=False) for s in seeds]
    print(p, {k: round(v, 3) for k, v in UNetAdapter.quality(ref, outs).items()}, "deep path computed", full(outs), flush=True)
for peer in cfgs[0].peers:
    with UNetAdapter.peer_context(pipe, peer.config):
        outs = [UNetAdapter.run(pipe, base, s, progress=False) for s in seeds]
    print(UNetAdapter.peer_name(peer), {k: round(v, 3) for k, v in UNetAdapter.quality(ref, outs).items()}, flush=True)
print("baseline cond_acc", UNetAdapter.quality(ref, ref)["cond_acc"])
