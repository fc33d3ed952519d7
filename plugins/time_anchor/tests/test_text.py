"""time-anchor on a tiny random text diffusion LM: anchoring, warm-up, max_age, real skipping,
stride, clusters, fp16, gates, separation between runs, metrics."""

from __future__ import annotations

import json

import pytest
import torch

import diffaccel
from diffaccel.adapters.text.testing import tiny_text_pipeline
from diffaccel import ConfigValueError
from diffaccel.testing import StepClock, run_with
from diffaccel_time_anchor import Gate, TimeAnchor, TimeAnchorConfig

L, N, STEPS = 3, 24, 24


@pytest.fixture(scope="module")
def pipe():
    return tiny_text_pipeline(n_layers=L, max_len=32)


class BlockSpy:
    """Wraps the denoiser's block: records, per call, the layer and the positions really run."""

    def __init__(self, pipe):
        self.pipe = pipe
        self.den = pipe.denoiser
        self.orig = self.den.block
        self.calls: list[tuple[int, torch.Tensor | None, int]] = []  # (layer, (B, N) mask or None, positions run)
        self.step_of_call: list[int] = []
        self.steps = 0

    def __enter__(self):
        step_model = self.pipe._step_model

        def counted(*a, **kw):  # once per step, reused or not
            self.steps += 1
            return step_model(*a, **kw)

        self.pipe._step_model = counted

        def block(i, h, c, kv, positions=None):
            self.step_of_call.append(self.steps - 1)
            if positions is None:
                self.calls.append((i, None, h.shape[0] * h.shape[1]))
            else:
                self.calls.append((i, positions.mask(), positions.count))
            return self.orig(i, h, c, kv, positions)

        self.den.block = block
        return self

    def __exit__(self, *exc):
        del self.den.block
        del self.pipe._step_model

    def computed(self, n: int) -> torch.Tensor:
        """(steps, layers, n) bool: position of row 0 run at that step and layer (a layer with
        nothing to run is not called)."""
        out = torch.zeros(self.steps, L, n, dtype=torch.bool)
        for step, (i, mask, _) in zip(self.step_of_call, self.calls):
            out[step, i] = True if mask is None else mask[0]
        return out


def anchor(**kw) -> TimeAnchor:
    return TimeAnchor(TimeAnchorConfig(**kw))


def generate(pipe, strategies=(), **kw):
    kw = {"length": N, "steps": STEPS, "temperature": 0.0, **kw}
    return run_with(pipe, strategies, **kw)


def test_nothing_settles_below_a_tiny_threshold_and_the_output_is_the_baseline(pipe):
    base = generate(pipe)
    out = generate(pipe, [anchor(threshold=1e-9)])
    m = out.report["strategies"]["time-anchor"]
    assert m["hits"] == 0 and out.report["counters"]["fraction_computed"] == 1.0
    assert torch.equal(out.tokens, base.tokens)


def test_settled_states_are_really_skipped(pipe):
    with BlockSpy(pipe) as spy:
        out = generate(pipe, [anchor(threshold=0.5, max_age=4, warmup=2)])
    c = out.report["counters"]
    run_positions = sum(n for _, _, n in spy.calls)
    assert run_positions == c["positions_computed"]  # what the block really ran
    assert run_positions < 0.6 * L * N * STEPS
    m = out.report["strategies"]["time-anchor"]
    assert m["hits"] == c["cache_hits"]
    skipped = L * N * STEPS - c["positions_computed"]
    assert m["hits"] == skipped  # positions are ragged: nothing served is ever run
    assert 0 < m["hit_rate"] <= 1


def test_warmup_steps_are_computed_in_full(pipe):
    with BlockSpy(pipe) as spy:
        out = generate(pipe, [anchor(threshold=0.9, warmup=4, max_age=8)])
    comp = spy.computed(N)
    assert comp[:4].all()
    assert not comp[4:].all()  # reuse starts after the warm-up
    by_step = torch.tensor(out.report["strategies"]["time-anchor"]["anchored_by_step"])
    assert (by_step[:, :4] == 0).all() and by_step[:, 4:].sum() > 0


