"""``make benchmarks``: docs/benchmarks.md (and docs/benchmarks/index.html) from the headline benches.

Runs each bench below as the command line it records (``diffaccel bench ... --report
docs/benchmarks/<name>``), then combines the report folders into one page: every figure on it is
read from the benches' JSON, none is typed. Short on purpose (few seeds) so that the page can be
regenerated in minutes; the plugins' READMEs carry the longer benches. Run it under the bench
lock with one thread, as the Makefile does:

    flock /tmp/diffaccel-bench.lock env OMP_NUM_THREADS=1 .venv/bin/python docs/benchmarks.py [--only NAME ...] [--note TEXT]

``--only`` reruns some benches and recombines the page with the others' existing folders;
``--combine-only`` runs none and recombines.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = Path("docs/benchmarks")  # relative to ROOT: the recorded commands are run from there

TEXT = ["configs/text-default.toml", "configs/text-swd.toml", "configs/text-swd-time-anchor.toml", "configs/text-time-anchor.toml"]
CONTINUOUS = ["configs/text-continuous.toml", "configs/text-continuous-swd.toml"]
DIT = ["configs/dit-digits.toml", "configs/dit-digits-time-anchor.toml", "configs/dit-digits-dct.toml"]
PARALLEL = ["configs/text-default.toml", "configs/text-parallel.toml", "configs/text-parallel-swd-time-anchor.toml"]
BENCHES: dict[str, list[str]] = {
    # name: the arguments after 'diffaccel bench' (the report folder is added)
    # batch 1: 8 seeds (a run of the shipped model moves by about 10% from one to the next on this
    # machine, so two seeds put even the steps-N peers 10% to 60% off their step ratio)
    "text-masked-b1": [*TEXT, "--seeds", "8"],
    "text-masked-b8": [*TEXT, "--seeds", "1", "--batch", "8"],
    "digits-dct": ["configs/digits-dct.toml", "--seeds", "1"],  # 10 images per seed; DeepCache peers in the config
    "digits-time-anchor": ["configs/digits.toml", "configs/digits-time-anchor.toml", "--seeds", "1"],  # on DDIM-35: DDIM-50 first
    "sd-medium-dct-fast": ["configs/sd-medium.toml", "configs/sd-medium-dct-fast.toml", "--seeds", "1"],  # + DeepCache i3
    "text-continuous-b1": [*CONTINUOUS, "--seeds", "2", "--judge", "none"],
    "text-continuous-b8": [*CONTINUOUS, "--seeds", "1", "--batch", "8", "--judge", "none"],
    "text-parallel-b1": [*PARALLEL, "--seeds", "8"],  # + the steps-N peers of the config
    "text-parallel-b8": [*PARALLEL, "--seeds", "1", "--batch", "8"],
    "text-bert-cond-b8": ["configs/text-bert-cond.toml", "--seeds", "1", "--batch", "8", "--judge", "none"],
    "dit-digits-b1": [*DIT, "--seeds", "10", "--repeats", "3", "--batch", "1"],  # runs of half a second: 3 repeats; + the configs' peers (diffusers' cache hooks)
    "dit-digits-b8": [*DIT, "--seeds", "1", "--batch", "8"],
}
# every shipped image strategy beside the fewer-steps and solver line (--solver-line: DDIM at fewer
# steps, DPM-Solver++ 2M at 3x to 7x) and the shipped cache-on-a-solver config, on held-out seeds
DIGITS_SOLVERS = ["configs/digits.toml", "configs/digits-time-anchor.toml", "configs/digits-dct.toml",
                  "configs/digits-fast.toml", "configs/digits-fast-dct.toml", "--solver-line", "--seed", "1000"]
DIT_SOLVERS = [*DIT, "configs/dit-digits-fast.toml", "--solver-line", "--seed", "1000"]
SOLVERS = {
    "digits-solvers-b1": [*DIGITS_SOLVERS, "--seeds", "10", "--batch", "1"],
    "digits-solvers-b10": [*DIGITS_SOLVERS, "--seeds", "3"],
    "dit-digits-solvers-b1": [*DIT_SOLVERS, "--seeds", "10", "--batch", "1"],
    "dit-digits-solvers-b10": [*DIT_SOLVERS, "--seeds", "10"],  # 100 images: the DiT's accuracy (0.2) moves by one image in 30
}
BENCHES.update(SOLVERS)

# ``--tune NAME``: the tunes whose configs the "at budget" benches and the README's column read.
# Each is ``diffaccel tune`` as recorded (its report folder is added); long (minutes to most of an
# hour on this 2-core machine), so not part of a plain run. Their held-out seeds start at 100000.
TUNES: dict[str, list[str]] = {
    "tune-digits": ["configs/digits-tune.toml", "--budget", "psnr>=30", "--budget", "acc>=-0.02", "--model-space", "steps=50,40,35,30",
                    "--out", "configs/digits-tuned.toml", "--trials", "24", "--tune-seeds", "2", "--heldout", "40"],
    "tune-dit-digits": ["configs/dit-digits-tune.toml", "--budget", "psnr>=30", "--budget", "acc>=-0.02",
                        "--out", "configs/dit-digits-tuned.toml", "--trials", "24", "--tune-seeds", "4", "--heldout", "64"],
    # the sudoku task model (docs/task-benchmarks.md benches it beside the steps-N line)
    "tune-sudoku": ["configs/sudoku-tune.toml", "--budget", "acc>=-0.01", "--model-space", "steps=41,31,27,20,14,10",
                    "--out", "configs/sudoku-fast.toml", "--trials", "27", "--heldout", "256"],
    # the arith task model: 16 searched trials, then 2 points enqueued by hand (parallel alone at
    # threshold 0.999, 43 and 29 steps; docs/task-models.md), validated with --candidates 3
    "tune-arith": ["configs/arith-tune.toml", "--budget", "acc>=-0.01", "--model-space", "steps=86,64,43,29,22",
                   "--out", "configs/arith-fast.toml", "--trials", "18", "--candidates", "3", "--heldout", "256"],
    "tune-text": ["configs/text-tune.toml", "--budget", "gen_ppl<=+5%", "--budget", "distinct2>=-5%",
                  "--out", "configs/text-tuned.toml", "--trials", "12", "--tune-seeds", "4", "--heldout", "128", "--candidates", "2"],
}
TUNED = {name: args[args.index("--out") + 1] for name, args in TUNES.items()}
# the shipped configs beside a tune's result, on the tune's held-out seeds: which meet its budget?
AT_BUDGET: dict[str, tuple[str, list[str]]] = {
    "digits-at-budget": ("tune-digits", ["configs/digits-dct.toml", "configs/digits-dct-fast.toml", "configs/digits-dct-input.toml",
                                         "configs/digits-time-anchor.toml", TUNED["tune-digits"], "--seed", "100000", "--seeds", "4"]),
    "dit-digits-at-budget": ("tune-dit-digits", ["configs/dit-digits-dct.toml", "configs/dit-digits-time-anchor.toml",
                                                 TUNED["tune-dit-digits"], "--seed", "100000", "--seeds", "7"]),
}
BENCHES.update({name: args for name, (_, args) in AT_BUDGET.items()})

INTRO = ("Generated by `make benchmarks` (docs/benchmarks.py): each section below is the report of the "
         "`diffaccel bench` command shown in it (`--report DIR`), and every figure is read from that bench's "
         "JSON; nothing here is typed by hand. Speedups are wall-clock ratios against the baseline measured "
         "in the same interleaved run on the same seeds; the quality columns compare each entry's outputs with "
         "the baseline's for the same seeds. These benches are short (one to eight seeds per entry) so that the "
         "page regenerates in minutes: read the ratios with the machine facts of each section (load average, "
         "threads, note) and see the plugins' READMEs for longer benches. The measurement record kept by hand "
         "before this page was generated (partial computation, the hook overhead, figures per commit) is in "
         "[benchmarks-history.md](benchmarks-history.md).")


# The README's strategies table: one row per strategy, one cell per model family, each cell the
# row's shipped setting on that family read from the benches above (batch 1 and batch N: 8 for text,
# 10 for images), its quality against the baseline and where it sits against the fewer-steps line.
# Rewritten between the markers by every run of this script (--combine-only: from the recorded
# benches alone); tests/test_readme.py fails when the README's copy differs.
README = ROOT / "README.md"
BEGIN = "<!-- strategies table: generated by docs/benchmarks.py from docs/benchmarks/*/bench.json, do not edit -->"
END = "<!-- end of the generated strategies table -->"
CELL_MAX = 120
"""At most this many characters of a cell's visible text (link targets not counted): read at a glance."""
SUDOKU, WORDNET, UNET, DIT = FAMILIES = ("sudoku task model (text)", "WordNet (text)", "digits (UNet)", "digits (DiT)")
"""The table's model columns. Other models (WordNet continuous, a synthetic SD) are in docs/benchmarks.md."""
LEGEND = ("Each model's cell: the shipped setting's speedup at batch 1 / batch N (linked to its record), its quality "
          "against the unaccelerated run at batch N, and whether that is above or below the fewer-steps line (the same "
          "model run at fewer steps, read at the same speedup). Other settings and models: the records.")
