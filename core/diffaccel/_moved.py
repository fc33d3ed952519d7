"""Old module paths of the core, kept working for one minor release (CHANGELOG.md, 0.2.0).

In 0.2 the core's 37 flat modules moved into subpackages by layer (``diffaccel.contract``,
``diffaccel.kit``, ``diffaccel.runtime``, ``diffaccel.bench``, ``diffaccel.tuning``,
``diffaccel.cli``). ``MOVED`` maps each old path to its new module; ``Finder`` (on
``sys.meta_path`` from ``import diffaccel``) makes ``import diffaccel.hookspecs`` give the very
module object ``diffaccel.contract.hookspecs`` (so ``isinstance`` checks and monkeypatching act on
the one module), with a DeprecationWarning naming the new path, once per process (then it is in
``sys.modules``). ``old_names`` keeps an old module's names importable from the subpackage that
took its name (``diffaccel.bench.run_bench`` -> ``diffaccel.bench.runner.run_bench``).

This module imports nothing of diffaccel at its top: the new modules are imported by name, when
an old path is asked for.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from typing import Any, Callable

MOVED = {
    # diffaccel.contract
    "diffaccel.errors": "diffaccel.contract.errors", "diffaccel.hookspecs": "diffaccel.contract.hookspecs",
    "diffaccel.capabilities": "diffaccel.contract.capabilities",
    "diffaccel.adapter": "diffaccel.contract.adapter",
    "diffaccel.validators": "diffaccel.contract.validators", "diffaccel.state": "diffaccel.contract.state",
    # diffaccel.kit
    "diffaccel.words": "diffaccel.kit.words", "diffaccel.conditions": "diffaccel.kit.conditions",
    "diffaccel.extrapolate": "diffaccel.kit.extrapolate", "diffaccel.hygiene": "diffaccel.kit.hygiene",
    "diffaccel.stats": "diffaccel.kit.stats",
    # diffaccel.runtime
    "diffaccel.accelerator": "diffaccel.runtime.accelerator",
    "diffaccel.sequence": "diffaccel.runtime.sequence", "diffaccel.guard": "diffaccel.runtime.guard",
    "diffaccel.memory": "diffaccel.runtime.memory", "diffaccel.placement": "diffaccel.runtime.placement",
    "diffaccel.plugins": "diffaccel.runtime.registry", "diffaccel.builtin": "diffaccel.runtime.builtin",
    "diffaccel.adapters_registry": "diffaccel.runtime.adapters_registry",
    "diffaccel.config": "diffaccel.runtime.config", "diffaccel.jobs": "diffaccel.runtime.jobs",
    # diffaccel.bench
    "diffaccel.prompt_bench": "diffaccel.bench.prompt_bench",
    "diffaccel.scale_bench": "diffaccel.bench.scale_bench", "diffaccel.report": "diffaccel.bench.report",
    "diffaccel.grid": "diffaccel.bench.grid",
    # diffaccel.tuning
    "diffaccel.tune_report": "diffaccel.tuning.tune_report", "diffaccel.search": "diffaccel.tuning.search",
    "diffaccel.budget": "diffaccel.tuning.budget", "diffaccel.toml_out": "diffaccel.tuning.toml_out",
    # diffaccel.cli
    "diffaccel.cli_examples": "diffaccel.cli.examples", "diffaccel.commands": "diffaccel.cli.commands",
    "diffaccel.tools": "diffaccel.cli.tools", "diffaccel.outputs": "diffaccel.cli.outputs",
}
"""Old module path -> new module path, until 0.3. bench.py, tuning.py and cli.py became the
packages ``diffaccel.bench``, ``diffaccel.tuning`` and ``diffaccel.cli``: ``old_names`` covers
their old names."""

REMOVED_IN = "0.3"


def _stacklevel() -> int:
    """The ``stacklevel`` (counted from ``warn``) that points a warning at the import statement or
    ``import_module`` call that asked for the old path: past this module's frames and
    ``importlib.import_module``'s. The import system's own frames (importlib._bootstrap) are
    skipped by ``warnings`` itself and are not counted."""
    frame, level = sys._getframe(2), 1
    while frame is not None:
        name = frame.f_code.co_filename
        if not ("importlib" in name and "_bootstrap" in name):
            if name != __file__ and not name.endswith(("importlib/__init__.py", "importlib\\__init__.py")):
                return level + 1
            level += 1
        frame = frame.f_back
    return level


def warn(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; the old path works until diffaccel {REMOVED_IN}, import {new}",
                  DeprecationWarning, stacklevel=_stacklevel())


class _Alias(importlib.abc.Loader):
    """Loads an old path as its new module: the new module object itself goes into sys.modules."""

    def create_module(self, spec: Any) -> None:
        return None  # a throwaway module; exec_module puts the real one in its place

    def exec_module(self, module: Any) -> None:
        old = module.__name__
        new = importlib.import_module(MOVED[old])
        warn(old, MOVED[old])
        # the import system returns what sys.modules holds under the name once exec_module is done
        sys.modules[old] = new


class Finder(importlib.abc.MetaPathFinder):
    """On ``sys.meta_path``: finds only the old paths in ``MOVED``."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias())


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once): a dict lookup per import elsewhere."""
    if not any(isinstance(f, Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, Finder())


def old_names(package: str, module: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``, a subpackage that took an old module's name
    (``diffaccel.bench`` was bench.py, now ``diffaccel.bench.runner``): the old module's names
    resolve, with a DeprecationWarning naming the new place. Submodules resolve as submodules."""

    warned: set[str] = set()  # one warning per name and process, as for an old module path

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if importlib.util.find_spec(f"{package}.{name}") is not None:
            return importlib.import_module(f"{package}.{name}")
        new = importlib.import_module(module)
        if not hasattr(new, name):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if name not in warned:
            warned.add(name)
            warn(f"{package}.{name}", f"{module}.{name}")
        # not kept on the package: a later monkeypatch of the new module is seen through the old name
        return getattr(new, name)

    return __getattr__


def moved_names(module: str, table: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``module``, some of whose names moved to other modules (``table``:
    name -> its new module; ``Tunable`` left ``diffaccel.tuning.search`` for ``diffaccel.contract.tunable``):
    each resolves with a DeprecationWarning naming the new place, once per name and process, as
    ``old_names`` does. The module must not hold the name itself (import it under another name)."""

    warned: set[str] = set()

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        if name not in warned:
            warned.add(name)
            warn(f"{module}.{name}", f"{table[name]}.{name}")
        return getattr(importlib.import_module(table[name]), name)

    return __getattr__


def register(table: dict[str, str]) -> None:
    """Add a package's own old -> new module paths (``diffaccel.adapters`` registers its moves from its
    ``__init__``): the one finder serves them, with the same warning, until the same release."""
    MOVED.update(table)
