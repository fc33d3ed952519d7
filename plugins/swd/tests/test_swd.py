"""Tests of the swd strategy on tiny random text diffusion LMs (``diffaccel.adapters.text.testing``)."""

from __future__ import annotations

import argparse
from pathlib import Path

import attrs
import pytest
import torch

import diffaccel
import diffaccel_swd
from diffaccel import ConfigError, ConfigValueError, hookimpl
from diffaccel.adapters.text.sampling.logits import most_probable
from diffaccel.adapters.text.sampling.pipeline import TextStepOutput
from diffaccel.runtime.config import parse_config
from diffaccel.contract.state import RunState, StepPlan
from diffaccel.testing import StepClock
from diffaccel.adapters.text.testing import tiny_text_pipeline
from diffaccel.testing import run_with
from diffaccel_swd import SWD, SWDConfig, radius_at, update_stability, widen



TEXT = frozenset({"token-positions", "token-logits", "mask-confidences"})  # what a text run offers

def swd(**kw) -> SWD:
    return SWD(SWDConfig(**kw))


@pytest.fixture(scope="module")
def masked_pipe():
    return tiny_text_pipeline("masked")


@pytest.fixture(scope="module")
def cont_pipe():
    return tiny_text_pipeline("continuous")


# ---- the stability test -----------------------------------------------------------------

def test_stable_needs_K_equal_top1_and_mean_probability_at_least_tau():
    K, tau = 3, 0.5
    run_len = torch.zeros(1, 3, dtype=torch.long)
    probs = torch.zeros(K, 1, 3)
    prev = torch.tensor([[5, 5, 5]])
    # position 0: same token, high probability; 1: same token, low probability; 2: changes at step 1
    seq = [([5, 5, 5], [0.9, 0.2, 0.9]), ([5, 5, 6], [0.9, 0.2, 0.9]), ([5, 5, 6], [0.9, 0.2, 0.9]),
           ([5, 5, 6], [0.1, 0.2, 0.9])]
    out = []
    for step, (tok, p) in enumerate(seq):
        top1 = torch.tensor([tok])
        stable, changed = update_stability(run_len, probs, prev, top1, torch.tensor([p]), step, K, tau)
        prev = top1
        out.append((stable[0].tolist(), changed[0].tolist()))
    assert [s for s, _ in out[:2]] == [[False, False, False]] * 2  # fewer than K steps seen
    assert out[1][1] == [False, False, True]
    assert out[2][0] == [True, False, False]  # 3 equal steps at 0.9; 0.2 < tau; position 2 restarted at step 1
    # step 3: position 0's mean over the last 3 steps is (0.9 + 0.9 + 0.1) / 3 = 0.63 >= 0.5; position 2 has run 3
    assert out[3][0] == [True, False, True]
    assert run_len.tolist() == [[4, 4, 3]]


def test_mean_probability_is_over_the_last_K_steps_only():
    K, tau = 2, 0.5
    run_len = torch.zeros(1, 1, dtype=torch.long)
    probs = torch.zeros(K, 1, 1)
    top1 = torch.tensor([[7]])
    results = []
    for step, p in enumerate([0.9, 0.9, 0.1, 0.1, 0.9, 0.9]):
        stable, _ = update_stability(run_len, probs, top1, top1, torch.tensor([[p]]), step, K, tau)
        results.append(bool(stable))
    assert results == [False, True, True, False, True, True]  # (0.9+0.1)/2 = 0.5 counts as stable


def test_widen_by_R_on_both_sides_clipped_to_the_sequence():
    u = torch.zeros(2, 10, dtype=torch.bool)
    u[0, 0] = u[0, 5] = True
    u[1, 9] = True
    assert widen(u, 0).tolist() == u.tolist()
    w = widen(u, 2)
    assert w[0].nonzero().squeeze(1).tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert w[1].nonzero().squeeze(1).tolist() == [7, 8, 9]
    assert widen(torch.zeros(1, 4, dtype=torch.bool), 3).sum() == 0


