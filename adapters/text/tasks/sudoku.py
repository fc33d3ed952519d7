"""``sudoku``: the prompt is a puzzle, the generation the filled grid.

A puzzle of an n x n grid (n = 9, 6 or 4: boxes 3x3, 2x3, 2x2) is written as its n * n cells
row by row on one line, ``0`` (or ``.``) for a blank. The generation is the filled grid, one row
per line. Puzzles come from a valid grid (a base pattern under random relabelling and row,
column, band and stack permutations) with some cells blanked; a puzzle may have more than one
solution, and any valid grid that keeps the givens counts as solved.

Scores: ``acc`` (solved: every row, column and box a permutation, the givens kept) and
``cells_acc`` (share of blank cells equal to the reference grid's).
"""

from __future__ import annotations

import numpy as np

from .common import Problem, PromptError, seed_rng

NAME = "sudoku"
BOXES = {9: (3, 3), 6: (2, 3), 4: (2, 2)}
#: blanks per puzzle, as a share of the cells (drawn uniformly in this range)
BLANKS = {9: (30, 45), 6: (12, 20), 4: (5, 10)}
#: the hard split (``task = "sudoku-hard"``): 9x9 only, 23 to 31 givens, grids from a randomized search
HARD_BLANKS = {9: (50, 58)}
WORDS: list[str] = []  # digits and the space marker are in every task tokenizer


