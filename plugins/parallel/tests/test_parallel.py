"""Tests of the parallel strategy: the rules on hand-made confidences, runs on tiny random masked
models (alone, in blocks, at batch > 1, with swd, time-anchor and topk), and bad input."""

from __future__ import annotations

import math

import pytest
import torch

from diffaccel import ConfigError, hookimpl, parse_config
from diffaccel.runtime.accelerator import build_strategies
from diffaccel.adapters.text.sampling.logits import TopKLogits
from diffaccel.adapters.text.testing import tiny_text_pipeline
from diffaccel.testing import run_with
from diffaccel_parallel import Parallel, ParallelConfig, choose, entropies, scaled_confidence, spaced

N = 32


@pytest.fixture(scope="module")
def pipe():
    return tiny_text_pipeline("masked")


def par(**kw) -> Parallel:
    return Parallel(ParallelConfig(**kw))


def conf_row(values, n=8):
    """(1, n) confidences, candidates where a value is given (None: not a candidate)."""
    c = torch.tensor([[v if v is not None else 0.0 for v in values] + [0.0] * (n - len(values))])
    cand = torch.tensor([[v is not None for v in values] + [False] * (n - len(values))])
    return c, cand


# ---- the rules -----------------------------------------------------------------------------

def test_threshold_on_probabilities_commits_every_candidate_at_or_above_tau():
    c, cand = conf_row([0.95, 0.5, None, 0.9, 0.89])
    got = choose(scaled_confidence(c, cand, "prob"), ParallelConfig(rule="threshold", scale="prob", tau=0.9))
    assert got[0].nonzero().squeeze(1).tolist() == [0, 3]


def test_ratio_scale_reads_confidence_against_the_rows_best_candidate():
    c, cand = conf_row([0.10, 0.08, 0.04, 0.5])
    cand[0, 3] = False  # a non-candidate's confidence never sets the scale
    conf = scaled_confidence(c, cand, "ratio")
    assert conf[0, :3].tolist() == pytest.approx([1.0, 0.8, 0.4])
    assert conf[0, 3] == -math.inf
    got = choose(conf, ParallelConfig(rule="threshold", tau=0.75))
    assert got[0].nonzero().squeeze(1).tolist() == [0, 1]  # 0.42 would never pass tau = 0.9 on probabilities


def test_ratio_is_per_row():
    c = torch.tensor([[0.2, 0.1], [0.02, 0.01]])
    cand = torch.ones(2, 2, dtype=torch.bool)
    assert scaled_confidence(c, cand, "ratio").flatten().tolist() == pytest.approx([1.0, 0.5, 1.0, 0.5])


def fast_dllm_factor(conf: list[float], factor: float) -> int:
    """How many Fast-dLLM's factor rule commits: the k-th most confident (k from 1) needs
    1 - factor / (k + 1), the first always goes, and the count is the leading run that passes."""
    s = sorted(conf, reverse=True)
    n = 1
    while n < len(s) and s[n] >= 1 - factor / (n + 2):
        n += 1
    return n


@pytest.mark.parametrize("factor", [0.5, 1.0, 2.0, 3.0])
def test_factor_rule_takes_the_leading_run_of_Fast_dLLMs_thresholds(factor):
    vals = [0.99, 0.8, 0.7, 0.55, 0.3, 0.9]
    c, cand = conf_row(vals)
    got = choose(scaled_confidence(c, cand, "prob"), ParallelConfig(rule="factor", scale="prob", factor=factor))
    n = fast_dllm_factor(vals, factor)
    assert int(got.sum()) == n
    best = sorted(range(len(vals)), key=lambda i: -vals[i])[:n]
    assert sorted(got[0].nonzero().squeeze(1).tolist()) == sorted(best)


def test_factor_rule_stops_at_the_first_failure_even_if_a_later_one_would_pass():
    # thresholds for k = 2, 3 at factor 1: 0.667, 0.75; the second (0.6) fails, so the third (0.6) waits too
    c, cand = conf_row([0.9, 0.6, 0.6])
    got = choose(scaled_confidence(c, cand, "prob"), ParallelConfig(rule="factor", scale="prob", factor=1.0))
    assert got[0].tolist()[:3] == [True, False, False]