def test_radius_schedule_is_constant_or_linear_from_R_to_R_end():
    assert [radius_at(s, 5, 2, None) for s in range(5)] == [2] * 5
    assert [radius_at(s, 5, 0, 4) for s in range(5)] == [0, 1, 2, 3, 4]
    assert radius_at(0, 100, 1, 3) == 1 and radius_at(99, 100, 1, 3) == 3 and radius_at(50, 100, 1, 3) == 2
    assert radius_at(0, 1, 1, 3) == 1


# ---- a run ----------------------------------------------------------------------------------

def test_first_step_full_then_fewer_positions(masked_pipe):
    s = swd(tau=0.01, K=1, R=0)
    out = run_with(masked_pipe, [s], length=24, steps=24, seed=0, temperature=1.0)
    m = out.report["strategies"]["swd"]
    assert m["computed_per_step"][0] == 1.0
    assert m["mean_computed"] < 0.6
    assert out.report["counters"]["fraction_computed"] < 0.6
    assert len(m["first_stable_step"]) == 1 and len(m["first_stable_step"][0]) == 24


def test_first_step_plan_covers_every_position():
    s = swd()
    run = RunState(adapter="text", capabilities=TEXT, num_steps=4, batch_size=1)
    run.info.set(sampler="masked", time_conditioned=False)
    run.step = 0
    s.diffaccel_run_start(run)
    plan = s.diffaccel_pre_step(run)
    assert plan is not None and plan.positions is None and not plan.reuse_step
    # merged with another strategy's narrower plan, the first step still computes everything
    merged = StepPlan.merge([plan, StepPlan(positions=torch.zeros(1, 4, dtype=torch.bool))])
    assert merged.positions is None


def _step_output(top1, prob, tokens=None, masked=None, fixed=None, computed=None):
    top1 = torch.tensor(top1)
    return TextStepOutput(tokens=tokens if tokens is not None else top1.clone(), top1=top1,
                          top1_prob=torch.tensor(prob), logits=torch.zeros(*top1.shape, 8), computed=computed,
                          masked=masked, fixed=fixed)


def _continuous_run(num_steps=10, batch=2):
    run = RunState(adapter="text", capabilities=TEXT, num_steps=num_steps, batch_size=batch)
    run.info.set(sampler="ddim", time_conditioned=True)
    return run


def test_rows_decide_independently():
    s = swd(tau=0.5, K=2, R=1, early_stop=False)
    run = _continuous_run()
    s.diffaccel_run_start(run)
    for step in range(4):
        run.step = step
        s.diffaccel_pre_step(run)
        # row 0 keeps its tokens; row 1's position 2 flips every step
        row1 = [1, 1, 9 if step % 2 else 8, 1, 1, 1]
        s.diffaccel_post_step(run, _step_output([[1] * 6, row1], [[0.9] * 6, [0.9] * 6]))
    nxt = run.state(s).next
    assert nxt[0].tolist() == [False] * 6
    assert nxt[1].tolist() == [False, True, True, True, False, False]


def test_fixed_positions_count_as_stable():
    s = swd(tau=0.9, K=3, R=0, early_stop=False)
    run = _continuous_run(batch=1)
    s.diffaccel_run_start(run)
    fixed = torch.tensor([[True, True, False, False]])
    for step in range(2):
        run.step = step
        s.diffaccel_pre_step(run)
        # every top-1 changes at every step, with low probability
        s.diffaccel_post_step(run, _step_output([[step] * 4], [[0.1] * 4], fixed=fixed))
    st = run.state(s)
    assert st.next[0].tolist() == [False, False, True, True]
    assert st.first_stable[0].tolist() == [0, 0, -1, -1]


def test_fixed_prompt_positions_are_not_recomputed(masked_pipe):
    s = swd(tau=0.01, K=1, R=0)
    out = run_with(masked_pipe, [s], prompt="hello world", length=24, steps=24, seed=0)
    first = out.report["strategies"]["swd"]["first_stable_step"][0]
    assert first[:11] == [0] * 11


