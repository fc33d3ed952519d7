"""The core's contract: every hook exercised and documented, checked at registration, a light import."""

from __future__ import annotations

import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

import diffaccel
from diffaccel import PluginError, Registry, Strategy, Tunable, hookimpl
from diffaccel.contract import hookspecs
from diffaccel.runtime.registry import contract_problems

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "generate.py")
docgen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(docgen)
HOOKS = sorted(n for n, f in inspect.getmembers(hookspecs, inspect.isfunction) if n.startswith("diffaccel_"))


@attrs.frozen(kw_only=True)
class ProbeConfig:
    level: int = 1
    """A parameter for tune (diffaccel_tunables)."""


@attrs.define
class ProbeState:
    steps: int = 0
    """post_step calls in this run."""


class Probe:
    """Implements every strategy hook and records which ran (the run hooks in order)."""

    name = "probe"

    def __init__(self, config=None, log=None):
        self.log = log if log is not None else []

    def _rec(self, hook):
        self.log.append(hook)

    @hookimpl
    def diffaccel_setup(self, info):
        self._rec("diffaccel_setup")
        assert "capabilities" in info

    @hookimpl
    def diffaccel_hooked_modules(self, available):
        self._rec("diffaccel_hooked_modules")
        return available[:1]

    @hookimpl
    def diffaccel_run_start(self, run):
        self._rec("diffaccel_run_start")

    @hookimpl
    def diffaccel_new_state(self, run):
        self._rec("diffaccel_new_state")
        return ProbeState()

    @hookimpl
    def diffaccel_pre_step(self, run):
        self._rec("diffaccel_pre_step")

    @hookimpl
    def diffaccel_layer_output(self, run, layer, hidden):
        self._rec("diffaccel_layer_output")

    @hookimpl
    def diffaccel_denoiser_output(self, run, output):
        self._rec("diffaccel_denoiser_output")

    @hookimpl
    def diffaccel_commit(self, run, proposal):
        self._rec("diffaccel_commit")

    @hookimpl
    def diffaccel_post_step(self, run, output):
        self._rec("diffaccel_post_step")
        run.state(self).steps += 1

    @hookimpl
    def diffaccel_finalize(self, run, final):
        self._rec("diffaccel_finalize")
        run.metrics[self.name] = {"steps": run.state(self).steps}

    @hookimpl
    def diffaccel_memory(self, run):
        self._rec("diffaccel_memory")
        return 4096

    @hookimpl
    def diffaccel_run_end(self, run):
        self._rec("diffaccel_run_end")

    @hookimpl
    def diffaccel_bench_quality(self, outputs, seeds):
        self._rec("diffaccel_bench_quality")
        return {"probe_rows": float(sum(len(o.texts) for o in outputs))}

    @hookimpl
    def diffaccel_bench_plot(self, reports, path):
        self._rec("diffaccel_bench_plot")
        Path(path).write_text(str(len(reports)))


def _registry(log):
    class Plugin:
        @hookimpl
        def diffaccel_register(self, register):
            log.append("diffaccel_register")
            register(Strategy(name="probe", config=ProbeConfig, factory=lambda c: Probe(c, log)))

        @hookimpl
        def diffaccel_tunables(self, strategy):
            log.append("diffaccel_tunables")
            return [Tunable(key="level", low=1, high=3, integer=True)] if strategy == "probe" else None

        @hookimpl
        def diffaccel_register_commands(self, commands):
            log.append("diffaccel_register_commands")
            commands.add("probe-command", help="a command of the probe plugin", run=lambda args: 0)

    reg = Registry(load_entrypoints=False)
    reg.register_plugin(Plugin(), name="probe-plugin")
    return reg


def test_every_hook_is_exercised_through_the_core(tmp_path):
    """register, setup, the run hooks and the bench hooks through run_bench on the shipped text
    model; hooked_modules through an adapter declaring inner-modules."""
    from diffaccel.bench.options import BenchOptions
    from diffaccel.bench.runner import run_bench
    from diffaccel.adapters.diffusers.unet.testing import tiny_digits_pipeline

    log: list[str] = []
    reg = _registry(log)
    cfg = tmp_path / "probe.toml"
    cfg.write_text('[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 8\nsteps = 2\n'
                   '[[strategy]]\nuse = "probe"\n')
    result = run_bench([str(cfg)],
        BenchOptions(seeds=1, progress=False, plot_dir=str(tmp_path / "plots"), noise_floor=False), registry=reg)
    probe = next(e for e in result.entries if e.name == "probe")
    assert probe.reports[0]["strategies"]["probe"] == {"steps": 2}
    assert probe.quality["probe_rows"] == 1.0 and result.entries[0].quality["probe_rows"] == 1.0
    assert (tmp_path / "plots" / "probe-probe.png").read_text() == "1"
    # one run, in order: the state is made on first use, in the first post_step
    run = log[log.index("diffaccel_run_start"):log.index("diffaccel_run_end") + 1]
    assert run[0] == "diffaccel_run_start" and run[1] == "diffaccel_pre_step"
    assert run[-3:] == ["diffaccel_finalize", "diffaccel_memory", "diffaccel_run_end"]
    assert probe.reports[0]["memory"] == {"state_bytes": {"probe": 4096}} and probe.memory.state_mb == 4096 / 2**20
    assert run.count("diffaccel_new_state") == 1 and run.count("diffaccel_pre_step") == 2
    from diffaccel.tuning.tuner import tunable_space

    assert tunable_space(diffaccel.load_config(cfg, reg), reg) == {"probe": {"level": Tunable(key="level", low=1, high=3, integer=True)}}

    from diffaccel.cli.commands import collect

    found, problems = collect(("bench",), registry=reg)
    assert [c.name for c in found if c.source.startswith("plugin 'probe-plugin'")] == ["probe-command"]

    pipe = tiny_digits_pipeline()
    with diffaccel.apply(pipe, strategies=[Probe(log=log)]):
        pipe(["1"], num_inference_steps=2, output_type="pt")
    assert set(log) == set(HOOKS)