TASK_PAGE = "docs/task-benchmarks.md"
"""Where the task models' benches (not in ``BENCHES``: docs/task_benchmarks.py runs them) are recorded."""


@dataclass(frozen=True)
class Figure:
    entry: str  # the bench entry's name
    bench: str  # the bench at batch 1 (or the only one)
    benchn: str | None = None  # the same entry at batch N (8 for text, 10 for images), where the batch matters
    setting: str = ""  # which shipped setting, where the strategy ships several on that model


HEADLINE: list[tuple[str, str, dict[str, Figure]]] = [
    ("[`swd`](plugins/swd)", "stable window decoding: computes only the positions whose top-1 still moves (text)",
     {SUDOKU: Figure("sudoku-swd", "sudoku-b1", "sudoku-b8"), WORDNET: Figure("text-swd", "text-masked-b1", "text-masked-b8")}),
    ("[`time-anchor`](plugins/time_anchor)", "reuses (layer, position) states that stopped changing (text and images)",
     {SUDOKU: Figure("sudoku-time-anchor", "sudoku-b1", "sudoku-b8"),
      WORDNET: Figure("text-time-anchor", "text-masked-b1", "text-masked-b8"),
      UNET: Figure("digits-time-anchor", "digits-solvers-b1", "digits-solvers-b10"),
      DIT: Figure("dit-digits-time-anchor", "dit-digits-solvers-b1", "dit-digits-solvers-b10")}),
    ("`time-anchor` prompt cache", "the prompt's states served for N steps, the response computed every step (`prompt_interval`)",
     {SUDOKU: Figure("sudoku-prompt-cache", "sudoku-b1", "sudoku-b8", "interval 8")}),
    ("`swd` + `time-anchor`", "both in one config (`configs/text-swd-time-anchor.toml`)",
     {SUDOKU: Figure("sudoku-swd-time-anchor", "sudoku-b1", "sudoku-b8"),
      WORDNET: Figure("text-swd-time-anchor", "text-masked-b1", "text-masked-b8")}),
    ("[`parallel`](plugins/parallel)", "commits every masked position a rule finds confident: fewer steps, not cheaper ones (text)",
     {SUDOKU: Figure("sudoku-parallel", "sudoku-b1", "sudoku-b8", "threshold 0.9"),
      WORDNET: Figure("text-parallel", "text-parallel-b1", "text-parallel-b8")}),
    ("[`dct-anchor`](plugins/dct_anchor)", "reuses deep UNet or DiT blocks while the low DCT band of the estimate is settled (images)",
     {UNET: Figure("digits-dct", "digits-solvers-b1", "digits-solvers-b10"),
      DIT: Figure("dit-digits-dct", "dit-digits-solvers-b1", "dit-digits-solvers-b10")}),
    ("cache on a solver", "a cache strategy on DPM-Solver++ at 10 steps (`configs/digits-fast.toml`, `configs/dit-digits-fast.toml`)",
     {UNET: Figure("digits-fast", "digits-solvers-b1", "digits-solvers-b10"),
      DIT: Figure("dit-digits-fast", "dit-digits-solvers-b1", "dit-digits-solvers-b10")}),
    ("[`topk`](plugins/topk)", "top-k sampling and top-k logit truncation (text): a sampling rule, not a speedup",
     {SUDOKU: Figure("sudoku-topk", "sudoku-b1", "sudoku-b8", "k 5 at temperature 0.5")}),
    ("[`bert-cond`](plugins/bert_cond)", "a pretrained BERT picks key terms of a source; the masked sampler writes around them (text)",
     {WORDNET: Figure("text-bert-cond", "text-bert-cond-b8")}),
]