def _grid(rng: np.random.Generator, n: int) -> np.ndarray:
    bh, bw = BOXES[n]
    r, c = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    g = (bw * (r % bh) + r // bh + c) % n  # a valid base grid
    rows = np.concatenate([b * bh + rng.permutation(bh) for b in rng.permutation(n // bh)])
    cols = np.concatenate([s * bw + rng.permutation(bw) for s in rng.permutation(n // bw)])
    g = g[rows][:, cols]
    if bh == bw and rng.random() < 0.5:
        g = g.T
    return rng.permutation(n)[g] + 1


def _puzzle(rng: np.random.Generator, grid: np.ndarray, blanks: tuple[int, int]) -> Problem:
    """``grid`` with a number of cells in ``blanks`` (inclusive range) blanked, drawn from ``rng``."""
    n = grid.shape[0]
    lo, hi = blanks
    cells = rng.choice(n * n, size=int(rng.integers(lo, hi + 1)), replace=False)
    puzzle = grid.reshape(-1).copy()
    puzzle[cells] = 0
    return Problem(prompt="".join(map(str, puzzle)), solution=[[*"".join(map(str, row))] for row in grid],
                   answer="".join(map(str, grid.reshape(-1))))


def generate(rng: np.random.Generator, n: int = 9) -> Problem:
    return _puzzle(rng, _grid(rng, n), BLANKS[n])


def search_grid(rng: np.random.Generator, n: int = 9) -> np.ndarray:
    """A valid n x n grid drawn by a randomized depth-first search (each cell tries the digits it
    may take in a random order): any valid grid can come out, not only relabellings and
    permutations of one base pattern as ``_grid``'s. Rows, columns and boxes keep bit masks of
    their digits (plain ints: numpy per cell made a 9x9 grid cost tens of milliseconds)."""
    bh, bw = BOXES[n]
    g = [0] * (n * n)
    rows, cols, boxes = [0] * n, [0] * n, [0] * n
    orders = [[int(d) + 1 for d in rng.permutation(n)] for _ in range(n * n)]

    def fill(k: int) -> bool:
        if k == n * n:
            return True
        r, c = divmod(k, n)
        b = (r // bh) * (n // bw) + c // bw
        used = rows[r] | cols[c] | boxes[b]
        for d in orders[k]:
            bit = 1 << d
            if not used & bit:
                g[k] = d
                rows[r] |= bit; cols[c] |= bit; boxes[b] |= bit  # noqa: E702
                if fill(k + 1):
                    return True
                rows[r] ^= bit; cols[c] ^= bit; boxes[b] ^= bit  # noqa: E702
        return False

    fill(0)
    return np.array(g).reshape(n, n)


def generate_hard(rng: np.random.Generator, n: int = 9) -> Problem:
    """A puzzle of the hard split: a searched grid with ``HARD_BLANKS`` blanks."""
    if n not in HARD_BLANKS:
        raise ValueError(f"the hard sudoku split is {', '.join(f'{k}x{k}' for k in HARD_BLANKS)} only, not {n}x{n}")
    return _puzzle(rng, search_grid(rng, n), HARD_BLANKS[n])


def problem(seed: int, n: int = 9) -> Problem:
    """Puzzle ``seed`` of an n x n grid, the same on every machine."""
    return generate(seed_rng(f"{NAME}{n}", seed), n)


def valid(grid: np.ndarray) -> bool:
    """Every row, column and box of the n x n grid holds 1..n once."""
    n = grid.shape[0]
    bh, bw = BOXES[n]
    want = set(range(1, n + 1))
    boxes = grid.reshape(n // bh, bh, n // bw, bw).transpose(0, 2, 1, 3).reshape(n, n)
    return all(set(line.tolist()) == want for part in (grid, grid.T, boxes) for line in part)


def parse(prompt: str, n: int = 9) -> Problem:
    """The puzzle a user's prompt states: n * n cells, digits 1..n, 0 or . for blanks (spaces,
    line breaks and | ignored). ``PromptError`` naming what was expected otherwise. A puzzle whose
    givens already clash has no valid completion: refused too."""
    cells = "".join(ch for ch in prompt if ch not in " \n\t|").replace(".", "0")
    expected = f"a {n}x{n} sudoku: {n * n} cells row by row, digits 1 to {n}, 0 or . for a blank"
    if len(cells) != n * n or any(ch not in "0123456789"[: n + 1] for ch in cells):
        bad = sorted({ch for ch in cells if ch not in "0123456789"[: n + 1]})
        got = f"characters {''.join(bad)!r}" if bad else f"{len(cells)} cells"
        raise PromptError(f"expected {expected}; got {got}")
    g = np.array([int(ch) for ch in cells]).reshape(n, n)
    bh, bw = BOXES[n]
    boxes = g.reshape(n // bh, bh, n // bw, bw).transpose(0, 2, 1, 3).reshape(n, n)
    for part in (g, g.T, boxes):
        for line in part:
            given = line[line > 0]
            if len(set(given.tolist())) != len(given):
                raise PromptError(f"the givens repeat a digit in a row, column or box; expected {expected} that can be solved")
    return Problem(prompt=cells, solution=[], answer="")


def read_grid(lines: list[str], n: int) -> np.ndarray | None:
    """The n x n grid of the generated lines, or None when they are not n rows of n digits."""
    rows = [line.strip() for line in lines if line.strip()]
    if len(rows) != n or any(len(r) != n or not r.isdigit() for r in rows):
        return None
    return np.array([[int(ch) for ch in r] for r in rows])


def score(problem: Problem, lines: list[str], n: int = 9) -> dict[str, float]:
    """``acc``: a valid grid keeping the givens; ``cells_acc``: blank cells equal to the reference
    (a user's puzzle has no reference: then the share of blanks consistent with a valid grid is
    not defined and ``cells_acc`` is ``acc``)."""
    puzzle = np.array([int(ch) for ch in problem.prompt]).reshape(n, n)
    grid = read_grid(lines, n)
    blank = puzzle == 0
    if grid is None:
        return {"acc": 0.0, "cells_acc": 0.0}
    solved = bool((grid[~blank] == puzzle[~blank]).all() and valid(grid))
    if not problem.answer:
        return {"acc": float(solved), "cells_acc": float(solved)}
    ref = np.array([int(ch) for ch in problem.answer]).reshape(n, n)
    return {"acc": float(solved), "cells_acc": float((grid[blank] == ref[blank]).mean()) if blank.any() else 1.0}
