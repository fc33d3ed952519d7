"""``diffaccel tune`` end to end on the shipped text model, short runs: a third-party strategy
tunable through ``diffaccel_tunables`` alone, the held-out check that refuses a point good only on
the tuning seeds, the written config, bad input before anything loads."""

import json
import types
from pathlib import Path

import attrs
import pytest

import diffaccel
from diffaccel import ConfigError, Registry, Strategy, Tunable, hookimpl, load_config
from diffaccel.cli.entry import main
from diffaccel.tuning.options import TuneOptions
from diffaccel.tuning.tuner import tune

HELDOUT = 50_000


@attrs.frozen(kw_only=True)
class RigConfig:
    skip: int = attrs.field(default=1, validator=attrs.validators.in_((0, 1, 2, 3)))
    """Layers skipped from the top at every step after the first (their cached outputs served)."""
    honest: bool = True
    """False: the quality it reports is perfect on the tuning seeds and zero on held-out ones."""


class Rig:
    """A third party's strategy: really skips layers (so it is really faster) and reports its own
    quality key, which a rigged one fakes on the tuning seeds."""

    def __init__(self, config):
        self.config = config

    @hookimpl
    def diffaccel_layer_output(self, run, layer, hidden):
        if run.step > 0 and layer.index >= 4 - self.config.skip:
            return layer.cached_output
        return None

    @hookimpl
    def diffaccel_bench_quality(self, outputs, seeds):
        held_out = any(s >= HELDOUT for s in seeds)
        return {"rig_score": 0.0 if held_out and not self.config.honest else 1.0}


class RigPlugin:
    def __init__(self, choices=(2, 3)):
        self.choices = choices

    @hookimpl
    def diffaccel_register(self, register):
        register(Strategy(name="rig", config=RigConfig, factory=Rig, reports=("rig_score",)))

    @hookimpl
    def diffaccel_tunables(self, strategy):
        return [Tunable(key="skip", choices=self.choices)] if strategy == "rig" else None


def _registry(choices=(2, 3)):
    reg = Registry(load_entrypoints=False)
    reg.register_plugin(RigPlugin(choices), "rig-plugin")
    return reg


def _config(tmp_path, honest=True, skip=1):
    path = tmp_path / "rig.toml"
    path.write_text('[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 24\nsteps = 12\nbatch = 2\n'
                    f'[[strategy]]\nuse = "rig"\nskip = {skip}\nhonest = {"true" if honest else "false"}\n')
    return path


def _short(registry=None, **kw):
    """A short tune's settings: 3 trials on 2 batches, 4 held-out samples, no judge."""
    options = {"trials": 3, "tune_seeds": 2, "heldout": 4, "heldout_seed": HELDOUT, "candidates": 1, "judge": "none",
               "progress": False, **kw}
    return {"options": TuneOptions(**options), "registry": registry or _registry()}


def _tune(tmp_path, honest=True, skip=1, **kw):
    return tune(_config(tmp_path, honest, skip), ["rig_score>=0.5"], tmp_path / "tuned.toml", **_short(**kw))


def test_a_third_party_strategy_is_tuned_through_its_hook_and_the_result_is_a_config(tmp_path):
    result = _tune(tmp_path)
    assert result.path == tmp_path / "tuned.toml"
    assert result.point["rig"]["skip"] in (2, 3)  # the declared range, not the config's 1
    cfg = load_config(result.path, _registry())  # what `diffaccel check` reads
    assert [(e.name, e.config.skip) for e in cfg.strategies] == [("rig", result.point["rig"]["skip"])]
    text = result.path.read_text()
    assert text.startswith("# Tuned by diffaccel tune from ") and "budget rig_score>=0.5" in text
    assert f"--seed {HELDOUT}" in text  # the command reproducing the held-out figures
    chosen = [n for n, f in result.figures.items() if n.startswith("tune-trial-") and all(f["met"].values())]
    assert chosen and all(result.figures[n]["speedup"][2] > 1.0 for n in chosen)
    assert set(result.figures[chosen[0]]["speedup"]) == {1, 2}  # batch 1 and the configured batch
    assert (result.report / "study.db").exists() and (result.report / "index.md").exists()
    assert (result.report / "trials-rig_score.png").stat().st_size > 1000
    held = json.loads((result.report / "heldout-b2.json").read_text())  # kept small: no run-by-run reports
    assert held["entries"][1]["speedup"] > 0 and not any("reports" in e for e in held["entries"])


