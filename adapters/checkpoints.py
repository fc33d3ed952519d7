"""Checkpoint files, checked the same way by every adapter: one line naming the file and what is
wrong (a ``ModelLoadError``: the CLI prints it and exits 2), before any step runs.

* Only safetensors are read by default. A pickled file (``.bin``, ``.pt``, ``.pth``, ``.ckpt``,
  ``.pkl``) is refused unless ``[model] allow_pickle = true``; even then it goes through
  ``torch.load(weights_only=True)`` only, whose unpickler builds tensors and plain containers and
  refuses any other global, so a payload's ``__reduce__`` never runs.
* A truncated or corrupted safetensors file is caught from its header (safetensors checks that
  the header's offsets cover the file exactly), before transformers or diffusers read it.
* Missing or unexpected tensors and shapes that differ from the config (``match_state``).
* NaN or inf in the loaded weights (``check_finite``): one pass of reductions, no copies.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from diffaccel.contract.errors import ModelLoadError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
ALLOW = "set allow_pickle = true in [model] to read it with torch.load(weights_only=True)"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def is_pickle(path: Path) -> bool:
    return path.suffix.lower() in PICKLE_SUFFIXES


def refuse_pickle(path: Path) -> ModelLoadError:
    return ModelLoadError(f"{path}: a pickled checkpoint, and diffaccel loads only safetensors by default "
                          f"(a pickle can run code when read); {ALLOW}")


def check_safetensors(path: Path) -> dict[str, tuple[int, ...]]:
    """The tensor shapes a safetensors file's header lists; a truncated or corrupted file is one
    line. Reads the header only (safetensors validates its offsets against the file's size)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except FileNotFoundError:
        raise ModelLoadError(f"{path}: missing") from None
    except Exception as exc:  # SafetensorError, OSError, ...: all mean "not a complete file"
        raise ModelLoadError(f"{path}: not a complete safetensors file (truncated or corrupted: {_first_line(exc)})") from None


def read_tensors(path: Path, allow_pickle: bool = False) -> dict[str, torch.Tensor]:
    """Every tensor of one weights file: safetensors, or (only with ``allow_pickle``) a pickle
    read by ``torch.load(weights_only=True)``."""
    path = Path(path)
    if is_pickle(path):
        return read_pickle(path, allow_pickle)
    check_safetensors(path)
    try:
        return load_file(str(path))
    except Exception as exc:
        raise ModelLoadError(f"{path}: not a readable safetensors file ({_first_line(exc)})") from None


def read_pickle(path: Path, allow_pickle: bool, mmap: bool = False) -> dict[str, torch.Tensor]:
    """``mmap``: map a zip-format file instead of reading it (a check before a library loads it)."""
    if not allow_pickle:
        raise refuse_pickle(path)
    try:
        try:
            state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=mmap)
        except RuntimeError as exc:  # a legacy (non-zip) pickle cannot be mapped: read it
            if not mmap or "mmap" not in str(exc):
                raise
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError (a forbidden global), EOFError (truncated), ...
        raise ModelLoadError(f"{path}: refused by torch.load(weights_only=True), which reads only tensors "
                             f"and plain containers ({_first_line(exc)})") from None
    if isinstance(state, Mapping) and isinstance(state.get("state_dict"), Mapping):
        state = state["state_dict"]  # Lightning-style .ckpt
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelLoadError(f"{path}: not a dictionary of tensors (a state dict)")
    return dict(state)


def folder_weights(folder: Path) -> tuple[list[Path], list[Path]]:
    """(safetensors files, pickled files) directly in ``folder``."""
    files = sorted(p for p in Path(folder).iterdir() if p.is_file())
    return [p for p in files if p.suffix == ".safetensors"], [p for p in files if is_pickle(p)]


def precheck_folder(folder: Path, allow_pickle: bool, *, recursive: bool = False) -> bool:
    """Before transformers or diffusers read a local folder: every safetensors header is whole,
    and pickles are refused without ``allow_pickle`` (only where no safetensors stands beside
    them: the loaders pick safetensors first). Returns whether the folder (each component folder
    when ``recursive``) has safetensors weights, i.e. whether ``use_safetensors=True`` fits."""
    folders = [Path(folder)]
    if recursive:
        folders += sorted(p for p in Path(folder).iterdir() if p.is_dir())
    all_safe = True
    for d in folders:
        safe, pickles = folder_weights(d)
        for p in safe:
            check_safetensors(p)
        if pickles and not safe:
            all_safe = False
            for p in pickles:  # the library reads them with weights_only=True too; this names the file
                read_pickle(p, allow_pickle, mmap=True)
    return all_safe


def check_loading_info(info: Mapping, where) -> None:
    """transformers' ``output_loading_info`` (loaded with ``ignore_mismatched_sizes=True``): it
    would initialise a missing or misshapen tensor at random; refuse instead."""
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise ModelLoadError(f"{where}: missing tensor '{missing[0]}' ({len(missing)} missing); "
                             "transformers would initialise it at random")
    mismatched = sorted(info.get("mismatched_keys") or (), key=lambda m: m[0])
    if mismatched:
        name, got, want = mismatched[0]
        raise ModelLoadError(f"{where}: tensor '{name}' has shape {tuple(got)}, the config says {tuple(want)}")


