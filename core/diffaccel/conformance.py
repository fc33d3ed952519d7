"""The adapter conformance suite: one call checks that an adapter drives the hooks as the core
promises. Every shipped adapter runs it in diffaccel's tests; a third-party adapter runs it in
its own::

    from diffaccel.testing import check_adapter

    def test_my_adapter_conforms():
        check_adapter(MyAdapter, MyAdapter.load(config), config)

It uses the public API only (``diffaccel.apply``, strategies with ``@diffaccel.hookimpl``, the
adapter's ``run`` and ``info``) and checks, on the pipeline and config it is given (keep them
small: a few steps, a tiny model):

* ``idle``: a run inside ``apply`` with no strategy, and with a strategy that answers nothing,
  is bitwise the run without ``apply``; after ``apply`` the pipeline is bitwise untouched again;
* ``order``: the hooks come in the contract's order (``run_start``; per step ``pre_step``, the
  layers, ``denoiser_output``, ``post_step``; ``finalize``; ``run_end``), each layer handed over
  is a ``diffaccel.Layer`` named in ``info(pipe)["layers"]``, ``run.step`` counts up from 0 and
  the report's ``steps_run`` is the number of steps;
* ``stop``: a strategy setting ``run.stop`` in ``post_step`` of step 1 ends the run there;
* ``state``: ``run.state(strategy)`` is made once per run (and guidance branch), never shared
  with the next run, and ``run.batch_size`` is the rows of the config's batch;
* ``guards``: a step whose output a strategy poisons with NaN is recomputed without strategies
  (the run's output is then the untouched run's), and ``[guard] every = 1`` compares every step;
* ``report``: the output's ``.report`` is the run's, the one ``apply``'s handle keeps
  (``last_report``), and the core's counters add up: a run whose strategy skips nothing counts
  no skip, every layer call computed in full (``positions_computed == positions_total``), a
  whole number of passes over ``info(pipe)["layers"]`` per step;
* ``commit`` (adapters declaring ``mask-confidences``): a strategy committing every candidate at
  step 0 ends the run in fewer steps than configured;
* ``partial`` (layers with ``supports_positions``): at step 1, each such layer computed on part of
  its positions (a ragged (B, N) mask: different positions in each row) equals the same layer
  computed in full at those positions, to the dtype's tolerance (``PARTIAL_TOLERANCE``), and keeps
  its full output elsewhere; an adapter whose partial path drops a mask (a sliding window) or
  returns something else fails here, though its full runs are right;
* ``facts`` (adapters with ``facts``): ``facts(config)`` agrees with ``info(pipe)`` on ``layers``
  and ``n_layers``, and refuses what ``load`` refuses: for a config naming a checkpoint folder
  that does not exist, and for each config of ``refused`` (configs ``load`` must refuse), both
  raise, with the same line;
* ``name``: the report names the adapter that ran (``report["adapter"] == adapter.name``).

A failure raises ``AssertionError`` naming the check and what differed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import attrs

from .conformance_checks import PARTIAL_TOLERANCE, check_counters, check_facts, check_order, check_partial
from .contract import capabilities as caps
from .runtime.accelerator import apply
from .runtime.guard import GuardConfig
from .runtime.registry import hookimpl

__all__ = ["CHECKS", "PARTIAL_TOLERANCE", "check_adapter", "same_output"]

CHECKS = ("idle", "order", "stop", "state", "guards", "report", "commit", "partial", "facts", "name")
"""Every check ``check_adapter`` runs (``skip`` takes names from here)."""


def _tensors(obj: Any, seen: set[int] | None = None) -> list[Any]:
    """Every tensor in an adapter's output (attrs fields, dataclass-like attributes, sequences),
    in a fixed order, so two outputs compare element by element."""
    import torch

    seen = seen if seen is not None else set()
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in _tensors(x, seen)]
    if isinstance(obj, dict):
        return [t for k in sorted(obj, key=str) for t in _tensors(obj[k], seen)]
    if attrs.has(type(obj)):
        return [t for f in attrs.fields(type(obj)) for t in _tensors(getattr(obj, f.name), seen)]
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        return [t for k in sorted(vars(obj)) for t in _tensors(vars(obj)[k], seen)]
    return []


def same_output(a: Any, b: Any) -> bool:
    """Whether two outputs of an adapter's ``run`` hold bitwise the same tensors (and texts)."""
    import torch

    ta, tb = _tensors(a), _tensors(b)
    if len(ta) != len(tb) or not ta:
        return False
    if getattr(a, "texts", None) != getattr(b, "texts", None):
        return False
    return all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(ta, tb))