def test_committed_positions_are_recomputed_at_the_next_step():
    s = swd(tau=0.01, K=1, R=0, early_stop=False, fresh_commits=False)
    run = RunState(adapter="text", capabilities=TEXT, num_steps=4, batch_size=1)
    run.info.set(sampler="masked", time_conditioned=False)
    s.diffaccel_run_start(run)
    M = 2  # mask id
    steps = [[M, M, M, M], [5, M, M, M], [5, M, 6, M]]
    for step, tokens in enumerate(steps):
        run.step = step
        s.diffaccel_pre_step(run)
        t = torch.tensor([tokens])
        s.diffaccel_post_step(run, _step_output([[5, 7, 6, 7]], [[0.9] * 4], tokens=t, masked=t == M))
        changed = [i for i in range(4) if steps[step][i] != (steps[step - 1][i] if step else M)]
        assert run.state(s).next[0].nonzero().squeeze(1).tolist() == changed


def _window_after_a_flip(R: int, widen_committed: bool) -> list[int]:
    """The next step's positions on a masked row where positions 0 and 4 were committed earlier and
    position 2 (masked) flips its top-1 at the last of three steps."""
    s = swd(tau=0.01, K=2, R=R, early_stop=False, widen_committed=widen_committed, fresh_commits=False)
    run = RunState(adapter="text", capabilities=TEXT, num_steps=4, batch_size=1)
    run.info.set(sampler="masked", time_conditioned=False)
    s.diffaccel_run_start(run)
    M = 2  # mask id
    for step, top2 in enumerate([7, 7, 8]):
        run.step = step
        s.diffaccel_pre_step(run)
        t = torch.tensor([[5, M, M, M, 6, M]])
        s.diffaccel_post_step(run, _step_output([[5, 7, top2, 7, 6, 7]], [[0.9] * 6], tokens=t, masked=t == M))
    return run.state(s).next[0].nonzero().squeeze(1).tolist()


@pytest.mark.parametrize("widen_committed", [False, True])
def test_widening_reaches_committed_neighbours_only_when_asked(widen_committed):
    # position 2 and its masked neighbours 1 and 3; committed 0 and 4 are not neighbours of 2
    assert _window_after_a_flip(1, widen_committed) == [1, 2, 3]
    assert _window_after_a_flip(2, widen_committed) == ([0, 1, 2, 3, 4] if widen_committed else [1, 2, 3])


def test_early_stop_when_every_position_is_stable(cont_pipe):
    kw = dict(length=16, steps=30, seed=0, temperature=0.7)
    out = run_with(cont_pipe, [swd(tau=0.01, K=1, R=0)], **kw)
    m = out.report["strategies"]["swd"]
    assert m["stopped_at"] is not None and out.report["steps_run"] == m["stopped_at"] + 1 < 30
    assert m["stable_per_step"][-1] == 1.0
    full = run_with(cont_pipe, [swd(tau=0.01, K=1, R=0, early_stop=False)], **kw)
    assert full.report["steps_run"] == 30 and full.report["strategies"]["swd"]["stopped_at"] is None


def test_masked_sampler_does_not_stop_while_tokens_remain_masked(masked_pipe):
    out = run_with(masked_pipe, [swd(tau=0.01, K=1, R=0)], length=16, steps=16, seed=0)
    assert out.report["steps_run"] == 16
    assert (out.tokens != 2).all()


@pytest.mark.parametrize("time_conditioned, expect_reuse", [(False, True), (True, False)])
def test_exact_skip_only_when_not_time_conditioned(time_conditioned, expect_reuse):
    # 32 steps for 16 tokens: once every token is committed the input stops changing
    pipe = tiny_text_pipeline("masked", time_conditioned=time_conditioned)
    kw = dict(length=16, steps=32, seed=0)
    out = run_with(pipe, [swd(tau=0.01, K=1, R=0, early_stop=False)], **kw)
    reused = out.report["counters"]["steps_reused"]
    assert (reused > 0) == expect_reuse
    assert out.report["strategies"]["swd"]["steps_reused"] == reused
    off = run_with(pipe, [swd(tau=0.01, K=1, R=0, early_stop=False, exact_skip=False)], **kw)
    assert off.report["counters"]["steps_reused"] == 0
    assert torch.equal(off.tokens, out.tokens)  # exact: the reuse changes nothing


