"""Per-row seeds (``seeds=[...]``), which ``diffaccel serve`` batches unrelated requests with: a row
seeded ``s`` in a batch equals the one-row run with ``seed=s`` bitwise, with and without strategies,
whatever the other rows are."""

from __future__ import annotations

import tomllib

import pytest
import torch

import diffaccel
from diffaccel.adapters.text.testing import tiny_text_pipeline
from diffaccel.adapters.diffusers.unet.testing import tiny_digits_pipeline
from diffaccel.runtime.adapters_registry import get_adapter
from diffaccel.runtime.config import parse_config

SEEDS = [41, 3, 3, 1000]  # unrelated, and one repeated: the repeated rows must be equal too


@pytest.mark.parametrize("kind", ["masked", "continuous"])
def test_text_rows_with_their_own_seeds_equal_single_runs(kind):
    pipe = tiny_text_pipeline(kind)
    batch = pipe(["ab", "", "", "the cat"], length=16, steps=6, seeds=SEEDS, batch=4, progress=False)
    for r, (prompt, seed) in enumerate(zip(["ab", "", "", "the cat"], SEEDS)):
        single = pipe(prompt, length=16, steps=6, seed=seed, batch=1, progress=False)
        assert torch.equal(single.tokens[0], batch.tokens[r]), f"row {r}"
    assert not torch.equal(batch.tokens[0], batch.tokens[3])  # the seeds (and prompts) do differ


def test_text_rows_with_their_own_seeds_under_a_strategy(tiny_text_pipe):
    """swd keeps per-row windows and caches: a row's positions and reuse decisions are its own."""
    cfg = parse_config(tomllib.loads('[model]\nadapter = "text"\nlength = 16\nsteps = 8\n[[strategy]]\nuse = "swd"\n'),
                       source="swd.toml")
    with diffaccel.apply(tiny_text_pipe, cfg):
        batch = tiny_text_pipe(length=16, steps=8, seeds=SEEDS, batch=4, progress=False)
        singles = [tiny_text_pipe(length=16, steps=8, seed=s, batch=1, progress=False) for s in SEEDS]
    for r, single in enumerate(singles):
        assert torch.equal(single.tokens[0], batch.tokens[r]), f"row {r}"
    assert batch.report["counters"]["fraction_computed"] < 1.0  # the strategy did skip work


def test_text_seeds_must_match_the_rows(tiny_text_pipe):
    with pytest.raises(ValueError, match="seeds: 2 given for 3 rows"):
        tiny_text_pipe(length=16, steps=4, seeds=[1, 2], batch=3, progress=False)


def test_image_rows_take_their_own_seeds():
    """The UNet's rows are not batch-invariant in float on the CPU (a row alone and in a batch
    differ by ~1e-5; serve checks it at start and then batches one request at a time), so: a
    consecutive ``seeds`` list is bitwise the ``seed`` run, and an unrelated seed's row is its
    own single run to float rounding, far from its neighbour seed's."""
    pipe = tiny_digits_pipeline()
    adapter = get_adapter("unet")
    prompts = '["digit 3", "digit 5", "digit 1"]'
    cfg = parse_config(tomllib.loads(f'[model]\nadapter = "unet"\nsteps = 4\nbatch = 3\nprompts = {prompts}\n'), source="d.toml")
    same = adapter.run(pipe, cfg, 0, progress=False, seeds=[40, 41, 42])
    assert torch.equal(same.images, adapter.run(pipe, cfg, 40, progress=False).images)
    mixed = adapter.run(pipe, cfg, 0, progress=False, seeds=[77, 5, 77])
    assert mixed.seeds == [77, 5, 77]
    one = parse_config(tomllib.loads('[model]\nadapter = "unet"\nsteps = 4\nprompts = ["digit 5"]\n'), source="one.toml")
    own, neighbour = (adapter.run(pipe, one, s, progress=False).images[0] for s in (5, 6))
    assert (own - mixed.images[1]).abs().max() < 1e-3
    assert (neighbour - mixed.images[1]).abs().max() > 0.1
    with pytest.raises(ValueError, match="seeds: 2 given for 3 rows"):
        adapter.run(pipe, cfg, 0, progress=False, seeds=[1, 2])
