"""``make benchmarks-tasks``: docs/task-benchmarks.md from the task models' benches (issue 46).

The task models (docs/task-models.md) are judged by exact accuracy, so their benches are long
(256 held-out problems per entry) and kept apart from ``make benchmarks``. For each task this
runs, as the command lines it records (``diffaccel bench ... --report docs/benchmarks/NAME``):

* ``TASK-b1`` and ``TASK-b8``: the baseline, every strategy config of the task, its tuned
  ``-fast`` config where it exists and the steps-N line (the config's ``[[peer]]`` tables), timed
  and interleaved, on 256 held-out problems at batch 1 (256 seeds) and at batch 8 (32 seeds);
* ``TASK-threshold``: ``parallel``'s threshold rule over ``THRESHOLDS`` (``bench --grid``,
  quality only) beside the steps-N line, for the plots of accuracy against the threshold and
  against the mean number of commits per step;
* a few sample solutions (``diffaccel generate``) of the baseline and the fastest config.

Then it writes the plots (docs/benchmarks/task-*.png) and the page, every figure read from the
benches' JSON; nothing is typed. Run under the bench lock with one thread, as the Makefile does:

    flock /tmp/diffaccel-bench.lock env OMP_NUM_THREADS=1 .venv/bin/python docs/task_benchmarks.py [--task arith] [--only NAME ...]

``--task`` reruns one task's benches (arith, when its new weights land) and recombines the page
with the other's existing folders; ``--combine-only`` runs none and recombines. A bench's
``bench.json`` keeps, per entry, the mean steps run and commits per step of its runs
(``run_summary``) instead of every run's report (megabytes at 256 problems).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = Path("docs/benchmarks")  # relative to ROOT: the recorded commands run from there
PAGE = ROOT / "docs" / "task-benchmarks.md"
THRESHOLDS = (0.5, 0.7, 0.8, 0.9, 0.95, 0.97, 0.98, 0.99, 0.995, 0.998, 0.999)
SAMPLE_SEEDS = (0, 1, 2)
BUDGET = 0.01  # "within one point": acc >= baseline - 0.01


@dataclass(frozen=True)
class Task:
    name: str
    second: str  # the task's second metric
    strategies: tuple[str, ...]  # entry configs, beside configs/TASK.toml
    what: str
    extra: tuple[str, ...] = field(default=())

    @property
    def base(self) -> str:
        return f"configs/{self.name}.toml"

    @property
    def steps(self) -> str:
        return f"configs/{self.name}-steps.toml"

    @property
    def fast(self) -> str:
        return f"configs/{self.name}-fast.toml"

    def configs(self) -> list[str]:
        # the tuned stack and, beside it, the tuned parallel alone (issue 56), where they exist
        fast = [c for c in (self.fast, f"configs/{self.name}-parallel-fast.toml") if (ROOT / c).is_file()]
        return [self.base, *self.strategies, *fast, self.steps]


def _strategy_configs(task: str) -> tuple[str, ...]:
    # each cache alone and with parallel (issue 56), parallel's rules, top-k
    return tuple(f"configs/{task}-{s}.toml" for s in ("swd", "time-anchor", "prompt-cache", "swd-time-anchor", "parallel",
                                                      "parallel-swd", "parallel-prompt-cache", "parallel-swd-time-anchor",
                                                      "parallel-factor", "parallel-entropy", "topk"))


TASKS = {
    "sudoku": Task("sudoku", "cells_acc", _strategy_configs("sudoku"), "6x6 sudoku, 12 to 20 blanks: solved rate (a valid grid keeping "
                   "the givens) and cells_acc (blank cells equal to the reference)"),
    "sudoku9": Task("sudoku9", "cells_acc", _strategy_configs("sudoku9"), "9x9 sudoku (the 9x9 model; the 6x6 one above carries "
                    "the tuned config): solved rate and cells_acc, as for 6x6"),
    "arith": Task("arith", "steps_acc", _strategy_configs("arith"), "miniature GSM8K, 2 to 4 operations: final answer exact, and "
                  "steps_acc (equations written as the reference writes them)"),
    "ledger": Task("ledger", "facts_acc", tuple(f"configs/ledger-{s}.toml" for s in (
        "swd", "time-anchor", "prompt-cache", "parallel", "parallel-swd", "parallel-prompt-cache")),
        "long context (issue 55): 20 facts, then a question on one or two of them with three operations: final answer "
        "exact, and facts_acc (the facts the solution restates, copied right: the look-up alone)"),
}


def benches(task: Task) -> dict[str, list[str]]:
    """Bench name -> the arguments after ``diffaccel bench`` (the report folder is added)."""
    grid = ",".join(str(t) for t in THRESHOLDS)
    return {
        f"{task.name}-b1": [*task.configs(), "--seeds", "256", "--batch", "1", "--no-noise-floor"],
        f"{task.name}-b8": [*task.configs(), "--seeds", "32", "--batch", "8", "--no-noise-floor"],
        f"{task.name}-threshold": [task.base, f"configs/{task.name}-parallel.toml", task.steps, "--grid", f"tau={grid}",
                                   "--quality-only", "--seeds", "32", "--batch", "8", "--no-noise-floor"],
    }


# ---- running ---------------------------------------------------------------------------------

def output_args(name: str, args: list[str]) -> list[str]:
    """Where a bench writes: ``--report DIR`` (bench.json, report.json, index.md and .html), or
    ``--json DIR/bench.json`` for a quality-only bench (a report plots speedup)."""
    folder = OUT / name
    return ["--json", str(folder / "bench.json")] if "--quality-only" in args else ["--report", str(folder)]


def command(name: str, args: list[str]) -> str:
    return shlex.join(["diffaccel", "bench", *args, *output_args(name, args)])


def summarise_runs(path: Path, cmd: str | None = None) -> None:
    """Record ``cmd`` as the bench's ``command`` and replace each entry's run reports in ``path`` (bench.json) by their means: steps run and
    commits per step per row (the masked positions over the steps run: every position is
    committed once, and the baseline's full steps commit one per step)."""
    result = json.loads(path.read_text())
    if cmd is not None:
        result["command"] = cmd
    if result.get("run_reports"):
        path.write_text(json.dumps(result, indent=1, default=float))
        return
    base = next(e for e in result["entries"] if e["name"] == "baseline")
    positions = sum(r["steps_run"] for r in base["reports"]) / len(base["reports"])  # full steps: one commit each
    for e in result["entries"]:
        reports = e.pop("reports", None) or []
        steps = sum(r["steps_run"] for r in reports) / max(len(reports), 1)
        e["run_summary"] = {"runs": len(reports), "steps_run": steps, "commits_per_step": positions / steps if steps else None}
    result["run_reports"] = "summarised by docs/task_benchmarks.py (run_summary: means over the runs)"
    path.write_text(json.dumps(result, indent=1, default=float))


def run_bench(name: str, args: list[str], diffaccel: str, env: dict[str, str], before_summary=None) -> None:
    """Run one bench into docs/benchmarks/NAME, then summarise its run reports (``before_summary(path)``
    first reads what it needs from them)."""
    print(f"== {name}: {command(name, args)}", flush=True)
    t0 = time.perf_counter()
    (ROOT / OUT / name).mkdir(parents=True, exist_ok=True)
    subprocess.run([diffaccel, "bench", *args, *output_args(name, args), "--no-progress"], cwd=ROOT, check=True, env=env)
    if before_summary is not None:
        before_summary(ROOT / OUT / name / "bench.json")
    summarise_runs(ROOT / OUT / name / "bench.json", command(name, args))
    print(f"== {name}: {time.perf_counter() - t0:.0f} s", flush=True)


def samples(task: Task, configs: list[str], diffaccel: str, env: dict[str, str]) -> dict[str, dict[str, str]]:
    """Config -> seed -> its solution text (``diffaccel generate --seed S``: held-out problem S)."""
    out: dict[str, dict[str, str]] = {}
    for cfg in configs:
        for seed in SAMPLE_SEEDS:
            text = subprocess.run([diffaccel, "generate", cfg, "--seed", str(seed), "--no-progress"], cwd=ROOT, check=True,
                                  env=env, capture_output=True, text=True).stdout
            body = text.split("--- sample 0 ---", 1)[-1].split("--- sample 1 ---", 1)[0].strip("\n")
            out.setdefault(cfg, {})[str(seed)] = body
    return out


# ---- reading ---------------------------------------------------------------------------------

def load(name: str, out: Path = ROOT / OUT) -> dict | None:
    path = out / name / "bench.json"
    return json.loads(path.read_text()) if path.is_file() else None


def entries(result: dict | None) -> dict[str, dict]:
    return {e["name"]: e for e in (result or {}).get("entries", [])}


def threshold_points(result: dict | None, metric: str = "acc") -> list[tuple[float, float, float | None]]:
    """(threshold, metric, commits per step) of each grid entry of a ``TASK-threshold`` bench."""
    pts = []
    for name, e in entries(result).items():
        if "[tau=" in name:
            tau = float(name.split("[tau=", 1)[1].rstrip("]"))
            pts.append((tau, e["quality"][metric], (e.get("run_summary") or {}).get("commits_per_step")))
    return sorted(pts)


def steps_points(result: dict | None, metric: str = "acc") -> list[tuple[float, float]]:
    """(commits per step, metric) of the baseline and the steps-N peers."""
    pts = [((e.get("run_summary") or {}).get("commits_per_step"), e["quality"][metric])
           for name, e in entries(result).items() if name == "baseline" or name.startswith("steps-")]
    return sorted(p for p in pts if p[0] is not None)


# ---- plots -----------------------------------------------------------------------------------

def plots(out: Path = ROOT / OUT) -> list[str]:
    """The page's plots (png under docs/benchmarks/), from the benches' JSON; their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for task in TASKS.values():
        res = load(f"{task.name}-threshold", out)
        pts = threshold_points(res)
        if not pts:
            continue
        base = entries(res)["baseline"]["quality"]["acc"]
        line = ax.plot([1 - t for t, _, _ in pts], [a for _, a, _ in pts], "o-", label=f"{task.name}: parallel (threshold, prob)")
        ax.axhline(base, color=line[0].get_color(), ls=":", lw=1, label=f"{task.name}: baseline {base:.3f}")
    if ax.lines:
        ax.set_xscale("log")
        ax.invert_xaxis()
        ticks = [1 - t for t in THRESHOLDS if t >= 0.5]
        ax.set_xticks(ticks, [f"{t:g}" for t in THRESHOLDS if t >= 0.5], rotation=60, fontsize=7)
        ax.axvline(0.1, color="grey", ls="--", lw=1)
        ax.text(0.1, ax.get_ylim()[0], " Fast-dLLM's 0.9", fontsize=7, color="grey", va="bottom")
        ax.set_xlabel("parallel's threshold tau (log scale of 1 - tau)")
        ax.set_ylabel("acc (held-out)")
        ax.set_title("accuracy against parallel's threshold")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "task-threshold.png", dpi=110)
        made.append("task-threshold.png")
    plt.close(fig)

    res = load("sudoku-threshold", out)
    if res is not None:
        fig, ax = plt.subplots(figsize=(6, 4))
        pts = [(c, a, t) for t, a, c in threshold_points(res) if c is not None]
        ax.plot([c for c, _, _ in pts], [a for _, a, _ in pts], "o-", label="parallel (threshold)")
        for c, a, t in pts:
            ax.annotate(f"{t:g}", (c, a), fontsize=6, xytext=(3, 3), textcoords="offset points")
        line = steps_points(res)
        ax.plot([c for c, _ in line], [a for _, a in line], "s--", color="grey", label="steps-N line (baseline: 1 per step)")
        ax.set_xscale("log")
        ax.set_xlabel("mean commits per step (positions committed / steps run)")
        ax.set_ylabel("acc (solved, held-out)")
        ax.set_title("sudoku: accuracy against commits per step")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "task-sudoku-commits.png", dpi=110)
        made.append("task-sudoku-commits.png")
        plt.close(fig)

    for task in TASKS.values():
        r1, r8 = load(f"{task.name}-b1", out), load(f"{task.name}-b8", out)
        if r1 is None and r8 is None:
            continue
        fig, axes = plt.subplots(1, 2, figsize=(9, 4), sharey=True)
        for ax, res, b in ((axes[0], r1, 1), (axes[1], r8, 8)):
            for name, e in entries(res).items():
                if e.get("speedup") is None:
                    continue
                peer = name == "baseline" or name.startswith("steps-")
                ax.plot(e["speedup"], e["quality"]["acc"], "s" if peer else "o", color="grey" if peer else None)
                ax.annotate(name.removeprefix(f"{task.name}-"), (e["speedup"], e["quality"]["acc"]), fontsize=6,
                            xytext=(3, 3), textcoords="offset points")
            if res is not None:
                base = entries(res)["baseline"]["quality"]["acc"]
                ax.axhspan(base - BUDGET, base, color="green", alpha=0.1)
            ax.set_xscale("log")
            ax.set_xlabel(f"speedup at batch {b}")
        axes[0].set_ylabel("acc (held-out)")
        fig.suptitle(f"{task.name}: accuracy against speedup (green: within one point of the baseline)")
        fig.tight_layout()
        fig.savefig(out / f"task-{task.name}-speedup.png", dpi=110)
        made.append(f"task-{task.name}-speedup.png")
        plt.close(fig)
    return made


# ---- the page --------------------------------------------------------------------------------

def _ci(ci) -> str:
    return f" [{ci[0]:.3f}-{ci[1]:.3f}]" if ci else ""


def _speed(e: dict | None) -> str:
    if e is None or e.get("speedup") is None:
        return "-"
    ci = e.get("speedup_ci")
    return f"{e['speedup']:.2f}x" + (f" [{ci[0]:.2f}-{ci[1]:.2f}]" if ci else "")


def _computed(e: dict | None) -> str:
    return "-" if e is None or e.get("fraction_computed") is None else f"{e['fraction_computed']:.0%}"


def fastest_within(result: dict | None, budget: float = BUDGET) -> tuple[str, dict] | None:
    """The fastest entry (strategies or peer) whose acc is within ``budget`` of the baseline's."""
    es = entries(result)
    if "baseline" not in es:
        return None
    base = es["baseline"]["quality"]["acc"]
    ok = [(n, e) for n, e in es.items() if n != "baseline" and e.get("speedup") and e["quality"]["acc"] >= base - budget - 1e-12]
    return max(ok, key=lambda ne: ne[1]["speedup"]) if ok else None


def _machine(name: str, out: Path) -> str:
    path = out / name / "report.json"
    if not path.is_file():
        return ""
    m = json.loads(path.read_text()).get("machine", {})
    load_avg = m.get("load_average_1_5_15min")
    return (f"{m.get('date_utc', '?')}, {m.get('cpu', '?')} x{m.get('cpu_count', '?')}, torch threads {m.get('torch_threads', '?')}, "
            f"load average {load_avg[0]:.1f} at the start, commit {m.get('git_commit', '?')}" if load_avg else "") + \
        (f"; note: {m['note']}" if m.get("note") else "")


def tune_commands() -> dict[str, list[str]]:
    """``docs/benchmarks.py``'s ``TUNES`` (where ``make benchmarks --tune`` runs the tunes)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_benchmarks", ROOT / "docs" / "benchmarks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.TUNES


def tune_lines(task: Task, out: Path) -> list[str]:
    """Where ``TASK-fast`` comes from: its tune (docs/benchmarks/tune-TASK/tune.json)."""
    path = out / f"tune-{task.name}" / "tune.json"
    if not path.is_file():
        return []
    t = json.loads(path.read_text())
    reproduce = "`" + shlex.join(["diffaccel", "tune", *tune_commands().get(f"tune-{task.name}", ["?"])]) + "`"
    chosen = t.get("chosen")
    fig = (t.get("figures") or {}).get(chosen) if chosen else None
    speed = ", ".join(f"{float(v):.2f}x" + (f" [{ci[0]:.2f}-{ci[1]:.2f}]" if (ci := (fig.get("speedup_ci") or {}).get(b)) else "")
                      + f" at batch {b}" for b, v in fig["speedup"].items()) if fig else ""
    if fig:
        speed += "; " + ", ".join(f"{m} {q['value']:.3f}{_ci(q.get('interval'))} (baseline {q['baseline']:.3f})"
                                  for m, q in fig["quality"].items())
    return [f"`{task.fast}`: " + (f"{reproduce}; {t['trials']} trials on tuning seeds {t['tune_seeds'][0]} to "
                                  f"{t['tune_seeds'][-1] + t['batch'] - 1}, validated on {t['heldout']} held-out problems from "
                                  f"seed {t['heldout_seed']} ({speed} there; report: docs/benchmarks/tune-{task.name}/index.md)."
                                  if chosen else f"the tune found no setting within {', '.join(t['budgets'])} "
                                  f"(docs/benchmarks/tune-{task.name}/index.md)."), ""]


def task_section(task: Task, out: Path = ROOT / OUT) -> list[str]:
    r1, r8, rt = (load(f"{task.name}-{k}", out) for k in ("b1", "b8", "threshold"))
    lines = [f"## {task.name}", "", f"{task.what}. Baseline `{task.base}`; every entry on held-out problems (bench seed s is "
             "held-out problem s), timed and interleaved with the baseline on the same seeds.", ""]
    if r1 is None and r8 is None:
        lines += [f"`{task.name}-b1`, `{task.name}-b8`: not measured yet (`make benchmarks-tasks TASK={task.name}`).", ""]
    for name, res in ((f"{task.name}-b1", r1), (f"{task.name}-b8", r8)):
        if res is None:
            continue
        cmd = res.get("command", "")
        seeds = res["seeds"]
        rows = seeds[-1] + res["model"]["batch"] - seeds[0]
        lines += [f"`{name}`: {len(seeds)} seeds x batch {res['model']['batch']} = {rows} problems (seeds {seeds[0]} to "
                  f"{seeds[-1] + res['model']['batch'] - 1}), {res['wall_s'] / 60:.1f} min; {_machine(name, out)}", "",
                  f"    {cmd}", ""]
    lines += tune_lines(task, out)
    e1, e8 = entries(r1), entries(r8)
    names = list(e1) or list(e8)
    q = entries(r1 or r8)
    lines += [] if not names else [f"| entry | steps run (mean) | speedup, batch 1 | speedup, batch 8 | acc | {task.second} | commits per step | "
                                   "computed, batch 1 / 8 |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for n in names:
        e = q[n]
        s = e.get("run_summary") or {}
        qc = e.get("quality_ci") or {}
        acc = f"**{e['quality']['acc']:.3f}**" if n == "baseline" else f"{e['quality']['acc']:.3f}"
        lines.append(f"| {n} | {s.get('steps_run', float('nan')):.1f} | {_speed(e1.get(n))} | {_speed(e8.get(n))} | "
                     f"{acc}{_ci(qc.get('acc'))} | {e['quality'][task.second]:.3f}{_ci(qc.get(task.second))} | "
                     f"{s.get('commits_per_step') or float('nan'):.2f} | {_computed(e1.get(n))} / {_computed(e8.get(n))} |")
    lines += [] if not names else ["", f"acc and {task.second} are those of the {'batch 1' if r1 else 'batch 8'} bench (rows are independent, so the "
              "batch changes no output); [lo-hi]: 95% paired bootstrap intervals over the problems; computed: the share of "
              "the positions of the steps run that the layers computed (a cache that saves work but not time shows it; "
              "a cost gate that kept a cache aside shows 100%).", ""]
    for b, res in ((1, r1), (8, r8)):
        best = fastest_within(res)
        if res is not None:
            base = entries(res)["baseline"]["quality"]["acc"]
            lines.append(f"* batch {b}: fastest within one point of the baseline's acc ({base:.3f}): " +
                         (f"`{best[0]}`, {best[1]['speedup']:.2f}x at acc {best[1]['quality']['acc']:.3f}" if best else "none"))
    lines.append("")
    if rt is not None:
        pts = threshold_points(rt)
        base = entries(rt)["baseline"]["quality"]["acc"]
        cmd = rt.get("command", "")
        lines += [f"`{task.name}-threshold` (quality only, {len(rt['seeds']) * rt['model']['batch']} problems from seed "
                  f"{rt['seeds'][0]}): parallel's threshold rule on probabilities (Fast-dLLM's rule; its default is 0.9)", "",
                  f"    {cmd}", "",
                  "| tau | " + " | ".join(f"{t:g}" for t, _, _ in pts) + " |", "| --- |" + " --- |" * len(pts),
                  f"| acc (baseline {base:.3f}) | " + " | ".join(f"{a:.3f}" for _, a, _ in pts) + " |",
                  "| commits per step | " + " | ".join(f"{c:.2f}" if c else "-" for _, _, c in pts) + " |", ""]
        line = [(n, e) for n, e in entries(rt).items() if n.startswith("steps-")]
        lines += ["The steps-N line on the same problems: " + "; ".join(
            f"{n} acc {e['quality']['acc']:.3f} at {(e.get('run_summary') or {}).get('commits_per_step') or float('nan'):.2f} commits per step"
            for n, e in line) + ".", ""] if line else []
        keep = [t for t, a, _ in pts if a >= base - BUDGET - 1e-12]
        lines += [f"Lowest threshold within one point of the baseline: {min(keep):g}." if keep else
                  "No threshold keeps the baseline's accuracy within one point.", ""]
        at09 = next((a for t, a, _ in pts if t == 0.9), None)
        if at09 is not None:
            lines += [f"Where ours differs from Fast-dLLM: at its default threshold 0.9 this model loses "
                      f"{100 * (base - at09):.1f} points of acc ({at09:.3f} against {base:.3f}), where Fast-dLLM reports "
                      "GSM8K accuracy nearly unchanged at 0.9 for LLaDA. A small model trained on one task gives high "
                      "probabilities to positions that still depend on each other, so a threshold that is safe for a "
                      "large model's calibrated confidences is not safe here; within one point it needs "
                      + (f"{min(keep):g}." if keep else "more than the sweep's highest threshold."), ""]
    if (out / f"task-{task.name}-speedup.png").is_file():
        lines += [f"![{task.name}: accuracy against speedup](benchmarks/task-{task.name}-speedup.png)", ""]
    if task.name == "sudoku" and (out / "task-sudoku-commits.png").is_file():
        lines += ["![sudoku: accuracy against commits per step](benchmarks/task-sudoku-commits.png)", ""]
    sp = out / f"{task.name}-samples.json"
    if sp.is_file():
        data = json.loads(sp.read_text())
        lines += ["Sample solutions (`diffaccel generate CONFIG --seed S`: held-out problem S):", ""]
        for seed in map(str, SAMPLE_SEEDS):
            for cfg, by_seed in data.items():
                if seed in by_seed:
                    lines += [f"seed {seed}, `{cfg}`:", "", *[f"    {ln}" for ln in by_seed[seed].splitlines()], ""]
    return lines


INTRO = ("Generated by `make benchmarks-tasks` (docs/task_benchmarks.py) from the benches' JSON under docs/benchmarks/ "
         "(`TASK-b1`, `TASK-b8`, `TASK-threshold`); nothing here is typed by hand. The task models and their figures' "
         "background: [task-models.md](task-models.md). Speedups are wall-clock ratios against the baseline in the same "
         "interleaved run on a shared CPU (ratios only); accuracy is exact (no judge, no noise floor).")


def page(out: Path = ROOT / OUT) -> str:
    lines = ["# Task benchmarks: accuracy at speed on the task models", "", INTRO, ""]
    if (out / "task-threshold.png").is_file():
        lines += ["![accuracy against parallel's threshold, both tasks](benchmarks/task-threshold.png)", ""]
    for task in TASKS.values():
        lines += task_section(task, out)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", nargs="+", choices=sorted(TASKS), default=sorted(TASKS), help="rerun these tasks' benches")
    p.add_argument("--only", nargs="+", help="rerun these benches only (names TASK-b1, TASK-b8, TASK-threshold, TASK-samples)")
    p.add_argument("--combine-only", action="store_true", help="run no bench: plots and page from the existing folders")
    p.add_argument("--note", help="a machine note recorded in every rerun bench")
    args = p.parse_args(argv)
    diffaccel = str(Path(sys.executable).with_name("diffaccel"))
    env = {**os.environ, **({"DIFFACCEL_MACHINE_NOTE": args.note} if args.note else {})}
    for task in [] if args.combine_only else [TASKS[t] for t in args.task]:
        for name, cmd in benches(task).items():
            if args.only and name not in args.only:
                continue
            run_bench(name, cmd, diffaccel, env)
        if not args.only or f"{task.name}-samples" in args.only:
            configs = [task.base] + ([task.fast] if (ROOT / task.fast).is_file() else [f"configs/{task.name}-parallel.toml"])
            (ROOT / OUT / f"{task.name}-samples.json").write_text(json.dumps(samples(task, configs, diffaccel, env), indent=1))
    made = plots()
    PAGE.write_text(page())
    print(f"wrote {PAGE.relative_to(ROOT)} and {', '.join(made) or 'no plots'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