@pytest.mark.parametrize("max_age", [1, 3])
def test_max_age_forces_a_recompute(pipe, max_age):
    with BlockSpy(pipe) as spy:
        out = generate(pipe, [anchor(threshold=0.99, warmup=2, max_age=max_age)])
    comp = spy.computed(N)
    # every (layer, position) runs at least once in every max_age + 1 consecutive steps
    for s in range(STEPS - max_age):
        assert comp[s: s + max_age + 1].any(0).all(), s
    m = out.report["strategies"]["time-anchor"]
    assert m["max_age_recomputes"] > 0
    assert m["hit_rate"] > 0.3


def test_stride_caches_every_nth_position_only(pipe):
    with BlockSpy(pipe) as spy:
        out = generate(pipe, [anchor(threshold=0.99, warmup=2, max_age=8, stride=3)])
    comp = spy.computed(N)
    off = torch.arange(N) % 3 != 0
    assert comp[:, :, off].all()  # positions off the stride always run
    assert not comp[:, :, ~off].all()
    full = generate(pipe, [anchor(threshold=0.99, warmup=2, max_age=8)]).report["strategies"]["time-anchor"]
    m = out.report["strategies"]["time-anchor"]
    assert m["peak_entries"] == L * N // 3 and full["peak_entries"] == L * N
    assert m["peak_bytes"] * 3 == full["peak_bytes"]
    assert m["hit_rate"] < full["hit_rate"]


def test_clusters_key_groups_of_positions(pipe, tmp_path):
    assign = [p % 4 for p in range(N)]
    path = tmp_path / "clusters.json"
    path.write_text(json.dumps({"length": N, "n_clusters": 4, "assign": assign}))
    rec = MaskRecorder()
    s = anchor(threshold=0.99, warmup=2, max_age=8, clusters=str(path), neighbors=0)
    with BlockSpy(pipe) as spy:
        out = generate(pipe, [s, rec])
    m = out.report["strategies"]["time-anchor"]
    assert m["peak_entries"] == L * 4 and m["hits"] > 0
    # a cluster is served as a whole: a member left out means every member is left out, but
    # for the position committed at the step before (its input moved: recomputed alone)
    comp = spy.computed(N)
    cl = torch.tensor(assign)
    for step in range(3, STEPS):
        committed = rec.masked[step - 2] & ~rec.masked[step - 1]
        for i in range(L):
            skipped = ~comp[step, i]
            for c in range(4):
                members = cl == c
                if skipped[members].any() and comp[step, i].sum() > 1:
                    assert (skipped | committed)[members].all(), (step, i, c)


def test_clusters_shorter_than_the_run_are_an_error(pipe, tmp_path):
    from diffaccel import ConfigValueError

    path = tmp_path / "clusters.json"
    path.write_text(json.dumps({"length": 8, "n_clusters": 2, "assign": [0, 1] * 4}))
    with pytest.raises(ConfigValueError, match="key 'clusters'.*assigns 8 positions but the run generates 24"):
        generate(pipe, [anchor(clusters=str(path))])


def test_fp16_storage(pipe):
    a32 = generate(pipe, [anchor(threshold=0.3, max_age=4)]).report["strategies"]["time-anchor"]
    a16 = generate(pipe, [anchor(threshold=0.3, max_age=4, fp16=True)]).report["strategies"]["time-anchor"]
    assert a16["peak_bytes"] * 2 == a32["peak_bytes"]
    assert a16["hits"] > 0


def test_byte_bound_below_the_demand_evicts_and_stays_bounded(pipe):
    dim = pipe.denoiser.model.config.dim
    bound = 10 * dim * 4  # 10 of the L * N = 72 entries a run wants
    m = generate(pipe, [anchor(threshold=0.5, max_age=4, max_bytes=bound)]).report["strategies"]["time-anchor"]
    assert m["peak_bytes"] <= bound and m["peak_entries"] == 10
    assert m["evictions"] > 0
    m2 = generate(pipe, [anchor(threshold=0.5, max_age=4, max_entries=7)]).report["strategies"]["time-anchor"]
    assert m2["peak_entries"] == 7 and m2["evictions"] > 0


