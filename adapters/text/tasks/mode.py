"""The text adapter's task mode (``[model] task = "arith"``, ``"ledger"`` or ``"sudoku"``).

Row r of a run with seed s solves held-out problem s + r (``TaskSpec.heldout``), or the user's
own problems (``prompts``, checked against the task's format when the config loads, before any
model). The sampler is the masked one at the task's length; the output carries each row's
scores (``acc`` and the task's second metric), which the adapter's ``quality`` pools, so the
bench's intervals resample problems without scoring them again.
"""

from __future__ import annotations

import attrs

from . import GRIDS, TASKS, PromptError, TaskSpec, task_spec
from .evaluate import generated_lines
from diffaccel.contract.errors import ConfigValueError


def spec_of(options) -> TaskSpec:
    return task_spec(options.task, options.grid)


def check_options(options) -> None:
    """``ConfigValueError`` for task options that cannot run: an unknown task or grid, a prompt
    that is not a problem of the task (one line naming what was expected)."""
    if options.task is None:
        return
    if options.task not in TASKS:
        raise ConfigValueError("task", f"must be one of {', '.join(map(repr, TASKS))}, got {options.task!r}")
    if options.grid not in GRIDS:
        raise ConfigValueError("grid", f"must be one of {', '.join(map(str, GRIDS))} (a sudoku's size), got {options.grid!r}")
    try:
        spec = spec_of(options)
    except ValueError as exc:  # a grid the task has no split of (sudoku-hard: 9x9 only)
        raise ConfigValueError("grid", str(exc)) from None
    for i, prompt in enumerate(options.prompts):
        if not prompt.strip():
            continue  # an empty prompt: the row's own held-out problem
        try:
            spec.parse(prompt)
        except PromptError as exc:
            where = "prompt" if len(options.prompts) == 1 else f"prompt {i + 1}"
            raise ConfigValueError("prompts", f"{where} is not a problem of task '{spec.key}': {exc}") from None


def check_model(spec: TaskSpec, max_len: int, where: str) -> None:
    """The model must have the task's positions (a sudoku model of another grid would not)."""
    if max_len != spec.max_len:
        raise ConfigValueError("task", f"{where}: the model has {max_len} positions; a {spec.key} model has "
                               f"{spec.max_len} (another task or grid?)")


def problems(spec: TaskSpec, options, seeds: list[int]):
    """Row r's problem: the user's prompt, or held-out problem ``seeds[r]`` where there is none
    (no ``prompts``, or an empty one: what ``serve`` sends for an unconditional request)."""
    given = [options.prompts[r % len(options.prompts)] if options.prompts else "" for r in range(len(seeds))]
    return [spec.parse(p) if p.strip() else spec.heldout(s) for s, p in zip(seeds, given)]


def run(pipe, config, seed: int, progress: bool = True, **extra):
    """A run of the task: the problems' prompts, greedy or not as ``temperature`` says. ``texts``
    are each row's problem and its generation line by line; the output keeps its problems, and
    scoring waits until the scores are asked for (outside the bench's timed region)."""
    m, o = config.model, config.options
    spec = spec_of(o)
    # a row's seed picks its problem: seed + r, or serve's own seed per row
    probs = problems(spec, o, extra.get("seeds") or [seed + r for r in range(m.batch)])
    out = pipe([p.prompt for p in probs], length=spec.max_len, steps=m.steps or spec.steps, seed=seed, batch=m.batch,
               sampler="masked", temperature=o.temperature, block_size=o.block_size, progress=progress,
               prefix_cache=o.prefix_cache, **extra)
    task = TaskRun(spec, probs, pipe.tokenizer)
    return attrs.evolve(out, texts=task.texts(out), task=task)


@attrs.define
class TaskRun:
    """What a task run's output keeps: the task, each row's problem, the tokenizer."""

    spec: TaskSpec
    problems: list
    tokenizer: object
    _scores: list | None = None

    def lines(self, output) -> list[list[str]]:
        return [generated_lines(self.tokenizer, row, n) for row, n in zip(output.tokens, output.prompt_lengths)]

    def scores(self, output) -> list[dict[str, float]]:
        """Each row's scores (``acc`` and the task's second metric), computed once."""
        if self._scores is None:
            self._scores = [self.spec.score(p, ls) for p, ls in zip(self.problems, self.lines(output))]
        return self._scores

    def texts(self, output) -> list[str]:
        """Each row's problem, then its generation line by line."""
        return [p.prompt + "\n" + "\n".join(x.strip() for x in ls if x.strip()) for p, ls in zip(self.problems, self.lines(output))]


def keys(options) -> list[str]:
    return [*spec_of(options).metrics, "agreement"]


def pool(parts) -> dict[str, float]:
    """The pooled scores of per-seed parts ((acc sum, second sum, rows, agreement, second key))."""
    rows = sum(p[2] for p in parts)
    return {"acc": sum(p[0] for p in parts) / rows, parts[0][4]: sum(p[1] for p in parts) / rows,
            "agreement": sum(p[3] for p in parts) / len(parts)}


def part(output, agreement: float) -> tuple:
    scores = output.task.scores(output)
    acc_key, second = output.task.spec.metrics
    return (sum(x[acc_key] for x in scores), sum(x[second] for x in scores), len(scores), agreement, second)