def test_entropy_rule_bounds_the_summed_entropy_less_the_largest():
    c, cand = conf_row([0.9, 0.8, 0.7, 0.6])
    H = torch.tensor([[0.5, 0.4, 0.3, 2.0, 0, 0, 0, 0]])
    cfg = ParallelConfig(rule="entropy", scale="prob", gamma=0.75)
    # in confidence order 0.5, 0.4, 0.3, 2.0: sum - max = 0, 0.4, 0.7, 1.2
    got = choose(scaled_confidence(c, cand, "prob"), cfg, H)
    assert got[0].nonzero().squeeze(1).tolist() == [0, 1, 2]
    # ratio: excess over the lowest candidate entropy (0.3): 0.2, 0.1, 0, 1.7 -> 0, 0.1, 0.1, 0.3
    got = choose(scaled_confidence(c, cand, "ratio"), ParallelConfig(rule="entropy", gamma=0.25), H)
    assert got[0].nonzero().squeeze(1).tolist() == [0, 1, 2]
    got = choose(scaled_confidence(c, cand, "ratio"), ParallelConfig(rule="entropy", gamma=0.35), H)
    assert got[0].nonzero().squeeze(1).tolist() == [0, 1, 2, 3]


def test_max_per_step_caps_a_row():
    c, cand = conf_row([0.9, 0.95, 0.99, 0.97])
    got = choose(scaled_confidence(c, cand, "prob"), ParallelConfig(rule="threshold", scale="prob", tau=0.5, max_per_step=2))
    assert got[0].nonzero().squeeze(1).tolist() == [2, 3]


def test_spacing_keeps_a_steps_extra_commits_apart_in_confidence_order():
    # row 0: scheduled 5; extras in confidence order 6 (next to 5: waits), 9, 8 (next to 9: waits), 1
    # row 1: no schedule; 3 and 4 adjacent: only the surer 4 goes, 0 is far enough at spacing 1
    conf = torch.tensor([[0.0, 0.5, 0.0, 0.0, 0.0, 1.0, 0.95, 0.0, 0.7, 0.9],
                         [0.4, 0.0, 0.0, 0.6, 0.8, 0.0, 0.0, 0.0, 0.0, 0.0]])
    chosen = conf > 0
    scheduled = torch.zeros_like(chosen)
    scheduled[0, 5] = True
    got = spaced(chosen, scheduled, conf, 1)
    assert got[0].nonzero().squeeze(1).tolist() == [1, 5, 9]
    assert got[1].nonzero().squeeze(1).tolist() == [0, 4]
    # spacing 4: the schedule's 5 blocks 1 to 9 in row 0; the kept 4 blocks 0 to 8 in row 1
    got4 = spaced(chosen, scheduled, conf, 4)
    assert got4[0].nonzero().squeeze(1).tolist() == [5]
    assert got4[1].nonzero().squeeze(1).tolist() == [4]
    assert torch.equal(spaced(chosen, scheduled, conf, 0), chosen)


def greedy_spacing(chosen, scheduled, conf, spacing):
    """The spacing filter as first written: one candidate at a time in confidence order."""
    kept = scheduled.clone()
    for r in range(chosen.shape[0]):
        blocked = [any(scheduled[r, max(0, i - spacing): i + spacing + 1]) for i in range(chosen.shape[1])]
        extras = [i for i in range(chosen.shape[1]) if chosen[r, i] and not scheduled[r, i]]
        for i in sorted(extras, key=lambda i: -float(conf[r, i])):
            if not blocked[i]:
                kept[r, i] = True
                for q in range(max(0, i - spacing), min(chosen.shape[1], i + spacing + 1)):
                    blocked[q] = True
    return kept


@pytest.mark.parametrize("spacing", [1, 2, 3, 6])
def test_spacing_filter_equals_the_greedy_pass_in_confidence_order(spacing):
    g = torch.Generator().manual_seed(spacing)
    for _ in range(50):
        conf = torch.rand(4, 40, generator=g)
        chosen = torch.rand(4, 40, generator=g) < 0.5
        scheduled = chosen & (torch.rand(4, 40, generator=g) < 0.1)
        assert torch.equal(spaced(chosen, scheduled, conf, spacing), greedy_spacing(chosen, scheduled, conf, spacing))


