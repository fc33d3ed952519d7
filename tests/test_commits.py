"""The masked sampler's commit hook (``diffaccel_commit``) and the ``steps`` peer of the text adapter."""

from __future__ import annotations

import pytest
import torch

from diffaccel import ConfigError, hookimpl, parse_config
from diffaccel.adapters.text.adapter import StepsPeer, TextAdapter
from diffaccel.runtime.config import PeerEntry
from diffaccel.adapters.text.testing import tiny_text_pipeline
from diffaccel.testing import run_with

N = 32


@pytest.fixture(scope="module")
def pipe():
    return tiny_text_pipeline("masked")


class Chooser:
    """Commits the positions ``pick(run, proposal)`` returns; records what each step saw."""

    def __init__(self, name, pick):
        self.name, self.pick, self.seen = name, pick, []

    @hookimpl
    def diffaccel_commit(self, run, proposal):
        self.seen.append((run.step, proposal.candidates.clone(), proposal.scheduled.clone()))
        return self.pick(run, proposal)

    @hookimpl
    def diffaccel_post_step(self, run, output):
        self.seen[-1] += (output.masked.clone(),)


def at(step, positions, rows=None):
    def pick(run, p):
        if run.step != step:
            return None
        m = torch.zeros_like(p.candidates)
        m[slice(None) if rows is None else rows, positions] = True
        return m
    return pick


def test_commits_of_two_strategies_are_ored_with_the_schedule(pipe):
    a, b = Chooser("a", at(0, [5])), Chooser("b", at(0, [9]))
    run_with(pipe, [a, b], length=N, steps=N, seed=3)
    _, cand, sched, masked_after = a.seen[0]
    committed = cand & ~masked_after
    assert int(sched.sum()) == 1  # one token per step on the schedule
    expected = sched.clone()
    expected[0, 5] = expected[0, 9] = True
    assert committed.tolist() == expected.tolist()


def test_a_strategy_that_chooses_nothing_leaves_the_run_unchanged(pipe):
    bare = pipe(None, length=N, steps=N, seed=4, batch=2, block_size=8, progress=False)
    out = run_with(pipe, [Chooser("none", lambda run, p: None)], length=N, steps=N, seed=4, batch=2, block_size=8)
    assert torch.equal(bare.tokens, out.tokens)
    assert out.report["steps_run"] == N


def test_committing_everything_ends_the_run_after_one_step(pipe):
    out = run_with(pipe, [Chooser("all", lambda run, p: p.candidates)], length=N, steps=N, seed=5)
    assert out.report["steps_run"] == 1
    assert not (out.tokens == pipe.denoiser.mask_id).any()


def test_each_block_ends_as_soon_as_it_is_committed(pipe):
    c = Chooser("all", lambda run, p: p.candidates)
    out = run_with(pipe, [c], length=N, steps=N, seed=5, block_size=8)
    assert out.report["steps_run"] == N // 8
    # step s commits block s only
    for s, cand, _, _ in c.seen:
        assert cand[0].nonzero().squeeze(1).tolist() == list(range(8 * s, 8 * s + 8))


def test_rows_advance_independently_and_a_finished_row_costs_nothing(pipe):
    c = Chooser("row0", at(0, slice(None), rows=0))  # row 0 commits everything at step 0
    out = run_with(pipe, [c], length=N, steps=N, seed=6, batch=2)
    alone = pipe(None, length=N, steps=N, seed=7, batch=1, progress=False)
    assert torch.equal(out.tokens[1], alone.tokens[0])  # row 1 ran its own schedule, untouched
    assert out.report["steps_run"] == N
    c_ = out.report["counters"]
    # step 0 computed both rows, every later step row 1 only
    layers = pipe.denoiser.n_layers
    assert c_["positions_computed"] == layers * (2 * N + (N - 1) * N)
    assert c_["positions_total"] == layers * 2 * N * N


def test_commits_stay_within_the_candidates(pipe):
    c = Chooser("outside", lambda run, p: torch.ones_like(p.candidates))
    out = run_with(pipe, [c], length=N, steps=N, seed=8, block_size=16, prompt="ab")
    assert out.tokens[0, :2].tolist() == pipe.tokenizer.encode("ab")
    assert out.report["steps_run"] == 2  # one step per block


# ---- the steps peer ----------------------------------------------------------------------

TEXT = '[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 64\nsteps = 32\n'


