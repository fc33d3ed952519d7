"""Sweep swd's tau, K and R against one baseline config; print a markdown table.

    OMP_NUM_THREADS=1 flock /tmp/diffaccel-bench.lock \
        python plugins/swd/sweep.py configs/text-default.toml --tau 0.01,0.5,0.9 --K 3,2,4 --R 1,0,2 --vary-one \
        --config configs/text-swd-time-anchor.toml --seeds 8 --plots runs/swd --out runs/swd/sweep-masked.md

Each (tau, K, R) combination becomes one bench entry (a config file in a temporary folder with
the baseline's [model] and one [[strategy]] use = "swd" table, plus --extra keys); every entry
runs on the same seeds, interleaved with the baseline (``diffaccel bench``), so the speedups are
wall-clock ratios taken in the same run. Varying one key at a time (--vary-one) keeps the table
short: the first value of each list is the centre, the others are changed one key at a time.
``--config`` adds whole configs (same [model]) to the same interleaved bench.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from pathlib import Path

from diffaccel.bench import run_bench
from diffaccel.config import read_toml


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    args = ap.parse_args(argv)

    combos = combinations(_values(args.tau, float), _values(args.K, int), _values(args.R, int), args.vary_one)
    model = _model_table(args.baseline)
    with tempfile.TemporaryDirectory(prefix="swd-sweep-") as tmp:
        paths = [str(Path(tmp) / "base.toml")]
        Path(paths[0]).write_text(model)
        for tau, K, R in combos:
            p = Path(tmp) / f"tau{tau:g}-K{K}-R{R}.toml"
            p.write_text(f'{model}\n[[strategy]]\nuse = "swd"\ntau = {tau!r}\nK = {K}\nR = {R}\n{args.extra}\n')
            paths.append(str(p))
        result = run_bench(paths + args.config, seeds=args.seeds, progress=sys.stderr.isatty(), plot_dir=args.plots,
                           batch=args.batch)
    entries = result["entries"]
    base_q = entries[0]["quality"]
    lines = [f"{result['model']['checkpoint']}, {result['model']['steps']} steps, batch {result['model'].get('batch', 1)}, seeds {result['seeds']}, "
             f"interleaved; agreement noise floor {base_q.get('agreement_noise_floor', float('nan')):.3f}", "",
             "| tau | K | R | computed | speedup | perplexity (vs baseline) | distinct-2 (vs baseline) | agreement |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    b_ppl, b_d2 = base_q["perplexity"], base_q["distinct_2"]
    lines.append(f"| baseline | | | 100% | 1.00x | {b_ppl:.1f} | {b_d2:.3f} | 1.000 |")
    labels = [(f"{tau:g}", str(K), str(R)) for tau, K, R in combos] + [(f"`{Path(c).name}`", "", "") for c in args.config]
    for (tau, K, R), e in zip(labels, entries[1:]):
        q = e["quality"]
        lines.append(f"| {tau} | {K} | {R} | {e['fraction_computed']:.0%} | {e['speedup']:.2f}x | "
                     f"{q['perplexity']:.1f} ({q['perplexity'] / b_ppl - 1:+.1%}) | "
                     f"{q['distinct_2']:.3f} ({q['distinct_2'] / b_d2:.0%}) | {q['agreement']:.3f} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