class _Quiet:
    """Implements every run hook and answers nothing: the run must be the untouched one."""

    name = "conformance-quiet"

    @hookimpl
    def diffaccel_pre_step(self, run):
        return None

    @hookimpl
    def diffaccel_layer_output(self, run, layer, hidden):
        return None

    @hookimpl
    def diffaccel_denoiser_output(self, run, output):
        return None

    @hookimpl
    def diffaccel_post_step(self, run, output):
        return None


@attrs.define
class _Count:
    made: int = 0


class _Recorder:
    """Records (hook, step) of every run hook, and the layers it was handed."""

    name = "conformance-recorder"

    def __init__(self):
        self.log: list[tuple[str, int]] = []
        self.layers: list[Any] = []
        self.states: list[Any] = []
        self.batch_sizes: list[int] = []

    def _rec(self, hook, run):
        self.log.append((hook, run.step))

    @hookimpl
    def diffaccel_run_start(self, run):
        self._rec("run_start", run)
        self.batch_sizes.append(run.batch_size)

    @hookimpl
    def diffaccel_new_state(self, run):
        return _Count()

    @hookimpl
    def diffaccel_pre_step(self, run):
        self._rec("pre_step", run)
        st = run.state(self)
        st.made += 1
        if st not in self.states:
            self.states.append(st)

    @hookimpl
    def diffaccel_layer_output(self, run, layer, hidden):
        self._rec("layer_output", run)
        self.layers.append(layer)
        return None

    @hookimpl
    def diffaccel_denoiser_output(self, run, output):
        self._rec("denoiser_output", run)

    @hookimpl
    def diffaccel_post_step(self, run, output):
        self._rec("post_step", run)

    @hookimpl
    def diffaccel_finalize(self, run, final):
        self._rec("finalize", run)

    @hookimpl
    def diffaccel_run_end(self, run):
        self._rec("run_end", run)


class _Stopper:
    name = "conformance-stopper"

    def __init__(self):
        self.post_steps: list[int] = []

    @hookimpl
    def diffaccel_post_step(self, run, output):
        self.post_steps.append(run.step)
        if run.step == 1:
            run.stop = True


class _Poison:
    """Poisons the last layer's output with NaN at step 1 (a test of the non-finite check, so it
    computes the layer first: never do this in a strategy)."""

    name = "conformance-poison"

    def __init__(self, last: str):
        self.last = last

    @hookimpl
    def diffaccel_layer_output(self, run, layer, hidden):
        if run.step != 1 or layer.name != self.last:
            return None
        out = layer.compute(hidden)
        return _nan_like(out)


def _nan_like(out: Any) -> Any:
    import torch

    if isinstance(out, torch.Tensor):
        return out * float("nan")
    if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):
        return (out[0] * float("nan"), *out[1:])
    raise AssertionError(f"conformance guards: cannot poison a layer output of type {type(out).__name__}")


class _CommitAll:
    name = "conformance-commit-all"

    @hookimpl
    def diffaccel_commit(self, run, proposal):
        return proposal.candidates


def _fail(check: str, what: str) -> None:
    raise AssertionError(f"adapter conformance, {check}: {what}")


def check_adapter(adapter: Any, pipe: Any, config: Any, *, seed: int = 0, skip: Iterable[str] = (),
                  refused: Iterable[Any] = ()) -> list[str]:
    """Run the conformance checks of ``adapter`` on ``pipe`` loaded for ``config`` (a
    ``RunConfig`` without strategies; keep it small). ``refused``: configs that ``load`` must
    refuse (a model family the adapter cannot run, an option the model does not fit), for the
    ``facts`` check. Returns the checks that ran; raises ``AssertionError`` naming the first
    that failed."""
    skip = set(skip)
    unknown = skip - set(CHECKS)
    if unknown:
        raise ValueError(f"unknown checks {sorted(unknown)}; checks: {', '.join(CHECKS)}")
    cfg = config.without_strategies()
    info = adapter.info(pipe)
    layers = list(info.get("layers", ()))
    offered = set(info.get("capabilities", adapter.capabilities))
    run = _runner(adapter, pipe, cfg, seed)
    plain = run()
    ran: list[str] = []
    if "idle" not in skip:
        _check_idle(run, plain)
        ran.append("idle")
    handed = None  # the layers a recorded run was handed
    if "order" not in skip or "state" not in skip:
        handed = _check_order_and_state(run, plain, layers, cfg, skip, ran)
    if "stop" not in skip:
        _check_stop(run)
        ran.append("stop")
    if "guards" not in skip and layers:
        _check_guards(run, plain, layers)
        ran.append("guards")
    if "report" not in skip:
        _check_report(adapter, pipe, cfg, seed, layers)
        ran.append("report")
    if "commit" not in skip and caps.MASK_CONFIDENCES in offered:
        out = run(strategies=[_CommitAll()])
        if out.report["steps_run"] >= plain.report["steps_run"]:
            _fail("commit", f"committing every candidate at step 0 still took {out.report['steps_run']} steps")
        ran.append("commit")
    if "partial" not in skip and any(getattr(layer, "supports_positions", False)
                                      for layer in (handed if handed is not None else _layers_of(run))):
        check_partial(run, layers)
        ran.append("partial")
    if "facts" not in skip and callable(getattr(adapter, "facts", None)):
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory() as where:
            check_facts(adapter, cfg, info, list(refused), Path(where))
        ran.append("facts")
    if "name" not in skip:
        if plain.report.get("adapter") != adapter.name:
            _fail("name", f"the report names adapter {plain.report.get('adapter')!r}, but {adapter.name!r} ran: "
                          "RunState(adapter=...) must be the adapter's name")
        ran.append("name")
    return ran


