"""dct-anchor: the DCT against scipy, the band and the criteria, the decision and its guards,
real skipping on tiny diffusers pipelines, per-branch state, metrics, plots and bad input."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import diffaccel
from diffaccel import ConfigError, DiffaccelError, load_config
from diffaccel.adapters.diffusers.unet.adapter import UNetAdapter
from diffaccel.adapters.diffusers.unet.synthetic import build as build_synthetic
from diffaccel.runtime.config import parse_config
from diffaccel.contract.errors import ConfigValueError
from diffaccel.adapters.diffusers.unet.testing import tiny_digits_pipeline
from diffaccel_dct_anchor import (DCTAnchor, DCTAnchorConfig, band_energy, dct2, dct_basis, decide, low_band,
                                  relative_band_change, relative_energy_change)
from diffaccel.adapters.diffusers.unet import tail
from diffaccel_dct_anchor.strategy import BlockState

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # also when run from the plugin's folder, without the repository's conftest
ROOT = Path(__file__).resolve().parents[3]
SD_BLOCKS = ["down_blocks.0", "down_blocks.1", "mid_block", "up_blocks.0", "up_blocks.1"]


# ---- tiny pipelines ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sd():
    return build_synthetic("synthetic-sd-tiny")


def tiny_digits():
    return tiny_digits_pipeline(text_layers=1)


def cfg(steps=8, checkpoint="synthetic-sd-tiny", batch=1, **options):
    model = {"adapter": "unet", "checkpoint": checkpoint, "steps": steps, "batch": batch,
             "prompts": ["a red cube", "a blue ball"], **options}
    return parse_config({"model": model})


def anchor(pipe, **kw) -> DCTAnchor:
    s = DCTAnchor(DCTAnchorConfig(**kw))
    s.diffaccel_setup(UNetAdapter.info(pipe))
    return s


def run(pipe, strategies, steps=8, **kw):
    with diffaccel.apply(pipe, strategies=strategies):
        return UNetAdapter.run(pipe, cfg(steps=steps, **kw), seed=0, progress=False)


def count_calls(module: torch.nn.Module) -> list[int]:
    n = [0]
    handle = module.register_forward_hook(lambda *_: n.__setitem__(0, n[0] + 1))
    n.append(handle)
    return n


def decisions(out, branch="main", name="dct-anchor"):
    return {b: "".join(r["decisions"]) for b, r in out.report["strategies"][name]["branches"][branch].items()}


ALWAYS = dict(threshold=1e9, max_reuse=1000, warmup=1)  # anchor whenever the guards allow


# ---- the DCT -----------------------------------------------------------------------------------------

def test_dct2_matches_scipy_orthonormal_dct_ii():
    from scipy.fft import dctn

    x = torch.randn(2, 3, 8, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    ref = dctn(x.numpy(), type=2, norm="ortho", axes=(-2, -1))
    assert np.allclose(dct2(x).numpy(), ref, atol=1e-10)
    # the explicit formula, one coefficient
    h, w, (u, v) = 8, 6, (3, 2)
    s = lambda k, n: math.sqrt((1 if k == 0 else 2) / n)  # noqa: E731
    want = sum(float(x[1, 2, i, j]) * math.cos(math.pi * (i + 0.5) * u / h) * math.cos(math.pi * (j + 0.5) * v / w)
               for i in range(h) for j in range(w)) * s(u, h) * s(v, w)
    assert float(dct2(x)[1, 2, u, v]) == pytest.approx(want, abs=1e-10)


def test_basis_is_orthonormal_and_cached_per_device_and_dtype():
    d = dct_basis(16, None, "cpu", torch.float64)
    assert torch.allclose(d @ d.T, torch.eye(16, dtype=torch.float64), atol=1e-12)
    assert dct_basis(16, 4, "cpu", torch.float32) is dct_basis(16, 4, "cpu", torch.float32)
    assert dct_basis(16, 4, "cpu", torch.float32).shape == (4, 16)


def test_low_band_is_the_corner_of_the_full_transform_and_holds_the_smooth_energy():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 16, 12, generator=gen)
    assert torch.allclose(low_band(x, 3), dct2(x)[..., :3, :3], atol=1e-5)
    # a constant map has all its energy at DC; Parseval: the full band holds all the energy
    c = torch.full((1, 1, 8, 8), 2.0)
    assert band_energy(low_band(c, 1)).item() == pytest.approx(c.square().sum().item(), rel=1e-6)
    assert band_energy(low_band(x, 12)[..., :12, :12]).sum() <= x.square().sum() + 1e-3
    assert torch.allclose(band_energy(dct2(x)), x.square().sum((-2, -1)), rtol=1e-4)
    # smooth maps put their energy in the low band, white noise spreads it
    yy, xx = torch.meshgrid(torch.linspace(0, 1, 16), torch.linspace(0, 1, 12), indexing="ij")
    smooth = (yy + xx)[None, None]
    share = lambda m: (band_energy(low_band(m, 4)) / m.square().sum((-2, -1))).item()  # noqa: E731
    assert share(smooth) > 0.99 and share(x[:1, :1]) < 0.3
    with pytest.raises(ValueError, match="band 9 is larger than the 8x8 map"):
        low_band(torch.zeros(1, 1, 8, 8), 9)
    assert low_band(x.half(), 2).dtype == torch.float32


def test_relative_changes_follow_their_formulas():
    ref = torch.zeros(2, 2, 1, 1)
    ref[:, 0] = 1.0
    ref[:, 1] = 2.0  # energies 1 and 4 per row
    cur = ref.clone()
    cur[1, 1] = -2.0  # row 1: same energies, sign flipped
    cur[0, 0] = math.sqrt(2.0)  # row 0: energy 1 -> 2
    e = relative_energy_change(cur, ref)
    assert e[0].item() == pytest.approx(1 / 5) and e[1].item() == pytest.approx(0.0)
    b = relative_band_change(cur, ref)
    assert b[0].item() == pytest.approx((math.sqrt(2) - 1) ** 2 / 5) and b[1].item() == pytest.approx(16 / 5)


# ---- the decision --------------------------------------------------------------------------------------

def test_decide_guards_then_threshold():
    c = DCTAnchorConfig(threshold=0.1, warmup=2, max_reuse=3, final_full=2)
    assert decide(1, 10, True, 0, 0.0, c) == "W"
    assert decide(8, 10, True, 0, 0.0, c) == "F"
    assert decide(4, 10, False, 0, 0.0, c) == "C"       # nothing cached yet
    assert decide(4, 10, True, 0, None, c) == "C"       # nothing measured
    assert decide(4, 10, True, 3, 0.0, c) == "M"        # max_reuse reached
    assert decide(4, 10, True, 2, 0.099, c) == "R"
    assert decide(4, 10, True, 2, 0.1, c) == "C"


def test_x0_change_takes_the_worst_row():
    s = DCTAnchor(DCTAnchorConfig(signal="x0"))
    ref = torch.ones(2, 1, 2, 2)
    cur = ref.clone()
    cur[1] *= 2  # row 1 moved, row 0 did not
    bs = BlockState(x0_ref=ref)
    assert s._x0_change(bs, ref) == 0.0
    assert s._x0_change(bs, cur) == pytest.approx(3.0)  # energy 4x in row 1: |16 - 4| / 4


# ---- on tiny pipelines ---------------------------------------------------------------------------------

def test_anchored_blocks_are_not_run(sd):
    unet = sd.unet
    mid, down1 = count_calls(unet.mid_block.resnets[0]), count_calls(unet.down_blocks[1].resnets[0])
    up0, down0 = count_calls(unet.up_blocks[0].resnets[0]), count_calls(unet.down_blocks[0].resnets[0])
    try:
        out = run(sd, [anchor(sd, blocks=["down_blocks.1", "mid_block", "up_blocks.0"], **ALWAYS)], steps=8)
    finally:
        for h in (mid, down1, up0, down0):
            h[1].remove()
    # x0 signal: step 0 has no estimate yet, step 1 sets the reference; steps 2..7 are anchored
    assert (mid[0], down1[0], up0[0], down0[0]) == (2, 2, 2, 8)
    d = decisions(out)
    assert d["mid_block"] == "WC" + "R" * 6
    m = out.report["strategies"]["dct-anchor"]["blocks"]
    assert m["mid_block"] == {"computed": 2, "reused": 6}
    c = out.report["counters"]
    assert c["layers_skipped"] == 18 and c["cache_hits"] == 18


def test_the_last_up_block_runs_only_its_tail(sd):
    last = sd.unet.up_blocks[-1]
    first_layer, last_layer = count_calls(last.resnets[0]), count_calls(last.resnets[-1])
    try:
        out = run(sd, [anchor(sd, blocks=SD_BLOCKS, **ALWAYS)], steps=6)
    finally:
        first_layer[1].remove()
        last_layer[1].remove()
    assert first_layer[0] == 2 and last_layer[0] == 6
    assert decisions(out)["up_blocks.1"] == "WCRRRR"
    assert out.report["strategies"]["dct-anchor"]["tail_block"] == "up_blocks.1"


def test_run_tail_from_the_first_layer_is_the_block_itself(sd):
    block = sd.unet.up_blocks[-1]
    gen = torch.Generator().manual_seed(0)
    n = len(block.resnets)
    h = torch.randn(2, 64, 8, 8, generator=gen)
    res = tuple(torch.randn(2, 32, 8, 8, generator=gen) for _ in range(n))
    hidden = {"hidden_states": h, "res_hidden_states_tuple": res, "temb": torch.randn(2, 128, generator=gen),
              "encoder_hidden_states": torch.randn(2, 5, 32, generator=gen)}
    with torch.no_grad():
        want = block(**hidden)
        assert torch.equal(tail.run_tail(block, hidden, h, 0), want)
        got = {}
        with tail.capture_tail_input(block, n - 1, res[0].shape[1], got):
            block(**hidden)
        assert torch.equal(tail.run_tail(block, hidden, got["h"], n - 1), want)
    assert not block.resnets[n - 1]._forward_pre_hooks  # the capture hook is gone


def test_quality_close_to_the_baseline_and_removal_is_bitwise(sd):
    base = UNetAdapter.run(sd, cfg(steps=10), seed=0, progress=False)
    out = run(sd, [anchor(sd, blocks=SD_BLOCKS, threshold=0.05, max_reuse=2)], steps=10)
    assert out.report["counters"]["layers_skipped"] > 0
    assert (out.images - base.images).abs().max() < 0.05 and not torch.equal(out.images, base.images)
    assert torch.equal(UNetAdapter.run(sd, cfg(steps=10), seed=0, progress=False).images, base.images)


def test_warmup_max_reuse_and_final_steps(sd):
    out = run(sd, [anchor(sd, threshold=1e9, warmup=3, max_reuse=2, final_full=2)], steps=12)
    d = decisions(out)["mid_block"]
    assert d == "WWW" + "RRM" + "RRM" + "R" + "FF"
    m = out.report["strategies"]["dct-anchor"]["blocks"]["mid_block"]
    assert m == {"computed": 7, "reused": 5}


def test_threshold_decides(sd):
    strict = decisions(run(sd, [anchor(sd, threshold=1e-9, warmup=1)], steps=8))["mid_block"]
    assert strict == "W" + "C" * 7
    loose = run(sd, [anchor(sd, threshold=1e9, warmup=1, max_reuse=100)], steps=8)
    trace = loose.report["strategies"]["dct-anchor"]["branches"]["main"]["mid_block"]["change"]
    assert trace[:2] == [None, None] and all(v is not None and v > 0 for v in trace[2:])
    # a threshold between the measured changes splits the steps
    thr = sorted(trace[2:])[2] * 1.0001
    mid = decisions(run(sd, [anchor(sd, threshold=thr, warmup=1, max_reuse=100)], steps=8))["mid_block"]
    assert "R" in mid and mid.count("C") >= 2


@pytest.mark.parametrize("signal", ["input", "output"])
def test_other_signals(sd, signal):
    unet = sd.unet
    mid = count_calls(unet.mid_block.resnets[0])
    try:
        out = run(sd, [anchor(sd, blocks=SD_BLOCKS, signal=signal, **ALWAYS)], steps=8)
    finally:
        mid[1].remove()
    d = decisions(out)
    assert all("R" in v for v in d.values()) and mid[0] < 8
    if signal == "input":
        # anchoring the first block feeds the next ones the very tensors of the cached step: they follow
        trace = out.report["strategies"]["dct-anchor"]["branches"]["main"]
        first_r = d["down_blocks.0"].index("R")
        assert trace["mid_block"]["change"][first_r] == 0.0 and d["mid_block"][first_r] == "R"


def test_state_is_cleared_between_generations(sd):
    s = anchor(sd, blocks=SD_BLOCKS, threshold=0.05, max_reuse=2, warmup=1)
    with diffaccel.apply(sd, strategies=[s]):
        a = UNetAdapter.run(sd, cfg(steps=8), seed=0, progress=False)
        b = UNetAdapter.run(sd, cfg(steps=8), seed=0, progress=False)
        c = UNetAdapter.run(sd, cfg(steps=8), seed=3, progress=False)
    assert torch.equal(a.images, b.images) and decisions(a) == decisions(b)
    assert decisions(c)["mid_block"][:2] == "WC"  # a new generation starts without references
    assert not torch.equal(a.images, c.images)


def test_guidance_branches_keep_their_own_anchors():
    pipe = tiny_digits()
    pipe.set_progress_bar_config(disable=True)
    prompts = ["digit 3", "7"]

    sess_metrics = {}

    class Grab:
        name = "grab"

        @diffaccel.hookimpl
        def diffaccel_finalize(self, run, final):
            sess_metrics["m"] = run.metrics.get("dct-anchor")

    def run_mode(batched):
        s = anchor(pipe, blocks=["down_blocks.1", "mid_block", "up_blocks.0", "up_blocks.1"], **ALWAYS)
        with diffaccel.apply(pipe, strategies=[s, Grab()]):
            gens = [torch.Generator().manual_seed(i) for i in range(2)]
            img = pipe(prompts, num_inference_steps=6, guidance_scale=2.0, generator=gens, output_type="pt",
                       cfg_batched=batched).images
        return img, sess_metrics["m"]

    batched, mb = run_mode(True)
    unbatched, mu = run_mode(False)
    assert set(mb["branches"]) == {"main"} and set(mu["branches"]) == {"uncond", "cond"}
    for branch in ("uncond", "cond"):
        assert "".join(mu["branches"][branch]["mid_block"]["decisions"]) == "WCRRRR"
    assert mu["blocks"]["mid_block"] == {"computed": 4, "reused": 8}
    # each branch served its own cache: unbatched guidance gives the batched images
    assert torch.allclose(batched, unbatched, atol=1e-4)


def test_bench_plot_writes_a_png(sd, tmp_path):
    s = anchor(sd, blocks=SD_BLOCKS, threshold=0.05, max_reuse=2)
    out = run(sd, [s], steps=6)
    path = tmp_path / "d.png"
    s.diffaccel_bench_plot([out.report], path)
    assert path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x89PNG"


# ---- bad input -----------------------------------------------------------------------------------------

SD_TINY = '[model]\nadapter = "unet"\ncheckpoint = "synthetic-sd-tiny"\n[[strategy]]\nuse = "dct-anchor"\n'
BAD = [
    ("threshold-zero", "threshold = 0\n", "key 'threshold': must be positive, got 0"),
    ("threshold-negative", "threshold = -0.1\n", "key 'threshold': must be positive, got -0.1"),
    ("band-zero", "band = 0\n", "key 'band': must be in [1, inf), got 0"),
    ("max-reuse-zero", "max_reuse = 0\n", "key 'max_reuse': must be in [1, inf), got 0"),
    ("warmup-negative", "warmup = -1\n", "key 'warmup': must be 0 or more, got -1"),
    ("criterion", 'criterion = "l2"\n', "key 'criterion': must be one of 'energy', 'band', got 'l2'"),
    ("signal", 'signal = "latent"\n', "key 'signal': must be one of 'x0', 'input', 'output', got 'latent'"),
    ("blocks-empty", "blocks = []\n", "key 'blocks': must be a non-empty list of block names"),
    ("blocks-twice", 'blocks = ["mid_block", "mid_block"]\n', "key 'blocks': lists 'mid_block' twice"),
    ("unknown-key", "thresh = 0.1\n", "unknown key 'thresh'"),
]


@pytest.mark.parametrize("name,line,expected", BAD, ids=[b[0] for b in BAD])
def test_bad_config_values_are_one_line_errors(tmp_path, name, line, expected):
    path = tmp_path / f"{name}.toml"
    path.write_text(SD_TINY + line)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert "\n" not in msg and "(dct-anchor)" in msg and expected in msg, msg


MODEL_BAD = [
    ('blocks = ["middle_block"]\n', "key 'blocks': unknown block 'middle_block'; this model's blocks are: down_blocks.0, "
                                     "down_blocks.1, mid_block, up_blocks.0, up_blocks.1"),
    ("band = 17\n", "key 'band': 17 is larger than the 16x16 denoised estimate (the model's sample size) that signal 'x0' measures; use at most 16"),
    ('band = 9\nsignal = "input"\n', "key 'band': 9 is larger than the 8x8 input map of 'down_blocks.1'"),
    ('band = 9\nsignal = "output"\nblocks = ["down_blocks.0", "up_blocks.0"]\n',
     "key 'band': 9 is larger than the 8x8 output map of 'down_blocks.0'"),
]


@pytest.mark.parametrize("line,expected", MODEL_BAD)
def test_values_that_do_not_fit_the_model(tmp_path, capsys, line, expected):
    from diffaccel.cli.entry import main

    path = tmp_path / "c.toml"
    path.write_text(SD_TINY + line)
    with pytest.raises(ConfigError) as info:
        with diffaccel.apply(build_synthetic("synthetic-sd-tiny"), str(path)):
            pass
    assert expected in str(info.value) and "\n" not in str(info.value)
    # the CLI exits 2 with the message and no traceback
    code = main(["bench", str(path), "--seeds", "1"])
    err = capsys.readouterr().err
    assert code == 2 and expected in err and "Traceback" not in err


def test_text_adapter_is_refused(tmp_path):
    from diffaccel.adapters.text.testing import tiny_text_pipeline

    tiny_text_pipe = tiny_text_pipeline()
    path = tmp_path / "t.toml"
    path.write_text('[model]\nadapter = "text"\n[[strategy]]\nuse = "dct-anchor"\n')
    with pytest.raises(ConfigError, match=r"strategy 'dct-anchor' requires capability 'block-stack', which adapter 'text' does not declare"):
        load_config(path)
    with pytest.raises(ConfigValueError, match=r"key 'use': dct-anchor needs a model with capability 'block-stack'"):
        DCTAnchor().diffaccel_setup({"capabilities": ["token-positions"], "layers": ["block.0"]})
    with pytest.raises(DiffaccelError, match=r"key 'use'"):
        with diffaccel.apply(tiny_text_pipe, strategies=[DCTAnchor()]):
            tiny_text_pipe(length=8, steps=2, progress=False)


def test_tail_layers_beyond_the_block(sd):
    with pytest.raises(DiffaccelError, match=r"key 'tail_layers': 5 is more than the 2 layers of 'up_blocks.1'; use 1 to 2"):
        run(sd, [anchor(sd, blocks=SD_BLOCKS, tail_layers=5)], steps=2)


def test_shipped_configs_decode():
    configs = {p.name: load_config(p) for p in sorted((ROOT / "configs").glob("*-dct*.toml"))}
    assert {"digits-dct.toml", "digits-dct-fast.toml", "digits-dct-input.toml", "sd-medium-dct.toml",
            "sd-medium-dct-fast.toml"} <= set(configs)
    for name, c in configs.items():
        # DDIM at 50 steps, or a cache composed on a multistep solver at fewer (configs/digits-fast*.toml)
        on_solver = getattr(c.options, "scheduler", "ddim") not in ("ddim", "checkpoint")
        assert [s.name for s in c.strategies] == ["dct-anchor"] and (c.model.steps == 50 or on_solver), name
    for name in ("digits-dct.toml", "sd-medium-dct.toml"):  # DeepCache at interval 3 is the peer
        assert any(p.config.cache_interval == 3 for p in configs[name].peers)
    # the bench entries share one [model] with the config they are compared with
    assert configs["digits-dct.toml"].model == load_config(ROOT / "configs" / "digits.toml").model
    assert configs["sd-medium-dct.toml"].model == load_config(ROOT / "configs" / "sd-medium.toml").model
