"""The adapter kit: what an adapter (a model family: ours in ``diffaccel.adapters``, or a third
party's) uses of the core beyond ``diffaccel.contract`` and ``diffaccel.kit``, in one public place.

An adapter imports only ``diffaccel`` (the top-level names), ``diffaccel.contract`` (the ``Adapter``
protocol and the optional ones, the capabilities, ``RunState`` and ``RunInfo``, the errors and
validators, ``Tunable``), ``diffaccel.kit`` (words, saved conditions, hygiene marks, ...), this
module, and ``diffaccel.testing`` / ``diffaccel.conformance`` in its tests; an import-linter contract
holds the shipped adapters to it (pyproject.toml, ``make layers``). Everything here is covered by
``diffaccel.PLUGIN_API`` (CHANGELOG.md's rule: an old form works for one minor release, with a
DeprecationWarning naming the new one). The names are the run machinery's own objects,
re-exported, not copies:

- ``RunSequence``, ``StepModel``: the order of a run and of a step that every adapter drives
  (``diffaccel.runtime.sequence``; docs/writing-an-adapter.md); ``NullAccelerator`` and ``NULL``
  (its shared instance): a run with no strategy.
- ``torch_dtype``, ``dtype_name``, ``DTYPES``: ``[model] dtype`` as a torch dtype and back
  (``diffaccel.runtime.placement``, which checks a device/dtype pair before anything loads).
- ``env_allows``: whether ``DIFFACCEL_PLUGINS`` / ``DIFFACCEL_BLOCK_PLUGINS`` let an entry point
  load, for an adapter that loads entry points of its own (the text adapter's model kinds).
- ``old_names``, ``register_moved``: keep an adapter's moved module paths and names working, with
  the core's DeprecationWarning, for one minor release (``diffaccel._moved``).

The core's other subpackages (``runtime``, ``bench``, ``tuning``, ``serve``, ``cli``) are internal:
they may change in any release.
"""

from __future__ import annotations

from ._moved import old_names
from ._moved import register as register_moved
from .runtime.placement import DTYPES, dtype_name, torch_dtype
from .runtime.registry import env_allows
from .runtime.sequence import NULL, NullAccelerator, RunSequence, StepModel

__all__ = ["DTYPES", "NULL", "NullAccelerator", "RunSequence", "StepModel", "dtype_name", "env_allows", "old_names",
           "register_moved", "torch_dtype"]
