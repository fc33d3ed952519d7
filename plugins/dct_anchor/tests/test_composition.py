"""dct-anchor and time-anchor in one config on a tiny UNet pipeline: both run, neither breaks the
other, the counters add up, and leaving ``apply`` gives back the untouched pipeline bitwise."""

from __future__ import annotations

import pytest
import torch

import diffaccel
from diffaccel.adapters.diffusers.unet.adapter import UNetAdapter
from diffaccel.adapters.diffusers.unet.synthetic import build as build_synthetic
from diffaccel.runtime.config import parse_config
from diffaccel.runtime.registry import Registry

STEPS = 10
DCT = {"use": "dct-anchor", "threshold": 0.5, "warmup": 1, "max_reuse": 2,
       "blocks": ["down_blocks.1", "mid_block", "up_blocks.0", "up_blocks.1"]}
TIME = {"use": "time-anchor", "threshold": 0.5, "warmup": 2, "max_age": 2}


@pytest.fixture(scope="module")
def registry():
    reg = Registry()
    if "time-anchor" not in reg.strategies:
        pytest.skip("time-anchor is not installed (pip install -e plugins/time_anchor): nothing to compose with")
    return reg


def config(strategies):
    model = {"adapter": "unet", "checkpoint": "synthetic-sd-tiny", "steps": STEPS, "prompts": ["a red cube"]}
    return parse_config({"model": model, "strategy": strategies}, registry=Registry())


def run_both(registry, order):
    pipe = build_synthetic("synthetic-sd-tiny")
    base = UNetAdapter.run(pipe, config([]), seed=0, progress=False)
    cfg = config(list(order))
    with diffaccel.apply(pipe, cfg, registry=registry):
        out = UNetAdapter.run(pipe, cfg, seed=0, progress=False)
    rep = out.report
    assert {"dct-anchor", "time-anchor"} <= set(rep["strategies"])
    c = rep["counters"]
    n_blocks = len(UNetAdapter.info(pipe)["layers"])
    # every block call is either computed or skipped, at every step the UNet ran
    assert c["layers_computed"] + c["layers_skipped"] == (STEPS - c["steps_reused"]) * n_blocks
    assert c["positions_total"] == (STEPS - c["steps_reused"]) * n_blocks * 2  # batched guidance: 2 rows
    assert c["layers_skipped"] > 0 and c["cache_hits"] >= 1
    assert torch.isfinite(out.images).all() and (out.images - base.images).abs().max() < 0.25
    # leaving apply removes both: bitwise the untouched pipeline
    assert torch.equal(UNetAdapter.run(pipe, config([]), seed=0, progress=False).images, base.images)
    return rep


def test_dct_anchor_first_leaves_the_blocks_it_does_not_anchor_to_time_anchor(registry):
    rep = run_both(registry, (DCT, TIME))
    dct, ta = rep["strategies"]["dct-anchor"], rep["strategies"]["time-anchor"]
    assert all(b["reused"] > 0 for b in dct["blocks"].values())
    # time-anchor was asked for the blocks dct-anchor computed (and for down_blocks.0): it holds entries
    assert ta["peak_entries"] > 0


def test_time_anchor_first_answers_every_block_and_dct_anchor_is_not_asked(registry):
    rep = run_both(registry, (TIME, DCT))
    dct = rep["strategies"]["dct-anchor"]
    # layer_output is first-result in config order: time-anchor answers every block itself
    assert all(set(r["decisions"]) == {"-"} for r in dct["branches"]["main"].values())
    assert rep["strategies"]["time-anchor"]["hits"] > 0
