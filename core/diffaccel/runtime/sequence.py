"""The order of a run and of a sampling step, in one place: every adapter drives the hooks through it.

A ``RunSequence`` is one generation's hooks, called in this order::

    run_start          (start: then run.pinned, set by a strategy, is handed to the adapter)
    for each step:
        pre_step        (denoise: the merged plan goes to run.plan)
        whole-step reuse, or the denoiser: each layer through layer_output
        non-finite check and the quality guard (the step again in full, inside bypassed())
        denoiser_output
        commit          (samplers that commit tokens: the union with the schedule)
        post_step       (with a step output built only if a strategy reads steps)
        run.stop        (stopped: the adapter ends the loop)
    finalize
    run_end            (also after an error)

Adapters supply only what is model-specific. Text samplers drive their own loop and call these
methods in order; the diffusers adapters are called from inside a pipeline's loop and call the
same methods from their wrappers (``start`` at the first denoiser call, ``denoise`` per call,
``post_step`` and ``finalize`` from the scheduler's step). What a step computes is a
``StepModel``: ``compute`` runs the denoiser under ``run.plan``, ``reuse`` serves a whole step
again.

The run's counters change in one place, its ``Tally`` (``run.tally``, below): while ``denoise``
computes a step the tally is current (``diffaccel.contract.state.CURRENT_STEP``), and every
``Layer.compute`` called meanwhile, by whoever, adds a computed layer and its positions
(``run.positions_per_layer``, or ``layer.computed_positions`` for a layer that ran on part of
them); ``layer_output`` adds every layer call to ``positions_total`` and counts the calls nothing
computed as skipped; ``skipped`` counts the plan's skips, ``denoise`` the reused steps; strategies
add their cache hits and the layers they ran in part outside ``Layer.compute`` through it. An
adapter only sets ``run.positions_per_layer``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from ..contract.errors import ModelError
from ..contract.state import CURRENT_STEP, MODEL_FAULT, TALLY, Layer, RunState, StepPlan

_HAND_COUNTED: set[type] = set()
"""Layer classes already warned about counting their own computations (one warning each)."""


def _hand_counted(cls: type) -> None:
    if cls in _HAND_COUNTED:
        return
    _HAND_COUNTED.add(cls)
    warnings.warn(f"{cls.__qualname__}.compute adds to run.counters itself; the core counts every computed layer now "
                  "(diffaccel.runtime.sequence.Tally): remove those lines, and for a call computing only some positions "
                  "set self.computed_positions (deprecated, counted once until 0.3.0)", DeprecationWarning, stacklevel=5)


class Tally:
    """The counting of one run (``run.tally``): the one place ``run.counters`` change.

    The accelerators call ``layer`` / ``layer_call`` for each layer call, ``RunSequence`` the rest
    of a step's counts, ``Layer.compute`` (through ``CURRENT_STEP``) ``computed``; strategies call
    ``cache_hits`` and ``computed_outside``."""

    __slots__ = ("run", "core")

    def __init__(self, run: RunState):
        self.run = run
        self.core = 0
        """Layer computations counted here (told apart from a layer counting itself, the old form)."""

    # -- layers ----------------------------------------------------------------------------------
    def layer(self, chain: Callable[[RunState, Layer, Any], Any], layer: Layer, hidden: Any) -> Any:
        """One layer call through ``layer_output``: ``chain(run, layer, hidden)`` gives its output;
        a call that computed nothing (no ``Layer.compute`` counted) is counted as skipped."""
        run = self.run
        counters = run.counters
        computed = counters.layers_computed
        counters.positions_total += run.positions_per_layer
        out = chain(run, layer, hidden)
        if counters.layers_computed == computed:
            counters.layers_skipped += 1
        return out

    def layer_call(self) -> None:
        """A layer call that is computed in full whatever happens (no strategies): its positions."""
        self.run.counters.positions_total += self.run.positions_per_layer

    def computed(self, layer: Layer, compute: Callable[..., Any], hidden: Any, positions: Any) -> Any:
        """``Layer.compute`` while a step computes: ``compute(layer, hidden, positions)``, counted as
        a computed layer over ``run.positions_per_layer`` or ``layer.computed_positions`` positions
        (0: it did not run, not counted); a layer that counted itself (the old form) is left as is."""
        run = self.run
        counters = run.counters
        # the counts made during the call: the core's (a block's inner modules hooked as layers
        # too) and any the layer made itself (the deprecated form)
        before, core = counters.layers_computed, self.core
        layer.computed_positions = None
        out = compute(layer, hidden, positions)
        if counters.layers_computed - before != self.core - core:
            _hand_counted(type(layer))
            return out
        n = layer.computed_positions
        if n is None:
            n = run.positions_per_layer
        if n:  # 0: the layer had no position to compute and did not run
            counters.layers_computed += 1
            counters.positions_computed += n
            self.core += 1
        return out

    def computed_outside(self, positions: int | None = None) -> None:
        """A layer call a strategy answered by running part of the layer itself, outside
        ``Layer.compute`` (a block's tail, ``layer.run_tail``): a computed layer over ``positions``
        (default ``run.positions_per_layer``)."""
        self.unhooked(self.run.positions_per_layer if positions is None else positions)

    def unhooked(self, positions: int) -> None:
        """A layer the adapter computed outside ``layer_output`` and ``Layer.compute``: computed, but
        not a layer call (``positions_total`` counts those)."""
        c = self.run.counters
        c.layers_computed += 1
        c.positions_computed += positions
        self.core += 1

    def skipped(self) -> None:
        """A layer call the step's plan skipped, served without a hook call."""
        c = self.run.counters
        c.positions_total += self.run.positions_per_layer
        c.layers_skipped += 1

    # -- steps and strategies ------------------------------------------------------------------
    def reused_step(self) -> None:
        """A whole step served again without running the denoiser."""
        self.run.counters.steps_reused += 1

    def cache_hits(self, n: int = 1) -> None:
        """``n`` cached values a strategy served."""
        self.run.counters.cache_hits += n


TALLY.append(Tally)  # RunState.tally makes one per run


class NullAccelerator:
    """No strategies, no checks: the untouched path, and what a pipeline without ``apply`` uses.

    It has every method an adapter calls on a ``diffaccel.Accelerator``; each does the least
    (``layer_output`` computes the layer, ``finalize`` takes the adapter's default)."""

    active = False
    commits = False
    watches_steps = False
    strategies: tuple = ()
    adapter = ""

    def run_start(self, run: RunState) -> None:
        pass

    def pre_step(self, run: RunState) -> None:
        return None

    def layer_output(self, run: RunState, layer: Layer, hidden: Any) -> Any:
        run.tally.layer_call()
        return layer.compute(hidden)

    def denoiser_output(self, run: RunState, output: Any) -> Any:
        return output

    def commit(self, run: RunState, proposal: Any) -> None:
        return None

    def post_step(self, run: RunState, output: Any) -> None:
        pass

    def finalize(self, run: RunState, final: Any) -> None:
        final.apply_default()

    def run_end(self, run: RunState) -> None:
        pass

    def output_ok(self, run: RunState, output: Any) -> bool:
        return True

    def guard_due(self, run: RunState) -> bool:
        return False


NULL = NullAccelerator()
"""The one null accelerator (it holds no state)."""


class StepModel:
    """What an adapter supplies for one denoiser evaluation. Subclass it (or give an object with
    the same methods); only ``compute`` is required."""

    def compute(self) -> Any:
        """Run the denoiser for the step under ``run.plan`` (None: in full), each layer or block
        through ``accelerator.layer_output``; return its raw output."""
        raise NotImplementedError

    def reuse(self) -> Any | None:
        """The step's raw output served whole from the last evaluation (``StepPlan.reuse_step``),
        or None when there is none to serve (the denoiser then runs)."""
        return None

    def tensor(self, raw: Any) -> Any:
        """The raw output as one tensor: what the quality guard compares."""
        return raw

    def fresh(self, raw: Any) -> Any:
        """The part of the raw output this evaluation computed: what the non-finite check reads."""
        return self.tensor(raw)

    def output(self, raw: Any) -> Any:
        """What ``denoiser_output`` receives (by default ``tensor(raw)``)."""
        return self.tensor(raw)

    def result(self, raw: Any, output: Any) -> Any:
        """What ``denoise`` returns, from the raw output and the strategies' replacement (default: the latter)."""
        return output


class RunSequence:
    """The hooks of one generation, in order. ``accelerator`` is a ``diffaccel.Accelerator`` or
    the ``NullAccelerator`` (None means the latter)."""

    __slots__ = ("accel", "run", "started")

    def __init__(self, accelerator: Any, run: RunState):
        self.accel = NULL if accelerator is None else accelerator
        self.run = run
        self.started = False

    # -- the run -----------------------------------------------------------------------------
    def start(self) -> Any:
        """``run_start``; returns ``run.pinned`` (tokens a strategy holds fixed, or None)."""
        self.started = True
        self.accel.run_start(self.run)
        return self.run.pinned

    def end(self) -> None:
        """``run_end``, once (also after an error)."""
        if self.started:
            self.started = False
            self.accel.run_end(self.run)

    def __enter__(self) -> "RunSequence":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.end()

    @property
    def stopped(self) -> bool:
        """Whether a strategy set ``run.stop``: the adapter runs no further step and finalises."""
        return self.run.stop

    def finalize(self, final: Any) -> Any:
        """``finalize`` (strategies, then the adapter's default); returns ``final``."""
        self.accel.finalize(self.run, final)
        return final

    # -- a step --------------------------------------------------------------------------------
    def plan(self) -> StepPlan | None:
        """``pre_step``: the strategies' merged plan, also left in ``run.plan``."""
        return self.accel.pre_step(self.run)

    def denoise(self, model: StepModel, planned: bool = True) -> Any:
        """One denoiser evaluation: ``pre_step`` (unless ``planned`` is False: the caller asked
        already), whole-step reuse or the denoiser, the non-finite check and the quality guard
        (the evaluation again in full, without strategies), then ``denoiser_output``.

        A reused step is neither checked nor guarded: its output was when it was computed."""
        accel, run = self.accel, self.run
        plan = accel.pre_step(run) if planned else run.plan
        tally = run.tally
        current = CURRENT_STEP.set(tally)  # the layers computed until reset count in this run
        try:
            raw = model.reuse() if plan is not None and plan.reuse_step else None
            if raw is not None:
                tally.reused_step()
            else:
                raw = self._compute(model)
                guarded = accel.guard_due(run)
                if not accel.output_ok(run, model.fresh(raw)) or guarded:
                    accelerated = model.tensor(raw).clone() if guarded else None
                    with accel.bypassed(run):
                        raw = self._compute(model)
                        accel.output_ok(run, model.tensor(raw))  # raises if the full step is non-finite too
                    if accelerated is not None:
                        accel.guard_compare(run, accelerated, model.tensor(raw))
        finally:
            CURRENT_STEP.reset(current)
        return model.result(raw, accel.denoiser_output(run, model.output(raw)))

    def _compute(self, model: StepModel) -> Any:
        """``model.compute()``; what a layer's own computation raised is the model's fault, one
        line naming the checkpoint and the step (``ModelError``), whoever called ``compute``."""
        try:
            return model.compute()
        except Exception as exc:
            layer = getattr(exc, MODEL_FAULT, None)
            if layer is None or isinstance(exc, ModelError):
                raise
            run = self.run
            raise ModelError(run.info.checkpoint, run.adapter, run.step, layer, exc) from exc

    def skipped(self, layer: Layer) -> None:
        """Count a layer the step's plan skipped (``StepPlan.skip``), served without a hook call."""
        self.run.tally.skipped()

    def computed_unhooked(self, positions: int) -> None:
        """Count one layer the adapter computed outside ``layer_output`` and ``Layer.compute``
        over ``positions`` positions: work no strategy sees (the text adapter's exact prefix
        pass), counted as computed but not in ``positions_total``, which counts layer calls."""
        self.run.tally.unhooked(positions)

    def commit(self, proposal: Callable[[], Any]) -> Any:
        """``commit``: the union of the strategies' masks ((B, N) bool), or None when no strategy
        commits. ``proposal`` builds the adapter's proposal, called only when one does."""
        accel = self.accel
        if not (accel.active and accel.commits):
            return None
        return accel.commit(self.run, proposal())

    @property
    def watched(self) -> bool:
        """Whether a strategy reads each step's output (else ``post_step`` builds nothing)."""
        accel = self.accel
        return accel.active and accel.watches_steps

    def post_step(self, output: Callable[[], Any]) -> None:
        """``post_step`` with the step output ``output()`` builds, called only when a strategy
        reads steps; afterwards its ``close()`` (if any) ends what it computes lazily."""
        if not self.watched:
            return
        out = output()
        try:
            self.accel.post_step(self.run, out)
        finally:
            close = getattr(out, "close", None)
            if close is not None:
                close()
