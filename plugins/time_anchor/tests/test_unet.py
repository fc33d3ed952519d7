"""time-anchor on the shipped digits UNet: nested depths skipped for real, guidance branches and
rows, warm-up, max_age, gates, metrics, plot."""

from __future__ import annotations

import pytest
import torch

import diffaccel
from diffaccel.adapters.diffusers.unet.adapter import UNetAdapter, load_checkpoint
from diffaccel_time_anchor import Gate, TimeAnchor, TimeAnchorConfig
from diffaccel.adapters.diffusers.unet.hooks import depth_of

STEPS = 16
PROMPTS = ["digit 3", "digit 7"]


@pytest.fixture(scope="module")
def pipe():
    p = load_checkpoint("digits")
    p.set_progress_bar_config(disable=True)
    return p


class Report:
    """Keeps the run report (the pipeline's output has images only)."""

    name = "report"
    report = None

    @diffaccel.hookimpl
    def diffaccel_run_end(self, run):
        self.report = run.report()


def count_calls(module):
    n = [0]
    module.register_forward_hook(lambda *_: n.__setitem__(0, n[0] + 1))
    return n


def generate(pipe, strategies=(), batched=True, steps=STEPS, prompts=PROMPTS):
    rep = Report()
    gens = [torch.Generator().manual_seed(i) for i in range(len(prompts))]
    with diffaccel.apply(pipe, strategies=[*strategies, rep]):
        images = pipe(list(prompts), num_inference_steps=steps, guidance_scale=2.0, generator=gens, output_type="pt",
                      cfg_batched=batched).images
    return images, rep.report


def anchor(**kw):
    kw = {"threshold": 0.5, "warmup": 3, "max_age": 3, **kw}
    return TimeAnchor(TimeAnchorConfig(**kw))


def test_depths_of_the_digits_blocks(pipe):
    names = UNetAdapter.info(pipe)["layers"]
    assert [depth_of(n, 3) for n in names] == [0, 1, 2, 3, 2, 1, 0]


def test_anchored_deep_blocks_do_not_run_and_the_shallow_branch_always_does(pipe):
    u = pipe.unet
    calls = {n: count_calls(m.resnets[0]) for n, m in
             [("down_blocks.0", u.down_blocks[0]), ("down_blocks.1", u.down_blocks[1]), ("mid_block", u.mid_block),
              ("up_blocks.1", u.up_blocks[1]), ("up_blocks.2", u.up_blocks[2])]}
    _, rep = generate(pipe, [anchor()])
    m = rep["strategies"]["time-anchor"]
    skipped = dict(zip(m["layers"], m["skipped_per_block"]))
    for name, n in calls.items():
        assert n[0] == STEPS - skipped[name], name  # a skipped block's code never ran
    assert skipped["down_blocks.0"] == skipped["up_blocks.2"] == 0  # min_depth 1: the shallow branch runs
    assert skipped["up_blocks.1"] > 0
    # nested: a depth is skipped only with everything below it
    assert skipped["mid_block"] >= skipped["down_blocks.2"] >= skipped["down_blocks.1"]
    c = rep["counters"]
    assert c["layers_skipped"] == sum(m["skipped_per_block"]) and c["cache_hits"] == m["hits"] > 0


def test_min_depth_0_may_skip_every_block(pipe):
    _, rep = generate(pipe, [anchor(min_depth=0, threshold=0.9)])
    m = rep["strategies"]["time-anchor"]
    assert m["skipped_per_block"][0] > 0


def test_tail_layers_run_the_last_up_block_tail_alone(pipe):
    """min_depth 0 with a tail: at an anchored outermost depth every block is skipped but the last
    up block, whose last layer runs on the cached features entering it (DeepCache's shallow branch)."""
    last = pipe.unet.up_blocks[-1]
    head, end = count_calls(last.resnets[0]), count_calls(last.resnets[-1])
    first = count_calls(pipe.unet.down_blocks[0].resnets[0])
    base, _ = generate(pipe)
    head[0] = end[0] = first[0] = 0
    out, rep = generate(pipe, [anchor(min_depth=0, tail_layers=1, threshold=0.9)])
    m = rep["strategies"]["time-anchor"]
    skipped = dict(zip(m["layers"], m["skipped_per_block"]))
    assert m["tail_only"] > 0 and skipped["up_blocks.2"] == 0
    assert end[0] == STEPS  # the tail ran at every step
    assert head[0] == STEPS - m["tail_only"]  # the rest of the block did not, at tail-only steps
    assert first[0] == STEPS - skipped["down_blocks.0"] and skipped["down_blocks.0"] == m["tail_only"]
    assert not torch.equal(out, base) and torch.isfinite(out).all()


def test_tail_layers_bounds(pipe):
    with pytest.raises(diffaccel.ConfigValueError, match="tail_layers.*min_depth"):
        TimeAnchorConfig(tail_layers=1)
    with pytest.raises(diffaccel.ConfigValueError, match="tail_layers.*more than the"):
        generate(pipe, [anchor(min_depth=0, tail_layers=9, threshold=0.9)])