def test_entropies_match_the_softmax_definition_and_topk_logits():
    lg = torch.randn(2, 3, 11)
    rows = torch.tensor([0, 4, 5])
    p = lg.reshape(6, 11).softmax(-1)
    ref = -(p * p.log()).sum(-1)
    assert entropies(lg, rows, 1.0).tolist() == pytest.approx(ref[rows].tolist(), rel=1e-5)
    vals, idx = lg.topk(4, dim=-1)
    pk = vals.reshape(6, 4).softmax(-1)
    ref_k = -(pk * pk.log()).sum(-1)
    assert entropies(TopKLogits(vals, idx, 11), rows, 1.0).tolist() == pytest.approx(ref_k[rows].tolist(), rel=1e-5)


# ---- runs ----------------------------------------------------------------------------------

def test_parallel_needs_fewer_steps_and_leaves_nothing_masked(pipe):
    out = run_with(pipe, [par(rule="threshold", tau=0.5)], length=N, steps=N, seed=1)
    assert out.report["steps_run"] < N
    assert not (out.tokens == pipe.denoiser.mask_id).any()
    m = out.report["strategies"]["parallel"]
    assert m["extra_commits"] > 0 and m["steps_run"] == out.report["steps_run"]
    assert m["commits_per_step"] == pytest.approx(N / m["steps_run"])


def test_tau_one_on_ratio_commits_only_ties_with_the_best(pipe):
    # tau = 1 on the ratio scale commits the surest only (ties aside): the schedule's one-per-step
    bare = run_with(pipe, [], length=N, steps=N, seed=2)
    out = run_with(pipe, [par(rule="threshold", tau=1.0)], length=N, steps=N, seed=2)
    assert torch.equal(bare.tokens, out.tokens) and out.report["steps_run"] == N


class MaskedWatch:
    """Appends row 0's masked positions after every step to ``seen``."""

    name = "watch"

    def __init__(self, seen: list):
        self.seen = seen

    @hookimpl
    def diffaccel_post_step(self, run, output):
        self.seen.append(output.masked[0].clone())


