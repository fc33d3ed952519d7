"""Measurement commands: ``overhead``, ``partial``, ``fluency``. All comparisons are interleaved."""

from __future__ import annotations

import statistics
import time
from typing import Any

import attrs

from ..bench.runner import with_batch
from ..contract.adapter import JudgesSamples, MeasuresFluency, TimesPartialSteps
from ..contract.errors import ConfigError, DiffaccelError
from ..contract.state import Layer, RunState
from ..runtime.accelerator import Accelerator
from ..runtime.guard import GuardConfig, all_finite
from ..runtime.placement import DeviceClock
from ..runtime.registry import Registry, hookimpl
from ..runtime.runs import Run
from ..runtime.sequence import RunSequence, StepModel


def _load(path: str, registry: Registry | None = None):
    """The config, its adapter and its loaded model (``diffaccel.Run``; no strategy is built: these
    measurements run the model bare or with their own accelerators)."""
    run = Run(path, registry=registry)
    return run.config, run.adapter, run.pipe


class PassThrough:
    """A strategy that changes nothing (it plans nothing: every layer is computed, the output is
    untouched): with it active the ``[guard]`` has a strategy to guard, so ``overhead --guard``
    times what the guard itself adds."""

    name = "pass-through"

    @hookimpl
    def diffaccel_pre_step(self, run) -> None:
        return None


def overhead(args) -> int:
    """Untouched sampler vs. hooks with every plugin loaded and no strategy active, with the
    non-finite check on (the default) and off; the check's own cost per step; with ``--guard N``
    also a pass-through strategy under ``[guard] every = N`` against the same with the guard off.
    Every entry runs once per round, the order rotating between rounds (interleaved)."""
    if getattr(args, "threads", None):
        import torch  # deferred: the core's import loads no torch

        torch.set_num_threads(args.threads)
    registry = Registry()  # loads every installed plugin
    cfg, adapter, pipe = _load(args.config, registry)
    cfg = cfg.without_strategies()
    if getattr(args, "batch", None) is not None:
        cfg = with_batch(cfg, args.batch)
    if getattr(args, "steps", None):  # shorter runs, same steps: the costs are per step
        cfg = attrs.evolve(cfg, model=attrs.evolve(cfg.model, steps=args.steps))
    every = getattr(args, "guard", 0) or 0
    empty = Accelerator([], adapter.name)
    unchecked = Accelerator([], adapter.name, guard=GuardConfig(finite=False))
    entries: dict[str, Accelerator | None] = {"untouched": None, "finite on": empty, "finite off": unchecked}
    if every:
        entries["pass-through, guard off"] = Accelerator([PassThrough()], adapter.name)
        entries["pass-through, guard on"] = Accelerator([PassThrough()], adapter.name, guard=GuardConfig(every=every))
    seen: list[Any] = []
    check = empty.output_ok
    empty.output_ok = lambda run, output: (seen.append(output) if not seen else None, check(run, output))[1]
    adapter.attach(pipe, empty)
    adapter.run(pipe, cfg, cfg.model.seed, progress=False)  # warm-up; keeps one step's output
    adapter.detach(pipe)
    empty.output_ok = check
    times: dict[str, list[float]] = {name: [] for name in entries}
    clock = DeviceClock(cfg.model.device, warmup_runs=1)
    reports: dict[str, dict] = {}
    order = list(entries)
    for i in range(args.repeats):
        for name in order[i % len(order):] + order[: i % len(order)]:
            accel = entries[name]
            if accel is None:
                adapter.detach(pipe)
            else:
                adapter.attach(pipe, accel)
            with clock.region() as r:
                out = adapter.run(pipe, cfg, cfg.model.seed, progress=False)
            times[name].append(r.seconds)
            adapter.detach(pipe)
            if accel is not None:  # untouched runs may carry no report (the UNet's has no run state)
                reports[name] = out.report
    plain = times["untouched"]
    steps = reports["finite on"]["steps_run"]
    step_ms = 1000 * statistics.median(plain) / steps
    n_layers = len(adapter.info(pipe).get("layers", ())) or 1
    per_step_us = _dispatch_cost_us(empty, n_layers)
    print(f"{cfg.model.checkpoint}: batch {cfg.model.batch}, {steps} steps per run, {args.repeats} interleaved rounds of "
          f"{len(entries)} runs, {len(registry.strategies)} strategies loaded ({', '.join(sorted(registry.strategies)) or 'none'}), none active")
    for label, name in (("finite check on (default)", "finite on"), ("finite check off", "finite off")):
        print(f"whole runs, hooked ({label}) vs untouched: {_ratio(times[name], plain)}; machine noise dominates this line")
    print(f"finite check on vs off (hooked, no strategy): {_ratio(times['finite on'], times['finite off'])}")
    print(f"hook dispatch alone: {per_step_us:.1f} us per step ({n_layers} layers + step hooks) = "
          f"{100 * per_step_us / (1000 * step_ms):.4f}% of a {step_ms:.1f} ms sampling step")
    if seen:
        finite_us = _finite_cost_us(seen[0])
        print(f"non-finite check alone: {finite_us:.1f} us per step (sum, then isfinite() if not finite, on a {tuple(seen[0].shape)} output) = "
              f"{100 * finite_us / (1000 * step_ms):.4f}% of a {step_ms:.1f} ms sampling step")
    if every:
        rel = reports["pass-through, guard on"].get("reliability") or {}
        print(f"[guard] every = {every} vs off (a pass-through strategy active): "
              f"{_ratio(times['pass-through, guard on'], times['pass-through, guard off'])}; "
              f"{rel.get('guard_checks', 0)} full steps computed beside the strategy's per run, max relative error "
              f"{rel.get('guard_max_error', 0.0):.3g}")
        print(f"whole runs, pass-through strategy ([guard] off) vs untouched: {_ratio(times['pass-through, guard off'], plain)}")
    return 0