def _tuned_strategies(path: str) -> frozenset[str]:
    import tomllib

    return frozenset(t["use"] for t in tomllib.loads((ROOT / path).read_text()).get("strategy", []))


def _tuned_cell(out: Path, sets: list[frozenset[str]]) -> str:
    """The "tuned to a budget" cell of a row: each tune whose chosen config uses one of the row's
    strategy sets, with its held-out speedups (tunes with the same budget and batches together),
    linked to the config it wrote; a tune that found nothing within its budget for strategies it
    searched: "none", linked to its report."""
    found: dict[tuple[str, str], list[str]] = {}  # (batches, budget) -> the tunes' figures
    none = []
    for name, cfg in TUNED.items():
        path, model = out / name / "tune.json", name.removeprefix("tune-")
        if not path.is_file() or not sets:
            continue
        data = json.loads(path.read_text())
        if not data.get("chosen"):
            if sets[0] <= _tuned_strategies(TUNES[name][0]):
                none.append(f"[{model}](docs/benchmarks.md#{name}-tuned-to-a-budget): none within its budget")
            continue
        if not (ROOT / cfg).is_file() or (used := _tuned_strategies(cfg)) not in sets:
            continue
        items = sorted(data["figures"][data["chosen"]]["speedup"].items(), key=lambda kv: int(kv[0]))
        more = f" (with {', '.join(sorted(used - sets[0]))})" if used - sets[0] else ""
        key = (" / ".join(b for b, _ in items), ", ".join(data["budgets"]))
        found.setdefault(key, []).append(f"[{model}]({cfg}){more} {' / '.join(f'{v:.2f}x' for _, v in items)}")
    cells = [f"{', '.join(figs)} (batch {batches}) within {budget}" for (batches, budget), figs in found.items()]
    return "; ".join(cells + none) or "-"


