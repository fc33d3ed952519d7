"""``diffaccel parallel-sweep``: the parallel rules' knobs against the baseline and the
fewer-steps line, drawn as a Pareto plot. Deprecated in 0.2 (removed in 0.3): its benches are
``diffaccel bench --grid``, which it now prints (one line) and runs.

    OMP_NUM_THREADS=1 flock /tmp/diffaccel-bench.lock \
        diffaccel parallel-sweep configs/text-default.toml --seed 5000 --seeds 6 \
        --factor 1.5,2.5,4 --tau 0.8,0.6,0.4 --gamma 1,3 --steps 64,43,32,24 \
        --out plugins/parallel/figures/pareto-b1.png

One bench per rule with values, each its own interleaved bench with its own baseline on the
same seeds: the baseline's ``[model]`` (``--seed`` replacing its seed, so the sweep runs on
held-out seeds) and, in the first bench only, one ``steps`` peer per ``--steps`` value; and one
config per rule (``factor.toml``, ``threshold-prob.toml`` with ``--scale prob``: the tables of
``--compose`` configs first, then one ``[[strategy]] use = "parallel"``) expanded by
``--grid parallel.KNOB=... [--grid parallel.spacing=...]``. The plot shows speedup against
perplexity (the bench's ``gen_ppl`` when it reports one, else the trigram ``perplexity``;
``--metric`` chooses) and against distinct-2, each rule as its own marker and the steps peers as
a line. Each bench's JSON is written beside the PNG (``OUT-RULE.json``), and their merge
(``OUT.json``).

``--merge part1.json part2.json ... --out figure.png`` draws benches' JSONs on one plot (a
part's speedups are ratios to its own baseline, taken in its own run; the baselines' quality is
the same, same seeds, deterministic sampling, which ``--merge`` checks).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from diffaccel import BenchOptions, format_table, read_toml, run_bench
from diffaccel.contract.errors import DiffaccelError

RULE_KNOB = {"factor": "factor", "threshold": "tau", "entropy": "gamma"}
# entry names: <rule>[-prob][<knob>=<value>[,spacing=<spacing>]] (bench --grid; scale ratio unless -prob),
# and the sweep's own before 0.2, <rule>[-prob]-<knob><value>[-s<spacing>]
ENTRY = re.compile(r"^(?P<rule>factor|threshold|entropy)(?P<prob>-prob)?(?:\[(?P<gknob>[a-z]+)=(?P<gvalue>[^,\]]+)"
                   r"(?:,spacing=(?P<gspacing>\d+))?\]|-(?P<knob>[a-z]+)(?P<value>[0-9.e+-]+?)(?:-s(?P<spacing>\d+))?)$")


def parse_entry(name: str) -> dict[str, Any] | None:
    """An entry's rule, scale (``prob``), knob, value and spacing ("" for none or 0), or None."""
    m = ENTRY.match(name)
    if m is None:
        return None
    spacing = m["gspacing"] if m["gknob"] else m["spacing"]
    return {"rule": m["rule"], "prob": bool(m["prob"]), "knob": m["gknob"] or m["knob"], "value": m["gvalue"] or m["value"],
            "spacing": "" if spacing in (None, "0") else spacing}


def _values(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, list):
        return "[" + ", ".join(map(_toml_value, v)) + "]"
    return repr(v)


def _tables(data: dict, seed: int | None) -> str:
    model = dict(data["model"])
    if seed is not None:
        model["seed"] = seed
    return "[model]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in model.items())


def _strategy_tables(path: str) -> str:
    out = ""
    for t in read_toml(path).get("strategy", []):
        out += "[[strategy]]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in t.items())
    return out


def write_configs(folder: Path, args) -> list[tuple[str, list[str], list[str]]]:
    """The benches of the sweep, one per rule with values: (rule file stem, configs, --grid options)."""
    base = read_toml(args.baseline)
    model = _tables(base, args.seed)
    composed = "".join(_strategy_tables(p) for p in args.compose)
    peers = "".join(f"[[peer]]\nuse = \"steps\"\nsteps = {int(n)}\n" for n in _values(args.steps))
    benches = []
    for rule, knob in RULE_KNOB.items():
        values = _words(getattr(args, knob))
        if not values:
            continue
        first = not benches
        base_path = folder / ("baseline-model.toml" if first else f"baseline-model-{rule}.toml")
        base_path.write_text(model + (peers if first else ""))  # the fewer-steps line once
        stem = rule + ("-prob" if args.scale == "prob" else "")
        p = folder / f"{stem}.toml"
        p.write_text(model + composed + f'[[strategy]]\nuse = "parallel"\nrule = "{rule}"\nscale = "{args.scale}"\n')
        grid = [f"parallel.{knob}={','.join(values)}"]
        spacing = _words(args.spacing)
        if spacing != ["0"]:
            grid.append(f"parallel.spacing={','.join(spacing)}")
        benches.append((stem, [str(base_path), str(p)], grid))
    return benches


