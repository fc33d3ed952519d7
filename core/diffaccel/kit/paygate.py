"""``PayGate``: whether a strategy's partial steps pay, decided from the run's own timed steps.

A strategy that skips part of a step pays for it with bookkeeping (its tests, its gathers, the
adapter's partial path). On a small model or a short sequence that bookkeeping can cost more
than the layers it skips, and the strategy is then slower than no strategy at all. The gate
measures it where it runs, for the model and batch at hand, with real steps of the run, no
extra work:

1. **plain** steps: the first ``plain`` steps after the first, the strategy steps aside (full
   steps, none of its bookkeeping); their wall time is what a step costs without it;
2. **probe** steps: the next ``probe`` steps run the strategy; their wall time, bookkeeping
   included, is what a step costs with it;
3. **verdict**: the strategy stays on only if its steps' median is below the plain steps'
   median by ``margin`` (a share); otherwise every later step is plain.

A step's time runs from one ``tick`` (the strategy's ``pre_step``) to the next, so it holds the
denoiser, the sampler and every strategy's hooks. The first step (allocations) is not timed.
The clock (``step_clock``) is the process's CPU time on a CPU: on a shared machine the wall
clock also counts the time other jobs held the cores, which moved a plain step's median by a
third between two runs of the same config; CPU time counts this process's work only. Where
CUDA is in use it is the wall clock after a synchronisation (the host's CPU time would miss the
kernels).
The verdict is remembered per ``key`` (model, batch, length: what the strategy passes) for the
instance's later runs, which then skip the plain and probe phases; at the end of a run on the
whole run's steps replace the probe's figures, so a verdict made on few steps is corrected. A
clock can be handed in (tests force either verdict with a fake one).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Hashable
from typing import Any

import attrs

def step_clock() -> Callable[[], float]:
    """The clock a gate times steps with: ``time.process_time`` on a CPU, a synchronised
    ``time.perf_counter`` where CUDA is initialised."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        def synced() -> float:
            torch.cuda.synchronize()
            return time.perf_counter()
        return synced
    return time.process_time


MODES = ("auto", "on", "off")
"""``auto``: measure and decide; ``on``: always partial steps (no timing decides); ``off``: never."""

PIN = "DIFFACCEL_COST_GATE"
"""Environment variable: ``on`` or ``off`` pins every gate left at ``auto`` (a verdict from the clock
makes the outputs depend on the machine's load; the test suite pins it ``on``). A config's
explicit ``on`` or ``off`` wins over it."""


def pinned(mode: str) -> str:
    """``mode``, or the pin of ``DIFFACCEL_COST_GATE`` where ``mode`` is ``auto``."""
    pin = os.environ.get(PIN, "")
    return pin if mode == "auto" and pin in ("on", "off") else mode


@attrs.define
class Verdict:
    """What the gate decided for one key, and on which figures."""

    on: bool
    """Partial steps pay: the strategy runs."""
    plain_ms: float
    """Median wall time of a plain (full, strategy aside) step, milliseconds."""
    strategy_ms: float
    """Median wall time of a step with the strategy, bookkeeping included, milliseconds."""
    plain_steps: int
    strategy_steps: int
    decided_in: int
    """The run (1-based, of this instance and key) whose steps decided."""

    @property
    def ratio(self) -> float:
        """Strategy step over plain step (below 1: the strategy pays)."""
        return self.strategy_ms / self.plain_ms if self.plain_ms > 0 else float("inf")

    def line(self, name: str) -> str:
        """One line for a run's summary."""
        state = "on" if self.on else "off, full steps"
        return (f"{name} cost gate: {state} (a step with it {self.strategy_ms:.2f} ms over {self.strategy_steps} steps, "
                f"a plain step {self.plain_ms:.2f} ms over {self.plain_steps}: {self.ratio:.2f}x; run {self.decided_in})")


