"""The whole strategy contract: every hook the core calls, in the order a run calls them.

Plugin modules (found through the ``diffaccel`` entry-point group) implement
``diffaccel_register`` to declare strategies. A strategy *instance*, built from one
``[[strategy]]`` table, implements any of the other hooks, each a method marked
``@diffaccel.hookimpl`` and named exactly as below (``diffaccel plugins --check`` and every run
refuse a ``diffaccel_*`` method that is not one of them). Nothing else of a strategy is called.

Who calls what:

* ``load_config`` / ``diffaccel check``: ``diffaccel_register`` (when plugins load) and the
  strategy's config class; the strategy's ``requires`` against the adapter's capabilities.
* ``build_strategies`` (``apply``, ``generate``, ``bench``): ``diffaccel_setup`` on each strategy.
* ``apply`` / ``run_with``: the adapter attaches; adapters with inner modules ask
  ``diffaccel_hooked_modules``. Then each generation: ``diffaccel_run_start``, per step
  ``diffaccel_pre_step``, per layer ``diffaccel_layer_output``, ``diffaccel_denoiser_output``,
  ``diffaccel_post_step``; then ``diffaccel_finalize`` and ``diffaccel_run_end``.
  ``diffaccel_new_state`` runs the first time a strategy calls ``run.state(self)`` in a branch.
* ``diffaccel bench``: ``diffaccel_bench_quality`` and ``diffaccel_bench_plot`` after the runs.
* ``diffaccel tune``: ``diffaccel_tunables`` on the plugin of each strategy of the config.

Hooks marked *per strategy* are called on one strategy at a time (its own result is used);
the others run over every strategy of the config, in config order, then the built-in default
(``diffaccel.builtin``), a plain plugin with ``trylast`` implementations.

Exceptions: a ``ConfigValueError`` from ``diffaccel_setup`` becomes a one-line ``ConfigError``
naming the config file and strategy; a ``DiffaccelError`` (or subclass) raised by any hook ends
the generation (``diffaccel_run_end`` still runs) and reaches the CLI user as one line, exit 2.
Any other exception raised in a strategy's implementation of any hook is a fault of that
strategy: it becomes a ``diffaccel.StrategyError`` naming the strategy, its distribution and
version, the hook and the step (the original as ``__cause__``; the CLI prints one line and exits
1, with the traceback under ``--debug``), or, when the strategy's table says
``on_error = "disable"``, the strategy is dropped for the rest of the generation and the run
report lists it under ``reliability``. Either way ``apply`` removes every hook on the way out.
An exception raised outside every strategy (the model, the adapter) propagates as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from .plugins import Strategy
    from .search import Tunable
    from .state import Layer, RunState, StepPlan

hookspec = pluggy.HookspecMarker("diffaccel")


@hookspec
def diffaccel_register(register: Callable[["Strategy"], None]) -> None:
    """Called once per plugin module when plugins are loaded (module level, not per strategy).

    Call ``register(Strategy(name=..., config=..., factory=..., requires=...))`` for each strategy
    the plugin offers; ``requires`` lists capabilities (``diffaccel.capabilities``), a tuple of
    alternatives standing for any one of them. Returns nothing.
    """


@hookspec
def diffaccel_setup(info: dict[str, Any]) -> None:
    """Per strategy, once, when it is built against a loaded model (before any run).

    ``info`` is the adapter's ``info(pipe)``: ``n_layers``, ``layers``, ``capabilities`` and
    model facts such as ``vocab_size``. Reject values that depend on the model by raising
    ``ConfigValueError(key, message)``; the core adds the file and strategy. Returns nothing.
    """


@hookspec
def diffaccel_hooked_modules(available: list[str]) -> list[str]:
    """Adapters declaring ``inner-modules``, when the strategies attach: the names among
    ``available`` (modules inside blocks) this strategy wants routed through
    ``diffaccel_layer_output`` too. Merge: the union of every strategy's lists, in config order;
    a name not in ``available`` is a ``ConfigError`` naming the strategy.
    """


@hookspec
def diffaccel_run_start(run: "RunState") -> None:
    """Called once at the start of every generation, before the first step, with a fresh
    ``RunState``. Strategies check run facts (``run.info``), set ``run.pinned`` or
    ``run.condition``. Every strategy is called; returns nothing."""


@hookspec(firstresult=True)
def diffaccel_new_state(run: "RunState") -> Any:
    """Per strategy: the strategy's own per-run state, an instance of an attrs class it defines,
    created the first time it calls ``run.state(self)`` in a generation and guidance branch
    (``run.branch``). Tensors in it keep a leading batch dimension. Returns the new state.
    """


@hookspec
def diffaccel_pre_step(run: "RunState") -> "StepPlan | None":
    """Called before the denoiser runs at each step (``run.step``, ``run.timestep`` are set).

    Return a ``StepPlan`` to narrow what is computed at this step (token positions, blocks that
    may be skipped) or to declare the whole step reusable; return None to leave the step alone.
    Merge: the plans of all strategies merge (``StepPlan.merge``: positions OR-ed, only blocks
    every plan skips are skipped, a step is reused only if every plan says so) into ``run.plan``.
    """


@hookspec(firstresult=True)
def diffaccel_layer_output(run: "RunState", layer: "Layer", hidden: Any) -> Any:
    """Asked for the output of one layer or block, before it runs.

    ``hidden`` is the layer's input (the adapter's layer objects say what it is: hidden states
    (B, N, D) for token layers, a dict of the block's arguments for UNet blocks). First result
    wins, in config order:

    * return a cached output (``layer.cached_output``) without calling ``layer.compute``: the
      layer is skipped;
    * return ``layer.compute(hidden, positions=mask)`` (``token-positions``): the layer runs on
      those positions only ((B, N) bool) and its cached outputs fill the rest. Where the last
      layer did not run, the head does not either: the logits there stay as they were;
    * return None to let the next strategy, and finally the built-in default, decide. The
      default computes the layer in full.

    Computing the layer and then replacing its output saves nothing: don't.
    Called on the hot path, once per layer per step: the core resolves the implementations once
    per ``apply``, not through the plugin manager on every call.
    """


@hookspec
def diffaccel_denoiser_output(run: "RunState", output: Any) -> Any:
    """Called after the denoiser ran at a step, before the sampler uses its output.

    ``token-logits``: the logits (B, N, V); images: the noise prediction. Return a replacement
    (truncated logits, a guided prediction) or None to keep it. Merge: a chain in config order,
    each implementation receiving the previous one's result. The adapter's caches keep the
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
    """Called after each step with what it produced, every strategy in config order.

    ``token-positions``: a step output with current ``tokens``, per-position ``top1`` and
    ``top1_prob``, ``logits``, ``computed`` (and ``masked`` with ``mask-confidences``,
    ``latents`` for continuous samplers). ``spatial-features``: ``latents``, ``noise_pred`` and
    ``pred_original``. Returns nothing; strategies update their state and may set ``run.stop``.
    """