def test_hold_freezes_the_latents_of_positions_not_computed(cont_pipe):
    seen = []

    class Spy:
        name = "spy"

        @hookimpl
        def diffaccel_post_step(self, run, output):
            seen.append((output.latents.clone(), None if output.computed is None else output.computed.clone()))

    run_with(cont_pipe, [swd(tau=0.01, K=1, R=0, stable_latents="hold", early_stop=False), Spy()],
             length=16, steps=12, seed=0)
    held = 0
    for (prev, _), (z, computed) in zip(seen, seen[1:]):
        mask = torch.ones(z.shape[:2], dtype=torch.bool) if computed is None else computed
        held += int((~mask).sum())
        assert torch.equal(z[~mask], prev[~mask])
    assert held > 0
    advanced = []
    seen.clear()
    run_with(cont_pipe, [swd(tau=0.01, K=1, R=0, early_stop=False), Spy()], length=16, steps=12, seed=0)
    for (prev, _), (z, computed) in zip(seen, seen[1:]):
        if computed is not None:
            mask = computed
            advanced.append(not torch.equal(z[~mask], prev[~mask]))
    assert any(advanced)  # "advance": the sampler's update moves them without the model


def test_state_is_kept_per_guidance_branch():
    s = swd(tau=0.5, K=1, R=0, early_stop=False)
    run = _continuous_run(batch=1)
    s.diffaccel_run_start(run)
    run.step = 0
    for branch, top1 in (("cond", [[1, 1]]), ("uncond", [[2, 2]])):
        run.branch = branch
        s.diffaccel_post_step(run, _step_output(top1, [[0.9, 0.2]]))
    run.branch = "cond"
    assert run.state(s).top1.tolist() == [[1, 1]]
    run.branch = "uncond"
    assert run.state(s).top1.tolist() == [[2, 2]]


def test_defaults_depend_on_the_sampler():
    d = diffaccel_swd.strategy.DEFAULTS
    assert swd().resolved("masked") == d["masked"]
    assert swd().resolved("hybrid") == d["continuous"] == swd().resolved("ddim")
    assert d["masked"]["tau"] != d["continuous"]["tau"]
    assert swd(tau=0.3, K=7).resolved("masked") == {**d["masked"], "tau": 0.3, "K": 7}
    # setting R alone gives a constant R; R_end alone moves the sampler's default R
    assert swd(R=2).resolved("masked")["R_end"] is None
    assert swd(R_end=3).resolved("masked") == {**d["masked"], "R_end": 3}


def test_the_defaults_reach_the_run(masked_pipe):
    out = run_with(masked_pipe, [swd()], length=16, steps=16, seed=0)
    m = out.report["strategies"]["swd"]
    assert {k: m[k] for k in ("tau", "K", "R", "R_end", "max_age")} == diffaccel_swd.strategy.DEFAULTS["masked"]


def test_reruns_start_fresh(masked_pipe):
    s = swd(tau=0.01, K=2, R=1)
    a = run_with(masked_pipe, [s], length=24, steps=24, seed=3)
    b = run_with(masked_pipe, [s], length=24, steps=24, seed=3)
    assert torch.equal(a.tokens, b.tokens) and a.report == b.report


# ---- configuration and bad input ------------------------------------------------------------

@pytest.mark.parametrize("kwargs, key, words", [
    ({"tau": 0.0}, "tau", "(0.0, 1.0]"),
    ({"tau": -0.5}, "tau", "(0.0, 1.0]"),
    ({"tau": 1.5}, "tau", "(0.0, 1.0]"),
    ({"K": 0}, "K", "[1, inf)"),
    ({"R": -1}, "R", "[0, inf)"),
    ({"R_end": -2}, "R_end", "[0, inf)"),
    ({"max_age": -1}, "max_age", "[0, inf)"),
    ({"stable_latents": "freeze"}, "stable_latents", "'advance', 'hold'"),
])
def test_bad_values_name_the_key(kwargs, key, words):
    with pytest.raises(ConfigValueError) as err:
        SWDConfig(**kwargs)
    assert err.value.key == key and words in err.value.message


