"""Is a task model's step compute-bound? Its full step against the sampler and the core around a
model that computes nothing, side by side.

    OMP_NUM_THREADS=1 python scripts/task_step_cost.py configs/ledger.toml configs/arith.toml --docs docs/task-models.md

For each config, at batch 1 and 8: a generation through ``diffaccel.Run`` (hooks attached, no
strategy) with the config's model, and the same with a *null* model of the same vocabulary and
positions but no blocks and width 8 (its embedding and head cost next to nothing), the two
interleaved over ``--rounds`` rounds; the medians per step and their ratio. The null run is what
the sampler and the core cost per step (the bookkeeping a cache must save more than); the ratio
says how many of those a full step of the model is worth. ``--docs`` rewrites the table between
the page's ``<!-- step-cost -->`` markers.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import attrs
import torch

from diffaccel import Run
from diffaccel.adapters.text.sampling.denoisers import ReferenceDenoiser
from diffaccel.adapters.text.sampling.model import TextDiffusionConfig, TextDiffusionLM
from diffaccel.adapters.text.sampling.pipeline import TextDiffusionPipeline

BEGIN, END = "<!-- step-cost -->", "<!-- /step-cost -->"


def null_pipe(pipe):
    """A pipeline like ``pipe`` whose model computes nothing: no blocks, width 8."""
    c = pipe.denoiser.model.config
    model = TextDiffusionLM(TextDiffusionConfig(vocab_size=c.vocab_size, kind=c.kind, max_len=c.max_len, dim=8, n_layers=0,
                                                n_heads=1, mask_id=c.mask_id, pad_id=c.pad_id)).eval()
    return TextDiffusionPipeline(ReferenceDenoiser(model), pipe.tokenizer, name="null")


def per_step(run: Run, config, seed: int) -> float:
    t = time.perf_counter()
    run.generate(seed, config=config)
    return (time.perf_counter() - t) / config.model.steps


def measure(path: str, batch: int, rounds: int) -> dict:
    real = Run(path)
    cfg = attrs.evolve(real.config, model=attrs.evolve(real.config.model, batch=batch))
    null = Run(path, pipe=null_pipe(real.pipe))
    times: dict[str, list[float]] = {"model": [], "null": []}
    for r in range(rounds + 1):  # round 0 warms up
        order = [("model", real), ("null", null)][:: 1 if r % 2 else -1]
        for name, run in order:
            t = per_step(run, cfg, seed=r)
            if r:
                times[name].append(t)
    c = real.pipe.denoiser.model.config
    m, n = statistics.median(times["model"]), statistics.median(times["null"])
    return {"config": path, "batch": batch, "positions": c.max_len, "layers": c.n_layers, "dim": c.dim,
            "model_ms": m * 1e3, "null_ms": n * 1e3, "ratio": m / n}


def table(rows: list[dict], threads: int, rounds: int) -> str:
    out = [f"`OMP_NUM_THREADS={threads} python scripts/task_step_cost.py {' '.join(dict.fromkeys(r['config'] for r in rows))}` "
           f"(medians of {rounds} interleaved rounds; ms per step on this machine, compare only within a row):", "",
           "| config | model | batch | full step (ms) | null model's step (ms) | full step / null step |",
           "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        out.append(f"| `{r['config']}` | {r['layers']} layers x {r['dim']}, {r['positions']} positions | {r['batch']} | "
                   f"{r['model_ms']:.2f} | {r['null_ms']:.2f} | **{r['ratio']:.1f}x** |")
    return "\n".join(out)


def write_docs(path: Path, text: str) -> None:
    page = path.read_text()
    if BEGIN not in page or END not in page:
        sys.exit(f"task_step_cost: {path}: no '{BEGIN}' ... '{END}' markers to write between")
    head, rest = page.split(BEGIN, 1)
    path.write_text(f"{head}{BEGIN}\n{text}\n{END}{rest.split(END, 1)[1]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("configs", nargs="+", help="task configs (text adapter, reference models)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--docs", type=Path, help="write the table into this page between its step-cost markers")
    args = ap.parse_args(argv)
    rows = [measure(c, b, args.rounds) for c in args.configs for b in args.batch]
    text = table(rows, torch.get_num_threads(), args.rounds)
    print(text)
    if args.docs:
        write_docs(args.docs, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
