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
  ``diffaccel_commit`` (text samplers, after their draws), ``diffaccel_post_step``; then
  ``diffaccel_finalize``, ``diffaccel_memory`` (per strategy) and ``diffaccel_run_end``.
  ``diffaccel_new_state`` runs the first time a strategy calls ``run.state(self)`` in a branch.
* ``diffaccel bench``: ``diffaccel_bench_quality`` and ``diffaccel_bench_plot`` after the runs.
* ``diffaccel tune``: ``diffaccel_tunables`` on the plugin of each strategy of the config.
* the command line, given a command that a distribution declares (entry-point group
  ``diffaccel.commands``): that declaration's ``diffaccel_register_commands``, once per process;
  ``diffaccel plugins --check`` calls every plugin's and adapter's.

Each hook's merge rule is declared once, here, with ``@contract(...)`` (``RULES``: first result,
collected list, pipe, union, each with wrappers, per strategy), and the core's dispatcher is
built from that data. Hooks marked *per strategy* are called on one strategy at a time (its own
result is used); the others run over every strategy of the config, in config order
(``tryfirst`` / ``trylast`` respected), then the built-in default (``diffaccel.runtime.builtin``), a
plain plugin with ``trylast`` implementations. The order of a run's hooks is the core's step
sequence (``diffaccel.runtime.sequence``), the same on every adapter.

Exceptions: a ``ConfigValueError`` from ``diffaccel_setup`` becomes a one-line ``ConfigError``
naming the config file and strategy; a ``DiffaccelError`` (or subclass) raised by any hook ends
the generation (``diffaccel_run_end`` still runs) and reaches the CLI user as one line, exit 2.
Any other exception raised in a strategy's implementation of any hook is a fault of that
strategy: it becomes a ``diffaccel.StrategyError`` naming the strategy, its distribution and
version, the hook and the step (the original as ``__cause__``; the CLI prints one line and exits
1, with the traceback under ``--debug``), or, when the strategy's table says
``on_error = "disable"``, the strategy is dropped for the rest of the generation and the run
report lists it under ``reliability``. Either way ``apply`` removes every hook on the way out.
Blame is decided at the call site: an exception raised by the model's own computation (inside
``layer.compute``, an out-of-memory for instance) is the model's even when a strategy's hook
called ``compute``: a ``diffaccel.ModelError`` naming the checkpoint, the step and the layer
(one line, exit 1), never a StrategyError, and ``on_error = "disable"`` does not drop the
strategy. An exception raised outside every strategy and layer (the adapter) propagates as it is.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import attrs
import pluggy

hookspec = pluggy.HookspecMarker("diffaccel")
hookimpl = pluggy.HookimplMarker("diffaccel")
"""Marks a strategy's method as the implementation of the hook it is named after
(``@diffaccel.hookimpl``; ``wrapper=True`` where the hook's rule allows wrappers)."""

# ---- merge rules: how the results of several implementations combine -----------------------------
FIRST = "first"
"""The first non-None result, in config order, then the built-in default; later ones are not called."""
COLLECT = "collect"
"""Every implementation is called in config order; the non-None results, as a list."""
PIPE = "pipe"
"""A chain in config order: each implementation gets the previous one's result in place of the
hook's last argument (None keeps it); the last result is the hook's."""
UNION = "union"
"""Every implementation is called; the non-None results are OR-ed (None when there is none)."""
EACH = "each"
"""Every implementation is called in config order, then the built-in default; results are ignored.
Wrappers (``@hookimpl(wrapper=True)``: a generator that yields once) run around the others."""
OWN = "own"
"""Per strategy: called on one strategy at a time; its own result is used."""
MODULE = "module"
"""Per plugin module, not per strategy (when plugins load)."""


@attrs.frozen
class Rule:
    """How the core calls one hook: the contract's data, which the dispatcher is built from."""

    name: str
    args: tuple[str, ...]
    """The hook's arguments, in order (an implementation may take any subset, by name)."""
    merge: str
    """FIRST, COLLECT, PIPE, UNION, EACH, OWN or MODULE."""
    hot: bool = False
    """Called once per layer per step: its implementations are resolved into a plain list once
    per run (no per-call lookup)."""

    @property
    def wrappers(self) -> bool:
        """Whether implementations may wrap the others (``wrapper=True``)."""
        return self.merge == EACH

    def describe(self) -> str:
        return {FIRST: "first non-None result wins, in config order", COLLECT: "every implementation is called, in "
                "config order; the results are collected", PIPE: "a chain in config order, each receiving the previous "
                "result", UNION: "every implementation is called; the answers are OR-ed", EACH: "every implementation is "
                "called, in config order (wrappers allowed)", OWN: "called on one strategy at a time; its own result is used",
                MODULE: "called once per plugin module"}[self.merge]


