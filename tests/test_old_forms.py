"""A plugin and an adapter written in the deprecated forms still work for one minor release, each
form with one DeprecationWarning naming the new one (CHANGELOG.md, "Deprecated"), and give the
same run as the current forms.

The old forms kept here: a strategy reading run info as a dict (``run.info["length"]``,
``run.info.get``) or by the flat attributes of before the groups (``run.info.length``, now
``run.info.tokens.length``); an adapter driving the accelerator by hand (``Accelerator.start_run`` /
``end_run``) and a ``Layer`` adding to ``run.counters`` itself, which the core now does.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from diffaccel import Accelerator, Layer, RunState, hookimpl
from diffaccel.runtime.sequence import RunSequence, StepModel

STEPS, ROWS, WIDTH = 4, 3, 8


class Block(Layer):
    """A linear block; the current form: the core counts its computations."""

    def __init__(self, index: int, weight: torch.Tensor):
        super().__init__(f"block.{index}", index, "block")
        self.weight = weight
        self.cached_output = None

    def compute(self, hidden, positions=None):
        self.cached_output = torch.tanh(hidden @ self.weight)
        return self.cached_output


class OldBlock(Layer):
    """The same block in the pre-0.2 form: it counts itself, from the run its model holds."""

    def __init__(self, index: int, weight: torch.Tensor, model: "Model"):
        super().__init__(f"block.{index}", index, "block")
        self.weight, self.model = weight, model
        self.cached_output = None

    def compute(self, hidden, positions=None):
        self.cached_output = torch.tanh(hidden @ self.weight)
        run = self.model.run
        if run is not None:
            run.counters.layers_computed += 1
            run.counters.positions_computed += hidden.shape[0]
        return self.cached_output


class Model:
    def __init__(self, old_blocks: bool):
        g = torch.Generator().manual_seed(0)
        weights = [torch.randn(WIDTH, WIDTH, generator=g) / WIDTH ** 0.5 for _ in range(3)]
        self.blocks = [OldBlock(i, w, self) if old_blocks else Block(i, w) for i, w in enumerate(weights)]
        self.run: RunState | None = None

    def step(self, accel, run, x):
        h = x
        for b in self.blocks:
            h = accel.layer_output(run, b, h)
        return h


class Step(StepModel):
    def __init__(self, model, seq):
        self.model, self.seq, self.x = model, seq, None

    def compute(self):
        return self.model.step(self.seq.accel, self.seq.run, self.x)


def current_run(model: Model, accel: Accelerator) -> tuple[torch.Tensor, dict]:
    """The current form: the run drives a RunSequence."""
    run = model.run = RunState(adapter="mini", num_steps=STEPS, batch_size=ROWS)
    run.info.set(length=WIDTH)
    x = torch.ones(ROWS, WIDTH)
    seq = RunSequence(accel, run)
    step = Step(model, seq)
    with seq:
        for s in range(STEPS):
            run.step = s
            run.positions_per_layer = ROWS
            step.x = x
            x = seq.denoise(step)
            seq.post_step(lambda: x)
    return x, run.report()


def old_run(model: Model, accel: Accelerator) -> tuple[torch.Tensor, dict]:
    """The pre-0.2 form: the adapter calls the accelerator's hooks itself."""
    run = model.run = RunState(adapter="mini", num_steps=STEPS, batch_size=ROWS)
    run.info.set(length=WIDTH)
    x = torch.ones(ROWS, WIDTH)
    accel.start_run(run)
    try:
        for s in range(STEPS):
            run.step = s
            run.positions_per_layer = ROWS
            accel.pre_step(run)
            x = accel.denoiser_output(run, model.step(accel, run, x))
            accel.post_step(run, x)
    finally:
        accel.end_run(run)
    return x, run.report()


