"""Tests of the block-cache strategy: the active blocks and step positions on hand-made masks, the
sampler's steps per block, runs on a tiny random masked model (what each step computes, that the
positions outside the plan never run, with parallel at batch > 1), and bad input."""

from __future__ import annotations

import pytest
import torch

from diffaccel import ConfigError, parse_config
from diffaccel.adapters.text.sampling.masked import block_steps
from diffaccel.adapters.text.testing import tiny_text_pipeline
from diffaccel.cli.entry import main
from diffaccel.testing import run_with
from diffaccel_block_cache import BlockCache, BlockCacheConfig, active_blocks, step_positions
from diffaccel_parallel import Parallel, ParallelConfig

N = 32


@pytest.fixture(scope="module")
def pipe():
    return tiny_text_pipeline("masked")


def cache(**kw) -> BlockCache:
    return BlockCache(BlockCacheConfig(**kw))


class RowsSeen:
    """Wraps the denoiser's ``block``: the rows (positions) each layer call ran on."""

    def __init__(self, den):
        self.den, self.inner, self.rows = den, den.block, []

    def __call__(self, i, h, c, kv, positions=None):
        self.rows.append(h.shape[0] * h.shape[1] if positions is None else h.shape[0])
        return self.inner(i, h, c, kv, positions)


# ---- the pieces ------------------------------------------------------------------------------

def test_active_block_is_the_block_of_the_first_masked_position():
    masked = torch.tensor([[False] * 5 + [True] * 3, [False] * 8, [False, False, True] + [False] * 5])
    assert active_blocks(masked, 4).tolist() == [1, -1, 0]


def test_step_positions_dual_prefix_full_and_finished_rows():
    blocks, full = torch.tensor([1, 0, -1, 2]), torch.tensor([False, True, False, False])
    dual = step_positions(blocks, full, 3, 8, "dual")
    assert dual[0].nonzero().squeeze(1).tolist() == [3, 4, 5]
    assert bool(dual[1].all()) and not bool(dual[2].any())
    assert dual[3].nonzero().squeeze(1).tolist() == [6, 7]  # a short last block
    prefix = step_positions(blocks, full, 3, 8, "prefix")
    assert prefix[0].nonzero().squeeze(1).tolist() == [3, 4, 5, 6, 7]


