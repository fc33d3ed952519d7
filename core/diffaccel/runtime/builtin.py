"""The built-in default behaviour, registered as a plain plugin after every strategy."""

from __future__ import annotations

from typing import Any

from ..contract.hookspecs import hookimpl


class DefaultBehaviour:
    """Computes a layer in full when no strategy answered, and finalises with the adapter's default."""

    name = "diffaccel.runtime.builtin"

    @hookimpl(trylast=True)
    def diffaccel_layer_output(self, run, layer, hidden) -> Any:
        return layer.compute(hidden)

    @hookimpl(trylast=True)
    def diffaccel_finalize(self, run, final) -> None:
        final.apply_default()
