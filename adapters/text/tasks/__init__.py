"""Task-trained text diffusion LMs: problems with exact answers (``arith``, ``sudoku``), their
held-out split, scoring and training recipe. ``task_spec(name)`` is the one entry point."""

from __future__ import annotations

from functools import partial
from typing import Callable

import attrs
import numpy as np

from . import arith, sudoku
from .common import HELD_OUT_EVERY, Problem, PromptError, build_tokenizer, heldout_problem, is_held_out

TASKS = ("arith", "sudoku")
GRIDS = tuple(sudoku.BOXES)


@attrs.frozen(kw_only=True)
class TaskSpec:
    """One task as the trainer and the adapter use it."""

    name: str
    """``arith`` or ``sudoku``."""
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
    """A problem drawn from a generator at a curriculum level (arith: operations; sudoku: ignored)."""
    parse: Callable[[str], Problem]
    """The problem a user's prompt states, or ``PromptError``."""
    score: Callable[[Problem, list[str]], dict[str, float]]
    """Scores of the generated lines: ``acc`` first, then the second metric."""
    metrics: tuple[str, str]
    levels: int = 1
    """Curriculum levels (arith: 1 to 4 operations)."""
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
    if name == "sudoku":
        if grid not in sudoku.BOXES:
            raise ValueError(f"sudoku grid {grid}: allowed {', '.join(map(str, GRIDS))}")
        gen = grid * grid + grid - 1  # the rows and the line breaks between them
        return TaskSpec(name="sudoku", key=f"sudoku{grid}", words=sudoku.WORDS, max_len=grid * grid + 1 + gen, steps=gen,
                        problem=partial(sudoku.problem, n=grid), draw=partial(sudoku.generate, n=grid), generate=lambda rng, level: sudoku.generate(rng, grid),
                        parse=partial(sudoku.parse, n=grid), score=partial(sudoku.score, n=grid),
                        metrics=("acc", "cells_acc"), grid=grid)
    raise ValueError(f"unknown task '{name}'; allowed: {', '.join(TASKS)}")


__all__ = ["GRIDS", "HELD_OUT_EVERY", "Problem", "PromptError", "TASKS", "TaskSpec", "is_held_out", "task_spec"]