def test_steps_peer_is_named_and_runs_its_steps():
    cfg = parse_config(_toml(TEXT + '[[peer]]\nuse = "steps"\nsteps = 8\n'), source="t.toml")
    (peer,) = cfg.peers
    assert TextAdapter.peer_name(peer) == "steps-8"
    assert TextAdapter.peer_name(PeerEntry(name="steps", index=1, config=StepsPeer(steps=8, name="short"))) == "short"
    run_cfg = TextAdapter.peer_run_config(cfg, peer.config)
    assert run_cfg.model.steps == 8 and run_cfg.options == cfg.options
    pipe = tiny_text_pipeline("masked")
    with TextAdapter.peer_context(pipe, peer.config):
        out = pipe(None, length=N, steps=run_cfg.model.steps, seed=0, progress=False)
    assert out.report["steps_run"] == 8


@pytest.mark.parametrize("extra, message", [
    ('[[peer]]\nuse = "steps"\nsteps = 32\n', "t.toml: [[peer]] #1 (steps): key 'steps': 32 is not below the config's 32 steps; allowed: 1 to 31"),
    ('[[peer]]\nuse = "steps"\nsteps = 8\n[[peer]]\nuse = "steps"\nsteps = 40\n', "[[peer]] #2 (steps): key 'steps': 40 is not below"),
    ('[[peer]]\nuse = "steps"\nsteps = 0\n', "[[peer]] #1 (steps): key 'steps': must be positive, got 0"),
    ('[[peer]]\nuse = "steps"\n', "[[peer]] #1 (steps): missing key 'steps'"),
])
def test_steps_peer_errors(extra, message):
    with pytest.raises(ConfigError) as e:
        parse_config(_toml(TEXT + extra), source="t.toml")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_steps_peer_default_steps_is_the_length():
    with pytest.raises(ConfigError, match="not below the config's 64 steps"):
        parse_config(_toml('[model]\nadapter = "text"\nlength = 64\n[[peer]]\nuse = "steps"\nsteps = 64\n'), source="t.toml")


def test_cli_exit_2_for_a_steps_peer_not_below(tmp_path, capsys):
    from diffaccel.cli.entry import main

    path = tmp_path / "bad.toml"
    path.write_text(TEXT + '[[peer]]\nuse = "steps"\nsteps = 50\n')
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "50 is not below the config's 32 steps" in err


def _toml(text):
    import tomllib

    return tomllib.loads(text)


def test_bench_configs_may_differ_in_the_masked_samplers_blocks(tmp_path):
    """A config in blocks (or with the exact prefix cache) is benched beside one without: its model
    runs as a steps peer carrying its blocks, its strategies on that model; another key still differs."""
    from diffaccel.bench.plan import load_bench_configs
    from diffaccel.bench.variants import add_peers
    from diffaccel.runtime.registry import Registry

    files = {"base": TEXT, "blocks": TEXT + "block_size = 16\n", "prefix": TEXT + "block_size = 16\nprefix_cache = true\n",
             "other": TEXT.replace("length = 64", "length = 48")}
    paths = {}
    for name, text in files.items():
        (tmp_path / f"{name}.toml").write_text(text)
        paths[name] = str(tmp_path / f"{name}.toml")
    configs = load_bench_configs([paths["base"], paths["blocks"], paths["prefix"]], Registry())
    peer = TextAdapter.variant_peer(configs[0], configs[2])
    assert (peer.steps, peer.block_size, peer.prefix_cache) == (32, 16, True)
    run_cfg = TextAdapter.peer_run_config(configs[0], peer)
    assert (run_cfg.options.block_size, run_cfg.options.prefix_cache) == (16, True)
    assert TextAdapter.peer_name(PeerEntry(name="steps", index=0, config=peer)) == "steps-32-b16-prefix"
    back = TextAdapter.variant_peer(configs[1], configs[0])  # no blocks: one block of the whole length
    assert TextAdapter.peer_run_config(configs[1], back).options.block_size == 64
    assert TextAdapter.variant_peer(configs[0], configs[0]) == StepsPeer(steps=32)
    merged, variants, alone, _ = add_peers(configs, TextAdapter, False, lambda c: c.source.rsplit("/", 1)[-1][:-5])
    assert [TextAdapter.peer_name(p) for p in merged[0].peers] == ["blocks", "prefix"] and not variants
    with pytest.raises(ConfigError, match="keys other than steps, block_size and prefix_cache"):
        load_bench_configs([paths["base"], paths["other"]], Registry())