RULES: dict[str, Rule] = {}
"""Hook name -> its ``Rule``, in the order a run calls them."""


def contract(merge: str, *, hot: bool = False, firstresult: bool = False) -> Callable[[Callable], Callable]:
    """Declare a hook: its merge rule becomes data (``RULES``) and pluggy's hookspec (``firstresult``:
    a per-module hook whose plugin manager call returns the first answer)."""

    def mark(fn: Callable) -> Callable:
        RULES[fn.__name__] = Rule(fn.__name__, tuple(inspect.signature(fn).parameters), merge, hot)
        return hookspec(firstresult=firstresult or merge in (FIRST, OWN))(fn)

    return mark


RUN_HOOKS = ("diffaccel_run_start", "diffaccel_pre_step", "diffaccel_layer_output", "diffaccel_denoiser_output",
             "diffaccel_commit", "diffaccel_post_step", "diffaccel_finalize", "diffaccel_run_end")
"""The hooks a run calls on every strategy of the config (``diffaccel.Accelerator``)."""


@attrs.frozen
class Impl:
    """One implementation of a hook on one plugin object, bound for a positional call in the hook's
    argument order."""

    owner: str
    """The strategy's name (or the plugin's)."""
    call: Callable[..., Any]
    wrapper: bool = False
    order: int = 1
    """0: ``tryfirst``, 1: normal, 2: ``trylast``."""


def implementation(obj: Any, hook: str, owner: str = "") -> Impl | None:
    """The implementation of ``hook`` on ``obj`` (a method marked ``@hookimpl`` under the hook's
    name), bound to the hook's argument order, or None."""
    fn = getattr(obj, hook, None)
    opts = getattr(fn, "diffaccel_impl", None)
    if opts is None:
        return None
    names = tuple(inspect.signature(fn).parameters)
    order = RULES[hook].args
    call = fn
    if names != order:  # an implementation may take a subset of the arguments, by name
        idx = tuple(order.index(n) for n in names)
        call = (lambda *a: fn(*[a[i] for i in idx]))
    return Impl(owner or getattr(obj, "name", ""), call, bool(opts.get("wrapper")),
                0 if opts.get("tryfirst") else 2 if opts.get("trylast") else 1)


def own(obj: Any, hook: str) -> Callable[..., Any] | None:
    """``obj``'s implementation of a per-strategy hook, to call with the hook's arguments by
    keyword or in order; None when it has none."""
    impl = implementation(obj, hook)
    if impl is None:
        return None
    args = RULES[hook].args

    def call(*a: Any, **kw: Any) -> Any:
        return impl.call(*a, *[kw[n] for n in args[len(a):]])

    return call


@contract(MODULE)
def diffaccel_register(register: Callable[[Any], None]) -> None:
    """Called once per plugin module when plugins are loaded (module level, not per strategy).

    Call ``register(Strategy(name=..., config=..., factory=..., requires=...))`` for each strategy
    the plugin offers; ``requires`` lists capabilities (``diffaccel.contract.capabilities``), a tuple of
    alternatives standing for any one of them. Returns nothing.
    """


@contract(OWN)
def diffaccel_setup(info: dict[str, Any]) -> None:
    """Per strategy, once, when it is built against a loaded model (before any run).

    ``info`` is the adapter's ``info(pipe)``: ``n_layers``, ``layers``, ``capabilities`` and
    model facts such as ``vocab_size``. Reject values that depend on the model by raising
    ``ConfigValueError(key, message)``; the core adds the file and strategy. Returns nothing.
    """


@contract(OWN)
def diffaccel_hooked_modules(available: list[str]) -> list[str]:
    """Adapters declaring ``inner-modules``, when the strategies attach: the names among
    ``available`` (modules inside blocks) this strategy wants routed through
    ``diffaccel_layer_output`` too. Merge: the union of every strategy's lists, in config order;
    a name not in ``available`` is a ``ConfigError`` naming the strategy.
    """