def _at_budget_blocks(out: Path, name: str, tune: str) -> list[tuple]:
    """Each entry of an at-budget bench checked against its tune's budget (the same held-out seeds)."""
    from diffaccel.tuning.budget import parse

    bench, tj = out / name / "bench.json", out / tune / "tune.json"
    if not (bench.is_file() and tj.is_file()):
        return []
    budgets = [parse(b) for b in json.loads(tj.read_text())["budgets"]]
    result = json.loads(bench.read_text())
    base = next(e for e in result["entries"] if e["name"] == "baseline")["quality"]
    rows = []
    for e in result["entries"]:
        if e["name"] == "baseline":
            continue
        met = [b.check(e["quality"], base)[0] for b in budgets]
        rows.append([e["name"], "-" if e["speedup"] is None else f"{e['speedup']:.2f}x",
                     *[f"{e['quality'].get(b.metric, float('nan')):.4g}" for b in budgets], "yes" if all(met) else "no"])
    rows.sort(key=lambda r: (r[-1] != "yes", -float(r[1].rstrip("x")) if r[1] != "-" else 0.0))
    return [("h3", f"{name}: every entry against the budget {' and '.join(b.text for b in budgets)}"),
            ("p", f"From the bench `{name}` above (held-out seeds, batch {result['model']['batch']}); fastest within budget first."),
            ("table", ["entry", "speedup", *[b.metric for b in budgets], "within budget"], rows)]