def test_state_is_cleared_between_generations(pipe):
    s = anchor(threshold=0.3, max_age=4)
    first = generate(pipe, [s], seed=3)
    second = generate(pipe, [s], seed=3)
    assert torch.equal(first.tokens, second.tokens)
    assert first.report["strategies"] == second.report["strategies"]


def test_rows_are_anchored_separately(pipe):
    out = generate(pipe, [anchor(threshold=0.3, max_age=4)], batch=2, prompt=["ab", "the cat"])
    m = out.report["strategies"]["time-anchor"]
    assert m["peak_entries"] == 2 * L * N  # one entry per row, layer and position


def test_low_layers_settle_first_is_measured_per_layer(pipe):
    m = generate(pipe, [anchor(threshold=0.3, max_age=4)]).report["strategies"]["time-anchor"]
    assert len(m["anchored_per_layer"]) == L and len(m["anchored_by_step"][0]) == STEPS
    assert m["layers"] == [f"block.{i}" for i in range(L)]


class MaskRecorder:
    name = "mask-recorder"

    def __init__(self):
        self.masked = []

    @diffaccel.hookimpl
    def diffaccel_post_step(self, run, output):
        self.masked.append(output.masked[0].clone())


def test_a_new_token_climbs_the_layers_at_once(pipe):
    """A position whose token was just committed is recomputed at every layer even if anchored."""
    rec = MaskRecorder()
    with BlockSpy(pipe) as spy:
        generate(pipe, [anchor(threshold=0.3, warmup=2, max_age=50), rec])
    comp = spy.computed(N)
    checked = 0
    for s in range(3, STEPS):
        committed = rec.masked[s - 2] & ~rec.masked[s - 1]  # committed at step s - 1: new input at step s
        assert comp[s][:, committed].all(), s
        checked += int(committed.sum())
    assert checked >= STEPS - 4
    # and little else runs: with max_age 50 most states stay anchored
    assert comp[3:].float().mean() < 0.5


def gate_file(tmp_path, n_layers, bias):
    path = tmp_path / f"gate-{n_layers}-{bias}.json"
    Gate(torch.zeros(n_layers, 17), torch.full((n_layers,), float(bias)),
         [f"block.{i}" for i in range(n_layers)]).save(path)
    return str(path)


def test_an_open_gate_anchors_and_a_closed_gate_does_not(pipe, tmp_path):
    open_ = generate(pipe, [anchor(gate=gate_file(tmp_path, L, 8.0), max_age=4)]).report["strategies"]["time-anchor"]
    closed = generate(pipe, [anchor(gate=gate_file(tmp_path, L, -8.0), max_age=4)]).report["strategies"]["time-anchor"]
    assert open_["hits"] > 0 and closed["hits"] == 0


def test_gate_file_for_another_layer_count_is_an_error(pipe, tmp_path):
    from diffaccel import ConfigValueError
    from diffaccel.adapters.text.adapter import TextAdapter

    s = anchor(gate=gate_file(tmp_path, L + 1, 0.0))
    with pytest.raises(ConfigValueError, match=r"key 'gate': the gate file has 4 layers but the model has 3"):
        s.diffaccel_setup(TextAdapter.info(pipe))


class PlanSpy:
    """After time-anchor: records the merged plan of each step (its own pre_step returns None)."""

    name = "plan-spy"

    def __init__(self, narrow=None):
        self.narrow = narrow
        self.plans = []

    @diffaccel.hookimpl
    def diffaccel_pre_step(self, run):
        if self.narrow is None:
            return None
        from diffaccel import StepPlan

        mask = torch.zeros(run.batch_size, run.info.tokens.length, dtype=torch.bool)
        mask[:, self.narrow] = True
        return StepPlan(positions=mask)

    @diffaccel.hookimpl
    def diffaccel_post_step(self, run, output):
        self.plans.append(run.plan)


