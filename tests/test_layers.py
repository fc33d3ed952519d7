"""The layers of issues 35 and 45, enforced: import-linter's contracts (pyproject.toml) over the package
layout as installed (tests/layers.py stages it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("layers", Path(__file__).with_name("layers.py"))
layers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(layers)


@pytest.fixture()
def staged(tmp_path):
    return layers.stage(tmp_path / "stage")


def test_every_contract_is_kept(staged):
    done = layers.lint_imports(staged)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def _broken(done) -> str:
    assert done.returncode != 0
    return done.stdout.split("Broken contracts", 1)[1]


def test_a_plugin_importing_an_adapter_breaks_a_contract(staged):
    strategy = staged / "diffaccel_swd" / "strategy.py"
    strategy.write_text(strategy.read_text() + "\nfrom diffaccel.adapters.text import tokenizer\n")
    report = _broken(layers.lint_imports(staged))
    assert "plugins import no adapter" in report and "diffaccel_swd.strategy" in report


def test_the_core_importing_a_plugin_breaks_a_contract(staged):
    errors = staged / "diffaccel" / "contract" / "errors.py"
    errors.write_text(errors.read_text() + "\n\ndef _late():\n    import diffaccel_topk  # noqa\n")
    report = _broken(layers.lint_imports(staged))
    assert "the core imports no adapter and no plugin" in report and "diffaccel.contract.errors" in report


def test_a_circle_through_a_function_local_import_breaks_a_contract(staged):
    # model imports positions; a deferred import back closes a circle
    positions = staged / "diffaccel" / "adapters" / "text" / "sampling" / "positions.py"
    positions.write_text(positions.read_text() + "\n\ndef _late():\n    from . import model  # noqa\n")
    report = _broken(layers.lint_imports(staged))
    assert "no import circles in adapters and plugins" in report and "diffaccel.adapters.text" in report


def test_a_lower_layer_importing_a_higher_one_breaks_the_layers(staged):
    # the run machinery reaching up into the bench, through a function-local import
    sequence = staged / "diffaccel" / "runtime" / "sequence.py"
    sequence.write_text(sequence.read_text() + "\n\ndef _late():\n    from ..bench import runner  # noqa\n")
    report = _broken(layers.lint_imports(staged))
    assert "the core's layers" in report and "diffaccel.runtime.sequence -> diffaccel.bench.runner" in report


def test_two_independent_layers_importing_each_other_break_the_layers(staged):
    engine = staged / "diffaccel" / "serve" / "metrics.py"
    engine.write_text(engine.read_text() + "\nfrom ..tuning import budget  # noqa\n")
    report = _broken(layers.lint_imports(staged))
    assert "the core's layers" in report and "diffaccel.serve.metrics -> diffaccel.tuning.budget" in report


def test_a_plugin_importing_the_run_machinery_breaks_its_contract(staged):
    # what a plugin needs of it is public at the top (diffaccel.get_adapter, diffaccel.run_bench, ...)
    strategy = staged / "diffaccel_topk" / "strategy.py"
    strategy.write_text(strategy.read_text() + "\nfrom diffaccel.runtime.adapters_registry import get_adapter  # noqa\n")
    report = _broken(layers.lint_imports(staged))
    assert "plugins use only the public API" in report and "diffaccel_topk.strategy -> diffaccel.runtime.adapters_registry" in report


def test_an_adapter_importing_the_run_machinery_breaks_its_contract(staged):
    # what an adapter drives of it (RunSequence, StepModel, torch_dtype, ...) is public in diffaccel.adapterkit
    masked = staged / "diffaccel" / "adapters" / "text" / "sampling" / "masked.py"
    masked.write_text(masked.read_text() + "\n\ndef _late():\n    from diffaccel.runtime.registry import _names  # noqa\n")
    report = _broken(layers.lint_imports(staged))
    assert "adapters use only the public API" in report
    assert "diffaccel.adapters.text.sampling.masked -> diffaccel.runtime.registry" in report


def test_an_adapter_importing_the_models_distribution_breaks_a_contract(staged):
    # issue 58: the runtime finds diffaccel-models through its entry points only, never by import
    reference = staged / "diffaccel" / "adapters" / "text" / "loading" / "reference.py"
    reference.write_text(reference.read_text() + "\n\ndef _late():\n    import diffaccel_models  # noqa\n")
    report = _broken(layers.lint_imports(staged))
    assert "import no models distribution" in report and "diffaccel.adapters.text.loading.reference" in report