# the strategy sets whose tunes each HEADLINE row shows (a tune's chosen config lands in the row
# listing its exact set of strategies)
F = frozenset
ROW_STRATEGIES = [[F({"swd"})], [F({"time-anchor"}), F({"time-anchor", "dct-anchor"})], [], [F({"swd", "time-anchor"})],
                  [F({"parallel"}), F({"parallel", "swd"}), F({"parallel", "time-anchor"}), F({"parallel", "swd", "time-anchor"})],
                  [F({"dct-anchor"})], [], [], []]


def _result(out: Path, bench: str | None) -> dict | None:
    path = out / bench / "bench.json" if bench else None
    return json.loads(path.read_text()) if path is not None and path.is_file() else None


def _entry(result: dict | None, entry: str) -> tuple[dict, dict] | None:
    by_name = {e["name"]: e for e in (result or {}).get("entries", [])}
    return (by_name[entry], by_name["baseline"]) if entry in by_name and "baseline" in by_name else None


def _quality(entry: dict, base: dict) -> str:
    """One short quality figure against the baseline of the same bench."""
    q, b = entry["quality"], base["quality"]
    if "key_term_recall" in q:
        ppl = f", perplexity {100 * (q['perplexity'] / b['perplexity'] - 1):+.0f}%" if "perplexity" in q else ""
        return f"key-term recall {q['key_term_recall']:.2f} vs {b.get('key_term_recall', 0.0):.2f}{ppl}"
    for key, name in (("gen_ppl", "gen_ppl"), ("perplexity", "perplexity")):
        if key in q and key in b:
            return f"{name} {100 * (q[key] / b[key] - 1):+.0f}%"
    if "acc" in q and "acc" in b and "cond_acc" not in q:  # a task model's exact accuracy (docs/task-benchmarks.md)
        return f"acc {q['acc']:.3f} vs {b['acc']:.3f}"
    if "psnr" in q:
        acc = f", acc {q['cond_acc']:.2f} vs {b['cond_acc']:.2f}" if "cond_acc" in q and "cond_acc" in b else ""
        return f"PSNR {q['psnr']:.1f} dB{acc}"
    return ""


def _line_at(points: list[tuple[float, float]], x: float) -> float | None:
    """A line's value at speedup ``x`` (linear between its points; None beyond its ends)."""
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else max(y0, y1)
    return None


# the quality the fewer-steps line is read in, per kind of bench: (key, higher is better)
LINE_KEYS = (("acc", True), ("gen_ppl", False), ("psnr", True), ("cond_acc", True))


