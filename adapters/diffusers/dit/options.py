"""The DiT adapter's ``[model]`` keys, apart from the adapter: attrs and the core only (no torch,
no diffusers), read by the command line through the ``diffaccel.adapters.options`` entry point
before the adapter is imported (see ``diffaccel.adapters.diffusers.unet.options``)."""

from __future__ import annotations

import attrs

from ..unet.options import UNetOptions


@attrs.frozen(kw_only=True)
class DiTOptions(UNetOptions):
    """Keys of ``[model]`` that only the DiT adapter reads (the UNet adapter's, same meaning)."""


class DiTSpec:
    """What the command line checks before importing the adapter (``adapters_registry.adapter_spec``)."""

    name = "dit"
    Options = DiTOptions
    output_suffix = ".png"