class Skipper:
    """Serves block 1 from its cache at odd steps; reads the run's length as the current form does."""

    name = "skipper"

    def __init__(self):
        self.lengths: list[int] = []

    @hookimpl
    def diffaccel_pre_step(self, run):
        self.lengths.append(run.info.tokens.length)
        return None

    @hookimpl
    def diffaccel_layer_output(self, run, layer, hidden):
        if run.step % 2 and layer.index == 1 and layer.cached_output is not None:
            return layer.cached_output
        return None


class OldSkipper(Skipper):
    """The same strategy in the pre-0.2 form: run info read as a dict."""

    @hookimpl
    def diffaccel_pre_step(self, run):
        self.lengths.append(run.info["length"] if "length" in run.info else run.info.get("length"))
        return None


class FlatSkipper(Skipper):
    """The same strategy in the flat form: run info read by its flat attribute (before the groups)."""

    @hookimpl
    def diffaccel_pre_step(self, run):
        self.lengths.append(run.info.length)
        return None


def _deprecations(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]


def test_an_old_form_strategy_runs_as_the_current_one_with_a_warning_naming_run_info_attributes():
    new = Skipper()
    (x_new, report_new), none = _deprecations(lambda: current_run(Model(False), Accelerator([new], "mini")))
    old = OldSkipper()
    (x_old, report_old), warned = _deprecations(lambda: current_run(Model(False), Accelerator([old], "mini")))
    assert none == []
    assert torch.equal(x_new, x_old) and report_new == report_old and old.lengths == new.lengths == [WIDTH] * STEPS
    assert report_new["counters"]["layers_skipped"] == STEPS // 2  # the strategy did serve something
    assert warned and all("run.info.tokens.length" in w for w in warned)
    flat = FlatSkipper()
    (x_flat, report_flat), warned = _deprecations(lambda: current_run(Model(False), Accelerator([flat], "mini")))
    assert torch.equal(x_new, x_flat) and report_new == report_flat and flat.lengths == new.lengths
    assert set(warned) == {"run.info.length is deprecated; use run.info.tokens.length"}


FLAT = {  # every flat attribute of run info (before the groups) -> where it is now
    **{k: "tokens" for k in ("length", "vocab_size", "kind", "sampler", "temperature", "tokenizer", "prompt_lengths",
                             "cond_dim", "truncated_logits", "draw_tokens")},
    **{k: "stack" for k in ("blocks", "canvas_length", "depths", "kinds", "modules")},
    **{k: "images" for k in ("sample_size", "in_channels", "guidance", "cfg_mode", "timesteps", "prompts")},
}


def test_every_flat_run_info_attribute_reads_and_writes_through_with_a_warning_naming_the_new_one():
    from diffaccel import RunInfo

    info = RunInfo()
    for k, group in FLAT.items():
        new = f"run.info.{group}.{k}"
        with pytest.warns(DeprecationWarning, match=rf"^run\.info\.{k} is deprecated; use {re.escape(new)}$"):
            setattr(info, k, f"<{k}>")
        assert getattr(getattr(info, group), k) == f"<{k}>"
        with pytest.warns(DeprecationWarning, match=re.escape(new)):
            assert getattr(info, k) == f"<{k}>"
        with pytest.warns(DeprecationWarning, match=re.escape(new)):
            assert info[k] == f"<{k}>"  # the dict form, older still
    with pytest.warns(DeprecationWarning, match=r"RunInfo\(length=\.\.\.\) is deprecated; use RunInfo\(tokens=TokenFacts"):
        old = RunInfo(length=12, checkpoint="c")
    assert old.tokens.length == 12 and old.checkpoint == "c"
    with warnings.catch_warnings():  # setting facts by name is the current form: no warning
        warnings.simplefilter("error", DeprecationWarning)
        assert RunInfo().set(length=3, depths=[0], prompts=["p"], seeds=[1]).as_dict() == {
            "length": 3, "depths": [0], "prompts": ["p"], "seeds": [1]}