@contract(EACH)
def diffaccel_run_start(run: "RunState") -> None:
    """Called once at the start of every generation, before the first step, with a fresh
    ``RunState``. Strategies check run facts (``run.info``), set ``run.pinned`` or
    ``run.condition``. Every strategy is called; returns nothing."""


@contract(OWN)
def diffaccel_new_state(run: "RunState") -> Any:
    """Per strategy: the strategy's own per-run state, an instance of an attrs class it defines,
    created the first time it calls ``run.state(self)`` in a generation and guidance branch
    (``run.branch``). Tensors in it keep a leading batch dimension. Returns the new state.
    """


@contract(COLLECT)
def diffaccel_pre_step(run: "RunState") -> "StepPlan | None":
    """Called before the denoiser runs at each step (``run.step``, ``run.timestep`` are set).

    Return a ``StepPlan`` to narrow what is computed at this step (token positions, blocks that
    may be skipped) or to declare the whole step reusable; return None to leave the step alone.
    Merge: the plans of all strategies merge (``StepPlan.merge``: positions OR-ed, only blocks
    every plan skips are skipped, a step is reused only if every plan says so) into ``run.plan``.
    """


@contract(FIRST, hot=True)
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


@contract(PIPE)
def diffaccel_denoiser_output(run: "RunState", output: Any) -> Any:
    """Called after the denoiser ran at a step, before the sampler uses its output.

    ``token-logits``: the logits (B, N, V); images: the noise prediction. Return a replacement
    (truncated logits, a guided prediction) or None to keep it. Merge: a chain in config order,
    each implementation receiving the previous one's result. The adapter's caches keep the
    denoiser's raw output; only the sampler and ``post_step`` see the replacement.
    """


@contract(UNION)
def diffaccel_commit(run: "RunState", proposal: Any) -> Any:
    """Called by every text sampler at each step, after its draws: which positions to commit
    beyond the schedule (asked only when some strategy implements it).

    ``proposal`` (text: a ``CommitProposal``) holds the step's ``candidates`` (B, N) bool, the
    drawn ``tokens`` and their ``confidence`` (B, N), the logits the sampler drew from, and
    ``scheduled`` (B, N) bool: what the sampler commits on its own. Masked sampler: candidates
    are the masked positions of each row's current semi-autoregressive block, scheduled each
    row's most confident (as many as its step schedule says). Continuous samplers and
    DiffusionGemma's block sampler: candidates are the positions not yet committed (in the active
    canvas, rows still denoising), tokens their top-1, and scheduled is empty. Return a (B, N)
    bool mask of positions to commit, or None.

    Merge rule: the sampler commits the union (OR) of ``scheduled`` and every strategy's answer,
    within the candidates. A strategy can add commits, never withhold the schedule's, so a run
    never takes more steps than configured. Masked: a row whose block is committed moves to its
    next block at once, and a row with nothing left masked is no longer computed. Continuous: a
    committed position is a known token from then on (its latent follows the forward process of
    that token, like the prompt's). Block sampler: it keeps its token for the rest of the block.
    """


@contract(EACH)
def diffaccel_post_step(run: "RunState", output: Any) -> None:
    """Called after each step with what it produced, every strategy in config order.

    ``token-positions``: a step output with current ``tokens``, per-position ``top1`` and
    ``top1_prob``, ``logits``, ``computed`` (and ``masked`` with ``mask-confidences``,
    ``latents`` for continuous samplers). ``spatial-features``: ``latents``, ``noise_pred`` and
    ``pred_original``. Returns nothing; strategies update their state and may set ``run.stop``:
    the core's step sequence (``diffaccel.runtime.sequence``) then ends the run after this step on every
    adapter. Text samplers finalise with what they have (masked positions left are filled by
    finalize); DiffusionGemma's block sampler ends the active block (the model's own early exit)
    and goes on with the next; UNet and DiT finalise at once from the scheduler's clean estimate
    of this step (``pred_original``, else its latents), ``run_end`` runs, and the pipeline's
    remaining steps compute nothing. Strategies that read no step output never make an adapter
    build one (the text top-1 is computed on first read).
    """


