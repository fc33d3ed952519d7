"""Sweep swd's tau, K and R against one baseline config; print a markdown table.

    OMP_NUM_THREADS=1 flock /tmp/diffaccel-bench.lock \
        diffaccel swd-sweep configs/text-default.toml --tau 0.01,0.5,0.9 --K 3,2,4 --R 1,0,2 --vary-one \
        --config configs/text-swd-time-anchor.toml --seeds 8 --plots runs/swd --out runs/swd/sweep-masked.md

Each (tau, K, R) combination becomes one bench entry (a config file in a temporary folder with
the baseline's [model] and one [[strategy]] use = "swd" table, plus --extra keys); every entry
runs on the same seeds, interleaved with the baseline (``diffaccel bench``), so the speedups are
wall-clock ratios taken in the same run. Varying one key at a time (--vary-one) keeps the table
short: the first value of each list is the centre, the others are changed one key at a time.
``--config`` adds whole configs (same [model]) to the same interleaved bench. ``--judge`` scores
every entry with a language model (``gen_ppl``, the bench's default judge unless 'none'), and
``--seed`` moves the seeds (tune on seeds that the bench's figures do not use). ``--fewer-steps
64,43,32`` adds the other way to go faster: the baseline with fewer steps (committing more tokens
per step), timed interleaved with the full baseline in a second pass on the same seeds.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path

import attrs

from diffaccel import load_config, read_toml, run_bench, with_batch, with_seed


def _values(text: str, cast) -> list:
    return [cast(v) for v in text.split(",") if v.strip()]


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    return repr(v)


def _model_table(path: str) -> str:
    model = read_toml(path)["model"]
    return "[model]\n" + "".join(f"{k} = {_toml_value(v) if not isinstance(v, list) else '[' + ', '.join(map(_toml_value, v)) + ']'}\n"
                                 for k, v in model.items())


def combinations(taus, Ks, Rs, vary_one: bool) -> list[tuple[float, int, int]]:
    if not vary_one:
        return list(itertools.product(taus, Ks, Rs))
    centre = (taus[0], Ks[0], Rs[0])
    out = [centre]
    out += [(t, Ks[0], Rs[0]) for t in taus[1:]]
    out += [(taus[0], k, Rs[0]) for k in Ks[1:]]
    out += [(taus[0], Ks[0], r) for r in Rs[1:]]
    return out


EXAMPLES = "\n    examples:\n      diffaccel swd-sweep configs/text-default.toml --tau 0.01,0.5,0.9 --K 3,2,4 --R 1,0,2 --vary-one --seeds 8\n      diffaccel swd-sweep configs/text-default.toml --only-configs --config configs/text-swd.toml --fewer-steps 64,43,32\n    Each (tau, K, R) combination is one entry of one interleaved bench against the baseline (speedups\n    are wall-clock ratios of the same run); --vary-one changes one key at a time from the first\n    values; --fewer-steps adds the baseline at fewer steps in a second pass. For a plain grid with\n    intervals, 'diffaccel bench CONFIG --grid tau=...' does the same without the table."


def register(commands) -> None:
    """``diffaccel swd-sweep`` (this plugin's ``diffaccel_register_commands``)."""
    commands.add('swd-sweep', help="sweep swd's tau, K and R against one baseline config; print a markdown table", arguments=add_arguments, run=run, examples=EXAMPLES)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("baseline", help="config whose [model] all entries share (its strategies are ignored)")
    ap.add_argument("--tau", default="0.01", help="comma-separated values")
    ap.add_argument("--K", default="4", help="comma-separated values")
    ap.add_argument("--R", default="2", help="comma-separated values")
    ap.add_argument("--extra", default="", help="more swd keys for every entry, TOML, e.g. 'early_stop = false'")
    ap.add_argument("--vary-one", action="store_true", help="change one key at a time from the first values")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--batch", type=int, help="rows per call in every entry (bench's --batch), e.g. 8")
    ap.add_argument("--config", action="append", default=[], help="also bench this config (same [model]); repeatable")
    ap.add_argument("--plots", help="bench's --plots: stability curves of every entry into this folder")
    ap.add_argument("--out", help="also write the table to this markdown file")
    ap.add_argument("--seed", type=int, help="first seed of every entry (bench's --seed), e.g. 100000 for tuning")
    ap.add_argument("--judge", default="default", help="bench's --judge: gen_ppl's language model ('none': no gen_ppl)")
    ap.add_argument("--no-noise-floor", action="store_true", help="skip the agreement noise-floor runs (gen_ppl_noise still runs)")
    ap.add_argument("--no-judge-noise", action="store_true", help="skip gen_ppl_noise (the baseline on as many other seeds)")
    ap.add_argument("--fewer-steps", default="", help="comma-separated step counts of the baseline, e.g. 64,43,32")
    ap.add_argument("--fewer-steps-seeds", type=int, help="seeds of the fewer-steps pass (default: --seeds)")
    ap.add_argument("--json", help="also write the bench's result (not the fewer-steps pass) as JSON")
    ap.add_argument("--only-configs", action="store_true", help="no (tau, K, R) entries: bench the --config files only")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    return run(ap.parse_args(argv))


def run(args: argparse.Namespace) -> int:

    combos = [] if args.only_configs else combinations(_values(args.tau, float), _values(args.K, int), _values(args.R, int), args.vary_one)
    model = _model_table(args.baseline)
    with tempfile.TemporaryDirectory(prefix="swd-sweep-") as tmp:
        paths = [str(Path(tmp) / "base.toml")]
        Path(paths[0]).write_text(model)
        for tau, K, R in combos:
            p = Path(tmp) / f"tau{tau:g}-K{K}-R{R}.toml"
            p.write_text(f'{model}\n[[strategy]]\nuse = "swd"\ntau = {tau!r}\nK = {K}\nR = {R}\n{args.extra}\n')
            paths.append(str(p))
        result = run_bench(paths + args.config, seeds=args.seeds, progress=sys.stderr.isatty(), plot_dir=args.plots,
                           batch=args.batch, seed=args.seed, judge=args.judge, noise_floor=not args.no_noise_floor,
                           judge_noise=not args.no_judge_noise, json_path=args.json)
    entries = result["entries"]
    base_q = entries[0]["quality"]
    judged = "gen_ppl" in base_q
    noise = f"; agreement noise floor {base_q['agreement_noise_floor']:.3f}" if "agreement_noise_floor" in base_q else ""
    if "gen_ppl_noise" in base_q:
        noise += f"; gen_ppl of the baseline on other seeds {result['judge']['noise_seeds']}: {base_q['gen_ppl_noise']:.1f} ({base_q['gen_ppl_noise'] / base_q['gen_ppl'] - 1:+.1%})"
    judge = (f"; gen_ppl judge {result['judge']['name']} (loading and scoring: {result['judge']['share_of_wall']:.0%} of the bench's wall time)"
             if judged else "")
    lines = [f"{result['model']['checkpoint']}, {result['model']['steps']} steps, batch {result['model'].get('batch', 1)}, seeds {result['seeds']}, "
             f"interleaved{judge}{noise}", "",
             "| tau | K | R | computed | speedup | perplexity (vs baseline) |" + (" gen_ppl (vs baseline) |" if judged else "")
             + " distinct-2 (vs baseline) | agreement |",
             "| ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if judged else "") + " ---: | ---: |"]
    rows = [(label, e) for label, e in zip([(f"{tau:g}", str(K), str(R)) for tau, K, R in combos]
                                           + [(f"`{Path(c).name}`", "", "") for c in args.config], entries[1:])]
    lines += [_row(("baseline", "", ""), entries[0], base_q, judged)] + [_row(label, e, base_q, judged) for label, e in rows]
    if args.fewer_steps:
        pass_base, steps_rows = fewer_steps(args.baseline, _values(args.fewer_steps, int), args)
        lines += [_row(label, e, pass_base["quality"], judged) for label, e in [(("baseline, fewer-steps pass", "", ""), pass_base), *steps_rows]]
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")
    return 0


def _row(label: tuple[str, str, str], e: dict, base_q: dict, judged: bool) -> str:
    q = e["quality"]
    computed = "-" if e["fraction_computed"] is None else f"{e['fraction_computed']:.0%}"
    cells = [*label, computed, f"{e['speedup']:.2f}x", f"{q['perplexity']:.1f} ({q['perplexity'] / base_q['perplexity'] - 1:+.1%})"]
    if judged:
        cells.append(f"{q['gen_ppl']:.1f} ({q['gen_ppl'] / base_q['gen_ppl'] - 1:+.1%})")
    cells += [f"{q['distinct_2']:.3f} ({q['distinct_2'] / base_q['distinct_2']:.0%})", f"{q['agreement']:.3f}"]
    return "| " + " | ".join(cells) + " |"


def fewer_steps(baseline: str, steps: list[int], args) -> tuple[dict, list[tuple[tuple[str, str, str], dict]]]:
    """The baseline with fewer steps, each timed interleaved with the full baseline on the bench's
    first seeds (a second pass: speedups and quality are relative to this pass's baseline, which
    it returns beside the rows)."""
    from diffaccel import get_adapter

    cfg = load_config(baseline).without_strategies()
    if args.batch:
        cfg = with_batch(cfg, args.batch)
    if args.seed is not None:
        cfg = with_seed(cfg, args.seed)
    adapter = get_adapter(cfg.model.adapter)
    judge = None if args.judge == "none" else adapter.load_judge(None if args.judge == "default" else args.judge)
    pipe = adapter.load(cfg)
    variants = [cfg] + [attrs.evolve(cfg, model=attrs.evolve(cfg.model, steps=s)) for s in steps]
    seeds = [cfg.model.seed + k * cfg.model.batch for k in range(args.fewer_steps_seeds or args.seeds)]
    adapter.run(pipe, cfg, seeds[0], progress=False)  # warm-up
    times, outs = [0.0] * len(variants), [[] for _ in variants]
    for k, seed in enumerate(seeds):
        for i in [(k + j) % len(variants) for j in range(len(variants))]:  # rotating order, as bench does
            t0 = time.perf_counter()
            outs[i].append(adapter.run(pipe, variants[i], seed, progress=False))
            times[i] += time.perf_counter() - t0
    rows = []
    for i, s in enumerate([cfg.model.steps, *steps]):
        q = adapter.quality(outs[0], outs[i])
        if judge is not None:
            q["gen_ppl"] = judge.score(adapter.judge_lines(outs[i])).perplexity()
        rows.append(((f"steps = {s}", "", ""), {"speedup": times[0] / times[i], "fraction_computed": None, "quality": q}))
    rows[0][1]["fraction_computed"] = 1.0
    return rows[0][1], rows[1:]


