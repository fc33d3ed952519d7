"""What the two diffusers adapters (``unet`` and ``dit``) share: loading a pipeline for a
``[model] checkpoint`` string, and one generation (``run``).

A checkpoint string is, in this order: a shipped model (by name, found in the ``diffaccel.checkpoints``
registry that diffaccel-models fills: ``diffaccel.kit.checkpoints``), a
synthetic model built offline from seeded random weights, a local folder saved by
``save_pretrained`` (the adapter's own pipeline class when its model_index.json names it, else the
adapter's fallback class), or a hub id (the fallback class). Every local file goes through the
shared checks of ``diffaccel.adapters.checkpoints`` first: safetensors only unless
``allow_pickle``, damaged files, missing tensors and NaN/inf weights are one ``ModelLoadError``.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import attrs
import torch

from diffaccel.adapterkit import torch_dtype
from diffaccel.contract.errors import ConfigError, ModelLoadError
from diffaccel.contract.state import RunState
from diffaccel.kit.checkpoints import shipped_checkpoint

from ..checkpoints import check_component_files, check_module_finite, precheck_folder, quiet_loading
from .hooks import session_of
from .schedulers import set_scheduler
from .digits import digit_label


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@attrs.frozen(kw_only=True)
class PipelineSource:
    """Where one diffusers adapter finds the pipeline a checkpoint string names."""

    shipped: Mapping[str, str]
    """Shipped model name -> its name in the ``diffaccel.checkpoints`` registry (diffaccel-models)."""
    retrain: str
    """How to rebuild a missing shipped model (said in the error line)."""
    synthetic: Collection[str]
    """Names of the synthetic (seeded random weights) models ``build`` makes."""
    build: Callable[[str], Any]
    own_class: type
    """The adapter's own pipeline class (imported on first use)."""
    fallback: Callable[..., Any]
    """``fallback(folder_or_hub_id, **kwargs)``: loads any other pipeline (``from_pretrained``)."""


def load_pipeline(source: PipelineSource, checkpoint: str, allow_pickle: bool = False):
    """A pipeline for a ``checkpoint`` string (see the module docstring), its weights checked."""
    with quiet_loading():
        pipe = _load(source, checkpoint, allow_pickle)
    check_pipeline(pipe, checkpoint, source.shipped)
    return pipe


def check_pipeline(pipe, checkpoint: str, shipped: Collection[str] = ()) -> None:
    """Each model of the pipeline: no tensor its local files lack (diffusers would initialise it
    at random), no NaN/inf weight (named ``component: tensor``)."""
    folder = Path(checkpoint).expanduser()
    for name, component in pipe.components.items():
        if isinstance(component, torch.nn.Module):
            if checkpoint not in shipped and (folder / name).is_dir():
                check_component_files(component, folder / name)
            check_module_finite(component, f"checkpoint '{checkpoint}': {name}")


def _load(source: PipelineSource, checkpoint: str, allow_pickle: bool):
    if checkpoint in source.shipped:
        path = shipped_checkpoint(source.shipped[checkpoint])  # one ConfigError line when diffaccel-models is missing
        if not (path / "model_index.json").is_file():
            raise ModelLoadError(f"shipped model '{checkpoint}' is missing at {path}; reinstall diffaccel-models or retrain "
                                 f"it with {source.retrain}")
        return source.own_class.from_pretrained(str(path))
    if checkpoint in source.synthetic:
        return source.build(checkpoint)
    path = Path(checkpoint).expanduser()
    if path.is_dir():
        index = path / "model_index.json"
        if not index.is_file():
            raise ModelLoadError(f"{checkpoint}: not a diffusers pipeline folder (no model_index.json)")
        try:
            cls_name = json.loads(index.read_text()).get("_class_name")
        except (OSError, ValueError, AttributeError) as exc:
            raise ModelLoadError(f"{checkpoint}: unreadable model_index.json ({first_line(exc)})") from None
        safe = precheck_folder(path, allow_pickle, recursive=True)
        use = {"use_safetensors": True} if safe and not allow_pickle else {}
        try:
            own = source.own_class
            if cls_name == own.__name__:
                return own.from_pretrained(str(path), **use)
            return source.fallback(str(path), **use)
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ModelLoadError(f"{checkpoint}: could not load the pipeline ({first_line(exc)})") from None
    if path.exists() or checkpoint.startswith((".", "/", "~")):
        raise ModelLoadError(f"{checkpoint}: no such model folder")
    try:
        return source.fallback(checkpoint, **({} if allow_pickle else {"use_safetensors": True}))
    except Exception as exc:  # hub errors come in many types; all mean "not loadable here"
        raise ModelLoadError(
            f"checkpoint '{checkpoint}': not a shipped model ({', '.join([*source.shipped, *source.synthetic])}), not a "
            f"local pipeline folder, and diffusers could not load it ({first_line(exc)})"
        ) from None


