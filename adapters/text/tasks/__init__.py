"""Task-trained text diffusion LMs: problems with exact answers (``arith``, ``ledger``, ``sudoku``), their
held-out split, scoring and training recipe. ``task_spec(name)`` is the one entry point."""

from __future__ import annotations

from functools import partial
from typing import Callable

import attrs
import numpy as np

from . import arith, ledger, sudoku
from .common import HELD_OUT_EVERY, Problem, PromptError, build_tokenizer, heldout_problem, is_held_out, seed_rng

TASKS = ("arith", "ledger", "sudoku", "sudoku-hard")
GRIDS = tuple(sudoku.BOXES)


@attrs.frozen(kw_only=True)
class TaskSpec:
    """One task as the trainer and the adapter use it."""

    name: str
    """``arith``, ``ledger`` or ``sudoku``."""
    key: str
    """The task and its size (``arith``, ``sudoku9``, ``sudoku6``): names its problem stream."""
    words: list[str]
    """The tokenizer's task words (digits and specials are in every task tokenizer)."""
    max_len: int
    """Prompt plus generation, in tokens: the model's positions and the sampler's length."""
    steps: int
    """Full steps: one committed token per step for the longest generation."""
    problem: Callable[[int], Problem]
    """Problem of a generator seed (of either split)."""
    draw: Callable[[np.random.Generator], Problem]
    """A problem of the test distribution drawn from a generator (arith: 2 to 4 operations)."""
    generate: Callable[[np.random.Generator, int], Problem]
    """A problem drawn from a generator at a curriculum level (arith: operations; ledger: facts / 2;
    sudoku: ignored)."""
    parse: Callable[[str], Problem]
    """The problem a user's prompt states, or ``PromptError``."""
    score: Callable[[Problem, list[str]], dict[str, float]]
    """Scores of the generated lines: ``acc`` first, then the second metric."""
    metrics: tuple[str, str]
    levels: int = 1
    """Curriculum levels (arith: 1 to 4 operations; ledger: 2 to 20 facts)."""
    grid: int = 0

    def tokenizer(self):
        return build_tokenizer(self.words)

    def heldout(self, index: int) -> Problem:
        """The ``index``-th held-out problem: the bench's seed ``index``."""
        return heldout_problem(self.key, self.draw, index)


def task_spec(name: str, grid: int = 9) -> TaskSpec:
    """The task ``name`` (``sudoku``: of ``grid`` x ``grid`` cells)."""
    if name == "arith":
        return TaskSpec(name="arith", key="arith", words=arith.WORDS, max_len=arith.PROMPT_LEN + arith.GEN_LEN,
                        steps=arith.GEN_LEN + arith.PROMPT_LEN - arith.MIN_PROMPT_LEN, problem=arith.problem, draw=arith.generate,
                        generate=lambda rng, level: arith.generate(rng, level), parse=arith.parse, score=arith.score,
                        metrics=("acc", "steps_acc"), levels=arith.MAX_OPS)
    if name == "ledger":
        return TaskSpec(name="ledger", key="ledger", words=ledger.WORDS, max_len=ledger.PROMPT_LEN + ledger.GEN_LEN,
                        steps=ledger.GEN_LEN + ledger.PROMPT_LEN - ledger.MIN_PROMPT_LEN, problem=ledger.problem,
                        draw=ledger.generate, generate=lambda rng, level: ledger.generate(rng, min(ledger.FACTS, 2 * level)),
                        parse=ledger.parse, score=ledger.score, metrics=("acc", "facts_acc"), levels=ledger.FACTS // 2)
    if name in ("sudoku", "sudoku-hard"):
        if grid not in (sudoku.HARD_BLANKS if name == "sudoku-hard" else sudoku.BOXES):
            allowed = sudoku.HARD_BLANKS if name == "sudoku-hard" else GRIDS
            raise ValueError(f"{name} grid {grid}: allowed {', '.join(map(str, allowed))}")
        gen = grid * grid + grid - 1  # the rows and the line breaks between them
        make = sudoku.generate_hard if name == "sudoku-hard" else sudoku.generate
        key = f"sudoku{grid}" + ("-hard" if name == "sudoku-hard" else "")
        return TaskSpec(name="sudoku", key=key, words=sudoku.WORDS, max_len=grid * grid + 1 + gen, steps=gen,
                        problem=lambda seed: make(seed_rng(key, seed), grid), draw=partial(make, n=grid),
                        generate=lambda rng, level: make(rng, grid),
                        parse=partial(sudoku.parse, n=grid), score=partial(sudoku.score, n=grid),
                        metrics=("acc", "cells_acc"), grid=grid)
    raise ValueError(f"unknown task '{name}'; allowed: {', '.join(TASKS)}")


__all__ = ["GRIDS", "HELD_OUT_EVERY", "Problem", "PromptError", "TASKS", "TaskSpec", "is_held_out", "task_spec"]
