"""Quality of bert-cond variants beside unconditioned generation (no timing: not a speed figure).

    OMP_NUM_THREADS=1 python plugins/bert_cond/bench_ablation.py --seeds 16 '{}' '{"word_boundary": false}'

Each argument is a JSON object of config keys overriding the first ``[[strategy]]`` of the config
(default ``configs/text-bert-cond.toml``). Prints, for the baseline (the config's ``[model]``
with no strategy) and each variant: perplexity, distinct-1/2 and key-term recall over the seeds,
recall scored on the terms of each variant's own extraction.

A long run splits into short commands: ``--first K`` starts at the K-th batch of seeds, and
``--save FILE`` appends each entry's raw outputs (texts, which terms are present, shares) to a
JSON-lines file instead of scoring them; ``--aggregate FILE...`` then scores every entry over
all its saved batches (perplexity and distinct-n over all the texts at once, as one run would):

    python plugins/bert_cond/bench_ablation.py --baseline only --first 0 --seeds 3 --save runs/abl.jsonl
    python plugins/bert_cond/bench_ablation.py --baseline only --first 3 --seeds 3 --save runs/abl.jsonl
    python plugins/bert_cond/bench_ablation.py --aggregate runs/abl.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

BASELINE = "baseline"


def record(name: str, outs: list, seeds: list[int], strategy, conditioned: bool) -> dict:
    """Raw outputs of one entry's batches: enough to score them together with other batches."""
    found = []
    for out, seed in zip(outs, seeds):
        for r, text in enumerate(out.texts):
            src = strategy.sources[strategy.source_index(seed + r)]
            found.append(strategy.presence_of(src, text))
    rec = {"entry": name, "seeds": seeds, "texts": [t for o in outs for t in o.texts], "found": found}
    if conditioned:
        ms = [o.report["strategies"]["bert-cond"] for o in outs]
        rec["stage_one_share"] = [m["stage_one_share"] for m in ms]
        rec["place_share"] = [m["place_s"] / m["run_s"] for m in ms]  # pin = model's own work, share of the run
    return rec


def score(recs: list[dict]) -> dict[str, float]:
    from diffaccel.adapters.text.metrics import text_quality
    from diffaccel_bert_cond.metrics import recall

    q = {**text_quality([t for r in recs for t in r["texts"]]),
         "key_term_recall": recall([f for r in recs for f in r["found"]]),
         "samples": sum(len(r["texts"]) for r in recs)}
    for k in ("stage_one_share", "place_share"):
        xs = [x for r in recs for x in r.get(k, [])]
        if xs:
            q[k] = sum(xs) / len(xs)
    return q


def aggregate(files: list[str]) -> None:
    """A markdown table of every entry in the files, over all its saved batches (each seed once)."""
    by: dict[str, dict[int, dict]] = {}
    for f in files:
        for line in Path(f).read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                by.setdefault(r["entry"], {})[r["seeds"][0]] = r  # a batch saved twice counts once
    base = score(list(by[BASELINE].values()))["perplexity"] if BASELINE in by else None
    print("| entry | samples | key-term recall | perplexity | ppl / unconditioned | distinct-2 | stage-one share | placement share |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, batches in by.items():
        q = score(list(batches.values()))
        ratio = f"{q['perplexity'] / base:.3f}" if base else "-"
        shares = [f"{100 * q[k]:.1f}%" if k in q else "-" for k in ("stage_one_share", "place_share")]
        print(f"| {name} | {q['samples']} | {q['key_term_recall']:.3f} | {q['perplexity']:.1f} | {ratio} | "
              f"{q['distinct_2']:.3f} | {shares[0]} | {shares[1]} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("variants", nargs="*", default=["{}"], help="JSON objects of bert-cond keys")
    ap.add_argument("--config", default="configs/text-bert-cond.toml")
    ap.add_argument("--seeds", type=int, default=16, help="calls per variant (batches of --batch rows)")
    ap.add_argument("--first", type=int, default=0, help="start at this batch of seeds (split a long run)")
    ap.add_argument("--batch", type=int, help="rows per call (default: the config's); rows use seeds seed .. seed + batch - 1")
    ap.add_argument("--steps", type=int, help="override [model] steps (fewer: a cheaper check, the same for every row)")
    ap.add_argument("--baseline", choices=["with", "only", "skip"], default="with",
                    help="only: the baseline alone; skip: the variants alone (one process each, in parallel)")
    ap.add_argument("--save", metavar="FILE", help="append raw outputs to this JSON-lines file (score with --aggregate)")
    ap.add_argument("--aggregate", nargs="+", metavar="FILE", help="instead: score the entries saved in these files")
    args = ap.parse_args()
    if args.aggregate:
        aggregate(args.aggregate)
        return

    import attrs

    import diffaccel
    from diffaccel.adapters.text.adapter import TextAdapter
    from diffaccel_bert_cond import BertCond

    cfg = diffaccel.load_config(args.config)
    if args.steps:
        cfg = attrs.evolve(cfg, model=attrs.evolve(cfg.model, steps=args.steps))
    if args.batch:
        cfg = attrs.evolve(cfg, model=attrs.evolve(cfg.model, batch=args.batch))
    pipe = diffaccel.load_pipeline(cfg)
    info = TextAdapter.info(pipe)
    seeds = [cfg.model.seed + k * cfg.model.batch for k in range(args.first, args.first + args.seeds)]

    def emit(name: str, outs: list, strategy, conditioned: bool) -> None:
        rec = record(name, outs, seeds, strategy, conditioned)
        if args.save:
            Path(args.save).parent.mkdir(parents=True, exist_ok=True)
            with open(args.save, "a") as f:
                f.write(json.dumps(rec) + "\n")
        q = score([rec])
        print(name, {k: round(v, 3) for k, v in q.items()}, flush=True)

    base = [] if args.baseline == "skip" else [TextAdapter.run(pipe, cfg, s, progress=False) for s in seeds]
    for i, text in enumerate(args.variants):
        strategy = BertCond(attrs.evolve(cfg.strategies[0].config, **json.loads(text)))
        strategy.diffaccel_setup(info)
        if i == 0 and base:
            emit(BASELINE, base, strategy, conditioned=False)
            if args.baseline == "only":
                return
        outs = []
        for s in seeds:
            with diffaccel.apply(pipe, strategies=[strategy]):
                outs.append(TextAdapter.run(pipe, cfg, s, progress=False))
        emit(text, outs, strategy, conditioned=True)


if __name__ == "__main__":
    main()
