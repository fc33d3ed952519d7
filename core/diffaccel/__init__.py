"""diffaccel: compose swappable accelerator strategies for diffusion sampling.

    import diffaccel

    run = diffaccel.Run("configs/text-default.toml")   # the one run setup (diffaccel.runtime.runs)
    out = run.generate(seed=0)                         # loads the model, applies the strategies
    print(run.summary(out))

or, on a pipeline loaded elsewhere, ``with diffaccel.apply(pipe, strategies=[{"use": "swd"}]): ...``.

Plugins implement the hooks in ``diffaccel.contract.hookspecs`` with ``@diffaccel.hookimpl`` and
register strategies through ``diffaccel_register(register)``; adapters (model families) implement
the ``diffaccel.contract.adapter.Adapter`` protocol and register in the ``diffaccel.adapters``
entry-point group. A plugin imports ``diffaccel``, ``diffaccel.contract`` and ``diffaccel.kit`` only.

The core's layers, each importing only those below it (import-linter checks it, ``make layers``):
``cli`` > ``serve`` | ``tuning`` > ``bench`` > ``runtime`` > ``kit`` > ``contract``.
"""

from __future__ import annotations

__version__ = "0.2.0.dev0"

PLUGIN_API = (1, 1)
"""The plugin API's version (major, minor): what strategy plugins and adapters rely on (the hooks,
``Strategy``, ``RunState``, ``Layer``, ``StepPlan``, capabilities, the ``Adapter`` protocol,
``diffaccel.testing``). A minor release adds, or deprecates with a warning naming the new form;
only a major one removes (CHANGELOG.md)."""

# old module paths (diffaccel.hookspecs, diffaccel.bench, ...) resolve to their new modules with a
# DeprecationWarning until 0.3; first, so that everything imported after may use either
from . import _moved

_moved.install()

from .contract import capabilities
from .contract.errors import (ConfigError, ConfigValueError, DiffaccelError, ModelError, ModelLoadError, NonFiniteError,
                              PluginError, StrategyError)
from .contract.hookspecs import hookimpl
from .contract.state import Counters, Layer, RunInfo, RunState, StepPlan
from .contract.strategy import Strategy
from .contract.tunable import Tunable
from .runtime.accelerator import Accelerator, Applied, apply, build_strategies
from .runtime.config import ModelConfig, RunConfig, load_config, parse_config
from .runtime.guard import GuardConfig
from .runtime.jobs import generate_job
from .runtime.registry import BrokenPlugin, PluginWarning, Registry
from .runtime.sequence import NullAccelerator, RunSequence, StepModel

_LAZY = {
    # what plugins' own commands (sweeps, calibration) use of the run machinery and the bench; public
    # here so that a plugin imports only diffaccel, diffaccel.contract and diffaccel.kit (the plugin
    # contract in pyproject.toml), imported on first use: ``import diffaccel`` stays as light as it was
    "Run": "diffaccel.runtime.runs",  # the one run setup: adapter, model, strategies, apply, report
    "get_adapter": "diffaccel.runtime.adapters_registry",
    "read_toml": "diffaccel.runtime.config",
    "run_bench": "diffaccel.bench.runner",
    "format_table": "diffaccel.bench.runner",
    "with_batch": "diffaccel.bench.runner",
    "with_seed": "diffaccel.bench.runner",
    "BenchOptions": "diffaccel.bench.options",
    "BenchResult": "diffaccel.bench.results",
    "TuneOptions": "diffaccel.tuning.options",
}


def __getattr__(name: str):
    """The lazy public names above, and the old modules as attributes (``diffaccel.config`` after
    ``import diffaccel``, as before the move; through the old path, so with its warning)."""
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if f"{__name__}.{name}" in _moved.MOVED:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def tune(config, budget, out, options=None, **kwargs):
    """Tune a config's strategies to a quality budget (``diffaccel.tuning.tuner.tune``; the
    ``diffaccel tune`` command): returns a ``TuneResult`` with the TUNED.toml written, or None
    there when no point met the budget on the held-out seeds."""
    from .tuning.tuner import tune as _tune  # deferred: tune's imports (the bench, optuna) stay out of `import diffaccel`

    return _tune(config, budget, out, options, **kwargs)


def load_pipeline(config):
    """Load the model a config (or its path) names, through its adapter (an entry point of the
    ``diffaccel.adapters`` group): ``diffaccel.Run(config).pipe``, for a pipeline alone."""
    from .runtime.runs import Run

    return Run(config).pipe


__all__ = [
    "Accelerator", "Applied", "BenchOptions", "BenchResult", "BrokenPlugin", "PLUGIN_API", "ConfigError", "ConfigValueError", "Counters", "DiffaccelError", "GuardConfig",
    "Layer", "ModelConfig", "ModelError", "ModelLoadError", "NonFiniteError", "NullAccelerator", "PluginError", "PluginWarning",
    "Registry", "Run", "RunConfig", "RunInfo", "RunSequence", "RunState", "StepModel", "StepPlan", "Strategy", "StrategyError",
    "TuneOptions", "Tunable", "__version__", "apply", "build_strategies", "capabilities", "format_table", "generate_job", "get_adapter",
    "hookimpl", "load_config", "load_pipeline", "parse_config", "read_toml", "run_bench", "tune", "with_batch", "with_seed",
]