def _runner(adapter: Any, pipe: Any, cfg: Any, seed: int) -> Callable[..., Any]:
    """``run(strategies=None, guard=None)``: one run of ``cfg``, inside ``apply`` when given either."""
    def run(strategies=None, guard=None):
        if strategies is None and guard is None:
            return adapter.run(pipe, cfg, seed, progress=False)
        c = attrs.evolve(cfg, guard=guard) if guard is not None else cfg
        with apply(pipe, c if guard is not None else None, strategies=list(strategies or [])):
            return adapter.run(pipe, c, seed, progress=False)

    return run


def _check_idle(run: Callable[..., Any], plain: Any) -> None:
    if not same_output(plain, run(strategies=[])):
        _fail("idle", "a run inside apply() with no strategy differs from the run without apply()")
    if not same_output(plain, run(strategies=[_Quiet()])):
        _fail("idle", "a strategy that answers every hook with None changed the output")
    if not same_output(plain, run()):
        _fail("idle", "after apply() the pipeline does not give its untouched output again")


def _check_order_and_state(run: Callable[..., Any], plain: Any, layers: list[str], cfg: Any, skip: set[str],
                           ran: list[str]) -> list[Any]:
    """``order`` and ``state`` (those not skipped, added to ``ran``); returns the layers a recorded run was handed."""
    rec = _Recorder()
    out = run(strategies=[rec])
    if "order" not in skip:
        if not same_output(plain, out):
            _fail("order", "a strategy that only records hooks changed the output")
        check_order(rec.log, out.report["steps_run"], rec.layers, layers)
        ran.append("order")
    if "state" not in skip:
        rec2 = _Recorder()
        run(strategies=[rec2])
        run(strategies=[rec2])
        if len(rec2.states) < 2 or rec2.states[0] is rec2.states[-1]:
            _fail("state", "two runs shared one strategy state: run.state() must make a new one per run")
        if len({id(s) for s in rec2.states}) != len(rec2.states):
            _fail("state", "a state object came back in a later run")
        if rec2.batch_sizes[0] != cfg.model.batch:
            _fail("state", f"run.batch_size is {rec2.batch_sizes[0]}, the config's batch is {cfg.model.batch}")
        ran.append("state")
    return rec.layers


def _check_stop(run: Callable[..., Any]) -> None:
    stopper = _Stopper()
    out = run(strategies=[stopper])
    if out.report["steps_run"] != 2 or stopper.post_steps != [0, 1]:
        _fail("stop", f"run.stop set at step 1 must end the run there (steps_run 2); got steps_run "
                      f"{out.report['steps_run']}, post_step at {stopper.post_steps}")


def _check_guards(run: Callable[..., Any], plain: Any, layers: list[str]) -> None:
    out = run(strategies=[_Poison(layers[-1])])
    rel = out.report.get("reliability") or {}
    if not rel.get("nonfinite_recomputed"):
        _fail("guards", "a step whose output held NaN was not recomputed without strategies")
    if not same_output(plain, out):
        _fail("guards", "after the poisoned step was recomputed in full the output differs from the untouched run's")
    out = run(strategies=[_Quiet()], guard=GuardConfig(every=1))
    rel = out.report.get("reliability") or {}
    if rel.get("guard_checks") != out.report["steps_run"]:
        _fail("guards", f"[guard] every = 1 compared {rel.get('guard_checks')} steps of {out.report['steps_run']}")


def _check_report(adapter: Any, pipe: Any, cfg: Any, seed: int, layers: list[str]) -> None:
    handle = apply(pipe, strategies=[_Quiet()])
    with handle:
        out = adapter.run(pipe, cfg, seed, progress=False)
    if handle.last_report is None or handle.last_report != out.report:
        _fail("report", "the output's report is not the run's (apply(...).last_report): build it with RunState.report() "
                        "after the run ends")
    check_counters(out.report["counters"], out.report["steps_run"], layers)


def _layers_of(run) -> list[Any]:
    """The layers one run with a recording strategy is handed."""
    rec = _Recorder()
    run(strategies=[rec])
    return rec.layers
