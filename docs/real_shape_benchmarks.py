"""``make benchmarks-real-shape``: docs/real-shape-benchmarks.md, the text caches on models of a real shape (issue 56).

The task models are small, so what a cache saves there is bounded by a step's fixed costs. This
page times the same caches, with the plugins' shipped settings and their cost gates left at
``auto``, on two random-weight models whose step is compute-bound, as a user's would be:

* ``synthetic-llada-small`` (LLaMA-style, 12 layers, width 768, about 110M parameters) on a long
  prompt: 176 prompt tokens, 80 generated (``configs/text-llada-small-long*.toml``), with its
  steps-N line;
* DiffusionGemma's ``mid`` random checkpoint (its block sampler; built into ``runs/`` when absent).

Each at batch 1 and batch 8, interleaved with the baseline on the same seeds, one thread. Random
weights: **only the speed, computed and cost-gate columns mean something** (the samples are random
tokens; no judge runs). Run under the bench lock, as the Makefile does:

    flock /tmp/diffaccel-bench.lock env OMP_NUM_THREADS=1 .venv/bin/python docs/real_shape_benchmarks.py [--only NAME ...]

``--combine-only`` runs nothing and rewrites the page from the existing folders.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from task_benchmarks import OUT, ROOT, _computed, _machine, _speed, load, run_bench  # noqa: E402

PAGE = ROOT / "docs" / "real-shape-benchmarks.md"
GEMMA = "runs/diffusion-gemma-mid"
LLADA = ["configs/text-llada-small-long.toml", "configs/text-llada-small-long-swd.toml",
         "configs/text-llada-small-long-time-anchor.toml", "configs/text-llada-small-long-prompt-cache.toml"]
GEMMA_CONFIGS = ["configs/text-diffusion-gemma-mid.toml", "configs/text-diffusion-gemma-mid-swd.toml",
                 "configs/text-diffusion-gemma-mid-time-anchor.toml"]
COMMON = ["--no-noise-floor", "--judge", "none"]
#: bench name -> the arguments after ``diffaccel bench`` (the report folder is added)
BENCHES = {
    "real-shape-llada-long-b1": [*LLADA, "--seeds", "6", "--repeats", "2", "--batch", "1", *COMMON],
    "real-shape-llada-long-b8": [*LLADA, "--seeds", "2", "--batch", "8", *COMMON],
    "real-shape-gemma-mid-b1": [*GEMMA_CONFIGS, "--seeds", "8", "--repeats", "2", "--batch", "1", *COMMON],
    "real-shape-gemma-mid-b8": [*GEMMA_CONFIGS, "--seeds", "4", "--repeats", "2", "--batch", "8", *COMMON],
}
MODELS = {
    "real-shape-llada-long": ("synthetic-llada-small, 176 prompt tokens and 80 generated, 16 steps",
                              "configs/text-llada-small-long.toml"),
    "real-shape-gemma-mid": ("DiffusionGemma `mid` (random, 9.2M parameters), block sampler, two blocks of 32, 8 steps per block",
                             "configs/text-diffusion-gemma-mid.toml"),
}


def keep_gates(path: Path) -> None:
    """Before the run reports are summarised away: each entry's cost-gate lines (``cost_gate``,
    the distinct ``summary`` lines its strategies wrote, with how many runs said each)."""
    result = json.loads(path.read_text())
    for e in result["entries"]:
        lines: dict[str, int] = {}
        for rep in e.get("reports") or []:
            for metrics in (rep.get("strategies") or {}).values():
                line = metrics.get("summary") if isinstance(metrics, dict) else None
                if line:
                    verdict = line.split(" (")[0]  # the verdict without the run's own milliseconds
                    lines[verdict] = lines.get(verdict, 0) + 1
        e["cost_gate"] = lines
    path.write_text(json.dumps(result, indent=1, default=float))


def _gate(e: dict) -> str:
    lines = e.get("cost_gate") or {}
    return "; ".join(f"{v} ({n} runs)" for v, n in lines.items()) or "-"


def reading(entries: list[dict]) -> str:
    """One generated line: which caches ran (their gate on) and how they stand against the steps line."""
    on = [e for e in entries if any(": on" in v for v in (e.get("cost_gate") or {}))]
    off = [e["name"] for e in entries if (e.get("cost_gate") or {}) and e not in on]
    steps = [e for e in entries if e["name"].startswith("steps-")]
    ran = ", ".join(f"`{e['name']}` {_speed(e)} computing {_computed(e)}" for e in on) or "none"
    line = f"Caches whose gate kept them on: {ran}."
    if off:
        line += f" Gate off (full steps, nothing to skip that pays): {', '.join(f'`{n}`' for n in off)}."
    if steps:
        line += f" The fewer-steps line: `{steps[0]['name']}` {_speed(steps[0])} (its quality cannot be judged on random weights)."
    return line


def section(model: str, out: Path) -> list[str]:
    title, base = MODELS[model]
    lines = [f"## {title}", "", f"Baseline: `{base}`.", ""]
    for batch in (1, 8):
        name = f"{model}-b{batch}"
        res = load(name, out)
        if res is None:
            lines += [f"`{name}`: not run yet.", ""]
            continue
        lines += [f"### Batch {batch}", "", "```", res.get("command", ""), "```", "",
                  f"{len(res['seeds'])} seeds x batch {res['model']['batch']}, {res.get('repeats', 1)} timed pass(es), "
                  f"{res['wall_s'] / 60:.1f} min; {_machine(name, out)}. Report: [{name}](benchmarks/{name}/index.md)", "",
                  "| entry | speedup [95% interval] | computed | cost gate |", "| --- | ---: | ---: | --- |"]
        lines += [f"| {e['name']} | {_speed(e)} | {_computed(e)} | {_gate(e)} |" for e in res["entries"]]
        lines += ["", reading(res["entries"]), ""]
    return lines


def page(out: Path = ROOT / OUT) -> str:
    intro = __doc__.split("\n\n")[1].replace("\n", " ")
    lines = ["# The text caches on real-shape models", "",
             f"Generated by `make benchmarks-real-shape` (`docs/real_shape_benchmarks.py`) from the benches' folders in "
             f"`docs/benchmarks/`; nothing here is typed by hand. {intro}", "",
             "Speedups are wall-clock ratios against the baseline in the same interleaved run, on a shared 2-core CPU "
             "(ratios only). `computed`: the share of (layer, position) states computed. `cost gate`: what each "
             "strategy's gate decided (`on`: its partial steps pay; `off`: it ran full steps, so it cannot be slower than "
             "the baseline by more than its start-up probe).", ""]
    for model in MODELS:
        lines += section(model, out)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", choices=sorted(BENCHES), help="rerun these benches only")
    p.add_argument("--combine-only", action="store_true", help="run no bench: the page from the existing folders")
    args = p.parse_args(argv)
    diffaccel = str(Path(sys.executable).with_name("diffaccel"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    names = [] if args.combine_only else (args.only or list(BENCHES))
    if any("gemma" in n for n in names) and not (ROOT / GEMMA).is_dir():
        subprocess.run([diffaccel, "diffusion-gemma-build", "--size", "mid", "--out", GEMMA], cwd=ROOT, check=True, env=env)
    for name in names:
        run_bench(name, BENCHES[name], diffaccel, env, before_summary=keep_gates)
    PAGE.write_text(page())
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
