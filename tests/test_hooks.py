"""The hook system: every hook documented and fired, config order, real skipping, clean removal."""

import inspect

import pytest
import torch

import diffaccel
from diffaccel import Accelerator, RunState, StepPlan, hookimpl
from diffaccel.contract import hookspecs
from diffaccel.adapters.text.testing import tiny_text_pipeline
from diffaccel.testing import run_with

HOOKS = [n for n, f in inspect.getmembers(hookspecs, inspect.isfunction) if n.startswith("diffaccel_")]


def test_every_hook_is_documented():
    assert len(HOOKS) >= 7
    for name in HOOKS:
        doc = inspect.getdoc(getattr(hookspecs, name)) or ""
        assert "Called" in doc or "Asked" in doc or "Per strategy" in doc or "Adapters declaring" in doc, \
            f"{name} has no docstring saying when it is called"


class Recorder:
    """Implements every run hook and records the calls."""

    def __init__(self, name, log):
        self.name = name
        self.log = log

    @hookimpl
    def diffaccel_run_start(self, run):
        self.log.append((self.name, "diffaccel_run_start"))

    @hookimpl
    def diffaccel_pre_step(self, run):
        self.log.append((self.name, "diffaccel_pre_step"))

    @hookimpl
    def diffaccel_layer_output(self, run, layer, hidden):
        self.log.append((self.name, "diffaccel_layer_output"))

    @hookimpl
    def diffaccel_denoiser_output(self, run, output):
        self.log.append((self.name, "diffaccel_denoiser_output"))

    @hookimpl
    def diffaccel_commit(self, run, proposal):
        self.log.append((self.name, "diffaccel_commit"))

    @hookimpl
    def diffaccel_post_step(self, run, output):
        self.log.append((self.name, "diffaccel_post_step"))

    @hookimpl
    def diffaccel_finalize(self, run, final):
        self.log.append((self.name, "diffaccel_finalize"))

    @hookimpl
    def diffaccel_run_end(self, run):
        self.log.append((self.name, "diffaccel_run_end"))


def test_every_run_hook_fires_in_config_order():
    log = []
    pipe = tiny_text_pipeline()
    run_with(pipe, [Recorder("b", log), Recorder("a", log)], steps=3)
    fired = {h for _, h in log}
    # the hooks of a generation; the others (set-up, state, bench) are exercised in test_contract.py
    run_hooks = {n for n, r in hookspecs.RULES.items() if r.merge not in (hookspecs.OWN, hookspecs.MODULE)}
    assert fired == run_hooks
    # within each hook call, config order: b before a, whatever the names' sort order
    pairs = [(log[i][0], log[i + 1][0]) for i in range(0, len(log), 2)]
    assert all(p == ("b", "a") for p in pairs)


def test_register_hook_fires_through_registry():
    got = []

    class Plugin:
        @hookimpl
        def diffaccel_register(self, register):
            got.append(register)

    diffaccel.Registry(load_entrypoints=False).register_plugin(Plugin(), name="p")
    assert len(got) == 1 and callable(got[0])


def test_config_order_not_registration_order():
    from diffaccel import Registry, Strategy, parse_config

    log = []

    class Plugin:
        @hookimpl
        def diffaccel_register(self, register):
            import attrs

            @attrs.frozen(kw_only=True)
            class Empty:
                pass

            for name in ("first", "second"):
                register(Strategy(name=name, config=Empty, factory=lambda c, n=name: Recorder(n, log), requires=("token-positions",)))

    reg = Registry(load_entrypoints=False)
    reg.register_plugin(Plugin(), name="p")
    cfg = parse_config({"model": {"adapter": "text"}, "strategy": [{"use": "second"}, {"use": "first"}]}, registry=reg)
    pipe = tiny_text_pipeline()
    with diffaccel.apply(pipe, cfg, registry=reg):
        pipe(length=8, steps=1, progress=False)
    starts = [n for n, h in log if h == "diffaccel_run_start"]
    assert starts == ["second", "first"]


class SkipDeep:
    """Answers the last layer from its cache after the first step: it never computes it."""

    name = "skip-deep"

    @hookimpl
    def diffaccel_layer_output(self, run, layer, hidden):
        if layer.index == 1 and run.step > 0:
            return layer.cached_output
        return None


def test_skipping_a_layer_does_not_run_it(monkeypatch):
    pipe = tiny_text_pipeline()
    calls = {"n": 0}
    block = pipe.denoiser.model.blocks[1]
    original = block.forward

    def counting(*a, **k):
        calls["n"] += 1
        return original(*a, **k)

    monkeypatch.setattr(block, "forward", counting)
    out = run_with(pipe, [SkipDeep()], steps=5)
    assert calls["n"] == 1  # only the first step computed block 1
    c = out.report["counters"]
    assert c["layers_skipped"] == 4 and c["layers_computed"] == 6


class HalfPositions:
    name = "half"

    @hookimpl
    def diffaccel_pre_step(self, run):
        if run.step == 0:
            return None
        mask = torch.zeros(run.batch_size, run.info.tokens.length, dtype=torch.bool)
        mask[:, ::2] = True
        return StepPlan(positions=mask)


def test_partial_positions_are_counted_and_cost_less():
    pipe = tiny_text_pipeline()
    out = run_with(pipe, [HalfPositions()], steps=4, length=24)
    c = out.report["counters"]
    assert c["positions_total"] == 4 * 2 * 24
    assert c["positions_computed"] == 2 * 24 + 3 * 2 * 12