def test_masked_steps_are_narrowed_to_what_some_layer_computes(pipe):
    spy = PlanSpy()
    with BlockSpy(pipe) as blocks:
        out = generate(pipe, [anchor(threshold=0.5, warmup=3, max_age=6), spy])
    comp = blocks.computed(N)
    assert all(p is None for p in spy.plans[:3])  # warm-up: full steps
    narrowed = [s for s, p in enumerate(spy.plans) if p is not None]
    assert narrowed == list(range(3, STEPS))
    for s in narrowed:
        plan = spy.plans[s]
        assert not comp[s][:, ~plan.positions[0]].any()  # no layer runs a position outside the plan
    m = out.report["strategies"]["time-anchor"]
    assert 0 < m["step_positions"] < 1


def test_another_strategys_positions_compose(pipe):
    """With a second plan narrowing the step, a layer runs only plan positions that are not anchored."""
    window = list(range(0, N, 2))
    other = PlanSpy(narrow=window)
    with BlockSpy(pipe) as blocks:
        out = generate(pipe, [anchor(threshold=0.5, warmup=3, max_age=6), other])
    comp = blocks.computed(N)
    odd = torch.arange(N) % 2 == 1
    assert not comp[1:3][:, :, odd].any()  # warm-up: the other plan alone narrows the step
    for s in range(3, STEPS):
        merged = other.plans[s].positions[0]
        assert not comp[s][:, ~merged].any()  # never outside the merged plan
    m = out.report["strategies"]["time-anchor"]
    assert m["hits"] > 0 and comp[3:].float().mean() < 0.5


def test_narrow_step_false_leaves_the_steps_positions_to_the_other_plan(pipe):
    """narrow_step = false: the merged plan is the other strategy's exactly (time-anchor adds no
    expired position to it), and layers still leave anchored states out within it."""
    window = list(range(0, N, 2))
    other = PlanSpy(narrow=window)
    with BlockSpy(pipe) as blocks:
        out = generate(pipe, [anchor(threshold=0.5, warmup=3, max_age=6, narrow_step=False), other])
    comp = blocks.computed(N)
    odd = torch.arange(N) % 2 == 1
    for s in range(1, STEPS):
        assert torch.equal(other.plans[s].positions[0], ~odd)
        assert not comp[s][:, odd].any()
    assert out.report["strategies"]["time-anchor"]["hits"] > 0
    assert comp[3:][:, :, ~odd].float().mean() < 1  # some anchored states inside the window skipped
    alone = PlanSpy()
    generate(pipe, [anchor(threshold=0.5, warmup=3, max_age=6, narrow_step=False), alone])
    assert all(p is None for p in alone.plans)


def test_continuous_sampler_skips_per_layer_without_narrowing_the_step():
    cont = tiny_text_pipeline("continuous", n_layers=L, max_len=32)
    spy = PlanSpy()
    with BlockSpy(cont) as blocks:
        out = generate(cont, [anchor(threshold=0.3, warmup=3, max_age=4), spy])
    assert all(p is None for p in spy.plans)  # inputs move everywhere: no step plan
    m = out.report["strategies"]["time-anchor"]
    assert m["hits"] > 0 and "step_positions" in m
    assert sum(n for _, _, n in blocks.calls) == out.report["counters"]["positions_computed"] < L * N * STEPS


class AnswerLastLayer:
    """Answers the last layer itself (before time-anchor, in config order)."""

    name = "answer-last"

    @diffaccel.hookimpl
    def diffaccel_layer_output(self, run, layer, hidden):
        if layer.index == L - 1:
            return layer.compute(hidden)
        return None


def test_writes_land_when_another_strategy_answers_the_last_layer(pipe):
    out = generate(pipe, [AnswerLastLayer(), anchor(threshold=0.5, max_age=4, warmup=2)])
    m = out.report["strategies"]["time-anchor"]
    # the cache writes and statistics of each step are flushed at the next step's plan
    assert m["peak_entries"] == (L - 1) * N
    assert m["hits"] > 0 and m["hits"] == out.report["counters"]["cache_hits"]


