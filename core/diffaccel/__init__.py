"""diffaccel: compose swappable accelerator strategies for diffusion sampling.

    import diffaccel

    cfg = diffaccel.load_config("configs/text-default.toml")
    pipe = diffaccel.load_pipeline(cfg)
    with diffaccel.apply(pipe, cfg):
        out = pipe(seed=0)

Plugins implement the hooks in ``diffaccel.hookspecs`` with ``@diffaccel.hookimpl`` and register
strategies through ``diffaccel_register(register)``; adapters (model families) implement the
``diffaccel.adapter.Adapter`` protocol and register in the ``diffaccel.adapters`` entry-point group.
"""

from __future__ import annotations

__version__ = "0.2.0.dev0"

PLUGIN_API = (1, 1)
"""The plugin API's version (major, minor): what strategy plugins and adapters rely on (the hooks,
``Strategy``, ``RunState``, ``Layer``, ``StepPlan``, capabilities, the ``Adapter`` protocol,
``diffaccel.testing``). A minor release adds, or deprecates with a warning naming the new form;
only a major one removes (CHANGELOG.md)."""

from . import capabilities
from .accelerator import Accelerator, Applied, apply, build_strategies
from .config import ModelConfig, RunConfig, load_config, parse_config
from .errors import (ConfigError, ConfigValueError, DiffaccelError, ModelError, ModelLoadError, NonFiniteError, PluginError,
                     StrategyError)
from .guard import GuardConfig
from .jobs import generate_job
from .plugins import BrokenPlugin, PluginWarning, Registry, Strategy, hookimpl
from .search import Tunable
from .sequence import NullAccelerator, RunSequence, StepModel
from .state import Counters, Layer, RunInfo, RunState, StepPlan


def tune(config, budget, out, **kwargs):
    """Tune a config's strategies to a quality budget (``diffaccel.tuning.tune``; the
    ``diffaccel tune`` command): returns a ``TuneResult`` with the TUNED.toml written, or None
    there when no point met the budget on the held-out seeds."""
    from .tuning import tune as _tune  # deferred: tune's imports (the bench, optuna) stay out of `import diffaccel`

    return _tune(config, budget, out, **kwargs)


def load_pipeline(config):
    """Load the model a config (or its path) names, through its adapter (an entry point of the
    ``diffaccel.adapters`` group)."""
    from .adapters_registry import get_adapter

    cfg = config if isinstance(config, RunConfig) else load_config(config)
    return get_adapter(cfg.model.adapter).load(cfg)


__all__ = [
    "Accelerator", "Applied", "BrokenPlugin", "PLUGIN_API", "ConfigError", "ConfigValueError", "Counters", "DiffaccelError", "GuardConfig",
    "Layer", "ModelConfig", "ModelError", "ModelLoadError", "NonFiniteError", "NullAccelerator", "PluginError", "PluginWarning",
    "Registry", "RunConfig", "RunInfo", "RunSequence", "RunState", "StepModel", "StepPlan", "Strategy", "StrategyError",
    "Tunable", "__version__", "apply", "build_strategies", "capabilities", "generate_job", "hookimpl", "load_config",
    "load_pipeline", "parse_config", "tune",
]