def registry():
    import diffaccel_topk

    reg = diffaccel.Registry(load_entrypoints=False)
    reg.register_plugin(diffaccel_swd, name="swd")
    reg.register_plugin(diffaccel_topk, name="topk")
    return reg


MODEL = {"adapter": "text", "checkpoint": "unused", "length": 16, "steps": 16}


@pytest.mark.parametrize("table, words", [
    ({"tau": 0}, "key 'tau': must be in (0.0, 1.0], got 0"),
    ({"tau": 2.0}, "key 'tau': must be in (0.0, 1.0], got 2.0"),
    ({"K": 0}, "key 'K': must be in [1, inf), got 0"),
    ({"K": 2.5}, "key 'K': expected"),
    ({"R": -3}, "key 'R': must be in [0, inf), got -3"),
    ({"radius": 2}, "unknown key 'radius'"),
])
def test_config_file_errors_name_table_and_key(table, words):
    with pytest.raises(ConfigError) as err:
        parse_config({"model": MODEL, "strategy": [{"use": "swd", **table}]}, source="x.toml", registry=registry())
    msg = str(err.value)
    assert msg.startswith("x.toml: [[strategy]] #1 (swd): ") and words in msg and "\n" not in msg


def test_a_model_without_token_positions_is_refused_by_capability():
    with pytest.raises(ConfigError) as err:
        parse_config({"model": {"adapter": "unet", "checkpoint": "digits"}, "strategy": [{"use": "swd"}]},
                     source="u.toml", registry=registry())
    assert str(err.value).startswith("u.toml: [[strategy]] #1 (swd): strategy 'swd' requires capability 'token-positions', "
                                     "which adapter 'unet' does not declare")
    with pytest.raises(ConfigError, match="needs a model with capability 'token-positions'"):
        swd().diffaccel_run_start(RunState(adapter="unet", num_steps=2, batch_size=1, capabilities=frozenset({"block-stack"})))


