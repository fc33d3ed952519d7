"""The image bench's fewer-steps and solver line (``bench --solver-line``), configs whose
``[model]`` differs in steps and scheduler only (a cache on a solver, judged against DDIM and
against its solver alone), and the report's lines."""

from __future__ import annotations

import pytest

from diffaccel.bench.report import steps_lines
from diffaccel.bench.options import BenchOptions
from diffaccel.bench.runner import load_bench_configs, run_bench
from diffaccel.cli.entry import main
from diffaccel.contract.errors import ConfigError
from diffaccel.runtime.registry import Registry

MODEL = ('[model]\nadapter = "unet"\ncheckpoint = "digits"\nsteps = {steps}\nbatch = 2\nguidance_scale = 2.0\n'
         'prompts = ["digit 3", "digit 7"]\nscheduler = "{scheduler}"\n')
ANCHOR = '[[strategy]]\nuse = "time-anchor"\nthreshold = 0.5\nwarmup = 1\nmax_age = 2\n'


@pytest.fixture
def paths(tmp_path):
    files = {"base": MODEL.format(steps=8, scheduler="ddim"),
             "fast": MODEL.format(steps=4, scheduler="dpm++2m") + ANCHOR + '[[peer]]\nuse = "deepcache"\ncache_interval = 2\n',
             "dpm": MODEL.format(steps=3, scheduler="dpm++2m")}
    for name, text in files.items():
        (tmp_path / f"{name}.toml").write_text(text)
    return {name: str(tmp_path / f"{name}.toml") for name in files}


def test_configs_may_differ_in_steps_and_scheduler_only(paths, tmp_path):
    configs = load_bench_configs([paths["base"], paths["fast"]], Registry())
    assert [c.model.steps for c in configs] == [8, 4] and configs[1].options.scheduler == "dpm++2m"
    other = tmp_path / "other.toml"
    other.write_text(MODEL.format(steps=4, scheduler="dpm++2m").replace("guidance_scale = 2.0", "guidance_scale = 3.0"))
    with pytest.raises(ConfigError) as e:
        load_bench_configs([paths["base"], str(other)], Registry())
    assert str(e.value) == (f"{other}: [model] differs from {paths['base']}'s in keys other than steps and scheduler; "
                            "bench compares configs that share one [model] (steps and scheduler may differ)")


def test_a_config_written_for_another_batch_is_compared_when_bench_sets_the_batch(paths, tmp_path):
    """A tune writes its config at the batch it tuned (e.g. 8): ``--batch`` makes it one model."""
    other = tmp_path / "b8.toml"
    other.write_text(MODEL.format(steps=4, scheduler="dpm++2m").replace("batch = 2", "batch = 8\nseed = 5") + ANCHOR)
    with pytest.raises(ConfigError):
        load_bench_configs([paths["base"], str(other)], Registry())
    with pytest.raises(ConfigError):  # the seed differs too
        load_bench_configs([paths["base"], str(other)], Registry(), batch=1)
    configs = load_bench_configs([paths["base"], str(other)], Registry(), batch=1, seed=0)
    assert [(c.model.batch, c.model.seed) for c in configs] == [(1, 0), (1, 0)] and configs[1].model.steps == 4


def test_batch_and_seed_reach_every_grid_point(paths):
    """--grid builds its points from the config file: --batch and --seed are set on them too (a
    threshold sweep at batch 8 of a batch-1 config was refused as another model)."""
    from diffaccel.bench.grid import parse_grid

    configs = load_bench_configs([paths["base"], paths["fast"]], Registry(), grid=parse_grid(["threshold=0.3,0.6"]),
                                 batch=8, seed=7)
    assert len(configs) == 3 and {(c.model.batch, c.model.seed) for c in configs} == {(8, 7)}


def test_solver_line_and_a_cache_on_a_solver_judged_against_both(paths):
    result = run_bench([paths["base"], paths["fast"], paths["dpm"]],
                       BenchOptions(seeds=2, solver_line=True, progress=False, noise_floor=False))
    by = {e.name: e for e in result.entries}
    # the line: the config's DDIM at 8/2, 8/3, 8/4 steps; DPM-Solver++ from 8/3 down (2 at least); then
    # the model of the cache on a solver, alone
    assert ["steps-4", "steps-3", "steps-2", "dpm++2m-3", "dpm++2m-2", "dpm++2m-4"] == [
        n for n in by if n.startswith(("steps-", "dpm++2m-"))]
    assert by["steps-4"].peer == {"use": "steps", "steps": 4, "scheduler": None, "name": None}
    assert by["dpm"].peer["scheduler"] == "dpm++2m" and by["dpm"].peer["steps"] == 3  # a config alone: a peer
    assert {"psnr", "ssim", "cond_acc"} <= set(by["dpm++2m-2"].quality)  # the task metric beside PSNR
    # the cache on DPM-Solver++ 4 steps: its model alone joined the bench, and it is judged against it
    fast = by["fast"]
    assert "dpm++2m-4" in by and fast.vs_model.entry == "dpm++2m-4"
    assert fast.fraction_computed < 1.0 and fast.reports[0]["steps_run"] == 4
    assert fast.vs_model.quality["psnr"] > fast.quality["psnr"]  # closer to its solver than to DDIM-8
    assert fast.vs_model.speedup > 0
    # a [[peer]] of that config (DeepCache) runs on its model too: DPM-Solver++ at 4 steps
    deep = by["deepcache-i2"]
    assert deep.vs_model.entry == "dpm++2m-4" and deep.vs_model.quality["psnr"] > deep.quality["psnr"]
    # every peer ran on the bare pipeline and put its scheduler back: the baseline is DDIM-8 throughout
    assert by["dpm++2m-4"].quality["psnr"] != by["steps-4"].quality["psnr"]
    lines = steps_lines(result, "psnr")
    assert set(lines) == {"steps", "dpm++2m"} and [round(x, 6) for x, _ in lines["steps"]] == sorted(
        round(by[n].speedup, 6) for n in ("steps-4", "steps-3", "steps-2"))


def test_solver_line_needs_an_adapter_that_has_one(capsys):
    rc = main(["bench", "configs/text-default.toml", "--solver-line", "--seeds", "1", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["diffaccel: error: --solver-line: adapter 'text' has no fewer-steps or solver line"]


def test_a_peer_on_another_model_needs_its_own_name(paths, tmp_path):
    other = tmp_path / "deep.toml"
    other.write_text(MODEL.format(steps=8, scheduler="ddim") + '[[peer]]\nuse = "deepcache"\ncache_interval = 2\n')
    with pytest.raises(ConfigError, match=r"fast.toml: \[\[peer\]\] #1: 'deepcache-i2' runs on another \[model\] elsewhere"):
        run_bench([paths["base"], str(other), paths["fast"]], BenchOptions(seeds=1, progress=False))


def test_the_solver_line_joins_peers_whose_configs_hold_lists():
    """diffusers' TaylorSeer peer keeps its hook names in a list: peers are compared, not hashed."""
    from diffaccel import parse_config
    from diffaccel.runtime.adapters_registry import get_adapter
    from diffaccel.bench.variants import add_peers

    cfg = parse_config({"model": {"adapter": "dit", "checkpoint": "dit-digits", "steps": 12},
                        "peer": [{"use": "diffusers-taylorseer", "cache_interval": 3, "max_order": 1}]}, source="t.toml")
    configs, _, _, _ = add_peers([cfg], get_adapter("dit"), True, lambda c: c.source)
    assert [p.name for p in configs[0].peers] == ["diffusers-taylorseer"] + ["steps"] * 7  # 6, 4, 3, 2 and 4, 3, 2 steps
