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

``--judge smollm2`` (with ``--aggregate``) adds ``gen_ppl``: the perplexity a pretrained causal
LM gives the texts (the bench's judge, ``diffaccel.adapters.text.judge``), beside the n-gram one;
each ratio to the unconditioned run comes with a 95% interval from a paired bootstrap over the
rows (the same rows drawn for the entry and the baseline). ``--term-cost`` adds what the n-gram
model charges the key terms' words against the rest, and what the same terms cost it in their own
source lines (written by people: the context a perfect placement could give them).
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path

BASELINE = "baseline"


def record(name: str, outs: list, seeds: list[int], strategy, conditioned: bool) -> dict:
    """Raw outputs of one entry's batches: enough to score them together with other batches."""
    found, terms, sources = [], [], []
    for out, seed in zip(outs, seeds):
        for r, text in enumerate(out.texts):
            src = strategy.sources[strategy.source_index(seed + r)]
            found.append(strategy.presence_of(src, text))
            terms.append(list(strategy.terms_of(src)))
            sources.append(src)
    rec = {"entry": name, "seeds": seeds, "texts": [t for o in outs for t in o.texts], "found": found,
           "terms": terms, "sources": sources}
    if conditioned:
        ms = [o.report["strategies"]["bert-cond"] for o in outs]
        rec["stage_one_share"] = [m["stage_one_share"] for m in ms]
        rec["place_share"] = [m["place_s"] / m["run_s"] for m in ms]  # pin = model's own work, share of the run
    return rec


def score(recs: list[dict]) -> dict[str, float]:
    """Distinct-n, key-term recall and shares of an entry's batches (perplexity: ``trigram_nll``)."""
    from diffaccel.adapters.text.metrics import distinct_n
    from diffaccel_bert_cond.metrics import recall

    texts = [t for r in recs for t in r["texts"]]
    q = {"distinct_1": distinct_n(texts, 1), "distinct_2": distinct_n(texts, 2),
         "key_term_recall": recall([f for r in recs for f in r["found"]]),
         "samples": sum(len(r["texts"]) for r in recs)}
    for k in ("stage_one_share", "place_share"):
        xs = [x for r in recs for x in r.get(k, [])]
        if xs:
            q[k] = sum(xs) / len(xs)
    return q


def rows(recs: list[dict]) -> dict[int, str]:
    """Seed of each row (a batch's first seed + its row) -> its text: how entries pair up."""
    return {r["seeds"][0] + j: t for r in recs for j, t in enumerate(r["texts"])}


def trigram_nll(by: dict[str, dict[int, str]]) -> dict[str, dict[int, tuple[float, int]]]:
    """Per entry and row: (summed NLL, words + line ends) under the n-gram fluency model."""
    from diffaccel.adapters.text.metrics import fluency_model, sentences

    m = fluency_model()
    out = {}
    for name, texts in by.items():
        out[name] = {}
        for key, text in texts.items():
            c = [x for sent in sentences([text]) for x in m.costs(sent)]
            out[name][key] = (sum(c), len(c))
    return out


def judge_nll(judge, by: dict[str, dict[int, str]]) -> dict[str, dict[int, tuple[float, int]]]:
    """Per entry and row: (summed NLL, tokens) under a judge, every line scored in one batched call."""
    from diffaccel.adapters.text.judge import judge_lines

    keys = [(name, key) for name, texts in by.items() for key in texts]
    lines = [judge_lines([by[name][key]]) for name, key in keys]
    scores = judge.score([line for g in lines for line in g])
    out: dict[str, dict[int, tuple[float, int]]] = {name: {} for name in by}
    k = 0
    for (name, key), g in zip(keys, lines):
        out[name][key] = (sum(scores.nll[k:k + len(g)]), sum(scores.tokens[k:k + len(g)]))
        k += len(g)
    return out


def ppl(nll: dict[int, tuple[float, int]], keys=None) -> float:
    """Perplexity over the rows ``keys`` (default all; a key drawn twice counts twice)."""
    pairs = [nll[k] for k in (nll if keys is None else keys)]
    return math.exp(sum(a for a, _ in pairs) / sum(n for _, n in pairs))


def ratio_ci(entry: dict[int, tuple[float, int]], base: dict[int, tuple[float, int]], draws: int = 2000,
             seed: int = 0) -> tuple[float, float]:
    """95% interval of ppl(entry) / ppl(base) over the rows both have, resampled in pairs."""
    keys = sorted(entry.keys() & base.keys())
    rng = random.Random(seed)
    rs = sorted(ppl(entry, d) / ppl(base, d) for d in ([rng.choice(keys) for _ in keys] for _ in range(draws)))
    return rs[int(0.025 * draws)], rs[int(0.975 * draws) - 1]


def aggregate(files: list[str], judge: str | None = None, terms: bool = False) -> None:
    """A markdown table of every entry in the files, over all its saved batches (each seed once),
    each perplexity's ratio to the baseline's with a paired 95% interval; with ``judge``, gen_ppl
    columns too."""
    by: dict[str, dict[int, dict]] = {}
    for f in files:
        for line in Path(f).read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                if terms and "terms" not in r:
                    raise SystemExit(f"{f}: entry {r['entry']!r} was saved without its rows' terms (before --term-cost "
                                     "existed); run it again to use --term-cost")
                by.setdefault(r["entry"], {})[r["seeds"][0]] = r  # a batch saved twice counts once
    texts = {name: rows(list(b.values())) for name, b in by.items()}
    nlls = {"perplexity": trigram_nll(texts)}
    if judge:
        from diffaccel.adapters.text.judge import load_judge

        nlls["gen_ppl"] = judge_nll(load_judge(judge), texts)
    head = "".join(f" {k} | {k} / unconditioned (95% CI) |" for k in nlls)
    print("| entry | samples | key-term recall |" + head + " distinct-2 | stage-one share | placement share |")
    print("| --- | ---: | ---: |" + " ---: | ---: |" * len(nlls) + " ---: | ---: | ---: |")
    for name, batches in by.items():
        q = score(list(batches.values()))
        cols = ""
        for nll in nlls.values():
            r = "-"
            if BASELINE in nll:
                lo, hi = ratio_ci(nll[name], nll[BASELINE])
                r = f"{ppl(nll[name]) / ppl(nll[BASELINE]):.3f}" + (f" ({lo:.3f} to {hi:.3f})" if name != BASELINE else "")
            cols += f" {ppl(nll[name]):.1f} | {r} |"
        shares = [f"{100 * q[k]:.1f}%" if k in q else "-" for k in ("stage_one_share", "place_share")]
        print(f"| {name} | {q['samples']} | {q['key_term_recall']:.3f} |{cols} {q['distinct_2']:.3f} | {shares[0]} | {shares[1]} |")
    if terms:
        print("\n| entry | term words | their mean NLL (nats) | unseen by the n-gram model | other words and line ends | their mean NLL |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        rows_of = {name: list(b.values()) for name, b in by.items()}
        if BASELINE in by:
            rows_of["the terms in their own source lines"] = rows_of[BASELINE]
        for name, recs in rows_of.items():
            c = term_costs(recs, own_lines=name not in by)
            print(f"| {name} | {c['term_words']} | {c['term_nll']:.2f} | {c['unseen']:.1%} | "
                  + (f"{c['rest_words']} | {c['rest_nll']:.2f} |" if name in by else "- | - |"))
        if BASELINE in by:
            print(f"\nThe baseline's texts with each row's terms added at their own-line cost: "
                  f"perplexity {own_line_ratio(rows_of[BASELINE]):.3f}x the baseline's.")


def split_costs(text: str, terms: list[str]) -> tuple[list[float], list[float], int]:
    """Under the n-gram fluency model: (NLL of every word of ``text`` inside an occurrence of a
    term, NLL of its other words and line ends, how many of the terms' words it never saw)."""
    from diffaccel.adapters.text.metrics import fluency_model, sentences, words
    from diffaccel_bert_cond.metrics import starts

    m = fluency_model()
    tw = [words(t) for t in terms]
    term_c, rest_c, unseen = [], [], 0
    for sent in sentences([text]):
        mark = [False] * len(sent)
        for t in tw:
            for a in starts(t, sent):  # the runs key-term recall counts as present
                mark[a:a + len(t)] = [True] * len(t)
        for i, x in enumerate(m.costs(sent)):  # the last cost is the line's end
            if i < len(sent) and mark[i]:
                term_c.append(x)
                unseen += sent[i] not in m.vocab
            else:
                rest_c.append(x)
    return term_c, rest_c, unseen


def term_costs(recs: list[dict], own_lines: bool = False) -> dict[str, float]:
    """Over the rows of ``recs``: the terms' words (count, mean NLL, share unseen) and the rest
    (count, mean NLL). ``own_lines``: the terms in their rows' source lines instead of the texts."""
    tc, rc, un = [], [], 0
    for r in recs:
        for text, src, terms in zip(r["texts"], r["sources"], r["terms"]):
            t, o, u = split_costs(src if own_lines else text, terms)
            tc.extend(t)
            rc.extend(o)
            un += u
    return {"term_words": len(tc), "term_nll": sum(tc) / max(len(tc), 1), "term_sum": sum(tc),
            "unseen": un / max(len(tc), 1), "rest_words": len(rc), "rest_nll": sum(rc) / max(len(rc), 1)}


def own_line_ratio(base_recs: list[dict]) -> float:
    """Perplexity of the baseline's texts with each row's terms added at what they cost in their
    own source line (the context people wrote around them), over the baseline's: what a
    placement that gave every term its natural context would reach if the rest stayed as is."""
    own = term_costs(base_recs, own_lines=True)
    texts = dict(enumerate(t for r in base_recs for t in r["texts"]))
    base = trigram_nll({BASELINE: texts})[BASELINE].values()
    total, n = sum(a for a, _ in base), sum(k for _, k in base)
    return math.exp((total + own["term_sum"]) / (n + own["term_words"]) - total / n)


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
    ap.add_argument("--term-cost", action="store_true",
                    help="with --aggregate: also the n-gram cost of the key terms' words against the rest, and in their own source lines")
    ap.add_argument("--judge", metavar="NAME_OR_PATH",
                    help="with --aggregate: also gen_ppl by this judge (bench's --judge: smollm2, a causal LM folder or hub id)")
    args = ap.parse_args()
    if (args.judge or args.term_cost) and not args.aggregate:
        ap.error("--judge and --term-cost score saved outputs: use them with --aggregate")
    if args.aggregate:
        aggregate(args.aggregate, args.judge, args.term_cost)
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
        q = {"perplexity": ppl(trigram_nll({name: rows([rec])})[name]), **score([rec])}
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