def test_cli_exits_2_on_bad_input(tmp_path, capsys):
    from diffaccel.cli.entry import main

    bad = tmp_path / "bad.toml"
    bad.write_text('[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\n\n[[strategy]]\nuse = "swd"\nR = -1\n')
    assert main(["check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "key 'R': must be in [0, inf), got -1" in err and "Traceback" not in err


def test_composes_with_topk_in_one_config(masked_pipe):
    cfg = parse_config({"model": {**MODEL, "temperature": 0.0},
                        "strategy": [{"use": "swd", "tau": 0.01, "K": 1, "R": 0}, {"use": "topk", "k": 3, "k_keep": 8}]},
                       registry=registry())
    with diffaccel.apply(masked_pipe, cfg, registry=registry()):
        out = masked_pipe(length=16, steps=16, seed=0, temperature=0.0, progress=False)
    assert set(out.report["strategies"]) == {"swd", "topk"}
    assert out.report["counters"]["fraction_computed"] < 1.0
    assert out.report["strategies"]["topk"]["steps_truncated"] == 16
    assert (out.tokens != 2).all()


def test_shipped_configs_are_valid():
    root = Path(__file__).resolve().parents[3] / "configs"
    for name in ("text-swd.toml", "text-continuous-swd.toml"):
        cfg = diffaccel.load_config(root / name)
        assert [s.name for s in cfg.strategies] == ["swd"]


def test_bench_plot_writes_a_png(masked_pipe, tmp_path):
    reports = [run_with(masked_pipe, [swd(tau=0.01, K=2, R=1)], length=16, steps=16, seed=s).report for s in (0, 1)]
    path = tmp_path / "curve.png"
    SWD().diffaccel_bench_plot(reports, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_retired_sweep_runs_the_equivalent_bench_grid_and_says_so(tmp_path, monkeypatch, capsys):
    from diffaccel_swd import sweep

    seen = {}

    def fake_bench(paths, options):
        seen.update(paths=paths, options=options, swd=Path(paths[1]).read_text())
        return "RESULT"

    monkeypatch.setattr(sweep, "run_bench", fake_bench)
    monkeypatch.setattr(sweep, "format_table", lambda result: f"table of {result}")
    assert sweep.main(["configs/text-default.toml", "--tau", "0.01,0.5", "--K", "3,2", "--seeds", "2",
                       "--extra", "early_stop = false", "--no-noise-floor"]) == 0
    out, err = capsys.readouterr()
    assert out == "table of RESULT\n"
    assert len(err.strip().splitlines()) == 1 and "deprecated" in err
    assert ("diffaccel bench configs/text-default.toml SWD.toml --grid tau=0.01,0.5 --grid K=3,2 --grid R=2 --seeds 2 "
            "--no-noise-floor") in err
    o = seen["options"]
    assert o.grid == ["tau=0.01,0.5", "K=3,2", "R=2"] and o.seeds == 2 and not o.noise_floor
    assert 'use = "swd"' in seen["swd"] and "early_stop = false" in seen["swd"] and 'checkpoint = "wordnet-masked"' in seen["swd"]


def test_the_swd_grid_runs_as_a_bench(tmp_path):
    """The command's configs and options, run: one entry per (tau, K, R)."""
    from diffaccel_swd import sweep

    args = argparse.Namespace(baseline=str(tmp_path / "base.toml"), tau="0.01,0.5", K="2", R="1", extra="", seeds=1,
                              batch=None, config=[], plots=None, seed=None, judge="none", no_noise_floor=True,
                              json=None, only_configs=False)
    Path(args.baseline).write_text('[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 8\nsteps = 4\n')
    (tmp_path / "swd.toml").write_text(sweep.swd_config(args.baseline, ""))
    _, paths, options = sweep.bench_args(args, str(tmp_path / "swd.toml"))
    result = diffaccel.run_bench(paths, attrs.evolve(options, progress=False, timed=False))
    assert [e.name for e in result.entries] == ["baseline", "swd[tau=0.01,K=2,R=1]", "swd[tau=0.5,K=2,R=1]"]


@pytest.mark.parametrize("kind", ["masked", "continuous"])
def test_post_step_top1_matches_the_logits_exactly_on_partial_steps(kind, masked_pipe, cont_pipe):
    # the adapter refreshes top-1 only on the rows computed at a step; it must equal a full recompute
    checked = []

    class Spy:
        name = "spy"

        @hookimpl
        def diffaccel_post_step(self, run, output):
            p, j = most_probable(output.logits.float())  # what a full step computes
            assert torch.equal(output.top1_prob, p) and torch.equal(output.top1, j)
            assert torch.allclose(p, output.logits.float().softmax(-1).amax(-1), rtol=1e-5)
            checked.append(output.computed is not None)

    pipe = masked_pipe if kind == "masked" else cont_pipe
    run_with(pipe, [swd(tau=0.01, K=1, R=1, early_stop=False), Spy()], length=24, steps=12, seed=0)
    assert sum(checked) >= 5


def test_max_age_recomputes_positions_whose_logits_grew_old():
    s = swd(tau=0.01, K=1, R=0, max_age=2, early_stop=False)
    run = _continuous_run(batch=1)
    s.diffaccel_run_start(run)
    plans = []
    for step in range(4):
        run.step = step
        plan = s.diffaccel_pre_step(run)
        plans.append(None if plan.positions is None else plan.positions[0].tolist())
        computed = plan.positions
        s.diffaccel_post_step(run, _step_output([[1, 2, 3]], [[0.9] * 3], computed=computed))
    # step 0 full; step 1 nothing (all stable); after two steps without computation: all again
    assert plans == [None, [False] * 3, [False] * 3, [True] * 3]


def test_masked_default_max_age_recomputes_old_logits_and_zero_turns_it_off(masked_pipe):
    aged = run_with(masked_pipe, [swd()], length=32, steps=32, seed=0).report["strategies"]["swd"]
    unlimited = run_with(masked_pipe, [swd(max_age=0)], length=32, steps=32, seed=0).report["strategies"]["swd"]
    assert aged["max_age"] == 8 and unlimited["max_age"] == 0
    assert aged["mean_computed"] > unlimited["mean_computed"]


def test_the_sweep_is_a_registered_command(monkeypatch, capsys):
    from diffaccel.cli.entry import main

    monkeypatch.setenv("DIFFACCEL_PLUGINS", "swd")
    with pytest.raises(SystemExit) as exc:
        main(["swd-sweep", "configs/text-default.toml", "--seeds", "x"])
    assert exc.value.code == 2 and "--seeds: invalid int value" in capsys.readouterr().err


# ---- fresh commits (masked sampler) and the cost gate --------------------------------------

def test_fresh_commits_compute_every_masked_position_and_refresh_old_context():
    s = swd(tau=0.01, K=1, R=0, early_stop=False, max_age=2)
    run = RunState(adapter="text", capabilities=TEXT, num_steps=5, batch_size=1)
    run.info.set(sampler="masked", time_conditioned=False)
    s.diffaccel_run_start(run)
    M = 2  # mask id
    steps = [[M, M, M, M], [5, M, M, M], [5, M, 6, M], [5, M, 6, M], [5, M, 6, M]]
    nexts = []
    for step, tokens in enumerate(steps):
        run.step = step
        plan = s.diffaccel_pre_step(run)
        t = torch.tensor([tokens])
        s.diffaccel_post_step(run, _step_output([[5, 7, 6, 7]], [[0.9] * 4], tokens=t, masked=t == M,
                                                computed=None if plan.positions is None else plan.positions))
        nexts.append(run.state(s).next[0].nonzero().squeeze(1).tolist())
    # every masked position, plus the one committed at that step; committed 0 (last computed at
    # step 2) is context refreshed two steps later (max_age 2), committed 2 (step 3) not yet
    assert nexts[:4] == [[0, 1, 2, 3], [0, 1, 2, 3], [1, 2, 3], [1, 3]]
    assert nexts[4] == [0, 1, 3]


class CommitSpy:
    """After swd: records each step's computed positions and the tokens after it."""

    name = "spy"

    def __init__(self):
        self.computed, self.tokens = [], []

    @hookimpl
    def diffaccel_post_step(self, run, output):
        B, N = output.tokens.shape
        self.computed.append(torch.ones(B, N, dtype=torch.bool) if output.computed is None else output.computed.clone())
        self.tokens.append(output.tokens.clone())

    def stale_commits(self) -> int:
        """Tokens committed at a step whose prediction that step did not compute."""
        n = 0
        for s in range(1, len(self.tokens)):
            committed = self.tokens[s] != self.tokens[s - 1]
            n += int((committed & ~self.computed[s]).sum())
        return n


@pytest.mark.parametrize("fresh", [True, False])
def test_no_token_is_committed_from_a_stale_prediction_with_fresh_commits(masked_pipe, fresh):
    spy = CommitSpy()
    out = run_with(masked_pipe, [swd(tau=0.01, K=1, R=0, fresh_commits=fresh), spy], length=32, steps=32, seed=0, batch=2)
    assert out.report["counters"]["fraction_computed"] < 1.0
    if fresh:
        assert spy.stale_commits() == 0
    else:  # the rule before: a stable masked position keeps its prediction, which is then committed
        assert spy.stale_commits() > 0


@pytest.mark.parametrize("strategy_s, on", [(0.5, True), (2.0, False)])
def test_the_cost_gate_keeps_or_drops_swd_as_the_clock_says(masked_pipe, monkeypatch, strategy_s, on):
    monkeypatch.delenv("DIFFACCEL_COST_GATE", raising=False)
    s = swd()
    s.paygate.clock = StepClock(s.paygate, 1.0, strategy_s)
    kw = dict(length=32, steps=32, seed=0)
    first = run_with(masked_pipe, [s], **kw).report
    second = run_with(masked_pipe, [s], **kw).report
    m = first["strategies"]["swd"]
    assert m["cost_gate"]["on"] is on and m["summary"].startswith("swd cost gate: " + ("on" if on else "off"))
    # a verdict off leaves every later step plain: the second run is the baseline's work, exactly
    assert (second["counters"]["fraction_computed"] == 1.0) is not on
    assert first["counters"]["fraction_computed"] < 1.0  # the probe steps ran swd either way