@attrs.define(eq=False)
class GateRun:
    """One run's view of the gate (kept in the strategy's ``run.state``)."""

    gate: "PayGate"
    key: Hashable
    phase: str
    """``plain``, ``probe``, ``on`` or ``off``: what the current step does."""
    clock: Callable[[], float]
    plain: list[float] = attrs.Factory(list)
    strategy: list[float] = attrs.Factory(list)
    last: float | None = None
    last_kind: str | None = None
    """How the step that started at ``last`` is counted: ``plain``, ``strategy`` or None (not timed)."""
    steps: int = 0
    first_active: int | None = None
    """The first step (0-based, of this run) the strategy acted at."""

    @property
    def active(self) -> bool:
        """Whether the strategy acts at the current step."""
        return self.phase in ("probe", "on")

    def tick(self, step: int, settled: Callable[[int], bool] | None = None) -> None:
        """At the start of every step (the strategy's ``pre_step``, ``step`` 0-based): times the
        step that ended and moves the phase on. ``settled(first_active)``: whether the strategy is
        past its own start-up at this step (a first full step, a warm-up): steps before are not
        timed as its steps (default: every step after the first it acted at)."""
        now = self.clock()
        if self.last is not None and self.last_kind is not None:
            (self.plain if self.last_kind == "plain" else self.strategy).append(now - self.last)
        g = self.gate
        if self.phase == "plain" and len(self.plain) >= g.plain:
            self.phase = "probe"
        elif self.phase == "probe" and len(self.strategy) >= g.probe:
            verdict = g.judge(self.plain, self.strategy, self.key)
            self.phase = "on" if verdict.on else "off"
        if self.active and self.first_active is None:
            self.first_active = step
        kind = None
        if self.steps > 0:  # the first step (allocations) is not timed
            if not self.active:
                kind = "plain"
            elif (settled(self.first_active) if settled is not None else step > self.first_active):
                kind = "strategy"
        self.last, self.last_kind, self.steps = now, kind, self.steps + 1

    def finish(self) -> Verdict | None:
        """At the run's end: the verdict this run ran under (refined with the whole run's steps
        when it measured both kinds), or None where no timing decided (mode ``on``/``off``)."""
        g = self.gate
        if pinned(g.mode) != "auto":
            return None
        if self.plain and self.strategy and self.phase == "on":
            g.judge(self.plain, self.strategy, self.key, refine=True)
        return g.verdicts.get(self.key)


@attrs.define(eq=False)
class PayGate:
    """One per strategy instance (its verdicts outlive a run). ``start(key)`` at each run's start."""

    mode: str = "auto"
    plain: int = 3
    """Plain steps timed (after the untimed first step)."""
    probe: int = 4
    """Steps with the strategy timed before the verdict."""
    margin: float = 0.0
    """The strategy's steps must be this share faster than plain ones to stay on."""
    clock: Callable[[], float] | None = None
    """Seconds, read at each tick; None: ``step_clock()`` at each run's start."""
    verdicts: dict[Any, Verdict] = attrs.Factory(dict)
    runs: dict[Any, int] = attrs.Factory(dict)
    current: GateRun | None = None
    """The gate of the instance's latest run."""

    def start(self, key: Hashable) -> GateRun:
        """A run's gate: decided already for ``key`` (an earlier run), or plain then probe steps."""
        self.runs[key] = self.runs.get(key, 0) + 1
        clock = self.clock or step_clock()
        mode = pinned(self.mode)
        if mode != "auto":
            self.current = GateRun(self, key, "on" if mode == "on" else "off", clock)
            return self.current
        known = self.verdicts.get(key)
        phase = "plain" if known is None else ("on" if known.on else "off")
        self.current = GateRun(self, key, phase, clock)
        return self.current

    def judge(self, plain: list[float], strategy: list[float], key: Hashable, refine: bool = False) -> Verdict:
        """The verdict on these step times (seconds), remembered for ``key``."""
        p, s = statistics.median(plain), statistics.median(strategy)
        prev = self.verdicts.get(key)
        decided = prev.decided_in if refine and prev is not None else self.runs.get(key, 1)
        v = Verdict(on=s < p * (1.0 - self.margin), plain_ms=p * 1e3, strategy_ms=s * 1e3, plain_steps=len(plain),
                    strategy_steps=len(strategy), decided_in=decided)
        self.verdicts[key] = v
        return v


def describe(name: str, mode: str, verdict: Verdict | None) -> str:
    """The summary line of a run's gate: its verdict, or the fixed mode."""
    if verdict is not None:
        return verdict.line(name)
    how = f"cost_gate = \"{mode}\"" if mode != "auto" else f"{PIN}={pinned(mode)}"
    if pinned(mode) == "on":
        return f"{name} cost gate: on ({how}: not measured)"
    if pinned(mode) == "off":
        return f"{name} cost gate: off, full steps ({how})"
    return f"{name} cost gate: undecided (the run ended before the probe steps)"


__all__ = ["MODES", "PIN", "GateRun", "PayGate", "Verdict", "describe", "pinned", "step_clock"]