@pytest.mark.parametrize("strategy_s, on", [(0.5, True), (2.0, False)])
def test_the_cost_gate_keeps_or_drops_time_anchor_as_the_clock_says(pipe, monkeypatch, strategy_s, on):
    monkeypatch.delenv("DIFFACCEL_COST_GATE", raising=False)
    ta = anchor(threshold=0.5, warmup=2, max_age=4)
    ta.tokens.paygate.clock = StepClock(ta.tokens.paygate, 1.0, strategy_s)
    first = generate(pipe, [ta]).report
    with BlockSpy(pipe) as spy:
        second = generate(pipe, [ta])
    m = first["strategies"]["time-anchor"]
    assert m["cost_gate"]["on"] is on and m["summary"].startswith("time-anchor cost gate: " + ("on" if on else "off"))
    plain = all(mask is None for _, mask, _ in spy.calls)  # every layer ran on every position
    assert plain is not on
    assert (second.report["counters"]["fraction_computed"] == 1.0) is not on
    if not on:
        assert torch.equal(second.tokens, generate(pipe).tokens)  # off: the baseline's steps, the baseline's output


def test_prompt_apart_is_refreshed_on_its_interval(pipe):
    """prompt_interval: prompt states are served between refreshes whatever they do (4 steps, then
    the whole prompt is computed); with one rule and a change test no state passes, the prompt runs
    at almost every step."""
    prompt = "the cat sat on"
    cfg = dict(threshold=1e-6, warmup=2, max_age=1, neighbors=0)
    with BlockSpy(pipe) as blocks:
        out = generate(pipe, [anchor(prompt_interval=4, **cfg)], prompt=prompt)
    n = out.prompt_lengths[0]
    comp = blocks.computed(N)  # ``length`` is the whole sequence: the prompt, then the generation
    first = next(s for s in range(blocks.steps) if not comp[s].all())  # the first step that skips
    runs_prompt = [s for s in range(blocks.steps) if comp[s, :, :n].any()]
    assert runs_prompt[:first] == list(range(first))
    refreshes = [s for s in runs_prompt if s >= first - 1]
    assert len(refreshes) >= 3 and all(b - a == 5 for a, b in zip(refreshes, refreshes[1:]))
    assert all(comp[s, :, :n].all() for s in refreshes)  # a refresh computes the whole prompt
    with BlockSpy(pipe) as plain:
        generate(pipe, [anchor(**cfg)], prompt=prompt)
    assert sum(bool(plain.computed(N)[s, :, :n].any()) for s in range(plain.steps)) > len(runs_prompt) + 8


def test_without_the_response_test_the_plan_alone_serves_the_prompt(pipe):
    """response_test = false: no layer runs any bookkeeping; every step computes the whole response
    at every layer, the prompt every 5th step (prompt_interval 4); nothing is cached by time-anchor."""
    prompt = "the cat sat on"
    strategy = anchor(warmup=2, prompt_interval=4, response_test=False, neighbors=0)
    with BlockSpy(pipe) as blocks:
        out = generate(pipe, [strategy], prompt=prompt)
    n = out.prompt_lengths[0]
    comp = blocks.computed(N)
    assert comp[:, :, n:].all()  # the response: every step, every layer
    runs_prompt = [s for s in range(blocks.steps) if comp[s, :, :n].any()]
    first = next(s for s in range(blocks.steps) if not comp[s].all())
    refreshes = [s for s in runs_prompt if s >= first - 1]
    assert len(refreshes) >= 3 and all(b - a == 5 for a, b in zip(refreshes, refreshes[1:]))
    m = out.report["strategies"]["time-anchor"]
    assert m["hits"] > 0 and 0 < m["step_positions"] < 1 and "anchored_by_step" not in m


def test_response_test_off_without_a_prompt_interval_computes_every_step(pipe):
    """A point tune may try (each key is searched alone): nothing is served, the output is the baseline's."""
    with BlockSpy(pipe) as blocks:
        out = generate(pipe, [anchor(warmup=1, response_test=False)], prompt="the cat sat on")
    assert blocks.computed(N).all()
    assert torch.equal(out.tokens, generate(pipe, prompt="the cat sat on").tokens)
