"""``diffaccel train task``: train a task model (``arith``, ``ledger``, ``sudoku``) from its recipe."""

from __future__ import annotations

import argparse

EXAMPLES = """
    examples:
      OMP_NUM_THREADS=1 diffaccel train task --task arith --out runs/arith --steps 4000
      OMP_NUM_THREADS=1 diffaccel train task --task sudoku --grid 6 --out runs/sudoku6
      diffaccel train task --task ledger --out runs/ledger --init models/diffaccel_models/assets/arith --init-layers 0,1,4,5 \
        --dim 128 --layers 6 --heads 4 --batch 32 --lr 1e-3 --curriculum 0.25 --top-share 0.5 --focus 0.5 --trim --no-bf16
    Resumes from OUT/ckpt.pt when it exists; the best held-out model so far is OUT/model.safetensors."""


def diffaccel_register_commands(commands) -> None:
    commands.add("task", group="train", help="train a task model (arith word problems, ledger look-ups, sudoku) with its held-out split",
                 arguments=_arguments, run=_train, examples=EXAMPLES)


def _arguments(t: argparse.ArgumentParser) -> None:
    t.add_argument("--task", choices=["arith", "ledger", "sudoku"], required=True)
    t.add_argument("--grid", type=int, choices=[9, 6, 4], default=9, help="sudoku: grid size (default 9)")
    t.add_argument("--out", required=True, help="output folder (resumed from its ckpt.pt)")
    t.add_argument("--steps", type=int, default=4000, help="optimiser steps (default 4000)")
    t.add_argument("--batch", type=int, default=64, help="problems per step (default 64)")
    t.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default 2e-3)")
    t.add_argument("--dim", type=int, default=192, help="width (default 192)")
    t.add_argument("--layers", type=int, default=6, help="transformer blocks (default 6)")
    t.add_argument("--heads", type=int, default=6, help="attention heads (default 6)")
    t.add_argument("--eval-every", type=int, default=500, help="steps between held-out evaluations (default 500)")
    t.add_argument("--eval-n", type=int, default=100, help="held-out problems per evaluation (default 100)")
    t.add_argument("--curriculum", type=float, default=0.2,
                   help="share of steps over which the curriculum's cap grows (arith: operations 1 -> 4; ledger: facts 2 -> 20)")
    t.add_argument("--trim", action="store_true", help="cut each batch 16 positions after its longest problem (a curriculum's short ones)")
    t.add_argument("--top-share", type=float, default=0.0,
                   help="chance a problem is drawn at the curriculum's current cap, not uniformly below it (default 0)")
    t.add_argument("--max-minutes", type=float, default=0.0, help="stop with a checkpoint after this many minutes (0: none)")
    t.add_argument("--focus", type=float, default=0.0, help="arith: chance each result digit is masked whatever the row's rate")
    t.add_argument("--lookup", type=float, default=0.0,
                   help="ledger: chance a row's restated facts and first equation are all masked (no copy from beside them)")
    t.add_argument("--pace", type=float, default=0.0, help="mastery curriculum: the next level when the running "
                   "accuracy on masked look-up digits reaches this (0: the --curriculum step ramp)")
    t.add_argument("--start-level", type=int, default=1, help="the paced curriculum's first level (with --init of a model "
                   "that passed levels in an earlier run)")
    t.add_argument("--init", metavar="FOLDER", help="start from this model folder's weights (not its optimiser); "
                   "another task's model is carried over by token, position and block")
    t.add_argument("--init-layers", metavar="I,J,...", help="with --init of fewer blocks: the new model's blocks that take "
                   "the source's, in order (default: the first)")
    t.add_argument("--no-bf16", action="store_true", help="train in float32 (default: bfloat16 autocast)")
    t.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    t.add_argument("--seed", type=int, default=0)


def _train(args: argparse.Namespace) -> int:
    import torch  # deferred: the recipe is imported by 'diffaccel train task' only

    from .tasks.train import TaskTrainConfig, train_task

    cfg = TaskTrainConfig(task=args.task, grid=args.grid, out=args.out, steps=args.steps, batch=args.batch, lr=args.lr,
                          dim=args.dim, layers=args.layers, heads=args.heads, eval_every=args.eval_every, eval_n=args.eval_n,
                          curriculum=args.curriculum, max_minutes=args.max_minutes, bf16=not args.no_bf16,
                          focus=args.focus, lookup=args.lookup, pace=args.pace, start_level=args.start_level, init=args.init,
                          top_share=args.top_share, trim=args.trim,
                          init_layers=tuple(int(i) for i in args.init_layers.split(",")) if args.init_layers else None,
                          threads=args.threads, seed=args.seed)
    torch.set_num_threads(cfg.threads)  # command-line entry points only, never library code
    print(f"wrote {train_task(cfg)}")
    return 0