def _words(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def plot(result: dict, path: Path, metric: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = result["entries"]
    base = next(e for e in entries if e["name"] == "baseline")
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), dpi=80)
    for ax, key, label in ((axes[0], metric, metric.replace("_", " ")), (axes[1], "distinct_2", "distinct-2")):
        steps = sorted((e for e in entries if e.get("peer")), key=lambda e: e["speedup"])
        ax.plot([1.0] + [e["speedup"] for e in steps], [base["quality"][key]] + [e["quality"][key] for e in steps],
                "k--o", ms=4, label="steps-N (fewer steps)")
        for e in steps:
            ax.annotate(e["name"].removeprefix("steps-"), (e["speedup"], e["quality"][key]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
        parsed = [(m, e) for e in entries if (m := parse_entry(e["name"]))]
        groups = sorted({(m["rule"], m["prob"], m["spacing"]) for m, _ in parsed})
        for rule, prob, sp in groups:  # one line per rule, scale and spacing
            marker = {"factor": "s", "threshold": "^", "entropy": "D"}[rule]
            pts = sorted((e for m, e in parsed if (m["rule"], m["prob"], m["spacing"]) == (rule, prob, sp)),
                         key=lambda e: e["speedup"])
            ax.plot([e["speedup"] for e in pts], [e["quality"][key] for e in pts], marker=marker, ls="-" if not sp else "-.",
                    ms=5, label=rule + (" (prob)" if prob else "") + (f", spacing {sp}" if sp else ""))
            for e in pts:
                m = parse_entry(e["name"])
                ax.annotate(m["knob"] + m["value"], (e["speedup"], e["quality"][key]), fontsize=7,
                            xytext=(3, -9), textcoords="offset points")
        ax.plot([1.0], [base["quality"][key]], "k*", ms=10, label="baseline")
        if key == metric:
            ax.axhline(base["quality"][key] * 1.05, color="grey", lw=0.8, ls=":", label="+5%")
        else:
            ax.axhline(base["quality"][key] * 0.95, color="grey", lw=0.8, ls=":", label="-5%")
        ax.set_xlabel("speedup (x, wall clock)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    m = result["model"]
    fig.suptitle(f"parallel on {m['checkpoint']}, batch {m['batch']}, seeds {result['seeds'][0]}..{result['seeds'][-1]}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def steps_run(entry: dict) -> float:
    """Mean steps an entry's runs took (a steps peer: its N; rows of a batch share a run's steps)."""
    runs = [r.get("steps_run", r.get("steps")) for r in entry.get("reports") or []]
    runs = [r for r in runs if r is not None]
    return sum(runs) / len(runs) if runs else float("nan")


def merge(paths: list[str]) -> dict:
    """One result from the JSONs of a sweep's parts: the first part's baseline, every part's
    other entries (speedups as each part measured them, against its own baseline)."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    first = parts[0]
    base = next(e for e in first["entries"] if e["name"] == "baseline")
    merged = dict(first, entries=[base], parts=list(paths))
    names = {"baseline"}
    for path, part in zip(paths, parts):
        if (part["model"], part["seeds"]) != (first["model"], first["seeds"]):
            raise DiffaccelError(f"{path}: model or seeds differ from {paths[0]}'s; merge parts of one sweep")
        pb = next(e for e in part["entries"] if e["name"] == "baseline")
        if any(abs(pb["quality"][k] - v) > 1e-6 * max(1.0, abs(v)) for k, v in base["quality"].items()
               if k in pb["quality"] and k != "gen_ppl_noise"):
            raise DiffaccelError(f"{path}: its baseline's quality differs from {paths[0]}'s (other seeds or code?)")
        for e in part["entries"]:
            if e["name"] in names:
                continue
            names.add(e["name"])
            merged["entries"].append(dict(e, part=path))
    return merged


EXAMPLES = ("\n    examples:\n      diffaccel bench configs/text-default.toml PARALLEL.toml --grid parallel.factor=1.5,2.5,4 --seeds 6\n"
            "      diffaccel parallel-sweep --merge runs/partA.json runs/partB.json --out runs/pareto.png\n"
            "    parallel-sweep is deprecated: it prints its benches ('diffaccel bench --grid', one per rule), runs them\n"
            "    and plots speedup against gen_ppl (or perplexity) and distinct-2; the JSONs go beside the PNG.")


def register(commands) -> None:
    """``diffaccel parallel-sweep`` (this plugin's ``diffaccel_register_commands``)."""
    commands.add('parallel-sweep', help="deprecated: runs 'diffaccel bench --grid' per rule and draws the Pareto plot", arguments=add_arguments, run=run, examples=EXAMPLES)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("baseline", nargs="?", help="config whose [model] every entry shares (its strategies are ignored)")
    ap.add_argument("--seed", type=int, default=None, help="replaces [model] seed: held-out seeds for the sweep")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--batch", type=int, default=None, help="rows per call in every entry")
    ap.add_argument("--factor", default="1.5,2.5,4", help="factor rule values, comma-separated ('' for none)")
    ap.add_argument("--tau", default="0.8,0.6,0.4", help="threshold rule values")
    ap.add_argument("--gamma", default="1,3", help="entropy rule values (nats)")
    ap.add_argument("--scale", default="ratio", choices=("ratio", "prob"))
    ap.add_argument("--spacing", default="0", help="spacing values, each crossed with every rule value")
    ap.add_argument("--steps", default="64,43,32,24", help="steps peers (the fewer-steps line)")
    ap.add_argument("--judge", default="default", help="the bench's --judge (gen_ppl): smollm2, none, a folder...")
    ap.add_argument("--compose", action="append", default=[], help="a config whose [[strategy]] tables go before parallel's")
    ap.add_argument("--metric", default=None, help="quality key on the plot's left panel (default: gen_ppl if reported, else perplexity)")
    ap.add_argument("--out", required=True, help="PNG path; the bench JSON goes beside it")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="no bench: plot these parts' JSONs as one sweep")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    return run(ap.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if args.merge:
        result = merge(args.merge)
    elif args.baseline is None:
        raise DiffaccelError("a baseline config, or --merge with a sweep's JSONs")
    else:
        result = _run_benches(args, out)
    metric = args.metric or ("gen_ppl" if "gen_ppl" in result["entries"][0]["quality"] else "perplexity")
    out.with_suffix(".json").write_text(json.dumps(result, indent=2, default=float))
    plot(result, out, metric)
    print("steps run (mean over the runs): " + ", ".join(f"{e['name']} {steps_run(e):.1f}" for e in result["entries"]))
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0


def bench_lines(benches: list[tuple[str, list[str], list[str]]], args: argparse.Namespace, out: Path) -> list[list[str]]:
    """Each bench's command line after ``diffaccel bench``."""
    lines = []
    for stem, paths, grid in benches:
        line = [*paths, *[w for g in grid for w in ("--grid", g)], "--seeds", str(args.seeds), "--no-noise-floor",
                "--json", str(out.with_name(f"{out.stem}-{stem}.json"))]
        line += ["--batch", str(args.batch)] if args.batch is not None else []
        line += ["--judge", args.judge] if args.judge != "default" else []
        lines.append(line)
    return lines


def _run_benches(args: argparse.Namespace, out: Path) -> dict:
    """The sweep's benches, run after one line naming them; their JSONs merged."""
    with tempfile.TemporaryDirectory(prefix="parallel-sweep-") as tmp:
        benches = write_configs(Path(tmp), args)
        if not benches:
            raise DiffaccelError("parallel-sweep: no rule values (--factor, --tau, --gamma are all empty)")
        lines = bench_lines(benches, args, out)
        shown = "; ".join("diffaccel bench " + " ".join(shlex.quote(w.replace(tmp + "/", "")) for w in line) for line in lines)
        print(f"diffaccel parallel-sweep is deprecated (removed in 0.3); it runs: {shown} "
              "(the configs: the baseline's [model], its steps peers in the first, and one parallel table per rule)",
              file=sys.stderr)
        out.parent.mkdir(parents=True, exist_ok=True)
        parts = []
        for (stem, paths, grid), line in zip(benches, lines):
            json_path = line[line.index("--json") + 1]
            result = run_bench(paths, BenchOptions(seeds=args.seeds, batch=args.batch, noise_floor=False, judge=args.judge,
                                                   grid=grid, json_path=json_path, progress=sys.stderr.isatty()))
            print(format_table(result))
            parts.append(json_path)
    return merge(parts)
