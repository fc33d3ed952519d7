"""Quality of bert-cond variants beside unconditioned generation (no timing: not a speed figure).

    OMP_NUM_THREADS=1 python plugins/bert_cond/bench_ablation.py --seeds 16 '{}' '{"word_boundary": false}'

Each argument is a JSON object of config keys overriding the first ``[[strategy]]`` of the config
(default ``configs/text-bert-cond.toml``). Prints, for the baseline (the config's ``[model]``
with no strategy) and each variant: perplexity, distinct-1/2 and key-term recall over the seeds,
recall scored on the terms of each variant's own extraction.
"""

from __future__ import annotations

import argparse
import json

import attrs

import diffaccel
from diffaccel.adapters.text.adapter import TextAdapter
from diffaccel.adapters.text.metrics import text_quality
from diffaccel_bert_cond import BertCond


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("variants", nargs="*", default=["{}"], help="JSON objects of bert-cond keys")
    ap.add_argument("--config", default="configs/text-bert-cond.toml")
    ap.add_argument("--seeds", type=int, default=16, help="calls per variant (batches of --batch rows)")
    ap.add_argument("--batch", type=int, help="rows per call (default: the config's); rows use seeds seed .. seed + batch - 1")
    ap.add_argument("--steps", type=int, help="override [model] steps (fewer: a cheaper check, the same for every row)")
    ap.add_argument("--baseline", choices=["with", "only", "skip"], default="with",
                    help="only: the baseline alone; skip: the variants alone (one process each, in parallel)")
    args = ap.parse_args()
    cfg = diffaccel.load_config(args.config)
    if args.steps:
        cfg = attrs.evolve(cfg, model=attrs.evolve(cfg.model, steps=args.steps))
    if args.batch:
        cfg = attrs.evolve(cfg, model=attrs.evolve(cfg.model, batch=args.batch))
    pipe = diffaccel.load_pipeline(cfg)
    info = TextAdapter.info(pipe)
    seeds = [cfg.model.seed + k * cfg.model.batch for k in range(args.seeds)]
    base = [] if args.baseline == "skip" else [TextAdapter.run(pipe, cfg, s, progress=False) for s in seeds]
    for i, text in enumerate(args.variants):
        strategy = BertCond(attrs.evolve(cfg.strategies[0].config, **json.loads(text)))
        strategy.diffaccel_setup(info)
        if i == 0 and base:
            q = {**text_quality([t for o in base for t in o.texts]), **strategy.diffaccel_bench_quality(base, seeds)}
            print("baseline", {k: round(v, 3) for k, v in q.items()}, flush=True)
            if args.baseline == "only":
                return
        outs = []
        for s in seeds:
            with diffaccel.apply(pipe, strategies=[strategy]):
                outs.append(TextAdapter.run(pipe, cfg, s, progress=False))
        q = {**text_quality([t for o in outs for t in o.texts]), **strategy.diffaccel_bench_quality(outs, seeds)}
        ms = [o.report["strategies"]["bert-cond"] for o in outs]
        q["place_share"] = sum(m["place_s"] / m["run_s"] for m in ms) / len(ms)  # pin = model's own work, share of the run
        print(text, {k: round(v, 3) for k, v in q.items()}, flush=True)


if __name__ == "__main__":
    main()
