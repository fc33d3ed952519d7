"""``diffaccel tune --model-space KEY=V1,V2``: the ``[model]`` keys a tune searches with the
strategies' options, for adapters that run a config's model under other ``steps`` and
``scheduler`` on one loaded pipeline (the diffusers adapters' ``variant_peer``, as
``diffaccel bench`` runs configs that differ in those keys). A point's ``[model]`` part sits
under ``MODEL``; the trial runs the strategies on that model (``model_context``), the baseline
stays the config's own, so a trial's speedup and quality are against the config as given."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import attrs

from ..contract.errors import ConfigError, ConfigValueError
from ..contract.tunable import Tunable
from .search import MODEL

KEYS = ("steps", "scheduler")


def parse_model_space(specs: list[str] | None) -> dict[str, tuple[Any, ...]]:
    """``["steps=8,10,12", "scheduler=ddim,dpm++2m"]`` -> {key: values}; one line for a bad one."""
    space: dict[str, tuple[Any, ...]] = {}
    for spec in specs or ():
        key, sep, raw = spec.partition("=")
        values = [v.strip() for v in raw.split(",")] if sep else []
        if key not in KEYS or not values or not all(values):
            raise ConfigError(f"--model-space {spec!r}: expected KEY=V1,V2,... with KEY one of {', '.join(KEYS)}")
        if key == "steps":
            if not all(v.isdigit() and int(v) > 0 for v in values):
                raise ConfigError(f"--model-space {spec!r}: steps must be positive integers")
            values = [int(v) for v in values]
        if key in space or len(set(values)) != len(values):
            raise ConfigError(f"--model-space {spec!r}: a key or a value is listed twice")
        space[key] = tuple(values)
    return space


def model_tunables(config: Any, adapter: Any, space: dict[str, tuple[Any, ...]]) -> dict[str, Tunable]:
    """The space's keys as categorical tunables, each value checked against the config's
    ``[model]`` (the adapter's allowed schedulers) before anything loads."""
    if not hasattr(adapter, "variant_peer"):
        raise ConfigError(f"--model-space: adapter '{config.model.adapter}' cannot run its model under other steps or "
                          "schedulers on one pipeline")
    for key, values in space.items():
        for v in values:
            try:
                apply_model(config, {key: v})
            except (ConfigValueError, ValueError, TypeError) as exc:
                raise ConfigError(f"--model-space {key}={v}: {exc}") from None
    return {key: Tunable(key=key, choices=values) for key, values in space.items()}


def apply_model(config: Any, params: dict[str, Any] | None) -> Any:
    """``config`` with the point's ``[model]`` keys (``steps`` on the model, ``scheduler`` on the
    adapter's options)."""
    if not params:
        return config
    model, options = config.model, config.options
    if "steps" in params:
        model = attrs.evolve(model, steps=params["steps"])
    if "scheduler" in params:
        options = attrs.evolve(options, scheduler=params["scheduler"])
    return attrs.evolve(config, model=model, options=options)


def model_context(adapter: Any, pipe: Any, base: Any, config: Any):
    """The pipeline set up for ``config``'s model (its scheduler) for a ``with`` block; nothing to
    do when it is ``base``'s."""
    if (config.model, config.options) == (base.model, base.options):
        return nullcontext()
    return adapter.peer_context(pipe, adapter.variant_peer(base, config))