def test_an_old_form_adapter_counts_as_the_current_one_with_one_warning_per_form():
    base, none = _deprecations(lambda: current_run(Model(False), Accelerator([Skipper()], "mini")))
    assert none == []
    # hand counting inside a RunSequence: counted once, not twice, one warning naming the new form
    hand, warned = _deprecations(lambda: current_run(Model(True), Accelerator([Skipper()], "mini")))
    assert torch.equal(hand[0], base[0]) and hand[1] == base[1]
    assert len(warned) == 1 and "OldBlock.compute adds to run.counters itself" in warned[0]
    assert "computed_positions" in warned[0]
    # and the accelerator driven by hand (start_run / end_run), which the core never sees step
    old, warned = _deprecations(lambda: old_run(Model(True), Accelerator([Skipper()], "mini")))
    assert torch.equal(old[0], base[0]) and old[1]["counters"] == base[1]["counters"]
    assert sorted(warned) == ["Accelerator.end_run is deprecated; use Accelerator.run_end (or diffaccel.runtime.sequence.RunSequence)",
                              "Accelerator.start_run is deprecated; use Accelerator.run_start (or diffaccel.runtime.sequence.RunSequence)"]


def test_a_layer_of_the_current_form_computing_part_of_the_positions_says_how_many():
    class Half(Block):
        supports_positions = True

        def compute(self, hidden, positions=None):
            if positions is None:
                return super().compute(hidden)
            self.computed_positions = int(positions.sum())  # the core counts these
            return torch.where(positions[:, None], torch.tanh(hidden @ self.weight), hidden)

    class Narrow:
        name = "narrow"

        @hookimpl
        def diffaccel_layer_output(self, run, layer, hidden):
            rows = torch.zeros(hidden.shape[0], dtype=torch.bool)
            rows[: run.step] = True  # 0 rows at step 0: the layer does not run
            return layer.compute(hidden, positions=rows)

    model = Model(False)
    model.blocks = [Half(b.index, b.weight) for b in model.blocks]
    _, report = current_run(model, Accelerator([Narrow()], "mini"))
    c = report["counters"]
    assert c["positions_computed"] == 3 * sum(min(s, ROWS) for s in range(STEPS))
    assert c["layers_computed"] == 3 * (STEPS - 1) and c["layers_skipped"] == 3  # step 0 computed nothing
    assert c["positions_total"] == 3 * STEPS * ROWS


def test_a_layer_computed_after_its_run_is_not_counted_in_it():
    model = Model(False)
    _, report = current_run(model, Accelerator([], "mini"))
    model.blocks[0].compute(torch.ones(ROWS, WIDTH))  # outside RunSequence.denoise: no run is current
    assert model.run.counters.as_dict() == report["counters"]


# ---- a plugin written against the first contract: one report of every old form -------------------

FIRST_CONTRACT = '''
import attrs
import diffaccel


@attrs.frozen(kw_only=True)
class LastLayerConfig:
    layers: list = attrs.field(factory=lambda: [1])


class LastLayer:
    def __init__(self, config):
        self.config = config

    def setup(self, info):  # the first contract's option check, by name
        if max(self.config.layers) >= info["n_layers"]:
            raise diffaccel.ConfigValueError("layers", "past the model's layers")

    def new_state(self, run):
        return {"skipped": 0}

    @diffaccel.hookimpl
    def diffaccel_layer_output(self, run, layer, hidden):
        state = run.state(self)
        state["skipped"] += 1
        return None


@diffaccel.hookimpl
def diffaccel_register(register):
    register(diffaccel.Strategy(name="lastlayer", config=LastLayerConfig, factory=LastLayer, KEYWORD))
'''
OLD_KEYWORD, NEW_KEYWORD = 'adapters=("text",)', "requires=()"
REPORT = ("written against the first plugin contract; change {adapters}LastLayer.setup -> diffaccel_setup marked "
          "@diffaccel.hookimpl; LastLayer.new_state -> diffaccel_new_state marked @diffaccel.hookimpl; LastLayer: "
          "run.state(self)['skipped'] on a state nothing makes (the first contract's empty dict) -> diffaccel_new_state "
          "returning the state, an attrs object read by attribute (docs/writing-a-plugin.md)")