def steps_verdict(result: dict | None, name: str) -> str:
    """Where an entry sits against the fewer-steps line of its bench (the ``steps`` peers: the same
    model at fewer steps; with ``--solver-line`` also DPM-Solver++, the best line counting) at its
    own speedup: "above" or "below" (below on any quality the line is read in, as rounded in the
    record: PSNR to 0.1 dB, the rest to 0.01), "faster (slower) than any steps setting" beyond the
    line's ends, "slower than the baseline" under 1x, "the baseline's speed" when the speedup's
    interval holds 1x (a cost gate that kept full steps reads so); "" with no line."""
    from diffaccel.bench.report import steps_lines

    e = next((e for e in (result or {}).get("entries", []) if e["name"] == name), None)
    if e is None or e.get("speedup") is None:
        return ""
    ci = e.get("speedup_ci")
    if ci and ci[0] <= 1.0 <= ci[1]:
        return "the baseline's speed"
    x, below, read, ends = e["speedup"], [], False, []
    for key, higher in LINE_KEYS:
        lines = list(steps_lines(result, key).values())
        if not lines or key not in e["quality"]:
            continue
        ends += [p[0] for pts in lines for p in pts]
        ys = [y for pts in lines if (y := _line_at(pts, x)) is not None]
        if ys:
            read = True
            margin = (e["quality"][key] - (max(ys) if higher else min(ys))) * (1 if higher else -1)
            if round(margin, 1 if key == "psnr" else 2) < 0:
                below.append(key)
    if x < 1:
        return "slower than the baseline"
    if not ends:
        return ""
    if not read:
        return f"{'faster' if x > max(ends) else 'slower'} than any steps setting"
    return "**below the steps line**" if below else "above the steps line"


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading (lower case, punctuation dropped, spaces as hyphens)."""
    return "".join(c for c in heading.lower() if c.isalnum() or c in " -_").replace(" ", "-")


def _anchors(out: Path) -> dict[str, str]:
    """Bench name -> its section's anchor on docs/benchmarks.md: the sections are the benches in
    ``BENCHES`` order, headed as ``diffaccel.bench.page`` heads them; a repeated heading's anchor
    takes GitHub's suffix (-1, -2, ...)."""
    seen: dict[str, int] = {"summary": 1}
    anchors = {}
    for name in BENCHES:
        m = ((_result(out, name) or {}).get("model") or {})
        if not m:
            continue
        slug = _slug(f"{m.get('checkpoint')} ({m.get('adapter')}), batch {m.get('batch')}")
        anchors[name] = slug if slug not in seen else f"{slug}-{seen[slug]}"
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _batch(result: dict | None) -> str:
    return str(((result or {}).get("model") or {}).get("batch", "-"))


def figure_cell(out: Path, f: Figure, anchors: dict[str, str]) -> str:
    """One cell: the speedup at batch 1 / batch N (linked to the bench's record), the quality at
    batch N against the baseline, and the verdict against the fewer-steps line at batch N."""
    benches = [f.bench] + ([f.benchn] if f.benchn else [])
    results = [_result(out, b) for b in benches]
    pairs = [_entry(r, f.entry) for r in results]
    if not any(pairs):
        return f"not measured yet (bench `{benches[-1]}`)"
    last = len(pairs) - 1 if pairs[-1] else 0  # batch N where measured, else batch 1
    speed = " / ".join(f"{p[0]['speedup']:.2f}x" if p else "-" for p in pairs)
    shown = benches[last]
    link = (f"docs/benchmarks.md#{anchors[shown]}" if shown in anchors
            else f"{TASK_PAGE}#{shown.rsplit('-b', 1)[0]}" if shown not in BENCHES else "docs/benchmarks.md")
    v = pairs[last][0].get("vs_model")
    head = ", ".join(x for x in (f.setting, f"on {v['entry']}" if v else "") if x)
    parts = [f"[{speed}]({link}) (batch {' / '.join(_batch(r) for r in results)})",
             _quality(*pairs[last]), steps_verdict(results[last], f.entry)]
    return (f"{head}: " if head else "") + "; ".join(p for p in parts if p)


def visible(cell: str) -> str:
    """A cell as read: link targets left out."""
    import re

    return re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", cell)