def _ratio(times: list[float], base: list[float]) -> str:
    """Extra time of ``times`` over ``base`` (runs of the same rounds): total and median of pairs."""
    total = sum(times) / sum(base)
    pair = statistics.median(t / b for t, b in zip(times, base))
    return f"{100 * (total - 1):+.2f}% (total time ratio), {100 * (pair - 1):+.2f}% (median of pair ratios)"


def _finite_cost_us(output: Any, calls: int = 200) -> float:
    """Microseconds of one non-finite check of a step's output (best of 5 rounds)."""
    def once() -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            all_finite(output)
        return time.perf_counter() - t0

    return 1e6 * min(once() for _ in range(5)) / calls


class _Flat(StepModel):
    """A denoiser step that does no work (its output: one zero)."""

    def __init__(self):
        import torch  # deferred: the core's import loads no torch

        self.out = torch.zeros(1)

    def compute(self):
        return self.out


def _dispatch_cost_us(accel: Accelerator, n_layers: int, calls: int = 20000) -> float:
    """Extra microseconds per step that the hooks add, timed on a layer that does no work."""
    class Noop(Layer):
        def compute(self, hidden, positions=None):
            return hidden

    run = RunState(adapter=accel.adapter, num_steps=1, batch_size=1)
    layer, x = Noop("noop", 0, "noop"), object()

    def direct():
        t0 = time.perf_counter()
        for _ in range(calls):
            layer.compute(x)
        return time.perf_counter() - t0

    def hooked():
        t0 = time.perf_counter()
        for _ in range(calls):
            accel.layer_output(run, layer, x)
        return time.perf_counter() - t0

    # a step's hooks as adapters run them: the core's sequence, its finite check off (the check
    # on real outputs is timed apart, on the next line of the report)
    unchecked = Accelerator(accel.configured, accel.adapter, guard=GuardConfig(finite=False))
    seq, flat = RunSequence(unchecked, run), _Flat()

    def step_hooks():
        t0 = time.perf_counter()
        for _ in range(calls):
            seq.denoise(flat)
            seq.post_step(flat.compute)
        return time.perf_counter() - t0

    per_layer = min(hooked() - direct() for _ in range(5)) / calls
    per_step = min(step_hooks() for _ in range(5)) / calls
    return 1e6 * (n_layers * max(per_layer, 0.0) + per_step)


def partial(args) -> int:
    """Time one denoiser step computing 100%, 50%, 25%, 15%, 10%, 5% of the positions, and one per row."""
    if getattr(args, "threads", None):
        import torch  # deferred: the core's import loads no torch

        torch.set_num_threads(args.threads)
    cfg, adapter, pipe = _load(args.config)
    if not isinstance(adapter, TimesPartialSteps):
        raise ConfigError(f"{cfg.source}: [model] key 'adapter': partial computation is benchmarked on adapters "
                          f"declaring 'token-positions' that time partial steps; '{adapter.name}' does not")
    if getattr(args, "batch", None) is not None:
        cfg = with_batch(cfg, args.batch)
    B, N = cfg.model.batch, cfg.options.length
    # down to one position per row: the floor, what a step costs whatever a strategy leaves out
    fractions = (1.0, 0.5, 0.25, 0.15, 0.1, 0.05, 1 / N)
    times = adapter.time_partial_steps(pipe, cfg, fractions, args.repeats)
    import torch  # deferred: the core's import loads no torch

    full = statistics.median(times[1.0])
    print(f"{cfg.model.checkpoint}: one denoiser step, batch {B}, {N} positions, {torch.get_num_threads()} thread(s), "
          f"median of {args.repeats} interleaved runs")
    print("positions computed   time vs 100%   speedup")
    for f in fractions:
        med = statistics.median(times[f])
        label = "1 per row" if f == 1 / N else f"{f:.0%}"
        print(f"{label:>18}   {med / full:>12.2f}   {full / med:>6.2f}x")
    return 0


def fluency(args) -> int:
    """Fluency of the model's samples beside held-out text, random tokens and unigram text."""
    cfg, adapter, pipe = _load(args.config)
    if not isinstance(adapter, MeasuresFluency):
        raise ConfigError(f"{cfg.source}: [model] key 'adapter': fluency is measured on adapters that score text; "
                          f"'{adapter.name}' does not")
    judge, note = None, ""
    if getattr(args, "judge", "none") != "none" and isinstance(adapter, JudgesSamples):
        try:
            judge = adapter.load_judge(None if args.judge == "default" else args.judge)
        except DiffaccelError as exc:
            if args.judge != "default":
                raise
            note = f"gen_ppl: not reported: {exc}"
    kw = {"judge": judge} if judge else {}
    rows = list(adapter.fluency_rows(pipe, cfg.without_strategies(), args.seeds, **kw))
    print(f"{cfg.model.checkpoint}: trigram Kneser-Ney perplexity (fitted on held-out WordNet text), "
          f"{rows[0][1]['samples']} samples" + (f"; gen_ppl under {judge.name}" if judge else ""))
    print(f"{'text':<16} {'perplexity':>11} {'distinct-1':>11} {'distinct-2':>11}" + (f" {'gen_ppl':>9}" if judge else ""))
    for name, q in rows:
        gen = f" {q['gen_ppl']:>9.1f}" if judge else ""
        print(f"{name:<16} {q['perplexity']:>11.1f} {q['distinct_1']:>11.3f} {q['distinct_2']:>11.3f}{gen}")
    if note:
        print(note)
    return 0