def test_partial_with_all_positions_equals_full_computation():
    class AllPositions:
        name = "all"

        @hookimpl
        def diffaccel_pre_step(self, run):
            return StepPlan(positions=torch.ones(run.batch_size, run.info.tokens.length, dtype=torch.bool))

    pipe = tiny_text_pipeline()
    full = run_with(pipe, [], steps=6, seed=3)
    part = run_with(pipe, [AllPositions()], steps=6, seed=3)
    assert torch.equal(full.tokens, part.tokens)


def test_reuse_step_skips_the_model():
    class Reuse:
        name = "reuse"

        @hookimpl
        def diffaccel_pre_step(self, run):
            return StepPlan(reuse_step=run.step % 2 == 1)

    pipe = tiny_text_pipeline()
    out = run_with(pipe, [Reuse()], steps=6)
    c = out.report["counters"]
    assert c["steps_reused"] == 3 and c["layers_computed"] == 3 * 2


def test_plan_merge_rules():
    a = torch.tensor([[True, False, False]])
    b = torch.tensor([[False, True, False]])
    merged = StepPlan.merge([StepPlan(positions=a, skip={"x", "y"}, reuse_step=True), None,
                             StepPlan(positions=b, skip={"y"}, reuse_step=False)])
    assert merged.positions.tolist() == [[True, True, False]]
    assert merged.skip == {"y"} and merged.reuse_step is False
    assert StepPlan.merge([None]) is None
    assert StepPlan.merge([StepPlan(positions=a), StepPlan()]).positions is None


def test_apply_and_remove_is_bitwise_identical():
    pipe = tiny_text_pipeline()
    before = pipe(length=24, steps=8, seed=1, progress=False)
    with diffaccel.apply(pipe, strategies=[SkipDeep(), HalfPositions()]):
        changed = pipe(length=24, steps=8, seed=1, progress=False)
    after = pipe(length=24, steps=8, seed=1, progress=False)
    assert pipe.accelerator is None
    assert torch.equal(before.tokens, after.tokens)
    assert changed.report["counters"]["layers_skipped"] > 0


def test_no_strategy_through_hooks_is_bitwise_identical():
    for kind in ("masked", "continuous"):
        pipe = tiny_text_pipeline(kind)
        plain = pipe(length=16, steps=6, seed=2, progress=False)
        pipe.accelerator = Accelerator([], "text")
        hooked = pipe(length=16, steps=6, seed=2, progress=False)
        pipe.accelerator = None
        assert torch.equal(plain.tokens, hooked.tokens)


def test_layer_chain_is_resolved_once(monkeypatch):
    import diffaccel.runtime.dispatch as A  # the chains are resolved there

    acc = Accelerator([SkipDeep()], "text")

    def boom(*a, **k):
        raise AssertionError("implementations resolved on the hot path")

    monkeypatch.setattr(A, "implementation", boom)  # resolving during the run would hit this
    pipe = tiny_text_pipeline()
    pipe.accelerator = acc
    pipe(length=8, steps=2, progress=False)


def test_state_is_kept_apart_per_branch():
    class S:
        name = "s"

        @hookimpl
        def diffaccel_new_state(self, run):
            return {"branch": run.branch}

    run = RunState(adapter="text", num_steps=1, batch_size=1)
    s = S()
    a = run.state(s)
    run.branch = "uncond"
    b = run.state(s)
    run.branch = "main"
    assert a is run.state(s) and a is not b and b["branch"] == "uncond"


def test_state_is_fresh_per_run():
    seen = []

    class S:
        name = "s"

        @hookimpl
        def diffaccel_new_state(self, run):
            return {"steps": 0}

        @hookimpl
        def diffaccel_post_step(self, run, output):
            st = run.state(self)
            st["steps"] += 1
            seen.append(st["steps"])

    pipe = tiny_text_pipeline()
    strategy = S()
    run_with(pipe, [strategy], steps=3)
    run_with(pipe, [strategy], steps=3)
    assert seen == [1, 2, 3, 1, 2, 3]


def test_finalize_may_choose_tokens_and_report_metrics():
    class Pick:
        name = "pick"

        @hookimpl
        def diffaccel_finalize(self, run, final):
            final.tokens = torch.full_like(final.draft, 5)
            run.metrics["pick"] = {"chosen": 5}

    pipe = tiny_text_pipeline()
    out = run_with(pipe, [Pick()], steps=2, length=8)
    assert (out.tokens == 5).all()
    assert out.report["strategies"]["pick"] == {"chosen": 5}


@pytest.mark.parametrize("kind", ["masked", "continuous"])
def test_denoiser_output_replacement_reaches_the_sampler(kind):
    class Force:
        name = "force"

        @hookimpl
        def diffaccel_denoiser_output(self, run, output):
            forced = torch.full_like(output, -10.0)
            forced[..., 7] = 10.0
            return forced

    pipe = tiny_text_pipeline(kind)
    out = run_with(pipe, [Force()], steps=4, length=8, temperature=0.0 if kind == "masked" else 1.0)
    assert (out.tokens == 7).all()


def test_dispatch_cost_is_measured_and_small():
    from diffaccel.cli.tools import _dispatch_cost_us

    cost = _dispatch_cost_us(Accelerator([], "text"), n_layers=4, calls=2000)
    assert 0 < cost < 500  # microseconds per step; a sampling step of the default model takes tens of ms