def headline_table(out: Path = ROOT / OUT) -> str:
    """The README's strategies table from the benches' JSON under ``out``: per strategy and model
    family the shipped setting's figures, and beside them what ``diffaccel tune`` found within a
    stated budget."""
    anchors = _anchors(out)
    rows = [LEGEND, "", "| strategy | what it does | " + " | ".join(FAMILIES) + " | tuned to a budget (held-out seeds) |",
            "| --- | --- | " + " | ".join("---" for _ in FAMILIES) + " | --- |"]
    for (name, what, figures), strategies in zip(HEADLINE, ROW_STRATEGIES):
        cells = [figure_cell(out, figures[fam], anchors) if fam in figures else "-" for fam in FAMILIES]
        rows.append(f"| {name} | {what} | {' | '.join(cells)} | {_tuned_cell(out, strategies)} |")
    return "\n".join(rows)


def readme_with_table(text: str, table: str) -> str:
    head, sep, rest = text.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not (sep and sep2):
        raise SystemExit(f"README.md: the markers of the generated strategies table are missing ({BEGIN!r} ... {END!r})")
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", choices=sorted(BENCHES), help="rerun these benches only")
    p.add_argument("--tune", nargs="+", choices=sorted(TUNES), default=[],
                   help="run these tunes (long), then their at-budget benches; with --only, only those benches")
    p.add_argument("--combine-only", action="store_true", help="run no bench: recombine the page from the existing folders")
    p.add_argument("--note", help="a machine note recorded in every rerun section (e.g. that the machine was shared)")
    args = p.parse_args(argv)
    diffaccel = str(Path(sys.executable).with_name("diffaccel"))
    env = {**os.environ, **({"DIFFACCEL_MACHINE_NOTE": args.note} if args.note else {})}

    def run(name: str, cmd: list[str]) -> None:
        print(f"== {name}: diffaccel {' '.join(cmd)}", flush=True)
        t0 = time.perf_counter()
        subprocess.run([diffaccel, *cmd], cwd=ROOT, check=True, env=env)
        print(f"== {name}: {time.perf_counter() - t0:.0f} s", flush=True)

    for name in [] if args.combine_only else args.tune:
        # exit code 1 is "no point met the budget": its report is still worth a section
        try:
            run(name, ["tune", *TUNES[name], "--report", str(OUT / name), "--no-progress"])
        except subprocess.CalledProcessError as exc:
            if exc.returncode != 1:
                raise
    benches = [] if args.combine_only else (args.only or ([n for n, (t, _) in AT_BUDGET.items() if t in args.tune]
                                                          if args.tune else list(BENCHES)))
    for name in benches:
        if name in AT_BUDGET and not (ROOT / TUNED[AT_BUDGET[name][0]]).is_file():
            print(f"== {name}: skipped, {TUNED[AT_BUDGET[name][0]]} does not exist (run --tune {AT_BUDGET[name][0]})")
            continue
        run(name, ["bench", *BENCHES[name], "--report", str(OUT / name), "--no-progress"])
    from diffaccel.bench.report import combine
    from diffaccel.tuning.tune_report import tune_blocks

    dirs = [ROOT / OUT / n for n in BENCHES if (ROOT / OUT / n / "bench.json").is_file()]
    extra = []
    for name, tune_args in TUNES.items():
        folder = ROOT / OUT / name
        if (folder / "tune.json").is_file():
            blocks = tune_blocks(folder, f"{name}: tuned to a budget",
                                 shlex.join(["diffaccel", "tune", *tune_args, "--report", str(OUT / name)]))
            for bench, (tune, _) in AT_BUDGET.items():
                if tune == name:
                    blocks += _at_budget_blocks(ROOT / OUT, bench, tune)
            extra.append((folder, blocks))
    combine(dirs, ROOT / "docs" / "benchmarks.md", ROOT / OUT / "index.html", title="Benchmarks", intro=INTRO, extra=extra)
    README.write_text(readme_with_table(README.read_text(), headline_table()))
    print(f"wrote docs/benchmarks.md, {OUT / 'index.html'} and the README's strategies table from {len(dirs)} benches "
          f"and {len(extra)} tunes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