def test_every_hook_is_documented_with_its_rule():
    assert sorted(name for name, *_ in docgen.hooks()) == HOOKS
    for name, _sig, first, doc in docgen.hooks():
        assert doc, f"{name} has no docstring"
        if not first and not doc.startswith("Per strategy") and name not in ("diffaccel_register",):
            # a hook every strategy answers must say how the answers combine
            assert any(w in doc for w in ("Merge", "Returns nothing", "returns nothing")), name


def test_the_plugin_guide_is_generated_from_the_hookspecs():
    text = docgen.GUIDE.read_text()
    assert text == docgen.render(), "docs/writing-a-plugin.md is out of date: run 'make docs'"
    for name in HOOKS:
        assert f"#### `{name}(" in text


def test_the_architecture_tables_are_what_the_installed_plugins_declare():
    text = docgen.ARCHITECTURE.read_text()
    assert text == docgen.render_architecture(), "docs/architecture.md's tables are out of date: run 'make docs'"
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1].rstrip(" |")
            for line in text.split("<!-- generated: strategies -->")[1].split("<!-- end generated -->")[0].strip().splitlines()[2:]}
    reg = Registry()
    assert set(rows) == set(reg.strategies)
    for name, spec in reg.strategies.items():  # every requirement named, alternatives with 'or'
        assert rows[name] == ", ".join(r if isinstance(r, str) else " or ".join(r) for r in spec.requires)


def test_contract_problems_name_misspelled_unmarked_and_misplaced_wrappers():
    class Sloppy:
        name = "sloppy"

        @hookimpl
        def diffaccel_pre_stp(self, run):  # misspelled
            return None

        def diffaccel_post_step(self, run, output):  # not marked: never called
            pass

        @hookimpl(wrapper=True)
        def diffaccel_layer_output(self, run, layer, hidden):  # first result: no wrappers
            return (yield)

    problems = contract_problems(Sloppy())
    assert any("diffaccel_pre_stp" in p for p in problems)
    assert any("'diffaccel_post_step' is not marked" in p for p in problems)
    assert any("'diffaccel_layer_output' is marked as a wrapper" in p for p in problems)
    assert contract_problems(Probe()) == []
    with pytest.raises(PluginError, match="strategy 'sloppy'"):
        diffaccel.Accelerator([Sloppy()])


def test_plugins_check_passes_on_the_shipped_plugins():
    proc = subprocess.run([sys.executable, "-m", "diffaccel.cli.entry", "plugins", "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "adapter text: ok" in proc.stdout and "strategy time-anchor: ok" in proc.stdout


def test_a_model_lacking_a_required_capability_is_refused_when_built():
    log: list[str] = []
    reg = _registry(log)
    reg.strategies["probe"] = attrs.evolve(reg.strategies["probe"], requires=(("spatial-features", "block-stack"),))
    cfg = diffaccel.parse_config({"model": {"adapter": "unet"}, "strategy": [{"use": "probe"}]}, source="p.toml", registry=reg)
    with pytest.raises(diffaccel.ConfigError) as err:
        diffaccel.build_strategies(cfg, reg, {"capabilities": ["token-positions"]})
    assert str(err.value) == ("p.toml: [[strategy]] #1 (probe): the model lacks capability 'spatial-features' or "
                              "'block-stack', which strategy 'probe' requires; it offers: token-positions")


def test_import_diffaccel_stays_light():
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", "import diffaccel"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    loaded = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    assert "diffaccel" in loaded
    heavy = {"torch", "numpy", "diffusers", "transformers", "sklearn", "matplotlib"} & loaded
    assert not heavy, f"import diffaccel loads {sorted(heavy)}"


def test_the_core_names_no_adapter_and_no_strategy_branches_on_one():
    registry = (ROOT / "core" / "diffaccel" / "runtime" / "adapters_registry.py").read_text()
    assert '"text"' not in registry and '"unet"' not in registry
    for path in (ROOT / "plugins").rglob("*.py"):
        text = path.read_text()
        assert "run.adapter" not in text and "adapters=(" not in text, path


def test_measurement_tools_go_through_the_adapter_protocol(tmp_path, capsys):
    """fluency and partial use the adapter's optional protocols; an adapter without them is one line, exit 2."""
    from diffaccel.cli.entry import main

    cfg = tmp_path / "f.toml"
    cfg.write_text('[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 16\nsteps = 4\n')
    assert main(["fluency", str(cfg), "--seeds", "1"]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [r.split()[0] for r in rows] == ["model", "held-out", "unigram", "random"]
    img = tmp_path / "i.toml"
    img.write_text('[model]\nadapter = "unet"\ncheckpoint = "digits"\n')
    for command in ("fluency", "partial"):
        assert main([command, str(img)]) == 2
        assert "'unet' does not" in capsys.readouterr().err