def test_tiny_threshold_skips_nothing_and_matches_the_baseline(pipe):
    base, _ = generate(pipe)
    out, rep = generate(pipe, [anchor(threshold=1e-9)])
    assert rep["strategies"]["time-anchor"]["hits"] == 0 and torch.equal(out, base)


def test_warmup_and_max_age(pipe):
    _, rep = generate(pipe, [anchor(threshold=0.9, warmup=5, max_age=2)])
    m = rep["strategies"]["time-anchor"]
    by_step = torch.tensor(m["anchored_by_step"])
    assert (by_step[:, :5] == 0).all() and by_step[:, 5:].sum() > 0
    assert m["max_age_recomputes"] > 0
    # a block is skipped at most max_age steps in a row: at most 2 of every 3 steps after warm-up
    assert max(m["skipped_per_block"]) <= 2 * ((STEPS - 5) // 3 + 1)


def test_batched_guidance_is_one_branch_of_2b_rows(pipe):
    _, rep = generate(pipe, [anchor()])
    m = rep["strategies"]["time-anchor"]
    assert m["branches"] == 1
    assert m["peak_entries"] == 2 * len(PROMPTS) * 7  # rows of both halves x blocks


def test_unbatched_guidance_keeps_each_branch_apart(pipe):
    _, rep = generate(pipe, [anchor()], batched=False)
    m = rep["strategies"]["time-anchor"]
    assert m["branches"] == 2
    assert m["peak_entries"] == 2 * len(PROMPTS) * 7  # per branch: rows x blocks
    assert m["hits"] > 0


def test_a_block_is_skipped_only_when_every_row_is_anchored(pipe):
    # one prompt alone skips at least as often as in a batch with a second row
    _, alone = generate(pipe, [anchor(threshold=0.2)], prompts=["digit 3"])
    _, both = generate(pipe, [anchor(threshold=0.2)], prompts=["digit 3", "digit 1"])
    a = alone["strategies"]["time-anchor"]["skipped_per_block"]
    b = both["strategies"]["time-anchor"]["skipped_per_block"]
    assert sum(b) <= sum(a)


def test_gate_open_skips_and_wrong_layer_count_is_an_error(pipe, tmp_path):
    path = tmp_path / "gate.json"
    names = UNetAdapter.info(pipe)["layers"]
    Gate(torch.zeros(7, 17), torch.full((7,), 6.0), names).save(path)
    _, rep = generate(pipe, [anchor(gate=str(path))])
    assert rep["strategies"]["time-anchor"]["hits"] > 0
    bad = tmp_path / "bad.json"
    Gate(torch.zeros(4, 17), torch.zeros(4), [f"block.{i}" for i in range(4)]).save(bad)
    with pytest.raises(diffaccel.ConfigValueError, match="key 'gate': the gate file has 4 layers but the model has 7"):
        anchor(gate=str(bad)).diffaccel_setup(UNetAdapter.info(pipe))


def test_bench_plot_writes_a_png(pipe, tmp_path):
    _, rep = generate(pipe, [anchor()])
    s = anchor()
    s.diffaccel_bench_plot([rep, rep], tmp_path / "plot.png")
    data = (tmp_path / "plot.png").read_bytes()
    assert data[:4] == b"\x89PNG" and len(data) < 200_000


def test_extrapolate_extends_the_tail_features_no_further_than_their_last_span(pipe):
    """extrapolate with tail_layers: at a tail-only step t the tail reads v2 + (v2 - v1) * k, the
    line through the features entering it at its last two full runs (s1, v1), (s2, v2), with
    k = (t - s2) / (s2 - s1) held at 1 (kit.extrapolate's reach): a slope taken over adjacent
    warm-up steps is never carried a whole refresh interval ahead."""
    last = pipe.unet.up_blocks[-1]
    h_ch = last.resnets[-2].out_channels  # the tail's input is (features, skip sample)
    full, calls = [False], []

    def tail_input(_module, args):  # returns None: the arguments are left as they are
        calls.append((full[0], args[0][:, :h_ch].clone()))
        full[0] = False

    hooks = [last.resnets[0].register_forward_pre_hook(lambda _m, _a: full.__setitem__(0, True)),
             last.resnets[-1].register_forward_pre_hook(tail_input)]
    try:
        _, rep = generate(pipe, [anchor(min_depth=0, tail_layers=1, threshold=0.9, warmup=3, max_age=5, extrapolate=True)])
    finally:
        for h in hooks:
            h.remove()
    assert rep["strategies"]["time-anchor"]["tail_only"] > 0
    runs, capped, moved = [], 0, 0
    for t, (was_full, h) in enumerate(calls):
        if was_full:
            runs.append((t, h))
            continue
        (s1, v1), (s2, v2) = runs[-2:]
        k = (t - s2) / (s2 - s1)
        capped += k > 1
        torch.testing.assert_close(h, v2 + (v2 - v1) * min(k, 1.0))
        moved += not torch.equal(h, v2)
    assert capped > 0 and moved > 0  # the bound was reached, and the features were not merely held
