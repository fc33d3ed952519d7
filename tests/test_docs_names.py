"""Docs that cannot drift (issue 45): every backticked dotted name ``diffaccel.x.y`` in README.md
and docs/*.md names a module, class, function or constant that exists under that path today, and
not only through an old path kept for the deprecation (the docs must name the new one)."""

from __future__ import annotations

import importlib
import importlib.util
import re
import tomllib
from pathlib import Path

from diffaccel._moved import MOVED

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NAME = re.compile(r"`+(diffaccel(?:\.[A-Za-z_]\w*)+)")
OLD_NAME_PACKAGES = ("diffaccel.bench", "diffaccel.tuning", "diffaccel.cli")
"""Subpackages that took an old module's name and keep its names (``diffaccel._moved.old_names``)."""
NOT_NAMES = {
    # docs/serve.md: a misspelled request field, shown being refused with a 400
    "diffaccel.stepz",
}


def entry_point_groups() -> set[str]:
    """Entry-point group names (``diffaccel.adapters.options``, ``diffaccel.commands``): dotted,
    backticked, and no module path. The groups the project's packages fill, and those it reads for
    third parties only (``diffaccel.text_models``: no shipped package declares one)."""
    from diffaccel.adapters.text.loading.loader import KINDS_GROUP

    groups = {KINDS_GROUP}
    for path in [ROOT / "pyproject.toml", ROOT / "models" / "pyproject.toml", *ROOT.glob("plugins/*/pyproject.toml")]:
        groups |= set(tomllib.loads(path.read_text())["project"].get("entry-points", {}))
    return groups


def old_path(name: str) -> bool:
    """``name`` goes through a path kept only for the 0.2 deprecation: an old module path, or an
    old module's name on the subpackage that took its name (``diffaccel.bench.run_bench``)."""
    parts = name.split(".")
    if any(".".join(parts[:i]) in MOVED for i in range(2, len(parts) + 1)):
        return True
    if len(parts) > 2 and ".".join(parts[:2]) in OLD_NAME_PACKAGES:
        package = importlib.import_module(".".join(parts[:2]))
        submodule = importlib.util.find_spec(".".join(parts[:3])) is not None
        return not submodule and parts[2] not in vars(package)
    return False


def resolves(name: str) -> bool:
    """``name`` imports as a module, or as a module's attribute chain, by its current path."""
    if old_path(name):
        return False
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def stale_names(paths: list[Path]) -> list[str]:
    """``file: name`` for each backticked dotted name that names nothing (or only an old path)."""
    skip = NOT_NAMES | entry_point_groups()
    stale = []
    for path in paths:
        for name in sorted(set(NAME.findall(path.read_text())) - skip):
            if not resolves(name):
                stale.append(f"{path.name}: {name}")
    return stale


def test_every_dotted_name_in_the_docs_exists():
    assert stale_names(DOCS) == []


def test_a_stale_name_is_caught(tmp_path):
    doc = tmp_path / "stale.md"
    doc.write_text("The hooks: `diffaccel.hookspecs` (moved), ``diffaccel.contract.state.NoSuchThing``, "
                   "`diffaccel.bench.run_bench` (an old module's name), `diffaccel.nowhere.at_all`; "
                   "current: `diffaccel.contract.hookspecs`, `diffaccel.apply(pipe, cfg)`, "
                   "`diffaccel.contract.capabilities.TOKEN_LOGITS`, the group `diffaccel.commands`.")
    assert stale_names([doc]) == ["stale.md: diffaccel.bench.run_bench", "stale.md: diffaccel.contract.state.NoSuchThing",
                                  "stale.md: diffaccel.hookspecs", "stale.md: diffaccel.nowhere.at_all"]


PATH = re.compile(r"`((?:adapters|core|plugins|scripts|docs|tests|configs)/[A-Za-z0-9_./-]+)`")


def test_every_backticked_repository_path_exists():
    """A backticked path in README.md, docs/*.md or a plugin's README (``adapters/diffusers/dit``,
    ``configs/x.toml``) names a file or folder that exists: from the repository root, or in a
    plugin's README from the plugin's folder too (its ``configs/...``). Files moved by a
    restructure leave no stale path behind."""
    readmes = sorted(ROOT.glob("plugins/*/README.md"))
    missing = []
    for doc in [*DOCS, *readmes]:
        bases = [ROOT] + ([doc.parent] if doc in readmes else [])
        for path in PATH.findall(doc.read_text()):
            if not any((base / path.rstrip("/")).exists() for base in bases):
                missing.append(f"{doc.relative_to(ROOT)}: {path}")
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)
