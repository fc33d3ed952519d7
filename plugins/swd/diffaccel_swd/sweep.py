"""``diffaccel swd-sweep``: retired for ``diffaccel bench --grid`` (deprecated in 0.2, removed in 0.3).

It was a grid of swd's tau, K and R against one baseline, in one interleaved bench: what
``bench --grid`` does, with intervals. The command now prints one line naming the equivalent
bench and runs it:

    diffaccel swd-sweep configs/text-default.toml --tau 0.01,0.5 --K 3,2 --R 1 --seeds 8
    # runs: diffaccel bench configs/text-default.toml SWD.toml --grid tau=0.01,0.5 --grid K=3,2 --grid R=1 --seeds 8
    # SWD.toml: the baseline's [model] with one [[strategy]] use = "swd" table (and --extra)

``--vary-one``, ``--fewer-steps`` and ``--out`` (a markdown table) went with it: a grid runs the
full product (list fewer values, or run several benches), the fewer-steps line is a ``[[peer]]
use = "steps"`` table in the baseline config, and the table is the bench's (``--json``,
``--report DIR`` for a page).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from pathlib import Path

from diffaccel import BenchOptions, format_table, read_toml, run_bench

EXAMPLES = ("\n    examples:\n      diffaccel bench configs/text-default.toml configs/text-swd.toml --grid tau=0.01,0.5,0.9 "
            "--grid K=3,2 --seeds 8\n    swd-sweep is deprecated: it prints the equivalent 'diffaccel bench --grid' and runs it.")


def register(commands) -> None:
    """``diffaccel swd-sweep`` (this plugin's ``diffaccel_register_commands``), deprecated."""
    commands.add('swd-sweep', help="deprecated: runs the equivalent 'diffaccel bench --grid tau=... --grid K=... --grid R=...'",
                 arguments=add_arguments, run=run, examples=EXAMPLES)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("baseline", help="config whose [model] all entries share (its strategies are ignored)")
    ap.add_argument("--tau", default="0.01", help="comma-separated values (bench --grid tau=...)")
    ap.add_argument("--K", default="4", help="comma-separated values (bench --grid K=...)")
    ap.add_argument("--R", default="2", help="comma-separated values (bench --grid R=...)")
    ap.add_argument("--extra", default="", help="more swd keys for every entry, TOML, e.g. 'early_stop = false'")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--batch", type=int, help="bench's --batch")
    ap.add_argument("--config", action="append", default=[], help="also bench this config (same [model]); repeatable")
    ap.add_argument("--plots", help="bench's --plots")
    ap.add_argument("--seed", type=int, help="bench's --seed")
    ap.add_argument("--judge", default="default", help="bench's --judge")
    ap.add_argument("--no-noise-floor", action="store_true", help="bench's --no-noise-floor")
    ap.add_argument("--json", help="bench's --json")
    ap.add_argument("--only-configs", action="store_true", help="no swd grid: bench the --config files only")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    return run(ap.parse_args(argv))


def _values(text: str) -> str:
    return ",".join(v.strip() for v in text.split(",") if v.strip())


def swd_config(baseline: str, extra: str) -> str:
    """The swd config the grid expands: the baseline's ``[model]``, one ``[[strategy]] use = "swd"``."""
    model = read_toml(baseline)["model"]
    lines = [f"{k} = {_toml(v)}" for k, v in model.items()]
    return "[model]\n" + "\n".join(lines) + f'\n\n[[strategy]]\nuse = "swd"\n{extra}\n'


def _toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, list):
        return "[" + ", ".join(map(_toml, v)) + "]"
    return repr(v)


def bench_args(args: argparse.Namespace, swd_path: str | None) -> tuple[list[str], list[str], BenchOptions]:
    """The equivalent bench: (its command line after ``diffaccel bench``, its configs, its options)."""
    paths = [args.baseline, *([swd_path] if swd_path else []), *args.config]
    grid = [] if swd_path is None else [f"{k}={_values(v)}" for k, v in (("tau", args.tau), ("K", args.K), ("R", args.R))]
    line = [*paths, *[w for g in grid for w in ("--grid", g)], "--seeds", str(args.seeds)]
    for flag, value in (("--batch", args.batch), ("--seed", args.seed), ("--plots", args.plots), ("--json", args.json)):
        if value is not None:
            line += [flag, str(value)]
    if args.judge != "default":
        line += ["--judge", args.judge]
    if args.no_noise_floor:
        line.append("--no-noise-floor")
    options = BenchOptions(seeds=args.seeds, batch=args.batch, seed=args.seed, plot_dir=args.plots, json_path=args.json,
                           judge=args.judge, noise_floor=not args.no_noise_floor, grid=grid or None,
                           progress=sys.stderr.isatty())
    return line, paths, options


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="swd-sweep-") as tmp:
        swd_path = None
        if not args.only_configs:
            swd_path = str(Path(tmp) / "swd.toml")
            Path(swd_path).write_text(swd_config(args.baseline, args.extra))
        line, paths, options = bench_args(args, swd_path)
        shown = " ".join(shlex.quote(w) if w != swd_path else "SWD.toml" for w in line)
        print(f"diffaccel swd-sweep is deprecated (removed in 0.3); it runs: diffaccel bench {shown}"
              + (" (SWD.toml: the baseline's [model] with one [[strategy]] use = \"swd\" table)" if swd_path else ""),
              file=sys.stderr)
        result = run_bench(paths, options)
    print(format_table(result))
    if args.json:
        print(f"wrote {args.json}")
    return 0
