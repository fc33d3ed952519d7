"""Where the core finds adapters: name -> ``module:Class``, imported on first use."""

from __future__ import annotations

import importlib
from typing import Any

ADAPTERS = {
    "text": "diffaccel.adapters.text.adapter:TextAdapter",
    "unet": "diffaccel.adapters.unet.adapter:UNetAdapter",
}


def get_adapter(name: str) -> Any:
    """The adapter class registered under ``name`` (``text``, ``unet``)."""
    module, _, cls = ADAPTERS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def adapter_options(name: str) -> type:
    """The attrs class of the adapter-specific keys of ``[model]``."""
    return get_adapter(name).Options


def adapter_for(pipe: Any) -> Any:
    """The adapter that drives ``pipe``; raises DiffaccelError if none does."""
    from .errors import DiffaccelError

    for name in ADAPTERS:
        adapter = get_adapter(name)
        if adapter.accepts(pipe):
            return adapter
    raise DiffaccelError(f"no diffaccel adapter drives a {type(pipe).__name__}; adapters: {', '.join(ADAPTERS)}")