@pytest.mark.parametrize("rule, kw", [("threshold", {"tau": 0.6}), ("factor", {"factor": 3.0}), ("entropy", {"gamma": 2.0})])
def test_rules_in_semi_autoregressive_blocks(pipe, rule, kw):
    seen = []
    out = run_with(pipe, [par(rule=rule, **kw), MaskedWatch(seen)], length=N, steps=N, seed=3, block_size=8)
    assert not (out.tokens == pipe.denoiser.mask_id).any() and out.report["steps_run"] < N
    # block b is committed entirely before any position of block b + 1 is
    for masked in seen:
        open_blocks = [b for b in range(N // 8) if masked[8 * b: 8 * b + 8].any()]
        assert all(masked[8 * b: 8 * b + 8].all() for b in open_blocks[1:])


def test_spacing_in_a_run_keeps_each_steps_commits_apart(pipe):
    seen = []
    out = run_with(pipe, [par(rule="factor", factor=8.0, spacing=2), MaskedWatch(seen)], length=N, steps=N, seed=4)
    assert not (out.tokens == pipe.denoiser.mask_id).any() and out.report["steps_run"] < N
    before = torch.ones(N, dtype=torch.bool)
    several = 0
    for masked in seen:  # at steps = length the schedule commits one per step; extras keep 3 apart
        pos = (before & ~masked).nonzero().squeeze(1)
        several += len(pos) > 1
        assert bool(((pos[1:] - pos[:-1]) > 2).all())
        before = masked
    assert several > 0


def test_rows_of_a_batch_commit_independently(pipe):
    p = par(rule="factor", factor=3.0)
    batch = run_with(pipe, [p], length=N, steps=N, seed=10, batch=3)
    for r in range(3):
        alone = run_with(pipe, [p], length=N, steps=N, seed=10 + r)
        assert torch.equal(batch.tokens[r], alone.tokens[0])
    # rows finish at different steps and stop costing compute: fewer positions than full steps
    c = batch.report["counters"]
    assert c["positions_computed"] < pipe.denoiser.n_layers * 3 * N * batch.report["steps_run"]


class RowsWatch:
    """Appends which rows still have a masked position after every step to ``left``."""

    name = "rows-watch"

    def __init__(self, left: list):
        self.left = left

    @hookimpl
    def diffaccel_post_step(self, run, output):
        self.left.append(output.masked.any(1).tolist())


def test_a_finished_row_leaves_the_forward_batch(pipe, monkeypatch):
    # rows of one batch finish at different steps; from the step after a row's last commit on,
    # neither the linears (the step's positions) nor attention (its batch) see that row
    den, calls, attn = pipe.denoiser, [], []
    block, sdpa = den.block, torch.nn.functional.scaled_dot_product_attention

    def watched_block(i, h, c, kv, positions=None):
        if i == 0:
            calls.append(None if positions is None else sorted(set(positions.rows.tolist())))
        return block(i, h, c, kv, positions)

    def watched_sdpa(q, k, v, *a, **kw):
        attn.append((q.shape[0], k.shape[0]))
        return sdpa(q, k, v, *a, **kw)

    monkeypatch.setattr(den, "block", watched_block)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", watched_sdpa)
    left = []
    p = par(rule="factor", factor=3.0)
    out = run_with(pipe, [p, RowsWatch(left)], length=N, steps=N, seed=10, batch=3)
    monkeypatch.undo()
    steps = out.report["steps_run"]
    assert len(calls) == steps and len(attn) == steps * den.n_layers
    finished_early = 0
    for s in range(1, steps):
        live = [r for r in range(3) if left[s - 1][r]]
        if len(live) < 3:
            finished_early += 1
            assert calls[s] == live  # the step's positions are in the unfinished rows only
            assert all(a == (len(live), len(live)) for a in attn[s * den.n_layers: (s + 1) * den.n_layers])
    assert finished_early > 0  # the seeds make rows finish apart
    # and each row still gets what it gets alone
    for r in range(3):
        assert torch.equal(out.tokens[r], run_with(pipe, [p], length=N, steps=N, seed=10 + r).tokens[0])


# ---- composition ---------------------------------------------------------------------------

MODEL = '[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 32\nsteps = 32\n'
PAR = '[[strategy]]\nuse = "parallel"\nrule = "factor"\nfactor = 3.0\n'
OTHERS = {
    "swd": '[[strategy]]\nuse = "swd"\ntau = 0.01\nK = 2\nR = 1\n',
    "time-anchor": '[[strategy]]\nuse = "time-anchor"\nthreshold = 0.05\nwarmup = 2\nmax_age = 4\n',
    "topk": '[[strategy]]\nuse = "topk"\nk = 3\nk_keep = 16\n',
}


def strategies_of(text):
    import tomllib

    return build_strategies(parse_config(tomllib.loads(text), source="pair.toml"), info={"kind": "masked", "vocab_size": 64})


@pytest.mark.parametrize("other", list(OTHERS))
def test_parallel_composes_with(pipe, other):
    alone = run_with(pipe, strategies_of(MODEL + OTHERS[other]), length=N, steps=N, seed=4, batch=2)
    both = run_with(pipe, strategies_of(MODEL + OTHERS[other] + PAR), length=N, steps=N, seed=4, batch=2)
    assert not (both.tokens == pipe.denoiser.mask_id).any()
    assert both.report["steps_run"] < alone.report["steps_run"] == N
    assert both.report["strategies"]["parallel"]["extra_commits"] > 0
    if other in ("swd", "time-anchor"):  # the other still makes steps cheaper
        assert both.report["counters"]["fraction_computed"] < 1.0
    if other == "topk":  # every committed token is among the 16 logits topk kept
        assert both.report["strategies"]["topk"]["steps_truncated"] == both.report["steps_run"]


def test_parallel_swd_time_anchor_together(pipe):
    out = run_with(pipe, strategies_of(MODEL + OTHERS["swd"] + OTHERS["time-anchor"] + PAR), length=N, steps=N, seed=5)
    assert out.report["steps_run"] < N and not (out.tokens == pipe.denoiser.mask_id).any()
    assert out.report["counters"]["fraction_computed"] < 1.0


# ---- bad input -----------------------------------------------------------------------------

@pytest.mark.parametrize("table, message", [
    ("tau = 0", "key 'tau': must be in (0.0, 1.0], got 0.0"),
    ("tau = 1.5", "key 'tau': must be in (0.0, 1.0], got 1.5"),
    ('rule = "greedy"', "key 'rule': must be one of 'threshold', 'factor', 'entropy', got 'greedy'"),
    ('scale = "rank"', "key 'scale': must be one of 'ratio', 'prob', got 'rank'"),
    ("factor = 0", "key 'factor': must be positive, got 0.0"),
    ("gamma = -1", "key 'gamma': must be 0 or more, got -1.0"),
    ("max_per_step = 0", "key 'max_per_step': must be positive, got 0"),
    ("spacing = -1", "key 'spacing': must be 0 or more, got -1"),
    ("threshold = 0.9", "unknown key 'threshold'; allowed keys: factor, gamma, max_cache_mb, max_per_step, on_error, rule, scale, spacing, tau"),
])
def test_bad_config(table, message):
    import tomllib

    with pytest.raises(ConfigError) as e:
        parse_config(tomllib.loads(MODEL + '[[strategy]]\nuse = "parallel"\n' + table + "\n"), source="p.toml")
    assert str(e.value) == f"p.toml: [[strategy]] #1 (parallel): {message}"


def test_config_is_frozen():
    with pytest.raises(AttributeError):
        ParallelConfig().tau = 0.5


def test_image_model_is_refused():
    import tomllib

    text = '[model]\nadapter = "unet"\ncheckpoint = "digits"\n[[strategy]]\nuse = "parallel"\n'
    with pytest.raises(ConfigError, match=r"strategy 'parallel' requires capability 'mask-confidences', which adapter 'unet' does not declare"):
        parse_config(tomllib.loads(text), source="p.toml")


def test_cli_exit_2_on_a_continuous_model(tmp_path, capsys):
    from diffaccel.cli.entry import main

    path = tmp_path / "cont.toml"
    path.write_text('[model]\nadapter = "text"\ncheckpoint = "wordnet-continuous"\nsteps = 4\nlength = 16\n'
                    '[[strategy]]\nuse = "parallel"\n')
    capsys.readouterr()  # the build's progress bars
    assert main(["generate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "capability 'mask-confidences', which strategy 'parallel' requires" in err[0]
    assert str(path) in err[0] and "[[strategy]] #1 (parallel)" in err[0]


def test_cli_exit_2_on_a_bad_tau(tmp_path, capsys):
    from diffaccel.cli.entry import main

    path = tmp_path / "tau.toml"
    path.write_text(MODEL + '[[strategy]]\nuse = "parallel"\ntau = 2\n')
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{path}: [[strategy]] #1 (parallel): key 'tau': must be in (0.0, 1.0], got 2" in err[0]


def test_diffusion_gemma_is_refused_by_capability(tmp_path, capsys):
    # DiffusionGemma's block sampler redraws every canvas position at every step (uniform noise,
    # no mask token): nothing is committed, so there is no commit for parallel to choose
    from diffaccel.adapters.text.families.diffusion_gemma.build import build
    from diffaccel.cli.entry import main

    ckpt = build(tmp_path / "dg", "tiny", seed=0)
    path = tmp_path / "dg.toml"
    path.write_text(f'[model]\nadapter = "text"\ncheckpoint = "{ckpt}"\nlength = 32\nsteps = 4\n'
                    '[[strategy]]\nuse = "parallel"\n')
    capsys.readouterr()  # the build's progress bars
    assert main(["generate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'mask-confidences'" in err[0] and "parallel" in err[0] and str(path) in err[0]


class Top1Watch(MaskedWatch):
    """Also reads the step output's top-1."""

    @hookimpl
    def diffaccel_post_step(self, run, output):
        self.seen.append(output.top1[0].clone())


def test_the_steps_top1_is_computed_only_when_a_strategy_reads_it(pipe, monkeypatch):
    # parallel answers diffaccel_commit only: the sampler then skips post_step's top-1 over every
    # position; a strategy that reads only the masked positions does not pay for it either; one
    # that reads the top-1 gets it at every step; the same tokens every way
    import diffaccel.adapters.text.sampling.pipeline as pl

    calls = []
    real = pl.most_probable
    monkeypatch.setattr(pl, "most_probable", lambda lg: calls.append(1) or real(lg))
    alone = run_with(pipe, [par(rule="factor", factor=3.0)], length=N, steps=N, seed=5)
    assert calls == []
    seen = []
    watched = run_with(pipe, [par(rule="factor", factor=3.0), MaskedWatch(seen)], length=N, steps=N, seed=5)
    assert calls == [] and len(seen) == watched.report["steps_run"]
    seen_top1 = []
    read = run_with(pipe, [par(rule="factor", factor=3.0), Top1Watch(seen_top1)], length=N, steps=N, seed=5)
    assert len(calls) == len(seen_top1) == read.report["steps_run"]
    assert torch.equal(alone.tokens, watched.tokens) and torch.equal(alone.tokens, read.tokens)