ADAPTERS = "Strategy(adapters=...) -> Strategy(requires=(...)), capabilities from diffaccel.capabilities; "


def _first_contract_module(folder, keyword, monkeypatch):
    import importlib.util
    import sys

    path = folder / "diffaccel_lastlayer.py"
    path.write_text(FIRST_CONTRACT.replace("KEYWORD", keyword))
    spec = importlib.util.spec_from_file_location("diffaccel_lastlayer", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "diffaccel_lastlayer", module)  # imported, as an entry point's module is
    spec.loader.exec_module(module)
    return module


def test_a_first_contract_plugin_gets_one_report_of_every_old_form(tmp_path, monkeypatch):
    import pytest

    from diffaccel import PluginError, Registry

    for keyword, adapters in ((OLD_KEYWORD, ADAPTERS), (NEW_KEYWORD, "")):  # and once requires= is fixed
        module = _first_contract_module(tmp_path, keyword, monkeypatch)
        reg = Registry(load_entrypoints=False)
        with pytest.raises(PluginError) as err:
            reg.register_plugin(module, "lastlayer")
        assert str(err.value) == "plugin 'lastlayer': " + REPORT.format(adapters=adapters)
        assert "lastlayer" not in reg.strategies


def test_plugins_check_and_every_run_show_the_report(tmp_path, install_distribution):
    import subprocess
    import sys

    src = tmp_path / "lastlayer"
    src.mkdir()
    (src / "diffaccel_lastlayer.py").write_text(FIRST_CONTRACT.replace("KEYWORD", NEW_KEYWORD))
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "diffaccel-lastlayer"\nversion = "0.1.0"\n'
        '[project.entry-points.diffaccel]\nlastlayer = "diffaccel_lastlayer"\n'
        '[tool.setuptools]\npy-modules = ["diffaccel_lastlayer"]\n')
    site = install_distribution(src)
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    line = ("plugin lastlayer (diffaccel-lastlayer 0.1.0): broken, left out: " + REPORT.format(adapters=""))
    check = subprocess.run([sys.executable, "-m", "diffaccel.cli", "plugins", "--check"], capture_output=True, text=True,
                           env=env, timeout=300)
    assert check.returncode == 1 and line in check.stderr.splitlines()
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\nadapter = "text"\n[[strategy]]\nuse = "lastlayer"\nlayers = [9]\n')
    run = subprocess.run([sys.executable, "-m", "diffaccel.cli", "check", str(cfg)], capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 2 and REPORT.format(adapters="") in run.stderr  # the warning, and the config's error
    assert f"{cfg}: [[strategy]] #1: strategy 'lastlayer': its plugin 'lastlayer'" in run.stderr


def _fresh_import(old: str):
    """Import ``old`` as a plugin written before 0.2 would, with it out of sys.modules first."""
    import importlib
    import sys

    sys.modules.pop(old, None)
    parent, _, leaf = old.rpartition(".")
    if leaf in vars(sys.modules[parent]):
        delattr(sys.modules[parent], leaf)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        first = importlib.import_module(old)
        again = importlib.import_module(old)  # cached: no second warning
    return first, again, [w for w in seen if issubclass(w.category, DeprecationWarning)]


def test_an_old_module_path_is_the_new_module_with_one_warning_naming_it():
    import diffaccel.contract.hookspecs as new

    for old, target in (("diffaccel.hookspecs", new), ("diffaccel.plugins", None), ("diffaccel.adapters_registry", None)):
        first, again, warned = _fresh_import(old)
        import diffaccel._moved as moved

        target = target or __import__(moved.MOVED[old], fromlist=["_"])
        assert first is target and again is target  # the same object: isinstance, monkeypatching act on one module
        assert len(warned) == 1, [str(w.message) for w in warned]
        message = str(warned[0].message)
        assert old in message and moved.MOVED[old] in message
        assert warned[0].filename == __file__  # pointed at the import, not at the import machinery


def test_old_names_resolve_to_the_same_objects_with_warnings():
    import diffaccel
    from diffaccel.bench import runner
    from diffaccel.contract.strategy import Strategy
    from diffaccel.runtime import registry

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        from diffaccel.plugins import Strategy as old_strategy  # a class that moved within the move
        from diffaccel.bench import run_bench  # bench.py's names, now the bench package's runner
        config = diffaccel.config  # an old module as an attribute after `import diffaccel`
    assert old_strategy is Strategy is registry.Strategy is diffaccel.Strategy
    assert run_bench is runner.run_bench and config.load_config is diffaccel.load_config
    messages = [str(w.message) for w in seen if issubclass(w.category, DeprecationWarning)]
    assert any("diffaccel.bench.run_bench moved to diffaccel.bench.runner.run_bench" in m for m in messages), messages


def test_monkeypatching_through_an_old_path_acts_on_the_new_module(monkeypatch):
    import importlib

    from diffaccel.runtime import placement

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = importlib.import_module("diffaccel.placement")
    monkeypatch.setattr(old, "check_placement", lambda *a, **k: "patched")
    assert placement.check_placement() == "patched"


BENCH_MODEL = '[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 8\nsteps = 2\n'


def test_the_old_bench_keywords_give_the_same_bench_with_one_warning_naming_bench_options(tmp_path):
    from diffaccel.bench.options import BenchOptions
    from diffaccel.bench.runner import run_bench

    (tmp_path / "base.toml").write_text(BENCH_MODEL)
    (tmp_path / "swd.toml").write_text(BENCH_MODEL + '[[strategy]]\nuse = "swd"\n')
    paths = [str(tmp_path / "base.toml"), str(tmp_path / "swd.toml")]
    kw = {"seeds": 2, "timed": False, "noise_floor": False, "judge": None, "progress": False}
    old, warned = _deprecations(lambda: run_bench(paths, **kw))
    assert len(warned) == 1 and "diffaccel.bench.options.BenchOptions(seeds=..." in warned[0]
    new, warned = _deprecations(lambda: run_bench(paths, BenchOptions(**kw)))
    assert warned == []
    strip = lambda r: [{k: v for k, v in e.to_dict().items() if k != "reports"} for e in r.entries]  # noqa: E731
    assert strip(old) == strip(new)
    # the result read as the dict it was: the same values, one warning per form
    entries, warned = _deprecations(lambda: [e["name"] for e in old["entries"]])
    assert entries == ["baseline", "swd"] and warned and all("use the attribute" in w for w in warned)


def test_the_old_tune_keywords_still_work_with_one_warning_naming_tune_options(tmp_path):
    from diffaccel import ConfigError
    from diffaccel.tuning.tuner import tune

    def old():
        try:
            tune(str(tmp_path / "c.toml"), "psnr>=5", tmp_path / "tuned.txt", trials=3, judge="none")
        except ConfigError as exc:  # the options reached tune's checks: --out must be a .toml
            return str(exc)

    message, warned = _deprecations(old)
    assert "write the tuned config to a .toml file" in message
    assert len(warned) == 1 and "diffaccel.tuning.options.TuneOptions(trials=..., judge=...)" in warned[0]


def test_an_old_adapter_module_path_is_the_new_module_with_one_warning_naming_it():
    import diffaccel.adapters as adapters  # registers the adapters' table with the core's finder
    import diffaccel.adapters.text  # noqa: F401 - the parent of an old text path
    from diffaccel._moved import MOVED

    for old in ("diffaccel.adapters.unet2d", "diffaccel.adapters.diffusers_hooks", "diffaccel.adapters.text.pipeline",
                "diffaccel.adapters.text.diffusion_gemma_build"):
        assert MOVED[old] == adapters.MOVED[old]
        first, again, warned = _fresh_import(old)
        assert first is again is __import__(MOVED[old], fromlist=["_"])
        assert len(warned) == 1, [str(w.message) for w in warned]
        assert old in str(warned[0].message) and MOVED[old] in str(warned[0].message)


def test_a_module_of_a_moved_adapter_package_is_its_new_module():
    import importlib

    from diffaccel.adapters.diffusers.unet import adapter, hooks

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        old = importlib.import_module("diffaccel.adapters.unet.adapter")
        from diffaccel.adapters.dit import hooks as old_dit_hooks
    assert old is adapter and old.UNetAdapter is adapter.UNetAdapter
    assert old_dit_hooks is importlib.import_module("diffaccel.adapters.diffusers.dit.hooks") and old_dit_hooks is not hooks
    messages = [str(w.message) for w in seen if issubclass(w.category, DeprecationWarning)]
    assert not messages or all("moved to diffaccel.adapters.diffusers." in m for m in messages), messages


def test_an_old_entry_point_of_an_adapter_loads_the_same_class():
    from importlib.metadata import EntryPoint

    from diffaccel.adapters.diffusers.unet2d.adapter import UNet2DAdapter
    from diffaccel.adapters.text.families.dispatch import load_pipeline

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert EntryPoint("unet2d", "diffaccel.adapters.unet2d:UNet2DAdapter", "diffaccel.adapters").load() is UNet2DAdapter
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        from diffaccel.adapters.text.loading import load_pipeline as old  # a module that became a package
    assert old is load_pipeline
    assert any("diffaccel.adapters.text.loading.load_pipeline moved to diffaccel.adapters.text.families.dispatch"
               in str(w.message) for w in seen)


def test_the_text_model_protocol_keeps_its_public_path_without_a_warning():
    import importlib

    from diffaccel.adapters.text.families import protocol

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert importlib.import_module("diffaccel.adapters.text.protocol") is protocol


def test_tunable_moved_to_the_contract_and_its_old_path_warns_once():
    # a hook returns it, so it lives in the contract (issue 58); the tuner's module still gives it until 0.3
    import diffaccel
    from diffaccel.contract.tunable import Tunable
    from diffaccel.tuning import search

    from diffaccel._moved import moved_names

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # once per process: another test may have asked first
        assert search.Tunable is Tunable is diffaccel.Tunable
    getattr_ = moved_names("diffaccel.tuning.search", {"Tunable": "diffaccel.contract.tunable"})  # search's, afresh
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert getattr_("Tunable") is getattr_("Tunable") is Tunable
    messages = [str(w.message) for w in seen if issubclass(w.category, DeprecationWarning)]
    assert len(messages) == 1 and "diffaccel.tuning.search.Tunable moved to diffaccel.contract.tunable.Tunable" in messages[0]
    assert "until diffaccel 0.3" in messages[0]
    with pytest.raises(AttributeError, match="NoSuchName"):
        search.NoSuchName  # noqa: B018


def test_the_adapter_kit_names_the_run_machinerys_own_objects():
    from diffaccel import adapterkit
    from diffaccel.runtime import placement, registry, sequence

    assert adapterkit.RunSequence is sequence.RunSequence and adapterkit.StepModel is sequence.StepModel
    assert adapterkit.NULL is sequence.NULL and adapterkit.torch_dtype is placement.torch_dtype
    assert adapterkit.env_allows is registry.env_allows


def test_env_allows_reads_the_block_and_allow_lists(monkeypatch):
    from diffaccel.adapterkit import env_allows

    monkeypatch.delenv("DIFFACCEL_PLUGINS", raising=False)
    monkeypatch.setenv("DIFFACCEL_BLOCK_PLUGINS", "swd, topk")
    assert not env_allows("swd") and not env_allows("topk", shipped=True) and env_allows("parallel")
    monkeypatch.setenv("DIFFACCEL_PLUGINS", "parallel")
    assert env_allows("parallel") and not env_allows("dct-anchor") and env_allows("unet", shipped=True)