def test_block_steps_equal_blocks_keep_the_samplers_old_split():
    for steps, nb in [(32, 4), (30, 4), (7, 3)]:
        assert block_steps(steps, [8] * nb) == [steps // nb + (1 if b < steps % nb else 0) for b in range(nb)]


def test_block_steps_give_the_prompt_none_and_follow_the_positions_to_fill():
    assert block_steps(20, [0, 0, 4, 16]) == [0, 0, 4, 16]
    assert block_steps(10, [0, 2, 16, 12]) == [0, 1, 5, 4]
    assert block_steps(3, [16, 16, 1]) == [1, 1, 1]  # a one-position block still gets its step


# ---- runs ------------------------------------------------------------------------------------

def test_first_step_of_each_block_is_full_and_the_others_compute_the_block_alone(pipe, monkeypatch):
    spy = RowsSeen(pipe.denoiser)
    monkeypatch.setattr(pipe.denoiser, "block", spy)
    out = run_with(pipe, [cache()], length=N, steps=N, seed=1, block_size=8, temperature=0.0)
    layers = pipe.denoiser.n_layers
    per_step = [spy.rows[i] for i in range(0, len(spy.rows), layers)]
    # 4 blocks of 8 steps each: a full pass, then 7 steps of the 8 positions of the block
    assert per_step == ([N] + [8] * 7) * 4
    assert out.report["counters"]["fraction_computed"] == pytest.approx((N + 7 * 8) / (8 * N))
    m = out.report["strategies"]["block-cache"] if "strategies" in out.report else out.report["metrics"]["block-cache"]
    assert (m["full_row_steps"], m["cached_row_steps"]) == (4, 28)
    assert not bool((out.tokens == pipe.tokenizer.MASK).any())


def test_refresh_every_step_is_the_uncached_run(pipe):
    bare = pipe(None, length=N, steps=N, seed=2, block_size=8, temperature=0.0, progress=False)
    out = run_with(pipe, [cache(refresh=1)], length=N, steps=N, seed=2, block_size=8, temperature=0.0)
    assert torch.equal(out.tokens, bare.tokens)
    assert out.report["counters"]["fraction_computed"] == pytest.approx(1.0)


def test_refresh_period_adds_full_passes_within_a_block(pipe, monkeypatch):
    spy = RowsSeen(pipe.denoiser)
    monkeypatch.setattr(pipe.denoiser, "block", spy)
    run_with(pipe, [cache(refresh=3)], length=N, steps=N, seed=1, block_size=8, temperature=0.0)
    per_step = spy.rows[::pipe.denoiser.n_layers]
    assert per_step[:8] == [N, 8, 8, N, 8, 8, N, 8]


def test_prefix_mode_computes_the_block_and_the_suffix(pipe, monkeypatch):
    spy = RowsSeen(pipe.denoiser)
    monkeypatch.setattr(pipe.denoiser, "block", spy)
    run_with(pipe, [cache(mode="prefix")], length=N, steps=N, seed=1, block_size=8, temperature=0.0)
    per_step = spy.rows[::pipe.denoiser.n_layers]
    assert per_step == [N] + [32] * 7 + [N] + [24] * 7 + [N] + [16] * 7 + [N] + [8] * 7


def test_cached_steps_read_the_blocks_first_pass_not_fresh_keys(pipe):
    """The suffix's keys and values at a cached step are those of the block's first step: the run
    differs from the uncached one (refresh 1) somewhere in its logits, the point of the approximation."""
    a = run_with(pipe, [cache()], length=N, steps=N, seed=3, block_size=8, temperature=1.0)
    b = run_with(pipe, [cache(refresh=1)], length=N, steps=N, seed=3, block_size=8, temperature=1.0)
    assert a.report["counters"]["fraction_computed"] < 0.5 < b.report["counters"]["fraction_computed"]


def test_a_prompt_block_takes_no_step_and_the_cache_starts_after_it(pipe, monkeypatch):
    spy = RowsSeen(pipe.denoiser)
    monkeypatch.setattr(pipe.denoiser, "block", spy)
    out = run_with(pipe, [cache()], prompt="abcdefghij", length=N, steps=22, seed=1, block_size=8, temperature=0.0)
    per_step = spy.rows[::pipe.denoiser.n_layers]
    # blocks 1, 2, 3 hold 6, 8, 8 positions to fill: 6, 8, 8 steps, each block's first one full
    assert per_step == [N] + [8] * 5 + [N] + [8] * 7 + [N] + [8] * 7
    assert out.report["steps_run"] == 22


def test_with_parallel_rows_get_their_own_full_passes_and_both_savings_multiply(pipe, monkeypatch):
    par = Parallel(ParallelConfig(rule="threshold", scale="ratio", tau=0.9))
    alone = run_with(pipe, [Parallel(ParallelConfig(rule="threshold", scale="ratio", tau=0.9))], length=N, steps=N,
                     seed=5, batch=3, block_size=8, temperature=0.0)
    spy = RowsSeen(pipe.denoiser)
    monkeypatch.setattr(pipe.denoiser, "block", spy)
    both = run_with(pipe, [cache(), par], length=N, steps=N, seed=5, batch=3, block_size=8, temperature=0.0)
    assert both.report["steps_run"] < N
    assert not bool((both.tokens == pipe.tokenizer.MASK).any())
    m = both.report["metrics"]["block-cache"] if "metrics" in both.report else both.report["strategies"]["block-cache"]
    assert m["full_row_steps"] == 3 * 4  # every row enters each of the 4 blocks once
    assert m["cached_row_steps"] > 0
    # what ran: N positions per row-step in full, the 8 of the block per cached row-step, per layer
    expected = (m["full_row_steps"] * N + m["cached_row_steps"] * 8) * pipe.denoiser.n_layers
    assert sum(spy.rows) == both.report["counters"]["positions_computed"] == expected
    assert expected < alone.report["counters"]["positions_computed"]


# ---- bad input -------------------------------------------------------------------------------

def _cfg(tmp_path, model: str, strategy: str = "") -> str:
    path = tmp_path / "c.toml"
    path.write_text(f'[model]\nadapter = "text"\n{model}\n[[strategy]]\nuse = "block-cache"\n{strategy}')
    return str(path)


@pytest.mark.parametrize("model, strategy, key", [
    ('checkpoint = "wordnet-masked"\nlength = 32\nsteps = 32\nblock_size = 8', "refresh = -1", "refresh"),
    ('checkpoint = "wordnet-masked"\nlength = 32\nsteps = 32\nblock_size = 8', 'mode = "suffix"', "mode"),
    ('checkpoint = "wordnet-masked"\nlength = 32\nsteps = 32', "", "block_size"),
    ('checkpoint = "wordnet-masked"\nlength = 32\nsteps = 32\nblock_size = 32', "", "block_size"),
    ('checkpoint = "wordnet-masked"\nlength = 32\nsteps = 32\nblock_size = 8\nprefix_cache = true', "", "prefix_cache"),
    ('checkpoint = "wordnet-continuous"\nlength = 32\nsteps = 8\nblock_size = 8', "", "mask-confidences"),
])
def test_check_exits_2_in_one_line_naming_config_table_and_key(tmp_path, capsys, model, strategy, key):
    path = _cfg(tmp_path, model, strategy)
    assert main(["check", path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and path in err[0] and "[[strategy]] #1" in err[0] and key in err[0]


def test_generate_refuses_a_run_without_blocks_before_any_step(tmp_path, capsys):
    path = _cfg(tmp_path, 'checkpoint = "wordnet-masked"\nlength = 32\nsteps = 32')
    assert main(["generate", path, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "block_size" in err[0]


def test_image_adapter_is_refused_by_capability():
    with pytest.raises(ConfigError, match="token-positions"):
        parse_config({"model": {"adapter": "unet", "checkpoint": "digits"}, "strategy": [{"use": "block-cache"}]})


def test_ragged_last_block_is_accepted(tmp_path, capsys):
    path = _cfg(tmp_path, 'checkpoint = "wordnet-masked"\nlength = 30\nsteps = 30\nblock_size = 8')
    assert main(["check", path]) == 0
