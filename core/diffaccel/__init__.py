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

__version__ = "0.1.0"

from . import capabilities
from .accelerator import Accelerator, apply, build_strategies
from .config import ModelConfig, RunConfig, load_config, parse_config
from .errors import (ConfigError, ConfigValueError, DiffaccelError, ModelError, ModelLoadError, NonFiniteError, PluginError,
                     StrategyError)
from .guard import GuardConfig
from .jobs import generate_job
from .plugins import Registry, Strategy, hookimpl
from .sequence import NullAccelerator, RunSequence, StepModel
from .state import Counters, Layer, RunInfo, RunState, StepPlan


def load_pipeline(config):
    """Load the model a config (or its path) names, through its adapter (an entry point of the
    ``diffaccel.adapters`` group)."""
    from .adapters_registry import get_adapter

    cfg = config if isinstance(config, RunConfig) else load_config(config)
    return get_adapter(cfg.model.adapter).load(cfg)


__all__ = [
    "Accelerator", "ConfigError", "ConfigValueError", "Counters", "DiffaccelError", "GuardConfig", "Layer", "ModelConfig",
    "ModelError", "ModelLoadError", "NonFiniteError", "PluginError", "NullAccelerator", "Registry", "RunConfig", "RunInfo", "RunSequence", "RunState", "StepModel", "StepPlan", "Strategy",
    "StrategyError", "__version__", "apply", "build_strategies", "capabilities", "generate_job", "hookimpl", "load_config",
    "load_pipeline", "parse_config",
]
