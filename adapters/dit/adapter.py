"""The DiT adapter: drives diffusers pipelines whose denoiser is a diffusion transformer (``.transformer``).

Checkpoints (``[model] checkpoint``):

* ``dit-digits``: the shipped class-conditional digits DiT (``TextDiTPipeline`` around a
  ``PixArtTransformer2DModel``, 32x32 grey, prompts ``"digit 7"`` or ``"7"``), trained by
  ``python -m diffaccel.adapters.dit.digits train``;
* ``synthetic-dit-medium`` / ``synthetic-dit-tiny``: PixArt-like pipelines with seeded random
  weights, built offline (``synthetic.py``);
* a local folder saved by ``save_pretrained`` (a ``TextDiTPipeline``, or any diffusers pipeline
  with a ``.transformer``: PixArt-alpha/sigma, Stable Diffusion 3 ...), or a hub id, loaded with
  ``DiffusionPipeline.from_pretrained``.

Peers (``[[peer]]``): diffusers' own cache hooks (``peers.py``).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import attrs
import torch

from diffaccel.errors import ConfigError, ModelLoadError
from diffaccel.state import RunState

from ..checkpoints import precheck_folder, quiet_loading
from ..unet.adapter import UNetAdapter, UNetOptions, UNetOutput, _first_line, check_pipeline
from . import hooks, peers
from .synthetic import SYNTHETIC

ASSETS = Path(__file__).parent / "assets"
SHIPPED = {"dit-digits": "dit-digits"}


@attrs.frozen(kw_only=True)
class DiTOptions(UNetOptions):
    """Keys of ``[model]`` that only the DiT adapter reads (the UNet adapter's, same meaning)."""


def load_checkpoint(checkpoint: str, allow_pickle: bool = False):
    """A pipeline for a ``checkpoint`` string (see the module docstring). The same checkpoint
    checks as the UNet adapter's: safetensors only unless ``allow_pickle``, damaged files, missing
    tensors and NaN/inf weights are one ``ModelLoadError`` (``diffaccel.adapters.checkpoints``)."""
    with quiet_loading():
        pipe = _load_checkpoint(checkpoint, allow_pickle)
    check_pipeline(pipe, checkpoint)
    return pipe


def _load_checkpoint(checkpoint: str, allow_pickle: bool):
    from .pipeline import TextDiTPipeline

    if checkpoint in SHIPPED:
        path = ASSETS / SHIPPED[checkpoint]
        if not (path / "model_index.json").is_file():
            raise ModelLoadError(f"shipped model '{checkpoint}' is missing at {path}; reinstall diffaccel or retrain it "
                                 f"with 'python -m diffaccel.adapters.dit.digits train --out DIR' and copy DIR there")
        return TextDiTPipeline.from_pretrained(str(path))
    if checkpoint in SYNTHETIC:
        from .synthetic import build

        return build(checkpoint)
    path = Path(checkpoint).expanduser()
    from diffusers import DiffusionPipeline

    if path.is_dir():
        index = path / "model_index.json"
        if not index.is_file():
            raise ModelLoadError(f"{checkpoint}: not a diffusers pipeline folder (no model_index.json)")
        try:
            cls_name = json.loads(index.read_text()).get("_class_name")
        except (OSError, ValueError, AttributeError) as exc:
            raise ModelLoadError(f"{checkpoint}: unreadable model_index.json ({_first_line(exc)})") from None
        safe = precheck_folder(path, allow_pickle, recursive=True)
        use = {"use_safetensors": True} if safe and not allow_pickle else {}
        try:
            if cls_name == "TextDiTPipeline":
                return TextDiTPipeline.from_pretrained(str(path), **use)
            return DiffusionPipeline.from_pretrained(str(path), **use)
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ModelLoadError(f"{checkpoint}: could not load the pipeline ({_first_line(exc)})") from None
    if path.exists() or checkpoint.startswith((".", "/", "~")):
        raise ModelLoadError(f"{checkpoint}: no such model folder")
    try:
        return DiffusionPipeline.from_pretrained(checkpoint, **({} if allow_pickle else {"use_safetensors": True}))
    except Exception as exc:  # hub errors come in many types; all mean "not loadable here"
        raise ModelLoadError(
            f"checkpoint '{checkpoint}': not a shipped model ({', '.join([*SHIPPED, *SYNTHETIC])}), not a local "
            f"pipeline folder, and diffusers could not load it ({_first_line(exc)})"
        ) from None


def is_digits(pipe) -> bool:
    """The digits geometry (a TextDiTPipeline on 1-channel pixels): its prompts name a class."""
    return type(pipe).__name__ == "TextDiTPipeline" and getattr(pipe, "vae", None) is None \
        and pipe.transformer.config.in_channels == 1


def patch_factor(pipe) -> int:
    """Image sizes must be multiples of this: the VAE's downsampling times the patch size."""
    f = getattr(pipe, "vae_scale_factor", None) or 1
    return f * int(getattr(pipe.transformer.config, "patch_size", 1) or 1)


class DiTAdapter:
    """The ``dit`` adapter (entry point ``diffaccel.adapters: dit``): diffusers pipelines whose
    ``.transformer`` has a ``transformer_blocks`` stack."""

    name = "dit"
    output_suffix = ".png"
    Options = DiTOptions
    capabilities = hooks.CAPABILITIES
    PEERS = peers.PEERS
    layer_types = (hooks.DiTBlock,)

    @staticmethod
    def accepts(pipe: Any) -> bool:
        try:
            from diffusers import DiffusionPipeline
        except ImportError:  # pragma: no cover
            return False
        t = getattr(pipe, "transformer", None)
        return isinstance(pipe, DiffusionPipeline) and isinstance(getattr(t, "transformer_blocks", None), torch.nn.ModuleList)

    @staticmethod
    def attach(pipe, accelerator) -> None:
        hooks.attach(pipe, accelerator)

    @staticmethod
    def detach(pipe) -> None:
        hooks.detach(pipe)

    @staticmethod
    def info(pipe) -> dict[str, Any]:
        t = pipe.transformer
        specs = hooks.block_specs(t)
        return {
            "adapter": "dit", "n_layers": len(specs), "layers": [n for n, _, _, _ in specs],
            "depths": [d for _, _, d, _ in specs], "kinds": [k for _, k, _, _ in specs],
            "capabilities": sorted(DiTAdapter.capabilities), "modules": [],
            "blocks": [{"name": n, "kind": k, "type": type(m).__name__} for n, k, _, m in specs],
            "sample_size": t.config.sample_size, "in_channels": t.config.in_channels,
            "time_conditioned": True, "pipeline": type(pipe).__name__, "transformer": type(t).__name__,
            "parameters": sum(p.numel() for p in t.parameters()),
        }

    @staticmethod
    def load(config):
        from diffusers import DDIMScheduler

        m, opts, where = config.model, config.options, f"{config.source}: [model]"
        pipe = load_checkpoint(m.checkpoint, m.allow_pickle)
        if not DiTAdapter.accepts(pipe):
            raise ModelLoadError(f"checkpoint '{m.checkpoint}': its pipeline has no diffusion transformer "
                                 f"(.transformer with transformer_blocks)")
        if opts.scheduler == "ddim" and not isinstance(pipe.scheduler, DDIMScheduler):
            pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
        if opts.size is not None:
            factor = patch_factor(pipe)
            if opts.size % factor:
                raise ConfigError(f"{where}: key 'size': {opts.size} is not a multiple of {factor}, the model's "
                                  f"patch size times its VAE downsampling; try {-(-opts.size // factor) * factor}")
        if opts.negative_prompt is not None and type(pipe).__name__ == "TextDiTPipeline":
            raise ConfigError(f"{where}: key 'negative_prompt': this pipeline's unconditional branch is the empty prompt")
        try:
            pipe = pipe.to(m.device)
        except (RuntimeError, AssertionError) as exc:
            raise ModelLoadError(f"{where}: key 'device': '{m.device}' is not usable ({_first_line(exc)})") from None
        return pipe

    @staticmethod
    def run(pipe, config, seed: int, progress: bool = True, **extra) -> UNetOutput:
        from ..unet.pipeline import digit_label

        m, o = config.model, config.options
        prompts = [o.prompts[i % len(o.prompts)] for i in range(m.batch)] if o.prompts else [""] * m.batch
        seeds = [seed + i for i in range(m.batch)]
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
        session = hooks.session_of(pipe)
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
            run = RunState(adapter="dit", num_steps=m.steps or 50, batch_size=m.batch)
        return UNetOutput(images=images.detach().float().cpu(), prompts=prompts, seeds=seeds,
                          labels=[digit_label(p) for p in prompts] if is_digits(pipe) else None, report=run.report(),
                          grid_columns=o.grid_columns, grid_scale=o.grid_scale)

    reference_run = UNetAdapter.reference_run
    write = UNetAdapter.write
    quality = UNetAdapter.quality

    # -- peers: diffusers' cache hooks ------------------------------------------------------------
    @staticmethod
    def peer_name(entry) -> str:
        return peers.peer_name(entry.config)

    @staticmethod
    def peer_context(pipe, peer):
        return peers.peer_context(pipe, peer, hooks.session_of)
