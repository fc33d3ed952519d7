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
The defaults of ``configs/text-parallel*.toml`` were chosen with it on seeds 100 to 105.
"""

from __future__ import annotations

import math
import sys
import tomllib

import torch

import diffaccel
from diffaccel import parse_config
from diffaccel.accelerator import build_strategies
from diffaccel.adapters.text.judge import DEFAULT_JUDGE, judge_lines, load_judge
from diffaccel.adapters.text.metrics import text_quality
from diffaccel.adapters.text.pipeline import TextDiffusionPipeline


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


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)
    use_judge = not (argv and argv[0] == "--no-judge")
    argv = argv[1:] if not use_judge else argv
    pipe = TextDiffusionPipeline.from_pretrained("wordnet-masked")
    lines: dict[str, list[str]] = {}
    seeds = range(int(argv[0]), int(argv[0]) + int(argv[1]))
    for spec in argv[2:]:
        steps, strats = (int(spec.split("=")[1]), []) if spec.startswith("steps=") else (128, strategies(spec))
        texts, run, frac = [], [], []
        for s in seeds:
            with diffaccel.apply(pipe, strategies=strats):
                o = pipe(None, length=128, steps=steps, seed=s, progress=False)
            texts += o.texts
            run.append(o.report["steps_run"])
            frac.append(o.report["counters"]["fraction_computed"])
        q = text_quality(texts)
        lines[spec or "baseline"] = judge_lines(texts)
        print(f"{spec or 'baseline'}: steps {sum(run) / len(run):.1f}, computed {sum(frac) / len(frac):.2f}, "
              f"perplexity {q['perplexity']:.1f}, distinct-2 {q['distinct_2']:.3f}", flush=True)
    if use_judge:
        scores = load_judge(DEFAULT_JUDGE).score([line for g in lines.values() for line in g])
        k = 0
        for name, g in lines.items():
            nll, toks = sum(scores.nll[k : k + len(g)]), sum(scores.tokens[k : k + len(g)])
            k += len(g)
            print(f"{name}: gen_ppl {math.exp(nll / toks):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
