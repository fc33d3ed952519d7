"""Every hook of diffaccel, in the order a run calls them.

Plugin modules (found through the ``diffaccel`` entry-point group) implement
``diffaccel_register`` to declare strategies. A strategy *instance*, built from one
``[[strategy]]`` table, implements any of the run hooks below; the core calls the instances in
the order the config lists them, then the built-in default behaviour (``diffaccel.builtin``),
which is itself a plain plugin with ``trylast`` implementations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from .plugins import Strategy
    from .state import Layer, RunState, StepPlan

hookspec = pluggy.HookspecMarker("diffaccel")


@hookspec
def diffaccel_register(register: Callable[["Strategy"], None]) -> None:
    """Called once per plugin when plugins are loaded.

    Call ``register(Strategy(name=..., config=..., factory=..., adapters=...))`` for each strategy
    the plugin offers. Returns nothing.
    """


@hookspec
def diffaccel_run_start(run: "RunState") -> None:
    """Called once at the start of every generation, before the first step, with a fresh
    ``RunState``. Strategies clear caches here. Returns nothing."""


@hookspec
def diffaccel_pre_step(run: "RunState") -> "StepPlan | None":
    """Called before the denoiser runs at each step (``run.step``, ``run.timestep`` are set).

    Return a ``StepPlan`` to narrow what is computed at this step (text positions, UNet blocks
    that may be skipped) or to declare the whole step reusable; return None to leave the step
    alone. The plans of all strategies merge (``StepPlan.merge``) into ``run.plan``.
    """


@hookspec(firstresult=True)
def diffaccel_layer_output(run: "RunState", layer: "Layer", hidden: Any) -> Any:
    """Asked for the output of one layer or block, before it runs.

    ``hidden`` is the layer's input (text: hidden states (batch, length, dim); UNet: a dict of
    the block's arguments). The first non-None answer wins, in config order:

    * return a cached output without calling ``layer.compute``: the layer is skipped;
    * return ``layer.compute(hidden, positions=mask)``: the layer runs on those positions only
      ((batch, length) bool; a (batch, m) long index is accepted too) and its cached outputs fill
      the rest (text adapters). Where the last layer did not run, the head does not either: the
      logits there stay as they were;
    * return None to let the next strategy, and finally the built-in default, decide. The
      default computes the layer in full.

    Computing the layer and then replacing its output saves nothing: don't.
    Called on the hot path, once per layer per step: the core resolves the implementations once
    per ``apply``, not through the plugin manager on every call.
    """


@hookspec
def diffaccel_denoiser_output(run: "RunState", output: Any) -> Any:
    """Called after the denoiser ran at a step, before the sampler uses its output.

    Text: ``output`` is the logits (batch, length, vocab); images: the noise prediction. Return
    a replacement (truncated logits, a guided prediction) or None to keep it. Implementations
    run in config order, each receiving the previous one's result. The adapter's caches keep the
    denoiser's raw output; only the sampler and ``post_step`` see the replacement.
    """


@hookspec
def diffaccel_commit(run: "RunState", proposal: Any) -> Any:
    """Called by the masked sampler at each step, after the draws: which positions to commit
    beyond the schedule.

    ``proposal`` (text: a ``CommitProposal``) holds the step's ``candidates`` (B, N) bool (masked
    positions of each row's current semi-autoregressive block), the drawn ``tokens`` and their
    ``confidence`` (B, N), the logits the sampler drew from, and ``scheduled`` (B, N) bool: what
    the sampler commits on its own (each row's most confident, as many as its step schedule
    says). Return a (B, N) bool mask of positions to commit, or None.

    Merge rule: the sampler commits the union (OR) of ``scheduled`` and every strategy's answer,
    within the candidates. A strategy can add commits, never withhold the schedule's, so a run
    never takes more steps than configured; a row whose block is committed moves to its next
    block at once, and a row with nothing left masked is no longer computed.
    """


@hookspec
def diffaccel_post_step(run: "RunState", output: Any) -> None:
    """Called after each step with what it produced.

    Text: a ``TextStepOutput`` (current tokens, per-position top-1 token and its probability,
    full probabilities when a strategy asked for them). Images: a ``UNetStepOutput`` (latents
    and the noise prediction). Returns nothing; strategies update their state.
    """


@hookspec
def diffaccel_finalize(run: "RunState", final: Any) -> None:
    """Called once after the last step, in config order, before the built-in default.

    ``final`` holds the final state (text: ``logits`` and ``tokens``, tokens still None unless a
    strategy chose them; the default takes the argmax). Strategies may set the result and add
    metrics to ``run.metrics[their name]``. Returns nothing.
    """


@hookspec
def diffaccel_run_end(run: "RunState") -> None:
    """Called once when the generation ends, also after an error. Release per-run memory."""
