"""Quality and steps of strategy tables on the shipped masked model, no timing (tuning aid).

    python plugins/parallel/probe.py 100 6 "" "parallel: rule=factor factor=2.5" \
        "swd: tau=0.01 K=3 R=1 | time-anchor: threshold=0.02 warmup=5 max_age=8 narrow_step=false | parallel: rule=factor factor=2.5" \
        "steps=43"

Arguments: the first seed, the number of seeds, then one spec per entry: strategy tables
separated by ``|``, each ``name: key=value ...`` (values parsed as TOML), "" for the baseline,
or ``steps=N`` for the sampler with N steps. Prints the mean steps run, the fraction of positions
computed, the trigram perplexity and distinct-2 over the samples (128 tokens, 128 steps), and at
the end ``gen_ppl`` under the bench's default judge (SmolLM2-135M, docs/text-quality-judge.md) for
every entry, scored in one call after all sampling (``--no-judge`` as the first argument: none).
``--json PATH`` (first, after ``--no-judge`` if given) also writes every sample's steps run and
judge score (nll and tokens summed over its lines) per entry, for ``line_ci.py``. ``--batch B`` runs B seeds per call
(rows seeded seed .. seed + B - 1, the tokens each row gets alone), the seeds a multiple of B.
The defaults of ``configs/text-parallel*.toml`` were chosen with it on seeds 100 to 105.
"""

from __future__ import annotations

import json
import math
import sys
import tomllib

import torch

import diffaccel
from diffaccel import hookimpl, parse_config
from diffaccel.accelerator import build_strategies
from diffaccel.adapters.text.judge import DEFAULT_JUDGE, judge_lines, load_judge
from diffaccel.adapters.text.metrics import text_quality
from diffaccel.adapters.text.loading import load_pipeline


def _value(v: str) -> str:
    """A TOML value as given (numbers, booleans), else quoted as a string."""
    try:
        tomllib.loads(f"x = {v}")
        return v
    except tomllib.TOMLDecodeError:
        return f'"{v}"'


def strategies(spec: str) -> list:
    tables = ""
    for part in filter(None, (p.strip() for p in spec.split("|"))):
        name, _, kv = part.partition(":")
        tables += f'[[strategy]]\nuse = "{name.strip()}"\n' + "".join(f"{k} = {_value(v)}\n" for k, _, v in (i.partition("=") for i in kv.split()))
    text = '[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\n' + tables
    return build_strategies(parse_config(tomllib.loads(text)), info={"kind": "masked", "vocab_size": 4096}) if tables else []


class RowSteps:
    """Per row of a batch, the steps until nothing of it is masked: what the row runs alone."""

    name = "row-steps"

    def __init__(self):
        self.steps: list[int | None] = []

    @hookimpl
    def diffaccel_post_step(self, run, output):
        left = output.masked.any(1).tolist()
        if run.step == 0:
            self.steps = [None] * len(left)
        self.steps = [run.step + 1 if n is None and not l else n for n, l in zip(self.steps, left)]


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)
    use_judge = not (argv and argv[0] == "--no-judge")
    argv = argv[1:] if not use_judge else argv
    out = batch = None
    while argv and argv[0] in ("--json", "--batch"):
        if argv[0] == "--json":
            out = argv[1]
        else:
            batch = int(argv[1])
        argv = argv[2:]
    pipe = load_pipeline("wordnet-masked")
    lines: dict[str, list[str]] = {}
    steps_run: dict[str, list[int]] = {}
    first, count = int(argv[0]), int(argv[1])
    batch = batch or 1
    if count % batch:
        raise SystemExit(f"probe.py: {count} seeds is not a multiple of --batch {batch}")
    for spec in argv[2:]:
        steps, strats = (int(spec.split("=")[1]), []) if spec.startswith("steps=") else (128, strategies(spec))
        texts, run, frac = [], [], []
        for s in range(first, first + count, batch):
            watch = RowSteps()
            with diffaccel.apply(pipe, strategies=strats + [watch] if strats else []):
                o = pipe(None, length=128, steps=steps, seed=s, batch=batch, progress=False)
            texts += o.texts
            run += [o.report["steps_run"] if n is None else n for n in watch.steps] if strats else [steps] * batch
            frac.append(o.report["counters"]["fraction_computed"])
        q = text_quality(texts)
        name = spec or "baseline"
        lines[name], steps_run[name] = [judge_lines([t]) for t in texts], run  # per sample: its lines
        print(f"{name}: steps {sum(run) / len(run):.1f}, computed {sum(frac) / len(frac):.2f}, "
              f"perplexity {q['perplexity']:.1f}, distinct-2 {q['distinct_2']:.3f}", flush=True)
    result = {"seeds": [first, count], "entries": {}}
    if use_judge:
        scores = load_judge(DEFAULT_JUDGE).score([line for g in lines.values() for sample in g for line in sample])
        k = 0
        for name, g in lines.items():
            nll, toks = [], []  # per sample: the sums over its lines
            for sample in g:
                nll.append(sum(scores.nll[k : k + len(sample)]))
                toks.append(sum(scores.tokens[k : k + len(sample)]))
                k += len(sample)
            result["entries"][name] = {"steps_run": steps_run[name], "nll": nll, "tokens": toks}
            print(f"{name}: gen_ppl {math.exp(sum(nll) / sum(toks)):.1f}")
    if out:
        with open(out, "w") as f:
            json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