@hookspec
def diffaccel_finalize(run: "RunState", final: Any) -> None:
    """Called once after the last step, every strategy in config order, then the built-in default.

    ``final`` holds the final state (``token-logits``: ``logits`` and ``tokens``, tokens still
    None unless a strategy chose them; the default takes the argmax. Images: ``latents``).
    Strategies may set the result and add what they report to ``run.metrics[self.name]`` (it
    appears in the run's report under ``strategies``). Returns nothing.
    """


@hookspec
def diffaccel_run_end(run: "RunState") -> None:
    """Called once when the generation ends, also after an error, every strategy. Release
    per-run memory. Returns nothing."""


@hookspec
def diffaccel_bench_quality(outputs: list[Any], seeds: list[int]) -> dict[str, float]:
    """Per strategy, ``diffaccel bench`` only: quality keys of the strategy's own, scored on any
    entry's outputs (``outputs[i]`` is the run of ``seeds[i]``). The strategy's entry gets its
    keys; the baseline gets them too (the first strategy offering a key wins), so the measure
    sits beside the unaccelerated run of the same seeds. Returns a dict (may be empty).
    """


@hookspec
def diffaccel_bench_plot(reports: list[dict[str, Any]], path: Any) -> None:
    """Per strategy, ``diffaccel bench --plots DIR`` only: draw a figure from the entry's run
    reports (``RunState.report()`` per seed) into ``path`` (a PNG path). Returns nothing."""


@hookspec(firstresult=True)
def diffaccel_tunables(strategy: str) -> "list[Tunable] | None":
    """Per plugin (on the plugin module, like ``diffaccel_register``), ``diffaccel tune`` only:
    the parameters of strategy ``strategy`` (a name this plugin registered) that ``tune`` may set,
    as ``diffaccel.Tunable`` objects (a config key and its range: ``low``/``high`` with ``log``
    and ``integer``, or ``choices``). Called once per strategy of the config being tuned, on the
    plugin that registered it. Return None (or an empty list) when ``tune`` should leave the
    strategy's settings as written; it may still switch the strategy off. Every value must be one
    the strategy's config class accepts. Merge: the registering plugin's answer only.
    """
