"""``[model] scheduler`` of the diffusers adapters: diffusers' schedulers built from the
checkpoint's config, their pitfalls on the shipped digits model (zero signal at the last
timestep, Euler's starting sigma), the clean estimate multistep solvers give the strategies,
and the refusals (one line, before anything loads)."""

from __future__ import annotations

import json
import subprocess
import sys

import attrs
import pytest
import torch
from diffusers import DDIMScheduler, DPMSolverMultistepScheduler, FlowMatchEulerDiscreteScheduler

from diffaccel import ConfigError, hookimpl, parse_config
from diffaccel.adapters.diffusers.schedulers import build_scheduler
from diffaccel.adapters.diffusers.unet.adapter import UNetAdapter
from diffaccel.adapters.diffusers.unet.metrics import psnr_per_image
from diffaccel.runtime.accelerator import apply

PROMPTS = ["digit 3", "digit 7", "digit 0", "digit 5"]


def _digits(scheduler="ddim", steps=50, checkpoint="digits"):
    return parse_config({"model": {"adapter": "unet", "checkpoint": checkpoint, "steps": steps, "batch": 4,
                                   "guidance_scale": 2.0, "prompts": PROMPTS, "scheduler": scheduler}}, source="test.toml")


@pytest.fixture(scope="module")
def digits_pipe():
    return UNetAdapter.load(_digits())


@pytest.fixture(scope="module")
def ddim50(digits_pipe):
    return UNetAdapter.run(digits_pipe, _digits(), seed=100, progress=False).images



@pytest.mark.parametrize("name", ["dpm++2m", "unipc", "euler"])
def test_solvers_on_the_shipped_digits_model_make_digits_not_noise(digits_pipe, ddim50, name):
    """At 10 steps each solver lands near DDIM-50 (about 25 dB on this model); noise is 7.5 dB.
    Fails without the "leading" spacing (DPM-Solver++, UniPC, Euler divide by the zero signal of
    the cosine schedule's last timestep) and, for Euler, without set_timesteps before the
    starting noise is scaled (its init_noise_sigma)."""
    ddim = digits_pipe.scheduler
    digits_pipe.scheduler = build_scheduler(name, ddim, "digits")
    try:
        images = UNetAdapter.run(digits_pipe, _digits(name, steps=10), seed=100, progress=False).images
    finally:
        digits_pipe.scheduler = ddim
    psnr = psnr_per_image(images, ddim50)
    assert sum(psnr) / len(psnr) > 18.0 and min(psnr) > 13.0, psnr  # noise: 7.5 dB


def test_the_spacing_moves_only_where_the_schedule_ends_without_signal():
    cosine = DDIMScheduler(beta_schedule="squaredcos_cap_v2", timestep_spacing="trailing")
    linear = DDIMScheduler(beta_schedule="linear", timestep_spacing="trailing")
    assert build_scheduler("dpm++2m", cosine, "x").config.timestep_spacing == "leading"
    assert build_scheduler("dpm++2m", linear, "x").config.timestep_spacing == "trailing"
    assert build_scheduler("ddim", cosine, "x") is cosine  # DDIM clips its clean estimate: as shipped
    dpm = build_scheduler("dpm++2m", linear, "x")
    assert isinstance(dpm, DPMSolverMultistepScheduler) and dpm.config.algorithm_type == "dpmsolver++"
    assert dpm.config.solver_order == 2 and dpm.config.beta_schedule == "linear"


def test_a_prediction_type_or_a_schedule_the_scheduler_lacks_is_one_line_naming_both():
    flow_dpm = DPMSolverMultistepScheduler(prediction_type="flow_prediction")
    with pytest.raises(ConfigError) as e:
        build_scheduler("euler", flow_dpm, "my-model", "c.toml")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("c.toml: [model] key 'scheduler': 'euler' cannot run checkpoint 'my-model'")
    assert "'flow_prediction'" in msg and "allowed here: dpm++2m, unipc, checkpoint" in msg
    with pytest.raises(ConfigError, match="FlowMatchEulerDiscreteScheduler has no beta schedule"):
        build_scheduler("ddim", FlowMatchEulerDiscreteScheduler(), "flux", "c.toml")


class _Seen:
    name = "seen"
    def __init__(self):
        self.x0: list[bool] = []

    @hookimpl
    def diffaccel_post_step(self, run, output):
        self.x0.append(output.pred_original is not None and bool(torch.isfinite(output.pred_original).all()))


@pytest.mark.parametrize("name", ["dpm++2m", "unipc", "euler", "ddim"])
def test_strategies_get_a_clean_estimate_under_every_solver(digits_pipe, name):
    """dct-anchor's x0 signal and the end of a stopped run read ``pred_original``; DPM-Solver++
    and UniPC do not return it from ``step``: the session takes it from their history."""
    ddim = digits_pipe.scheduler
    digits_pipe.scheduler = build_scheduler(name, ddim, "digits")
    seen = _Seen()
    try:
        with apply(digits_pipe, strategies=[seen]):
            UNetAdapter.run(digits_pipe, _digits(name, steps=5), seed=0, progress=False)
    finally:
        digits_pipe.scheduler = ddim
    assert seen.x0 == [True] * 5


@pytest.mark.parametrize("adapter, allowed", [
    ("unet", "'ddim', 'dpm++2m', 'unipc', 'euler', 'checkpoint'"),
    ("dit", "'ddim', 'dpm++2m', 'unipc', 'euler', 'checkpoint'"),
    ("unet2d", "'ddim', 'ddpm', 'dpm++2m', 'unipc', 'euler', 'checkpoint'"),
])
def test_an_unknown_scheduler_is_one_line_listing_the_names_exit_2_before_diffusers(tmp_path, adapter, allowed):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(f'[model]\nadapter = "{adapter}"\ncheckpoint = "whatever"\nscheduler = "heun"\n')
    probe = ("import json, sys\nfrom diffaccel.cli.entry import main\nrc = main(sys.argv[1:])\n"
             "print(json.dumps({'rc': rc, 'diffusers': 'diffusers' in sys.modules}))")
    proc = subprocess.run([sys.executable, "-c", probe, "check", str(cfg)], capture_output=True, text=True, timeout=120)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"rc": 2, "diffusers": False}
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and f"key 'scheduler': must be one of {allowed}, got 'heun'" in err[0], proc.stderr