@contract(EACH)
def diffaccel_finalize(run: "RunState", final: Any) -> None:
    """Called once after the last step, every strategy in config order, then the built-in default.

    ``final`` holds the final state (``token-logits``: ``logits`` and ``tokens``, tokens still
    None unless a strategy chose them; the default takes the argmax. Images: ``latents``).
    Strategies may set the result and add what they report to ``run.metrics[self.name]`` (it
    appears in the run's report under ``strategies``). Returns nothing.
    """


@contract(OWN)
def diffaccel_memory(run: "RunState") -> "int | None":
    """Per strategy, once per generation, after ``diffaccel_finalize`` and before
    ``diffaccel_run_end`` releases per-run memory: the bytes this strategy holds for the run
    beyond the model's own (caches, anchors, every guidance branch), on whatever device they
    live. Return None (or implement nothing) to let the core count the tensors in the strategy's
    ``run.state`` states, each storage once (``diffaccel.runtime.memory.state_bytes``); implement it when
    the strategy holds memory elsewhere or pre-allocates beyond what it uses. Merge: the
    strategy's own answer; the run report lists each under ``memory.state_bytes`` and ``bench``
    reports the largest over its seeds (``state_mb``).
    """


@contract(EACH)
def diffaccel_run_end(run: "RunState") -> None:
    """Called once when the generation ends, also after an error, every strategy. Release
    per-run memory. Returns nothing."""


@contract(OWN)
def diffaccel_bench_quality(outputs: list[Any], seeds: list[int]) -> dict[str, float]:
    """Per strategy, ``diffaccel bench`` only: quality keys of the strategy's own, scored on any
    entry's outputs (``outputs[i]`` is the run of ``seeds[i]``). The strategy's entry gets its
    keys; the baseline gets them too (the first strategy offering a key wins), so the measure
    sits beside the unaccelerated run of the same seeds. Returns a dict (may be empty).
    """


@contract(OWN)
def diffaccel_bench_plot(reports: list[dict[str, Any]], path: Any) -> None:
    """Per strategy, ``diffaccel bench --plots DIR`` only: draw a figure from the entry's run
    reports (``RunState.report()`` per seed) into ``path`` (a PNG path). Returns nothing."""


@contract(MODULE, firstresult=True)
def diffaccel_tunables(strategy: str) -> "list[Tunable] | None":
    """Per plugin (on the plugin module, like ``diffaccel_register``), ``diffaccel tune`` only:
    the parameters of strategy ``strategy`` (a name this plugin registered) that ``tune`` may set,
    as ``diffaccel.Tunable`` objects (a config key and its range: ``low``/``high`` with ``log``
    and ``integer``, or ``choices``). Called once per strategy of the config being tuned, on the
    plugin that registered it. Return None (or an empty list) when ``tune`` should leave the
    strategy's settings as written; it may still switch the strategy off. Every value must be one
    the strategy's config class accepts. Merge: the registering plugin's answer only.
    """


# ---- the command line ---------------------------------------------------------------------

@contract(MODULE)
def diffaccel_register_commands(commands: Any) -> None:
    """Called by the ``diffaccel`` command line, once per process, when the command it was given
    is a registered one: on the registration its distribution declares for that command (entry
    point ``NAME = "module:diffaccel_register_commands"`` in group ``diffaccel.commands``,
    ``train.NAME`` for ``diffaccel train NAME``), which alone is imported; ``diffaccel --help``
    lists the declared names from the metadata without calling it, and a command declared nowhere
    is unknown. ``diffaccel plugins --check`` calls it on every plugin module of the ``diffaccel``
    group and every adapter (group ``diffaccel.adapters``) that has the attribute, and reports
    commands added but not declared. Add subcommands with ``commands.add(name,
    help=..., run=..., arguments=..., examples=..., group=None, precheck=None)`` (a
    ``diffaccel.cli.commands.Commands``; ``precheck(args)`` runs before ``run``).
    ``group="train"`` makes it ``diffaccel train NAME`` (how adapters offer training). The core
    registers its own commands the same way (``diffaccel.cli.commands``). A plugin's command imports only the core (``diffaccel``), never an
    adapter or another plugin.

    Returns nothing. Merge rule: every registration is called on its own, plugins in
    registration order, then adapters by name; each name is taken once (core commands first),
    and a registration that raises or takes a taken name is left out whole, reported as one
    warning line naming the plugin or adapter, while every other command still works.
    """