def load_for_config(config, source: PipelineSource, *, accepts: Callable[[Any], bool], lacks: str,
                    size_factor: Callable[[Any], int], factor_is: str, negative_refused: str):
    """``[model]``'s pipeline, ready to run: loaded (``load_pipeline``), checked to have the
    adapter's denoiser (else ``lacks`` is said), its ``scheduler`` put in (``diffusers_schedulers``),
    ``size`` checked against ``size_factor(pipe)`` (described as ``factor_is``), a
    ``negative_prompt`` refused for the adapter's own pipeline (whose unconditional branch is the
    empty prompt: ``negative_refused``), then moved to ``device``."""
    m, opts, where = config.model, config.options, f"{config.source}: [model]"
    pipe = load_pipeline(source, m.checkpoint, m.allow_pickle)
    if not accepts(pipe):
        raise ModelLoadError(f"checkpoint '{m.checkpoint}': its pipeline has no {lacks}")
    set_scheduler(pipe, opts.scheduler, m.checkpoint, config.source)
    if opts.size is not None:
        factor = size_factor(pipe)
        if opts.size % factor:
            raise ConfigError(f"{where}: key 'size': {opts.size} is not a multiple of {factor}, {factor_is}; "
                              f"try {-(-opts.size // factor) * factor}")
    if opts.negative_prompt is not None and type(pipe) is source.own_class:
        raise ConfigError(f"{where}: key 'negative_prompt': {negative_refused}")
    try:
        dtype = torch_dtype(m.dtype)
        # a dtype only when it changes: diffusers warns on every .to(dtype) of a model that keeps
        # modules in float32 (PixArt's), even a no-op one, and that line would print on every run
        pipe = pipe.to(m.device) if getattr(pipe, "dtype", None) == dtype else pipe.to(m.device, dtype)
    except (RuntimeError, AssertionError) as exc:
        raise ModelLoadError(f"{where}: key 'device': '{m.device}' is not usable ({first_line(exc)})") from None
    return pipe


@attrs.define
class ImageOutput:
    images: torch.Tensor
    """(B, C, H, W) float in [0, 1], on the CPU."""
    prompts: list[str]
    seeds: list[int]
    labels: list[int | None] | None
    """Digits models: the class each prompt asks for; None for other models."""
    report: dict[str, Any]
    """Counters and what each strategy reported (``RunState.report()``)."""
    grid_columns: int = 8
    grid_scale: int = 1


def run_pipeline(pipe, config, seed: int, progress: bool, extra: Mapping[str, Any], *, adapter: str,
                 labelled: bool) -> ImageOutput:
    """One generation of ``config``'s batch (row i: prompt i, cycling, and seed ``seed + i``, or
    ``extra["seeds"][i]`` when given: ``diffaccel serve`` batches requests with unrelated seeds).
    ``eta`` goes to pipelines whose call takes it; ``labelled``: digits prompts name a class."""
    m, o = config.model, config.options
    prompts = [o.prompts[i % len(o.prompts)] for i in range(m.batch)] if o.prompts else [""] * m.batch
    extra = dict(extra)
    seeds = list(extra.pop("seeds", None) or [seed + i for i in range(m.batch)])
    if len(seeds) != m.batch:
        raise ValueError(f"seeds: {len(seeds)} given for {m.batch} rows")
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    kwargs: dict[str, Any] = dict(prompt=prompts, num_inference_steps=m.steps or 50, guidance_scale=o.guidance_scale,
                                  generator=gens, output_type="pt")
    if "eta" in inspect.signature(type(pipe).__call__).parameters:
        kwargs["eta"] = o.eta
    if o.size is not None:
        kwargs.update(height=o.size, width=o.size)
    if o.negative_prompt is not None:
        kwargs["negative_prompt"] = [o.negative_prompt] * m.batch
    kwargs.update(extra)
    pipe.set_progress_bar_config(disable=not progress, leave=False, desc=m.checkpoint)
    session = session_of(pipe)
    if session is not None:
        session.last_run = None
        session.next_info = {"seeds": seeds, "prompts": prompts}
    try:
        images = pipe(**kwargs).images
    finally:
        if session is not None and session.run is not None:
            session.end_run()
    run = session.last_run if session is not None else None
    if run is None:  # no accelerator attached: nothing was counted
        run = RunState(adapter=adapter, num_steps=m.steps or 50, batch_size=m.batch)
    return ImageOutput(images=images.detach().float().cpu(), prompts=prompts, seeds=seeds,
                       labels=[digit_label(p) for p in prompts] if labelled else None, report=run.report(),
                       grid_columns=o.grid_columns, grid_scale=o.grid_scale)