def test_a_point_good_only_on_the_tuning_seeds_is_refused_and_nothing_is_written(tmp_path):
    result = _tune(tmp_path, honest=False)
    assert result.path is None and not (tmp_path / "tuned.toml").exists()
    assert "none of the 1 best trials met the budget" in result.message
    fig = next(f for n, f in result.figures.items() if n.startswith("tune-trial-"))
    assert fig["met"] == {"rig_score>=0.5": False} and fig["quality"]["rig_score"]["value"] == 0.0
    assert (result.report / "study.db").exists()  # left for the user to look at


def test_bad_budget_and_bad_out_fail_before_anything_loads(tmp_path, capsys):
    cfg = Path(__file__).resolve().parents[1] / "configs" / "text-swd.toml"
    assert main(["tune", str(cfg), "--budget", "bleu>=1", "--out", str(tmp_path / "t.toml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "metric 'bleu' is not reported" in err[0]
    assert main(["tune", str(cfg), "--budget", "agreement>=0.5", "--out", str(tmp_path / "nowhere" / "t.toml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.tune"))


def test_a_config_with_nothing_to_tune_is_refused(tmp_path):
    path = tmp_path / "plain.toml"
    path.write_text('[model]\nadapter = "text"\nlength = 16\nsteps = 4\n[[strategy]]\nuse = "rig"\n')
    reg = Registry(load_entrypoints=False)

    class NoTunables:
        @hookimpl
        def diffaccel_register(self, register):
            register(Strategy(name="rig", config=RigConfig, factory=Rig))

    reg.register_plugin(NoTunables(), "plain")
    with pytest.raises(ConfigError, match="nothing to tune"):
        tune(path, "agreement>=0.5", tmp_path / "t.toml", TuneOptions(judge="none"), registry=reg)


@pytest.mark.parametrize("name", ["swd", "time-anchor", "dct-anchor", "parallel", "topk"])
def test_shipped_tunables_are_keys_their_configs_accept_at_both_ends(name):
    reg = Registry()
    spec = reg.get(name)
    tunables = reg.pm.get_plugin(spec.plugin).diffaccel_tunables(strategy=name)
    assert tunables, f"{name} declares nothing tunable"
    fields = {f.name for f in attrs.fields(spec.config)}
    for t in tunables:
        assert t.key in fields
        for value in (t.choices or (t.low, t.high)):
            value = int(value) if t.integer else value
            spec.config(**{t.key: value})  # raises if the config refuses it
    assert reg.pm.get_plugin(spec.plugin).diffaccel_tunables(strategy="not-mine") is None


def test_the_config_as_given_is_kept_when_it_is_the_fastest_point_within_budget(tmp_path):
    # as given it skips 3 of 4 layers; the search may only try skipping 1 (slower, same quality)
    result = _tune(tmp_path, skip=3, registry=_registry(choices=(1,)))
    assert result.point == {"rig": {}}  # the config's own settings
    cfg = load_config(result.path, _registry())
    assert [e.config.skip for e in cfg.strategies] == [3]
    assert "the config as given was the fastest point" in result.path.read_text().splitlines()[0]
    trial = next(f for n, f in result.figures.items() if n.startswith("tune-trial-"))
    assert result.figures["rig"]["speedup"][2] > trial["speedup"][2]


def test_each_session_of_a_tune_records_its_wall_time_and_trials(tmp_path):
    _tune(tmp_path, trials=2)
    _tune(tmp_path, trials=3)  # resumes the study in the same report folder: one more trial
    sessions = json.loads((tmp_path / "tuned.tune" / "tune.json").read_text())["sessions"]
    assert [(s["trials_before"], s["trials_after"]) for s in sessions] == [(0, 2), (2, 3)]
    assert all(s["wall_s"] > 0 for s in sessions)


def test_a_trial_runs_its_first_chunk_once_and_an_idle_point_reports_it(tmp_path):
    from diffaccel.runtime.adapters_registry import get_adapter
    from diffaccel.tuning.tuner import _Trials

    reg = _registry()
    cfg = load_config(_config(tmp_path), reg)
    adapter = get_adapter("text")
    measure = _Trials(adapter, adapter.load(cfg), cfg, reg, None)
    runs = []
    real = adapter.run
    adapter_run = lambda *a, **k: runs.append(a[2]) or real(*a, **k)  # noqa: E731
    measure.adapter = types.SimpleNamespace(run=adapter_run, quality=adapter.quality)
    measure({"rig": {"skip": 2}}, [0])
    assert runs == [0, 0]  # the baseline and the trial on seed 0
    m = measure({"rig": {"skip": 2}}, [0, 2])
    assert runs == [0, 0, 2, 2]  # seed 0 is not run again for the same point
    assert m.skipped and m.speedup > 0
    assert measure({"rig": {"skip": 0}}, [0]).skipped is False  # skip 0: every layer computed


def test_a_loaded_pipeline_is_tuned_with_its_strategy_tables(tmp_path):
    from diffaccel.adapters.text.families.dispatch import load_pipeline

    reg = _registry()
    pipe = load_pipeline("wordnet-masked")
    result = diffaccel.tune(pipe, ["rig_score>=0.5"], tmp_path / "tuned.toml", model={"length": 24, "steps": 12, "batch": 2},
                            strategies=[{"use": "rig", "skip": 1}], **_short(registry=reg))
    assert result.path == tmp_path / "tuned.toml" and result.point["rig"]["skip"] in (2, 3)
    cfg = load_config(result.path, reg)  # a config without a checkpoint, for diffaccel.apply(pipe, ...)
    assert cfg.model.adapter == "text" and cfg.model.steps == 12
    assert [(e.name, e.config.skip) for e in cfg.strategies] == [("rig", result.point["rig"]["skip"])]
    with diffaccel.apply(pipe, result.path, registry=reg) as p:
        assert p(length=24, steps=12, seed=0, progress=False, batch=2).report["counters"]["layers_skipped"] > 0
    assert (result.report / "config.toml").is_file()


def test_model_and_strategies_go_with_a_pipeline_only(tmp_path):
    with pytest.raises(ConfigError, match="go with a pipeline"):
        tune(_config(tmp_path), ["rig_score>=0.5"], tmp_path / "t.toml", strategies=[{"use": "rig"}], registry=_registry())


DIGITS = ('[model]\nadapter = "unet"\ncheckpoint = "digits"\nsteps = 8\nbatch = 2\nguidance_scale = 2.0\n'
          'prompts = ["digit 3", "digit 7"]\nscheduler = "ddim"\n'
          '[[strategy]]\nuse = "time-anchor"\nthreshold = 0.3\nwarmup = 1\nmax_age = 2\n')


def test_tune_searches_the_models_steps_and_scheduler_with_the_strategies(tmp_path):
    path = tmp_path / "digits.toml"
    path.write_text(DIGITS)
    result = tune(path, ["psnr>=5"], tmp_path / "tuned.toml", TuneOptions(
        trials=3, tune_seeds=1, heldout=2, heldout_seed=HELDOUT, candidates=3, judge="none", progress=False,
        model_space={"steps": (3, 4), "scheduler": ("dpm++2m",)}))
    study = json.loads((result.report / "tune.json").read_text())
    points = list(study["points"].values())
    assert points and all(p["[model]"]["scheduler"] == "dpm++2m" and p["[model]"]["steps"] in (3, 4) for p in points)
    # each candidate is a config on its own model, benched against the config as given (DDIM 8 steps)
    cand = (result.report / "candidates" / f"{next(iter(study['points']))}.toml").read_text()
    assert 'scheduler = "dpm++2m"' in cand and "[model]" not in cand.split("[[strategy]]")[-1]
    # 3 or 4 DPM-Solver++ steps with a cache against 8 DDIM steps: faster than 1.5x on the held-out seeds
    assert all(study["figures"][name]["speedup"]["2"] > 1.5 for name in study["points"])


@pytest.mark.parametrize("spec, message", [
    ("steps=8,x", "steps must be positive integers"), ("size=16", "KEY one of steps, scheduler"),
    ("scheduler=heun", "--model-space scheduler=heun: key 'scheduler': must be one of"),
])
def test_a_bad_model_space_is_one_line_before_anything_loads(tmp_path, capsys, spec, message):
    path = tmp_path / "digits.toml"
    path.write_text(DIGITS)
    assert main(["tune", str(path), "--budget", "psnr>=20", "--out", str(tmp_path / "t.toml"), "--model-space", spec]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not list(tmp_path.glob("*.tune"))
