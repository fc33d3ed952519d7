"""The unet2d adapter (unconditional UNet2DModel pipelines, DDPM and DDIM): loading, the
strategies that skip its blocks really skip them, its config errors, the command line. Its
conformance runs in tests/test_conformance.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import diffaccel
from diffaccel import ConfigError, ModelLoadError, parse_config
from diffaccel.runtime.accelerator import apply, build_strategies
from diffaccel.adapters.diffusers.unet2d.adapter import UNet2DAdapter, block_specs
from diffaccel.runtime.adapters_registry import adapter_for
from diffaccel.cli.entry import main

STEPS = 12


def _cfg(checkpoint, scheduler="ddim", steps=STEPS, strategy=None, **model):
    table = {"model": {"adapter": "unet2d", "checkpoint": checkpoint, "steps": steps, "batch": 2, "scheduler": scheduler,
                       **model}}
    if strategy is not None:
        table["strategy"] = [strategy]
    return parse_config(table, source="test")


def _resnet_calls(pipe) -> dict[str, list[int]]:
    """Per block, a counter of its first resnet's forward calls: it moves only when the block's
    own code runs (a block served from its cache never calls it)."""
    counts = {}
    for name, _, _, block in block_specs(pipe.unet):
        n = counts[name] = [0]
        block.resnets[0].register_forward_hook(lambda *_, n=n: n.__setitem__(0, n[0] + 1))
    return counts


@pytest.mark.parametrize("scheduler, pipeline", [("ddim", "DDIMPipeline"), ("ddpm", "DDPMPipeline"),
                                                 ("checkpoint", "DDPMPipeline"), ("dpm++2m", "SolverPipeline"),
                                                 ("unipc", "SolverPipeline"), ("euler", "SolverPipeline")])
def test_loads_a_saved_folder_under_each_scheduler(tiny_unet2d, scheduler, pipeline):
    cfg = _cfg(tiny_unet2d, scheduler)
    pipe = UNet2DAdapter.load(cfg)
    assert type(pipe).__name__ == pipeline and adapter_for(pipe) is UNet2DAdapter
    with apply(pipe, strategies=[]):  # counted: the idle accelerator
        out = UNet2DAdapter.run(pipe, cfg, seed=3, progress=False)
    assert out.images.shape == (2, 1, 16, 16) and out.seeds == [3, 4]
    assert out.report["steps_run"] == STEPS and out.report["counters"]["layers_computed"] == STEPS * 5
    again = UNet2DAdapter.run(pipe, cfg, seed=3, progress=False)
    assert torch.equal(out.images, again.images)  # seeded: DDPM's noise too
    facts = UNet2DAdapter.facts(cfg)
    info = UNet2DAdapter.info(pipe)
    assert facts["layers"] == info["layers"] == ["down_blocks.0", "down_blocks.1", "mid_block", "up_blocks.0", "up_blocks.1"]
    assert facts["depths"] == [0, 1, 2, 1, 0] and facts["kinds"] == ["down", "down", "mid", "up", "up"]


@pytest.mark.parametrize("scheduler", ["ddim", "ddpm", "dpm++2m", "euler"])
def test_time_anchor_skips_deep_blocks_without_running_them(tiny_unet2d, scheduler):
    cfg = _cfg(tiny_unet2d, scheduler, strategy={"use": "time-anchor", "threshold": 0.5, "warmup": 2, "max_age": 3})
    pipe = UNet2DAdapter.load(cfg)
    calls = _resnet_calls(pipe)
    base = UNet2DAdapter.run(pipe, cfg.without_strategies(), seed=0, progress=False)
    assert all(n == [STEPS] for n in calls.values())
    for n in calls.values():
        n[0] = 0
    with apply(pipe, cfg, strategies=build_strategies(cfg, None, UNet2DAdapter.info(pipe))):
        out = UNet2DAdapter.run(pipe, cfg, seed=0, progress=False)
    c, m = out.report["counters"], out.report["strategies"]["time-anchor"]
    skipped = dict(zip(m["layers"], m["skipped_per_block"]))
    assert sum(skipped.values()) > 0 and skipped["down_blocks.0"] == skipped["up_blocks.1"] == 0  # min_depth 1
    for name, n in calls.items():  # each skip is a block whose code did not run
        assert n[0] == STEPS - skipped[name], name
    assert c["layers_computed"] == STEPS * 5 - sum(skipped.values())
    assert not torch.equal(out.images, base.images)  # served from the cache: not the computed output


@pytest.mark.parametrize("scheduler", ["ddim", "ddpm", "unipc", "euler"])
def test_dct_anchor_reuses_blocks_without_running_them(tiny_unet2d, scheduler):
    cfg = _cfg(tiny_unet2d, scheduler, strategy={"use": "dct-anchor", "threshold": 5.0, "warmup": 2, "max_reuse": 2})
    pipe = UNet2DAdapter.load(cfg)
    calls = _resnet_calls(pipe)
    with apply(pipe, cfg, strategies=build_strategies(cfg, None, UNet2DAdapter.info(pipe))):
        out = UNet2DAdapter.run(pipe, cfg, seed=0, progress=False)
    blocks = out.report["strategies"]["dct-anchor"]["blocks"]
    assert set(blocks) == {"down_blocks.1", "mid_block", "up_blocks.0"}  # the default: deepest down, mid, first up
    assert all(b["reused"] > 0 for b in blocks.values())
    for name, n in calls.items():
        reused = blocks.get(name, {"reused": 0})["reused"]
        assert n[0] == STEPS - reused, name
    assert out.report["counters"]["layers_computed"] == STEPS * 5 - sum(b["reused"] for b in blocks.values())


def test_what_the_adapter_lacks_is_refused_by_capability(tiny_unet2d):
    cfg = {"model": {"adapter": "unet2d", "checkpoint": tiny_unet2d, "steps": 4},
           "strategy": [{"use": "dct-anchor", "blocks": ["up_blocks.1"]}]}
    pipe = UNet2DAdapter.load(parse_config(cfg))
    with pytest.raises(diffaccel.DiffaccelError, match="no capability 'block-tail'"):
        build_strategies(parse_config(cfg), None, UNet2DAdapter.info(pipe))


@pytest.mark.parametrize("line, named", [
    ('scheduler = "heun"', "key 'scheduler': must be one of 'ddim', 'ddpm', 'dpm++2m', 'unipc', 'euler', 'checkpoint', "
                           "got 'heun'"),
    ("eta = 2.0", "key 'eta': must be in [0.0, 1.0], got 2.0"),
    ("grid_scale = 0", "key 'grid_scale'"),
    ('prompts = ["a cat"]', "unknown key 'prompts'"),
])
def test_bad_options_are_one_line_before_diffusers_loads(tmp_path, line, named):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(f'[model]\nadapter = "unet2d"\ncheckpoint = "synthetic-ddpm-16"\n{line}\n')
    probe = ("import json, sys\nfrom diffaccel.cli.entry import main\nrc = main(sys.argv[1:])\n"
             "print(json.dumps({'rc': rc, 'diffusers': 'diffusers' in sys.modules}))")
    proc = subprocess.run([sys.executable, "-c", probe, "check", str(cfg)], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "DIFFACCEL_PLUGINS": ""}, timeout=120)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"rc": 2, "diffusers": False}
    assert named in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    with pytest.raises(ConfigError, match="key"):
        diffaccel.load_config(cfg)


def test_missing_and_wrong_checkpoints_are_one_line(tmp_path, tiny_sd):
    with pytest.raises(ModelLoadError, match="no such model folder"):
        UNet2DAdapter.load(_cfg(str(tmp_path / "nope")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no model_index.json"):
        UNet2DAdapter.facts(_cfg(str(tmp_path / "empty")))
    tiny_sd.save_pretrained(tmp_path / "sd")  # a text-to-image UNet: the unet adapter's, not this one's
    with pytest.raises(ModelLoadError, match='no UNet2DModel .* use adapter = "unet"'):
        UNet2DAdapter.load(_cfg(str(tmp_path / "sd")))


def test_generate_check_bench_and_overhead_through_the_cli(tmp_path, tiny_unet2d, capsys):
    from PIL import Image

    base = tmp_path / "base.toml"
    base.write_text(f'[model]\nadapter = "unet2d"\ncheckpoint = "{tiny_unet2d}"\nsteps = 6\nbatch = 2\ngrid_scale = 2\n')
    fast = tmp_path / "fast.toml"
    fast.write_text(base.read_text() + '[[strategy]]\nuse = "time-anchor"\nthreshold = 0.5\nwarmup = 2\n')
    assert main(["check", str(base), str(fast)]) == 0
    out = tmp_path / "grid.png"
    assert main(["generate", str(fast), "--out", str(out), "--no-progress"]) == 0
    assert Image.open(out).size == (64, 32) and not list(tmp_path.glob("*.partial"))
    assert main(["bench", str(base), str(fast), "--seeds", "1", "--json", str(tmp_path / "b.json"), "--no-progress"]) == 0
    entries = json.loads((tmp_path / "b.json").read_text())["entries"]
    assert [e["name"] for e in entries][0] == "baseline" and "psnr" in entries[1]["quality"]
    assert entries[1]["fraction_computed"] < 1.0
    capsys.readouterr()
    assert main(["overhead", str(base), "--repeats", "1"]) == 0
    assert "6 steps per run" in capsys.readouterr().out


def test_the_shipped_configs_load_and_run_small():
    from pathlib import Path

    import attrs

    root = Path(__file__).resolve().parents[1] / "configs"
    for name in ("unet2d.toml", "unet2d-time-anchor.toml", "unet2d-dct.toml"):
        cfg = diffaccel.load_config(root / name)
        assert cfg.model.adapter == "unet2d" and cfg.model.checkpoint == "synthetic-ddpm-16"
    small = attrs.evolve(cfg, model=attrs.evolve(cfg.model, steps=8, batch=1))
    pipe = UNet2DAdapter.load(small)
    with apply(pipe, small, strategies=build_strategies(small, None, UNet2DAdapter.info(pipe))):
        out = UNet2DAdapter.run(pipe, small, seed=0, progress=False)
    assert out.images.shape == (1, 1, 16, 16) and "dct-anchor" in out.report["strategies"]