def check_component_files(module: torch.nn.Module, folder: Path) -> None:
    """A loaded diffusers component against the safetensors files of its folder: diffusers
    initialises a tensor the file lacks at random (with a warning only); refuse instead. A
    tensor tied to one the file holds (same storage) is not missing."""
    safe, _ = folder_weights(folder)
    if not safe:
        return
    found: dict[str, tuple[int, ...]] = {}
    for f in safe:
        found.update(check_safetensors(f))
    state = module.state_dict()
    present = {state[k].data_ptr() for k in found if k in state}
    missing = sorted(k for k, t in state.items() if k not in found and t.data_ptr() not in present)
    if missing:
        raise ModelLoadError(f"{safe[0] if len(safe) == 1 else folder}: missing tensor '{missing[0]}' ({len(missing)} missing)")


@contextmanager
def quiet_loading():
    """Silence diffusers' and transformers' loading bars, notices and load reports (errors still
    raise): a damaged checkpoint must end in one line, not a table on stderr."""
    from diffusers.utils import logging as dlog  # diffusers takes seconds to import: a text load need not pay it
    from transformers.utils import logging as tlog

    levels = (dlog.get_verbosity(), tlog.get_verbosity())
    bars = (dlog.is_progress_bar_enabled(), tlog.is_progress_bar_enabled())
    dlog.set_verbosity_error()
    tlog.set_verbosity_error()
    dlog.disable_progress_bar()
    tlog.disable_progress_bar()
    try:
        yield
    finally:
        dlog.set_verbosity(levels[0])
        tlog.set_verbosity(levels[1])
        if bars[0]:
            dlog.enable_progress_bar()
        if bars[1]:
            tlog.enable_progress_bar()


def match_state(expected: Mapping[str, tuple[int, ...]], found: Mapping[str, tuple[int, ...]], where) -> None:
    """Names and shapes of a checkpoint's tensors against the model its config builds."""
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    if missing:
        raise ModelLoadError(f"{where}: missing tensor '{missing[0]}' ({len(missing)} missing, {len(extra)} unexpected)")
    if extra:
        raise ModelLoadError(f"{where}: unexpected tensor '{extra[0]}' ({len(extra)} unexpected); it does not belong to the model its config.json describes")
    for name, shape in expected.items():
        if tuple(found[name]) != tuple(shape):
            raise ModelLoadError(f"{where}: tensor '{name}' has shape {tuple(found[name])}, the config says {tuple(shape)}")


def check_finite(named: Iterable[tuple[str, torch.Tensor]], where) -> None:
    """NaN or inf in any floating tensor: one line naming it. One reduction per tensor, and one
    test of all the sums together: if a sum is finite no element can be NaN or inf (either would
    make it non-finite); only a tensor with a non-finite sum (a real NaN/inf, or overflow of large
    values) is checked element-wise."""
    with torch.no_grad():
        tensors = [(n, t) for n, t in named if t.is_floating_point() and t.numel() and t.device.type != "meta"]
        if not tensors:
            return
        sums = torch.stack([(t.sum(dtype=torch.float32) if t.dtype in (torch.float16, torch.bfloat16) else t.sum()).float().cpu()
                            for _, t in tensors])
        if bool(torch.isfinite(sums).all()):
            return
        for i in torch.nonzero(~torch.isfinite(sums)).flatten().tolist():
            name, t = tensors[i]
            n = int((~torch.isfinite(t)).sum())
            if n:
                kind = "NaN" if bool(torch.isnan(t).any()) else "inf"
                raise ModelLoadError(f"{where}: tensor '{name}' holds {kind} ({n} of {t.numel()} values are not finite); "
                                     "the weights are damaged")


def check_module_finite(module: torch.nn.Module, where) -> None:
    """``check_finite`` over a module's parameters and buffers (each shared tensor once)."""
    seen: set[int] = set()

    def tensors():
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            if id(t) not in seen:
                seen.add(id(t))
                yield name, t

    check_finite(tensors(), where)


def check_vocab(tokenizer_size: int, table_rows: int, where, *, exact: bool = True, with_added: int | None = None) -> None:
    """A tokenizer against the embedding table it indexes. ``exact``: the sizes must be equal
    (diffaccel's own models). Otherwise (transformers tokenizers) ``tokenizer_size`` is the base
    vocabulary, which must fit in the table; the table may be padded past the tokenizer
    (``with_added``: with its added tokens) as LLaMA-class and Qwen2 checkpoints do, by at most 1%."""
    total = max(tokenizer_size, with_added or 0)
    ok = tokenizer_size == table_rows if exact else tokenizer_size <= table_rows <= total * 1.01 + 128
    if not ok:
        rule = "they must be equal" if exact else "the table may be padded past the tokenizer by at most 1%, never smaller"
        raise ModelLoadError(f"{where}: the tokenizer has {tokenizer_size} tokens but the model's embedding table has "
                             f"{table_rows} rows; {rule} (a tokenizer from another model?)")
