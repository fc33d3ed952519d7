"""Output paths and options of ``generate`` and ``bench``, checked before any model loads.

A run that samples for minutes and then cannot write its result wastes the minutes; so every
path a command will write is checked first: no existing folder where a file goes (or a file where
a folder goes), no file standing where a folder of the path should be, the nearest existing
folder writable, and the suffix an image adapter writes. Missing folders are fine: the writers
create them (``--out runs/demo/digits.png`` works in a fresh checkout).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..contract.adapter import WritesFiles
from ..contract.errors import ConfigError


def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _check_parent(path: Path, option: str) -> None:
    parent = path.parent if str(path.parent) else Path(".")
    anchor = _nearest_existing(parent)
    if not anchor.is_dir():
        raise ConfigError(f"{option} {path}: {anchor} is a file, not a folder; give a path inside a folder")
    if not os.access(anchor, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {path}: the folder {anchor} is not writable; give a path in a writable folder")


def check_file(path: str | os.PathLike, option: str = "--out", suffix: str | None = None, why: str = "") -> Path:
    """``path`` can be written as a file (and ends in ``suffix``, case-insensitive, when given);
    otherwise one ``ConfigError`` line naming the option, the path, what is wrong and what is allowed."""
    p = Path(path)
    if not str(path).strip():
        raise ConfigError(f"{option}: empty path; give a file name")
    if p.is_dir():
        raise ConfigError(f"{option} {p}: is a folder; give a file name, e.g. {p / ('out' + (suffix or '.txt'))}")
    if suffix and p.suffix.lower() != suffix:
        raise ConfigError(f"{option} {p}: must end in {suffix}{why}; e.g. {p.with_suffix(suffix)}")
    _check_parent(p, option)
    if p.exists() and not os.access(p, os.W_OK):
        raise ConfigError(f"{option} {p}: the file exists and is not writable")
    return p


def check_folder(path: str | os.PathLike, option: str) -> Path:
    """``path`` is a folder or can be created as one; otherwise one ``ConfigError`` line."""
    p = Path(path)
    if not str(path).strip():
        raise ConfigError(f"{option}: empty path; give a folder")
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{option} {p}: is a file, not a folder; give a folder (created when missing)")
    if p.is_dir():
        if not os.access(p, os.W_OK | os.X_OK):
            raise ConfigError(f"{option} {p}: the folder is not writable")
        return p
    _check_parent(p, option)
    return p


def at_least_one(value: int | None, option: str) -> None:
    if value is not None and value < 1:
        raise ConfigError(f"{option} must be 1 or more, got {value}")


def generate_out(adapter, config, out: str | None) -> str | None:
    """Where ``generate`` writes, checked: ``out``, or for adapters that write files of one kind
    (``output_suffix``, e.g. the unet adapter's ``.png``) ``<config name><suffix>`` in the current
    folder when ``out`` is None. None: the adapter's own default (text: stdout). ``adapter`` may be
    the adapter's light spec (``adapters_registry.adapter_spec``), before the adapter is imported."""
    suffix = adapter.output_suffix if isinstance(adapter, WritesFiles) else None
    why = f" (the {adapter.name} adapter writes {suffix[1:].upper()} files)" if suffix else ""
    if out is None:
        if suffix is None:
            return None
        out = Path(config.source).stem + suffix
    check_file(out, "--out", suffix, why)
    return out


def check_bench_args(args) -> None:
    """``bench``'s counts and output paths (--json, --plots, --report), before any config loads."""
    for name in ("seeds", "repeats", "batch"):
        at_least_one(getattr(args, name, None), f"--{name}")
    if getattr(args, "json_path", None) is not None:
        check_file(args.json_path, "--json")
    for option, attr in (("--plots", "plot_dir"), ("--report", "report_dir")):
        if getattr(args, attr, None) is not None:
            check_folder(getattr(args, attr), option)


COUNTS = ("repeats", "threads", "batch", "steps", "processes", "seeds")
"""Count options a core command may have; each given one must be 1 or more."""


def precheck(args) -> list:
    """The checks a core command that reads configs runs first (its ``precheck``), before any
    adapter, plugin or model library is imported: counts (``COUNTS``), config files (TOML, tables,
    adapter name, ``[model]`` keys where the adapter declares them lightly), a prompts file. One
    ``ConfigError`` or ``DiffaccelError`` line; the commands repeat what needs the adapter once it
    is imported. Returns the configs as prechecked (``runtime.config.precheck_config``)."""
    from ..runtime.config import precheck_config

    for name in COUNTS:
        at_least_one(getattr(args, name, None), f"--{name}")
    configs = getattr(args, "configs", None) or ([args.config] if getattr(args, "config", None) else [])
    checked = [precheck_config(path) for path in configs]
    if getattr(args, "prompts", None) is not None:
        from ..runtime.jobs import read_items

        read_items(args.prompts, 0)
    return checked
