"""The ``unet2d`` adapter: unconditional diffusers pipelines whose ``.unet`` is a ``UNet2DModel``
(``DDPMPipeline``, ``DDIMPipeline``). The worked example of docs/writing-an-adapter.md: one
module, built on the public diffusers hook session (``diffaccel.adapters.diffusers.hooks``).

Checkpoints (``[model] checkpoint``): a local folder saved by ``save_pretrained`` (its
model_index.json names the pipeline), a hub id (offline: only when cached), or
``synthetic-ddpm-16``, a seeded random 16x16 one-channel ``UNet2DModel`` built offline (a model
to measure speed on: its images are noise-like, its blocks do the work of a trained one's).

This module imports attrs, torch and the core only at its top: the ``diffaccel.adapters.options``
entry point names ``UNet2DAdapter`` too, so that a config's ``[model]`` keys and ``--out`` are
checked before diffusers is imported. diffusers is imported where a pipeline is made.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import torch

from diffaccel.adapterkit import torch_dtype
from diffaccel.contract.capabilities import BLOCK_STACK, IMAGE_STEPS, SPATIAL_FEATURES
from diffaccel.contract.errors import DiffaccelError, ModelLoadError
from diffaccel.contract.state import RunState
from diffaccel.contract.validators import in_range, one_of, positive

from ..hooks import DenoiserBlock, DenoiserSession, attach, call_pipeline, detach

SCHEDULERS = ("ddim", "ddpm", "dpm++2m", "unipc", "euler", "checkpoint")
SYNTHETIC = "synthetic-ddpm-16"
CAPABILITIES = frozenset({BLOCK_STACK, SPATIAL_FEATURES, IMAGE_STEPS})
"""What the blocks offer strategies. No ``block-tail``: the up blocks of a ``UNet2DModel``
(``AttnUpBlock2D`` among them) have no layer methods here to run their last layers alone."""


@attrs.frozen(kw_only=True)
class UNet2DOptions:
    """Keys of ``[model]`` that only the unet2d adapter reads."""

    scheduler: str = attrs.field(default="ddim", validator=one_of(SCHEDULERS))
    """ddim (a DDIMPipeline, DDIM from the checkpoint's noise schedule), ddpm (a DDPMPipeline, ancestral DDPM sampling), dpm++2m, unipc or euler (DPM-Solver++ 2M, UniPC, Euler from the checkpoint's noise schedule, in a loop that scales inputs as they need) or checkpoint (the pipeline and scheduler it was saved with)."""
    eta: float = attrs.field(default=0.0, validator=in_range(0.0, 1.0))
    """DDIM eta (DDIM pipelines only): 0 is deterministic DDIM, 1 is DDPM-like noise."""
    grid_columns: int = attrs.field(default=8, validator=positive)
    """Images per row in the PNG grid that ``generate --out`` writes."""
    grid_scale: int = attrs.field(default=4, validator=in_range(1, 16))
    """Nearest-neighbour enlargement of each image in the written grid (1: native size)."""


def block_specs(unet: torch.nn.Module) -> list[tuple[str, str, int, torch.nn.Module]]:
    """(name, kind, depth, module) of each block, in forward order: ``down_blocks.i`` (depth i),
    ``mid_block`` (the deepest), ``up_blocks.j`` (depth n_down - 1 - j, the down block it reads
    the skips of)."""
    downs = list(unet.down_blocks)
    specs = [(f"down_blocks.{i}", "down", i, b) for i, b in enumerate(downs)]
    if getattr(unet, "mid_block", None) is not None:
        specs.append(("mid_block", "mid", len(downs), unet.mid_block))
    specs += [(f"up_blocks.{j}", "up", len(downs) - 1 - j, b) for j, b in enumerate(unet.up_blocks)]
    return specs


class UNet2DBlock(DenoiserBlock):
    """The unet2d adapter's layer: one block of a ``UNet2DModel`` (``down_blocks.i``,
    ``mid_block``, ``up_blocks.j``; kind ``down``/``mid``/``up``, ``depth`` 0 outermost).
    ``compute(hidden)`` runs the block's own ``forward``; ``cached_output`` is its last output in
    the run (while strategies are active), served without running the block."""

    family = "UNet2D"


class UNet2DSession(DenoiserSession):
    """The accelerator attached to one unconditional UNet pipeline."""

    adapter = "unet2d"
    capabilities = CAPABILITIES
    denoiser_attr = "unet"

    def build_layers(self, accelerator: Any) -> None:
        self.layers = [UNet2DBlock(name, i, kind, mod, self, depth)
                       for i, (name, kind, depth, mod) in enumerate(block_specs(self.denoiser))]


def build_synthetic() -> Any:
    """``synthetic-ddpm-16``: a DDPMPipeline around a seeded random 16x16 grey UNet2DModel."""
    from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        unet = UNet2DModel(sample_size=16, in_channels=1, out_channels=1, layers_per_block=1,
                           block_out_channels=(32, 64, 64), norm_num_groups=8,
                           down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
                           up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D"))
    return DDPMPipeline(unet=unet.eval(), scheduler=DDPMScheduler(num_train_timesteps=1000))


def _source():
    from diffusers import DDPMPipeline, DiffusionPipeline

    from ..pipelines import PipelineSource

    return PipelineSource(shipped={}, retrain="", synthetic=(SYNTHETIC,),
                          build=lambda _name: build_synthetic(), own_class=DDPMPipeline,
                          fallback=DiffusionPipeline.from_pretrained)


class UNet2DAdapter:
    """The ``unet2d`` adapter (entry point ``diffaccel.adapters: unet2d``): diffusers pipelines
    whose ``.unet`` is an unconditional ``UNet2DModel``."""

    name = "unet2d"
    Options = UNet2DOptions
    capabilities = CAPABILITIES
    PEERS: dict[str, type] = {}
    layer_types = (UNet2DBlock,)
    output_suffix = ".png"
    """``generate`` writes one PNG grid (``WritesFiles``)."""

    @staticmethod
    def accepts(pipe: Any) -> bool:
        from diffusers import DiffusionPipeline, UNet2DModel

        return isinstance(pipe, DiffusionPipeline) and isinstance(getattr(pipe, "unet", None), UNet2DModel)

    @staticmethod
    def attach(pipe: Any, accelerator: Any) -> None:
        attach(pipe, accelerator, UNet2DSession)

    @staticmethod
    def detach(pipe: Any) -> None:
        detach(pipe)

    @staticmethod
    def info(pipe: Any) -> dict[str, Any]:
        unet = pipe.unet
        specs = block_specs(unet)
        return {
            "adapter": "unet2d", "n_layers": len(specs), "layers": [n for n, _, _, _ in specs],
            "depths": [d for _, _, d, _ in specs], "kinds": [k for _, k, _, _ in specs],
            "capabilities": sorted(CAPABILITIES), "modules": [],
            "blocks": [{"name": n, "kind": k, "type": type(m).__name__} for n, k, _, m in specs],
            "sample_size": unet.config.sample_size, "in_channels": unet.config.in_channels,
            "time_conditioned": True, "pipeline": type(pipe).__name__,
            "parameters": sum(p.numel() for p in unet.parameters()),
        }

    @staticmethod
    def facts(config: Any) -> dict[str, Any]:
        """``info`` without the weights (``KnowsFacts``): the UNet built on the meta device from
        the synthetic spec or the folder's unet/config.json; a hub id is loaded as ``load`` would."""
        import types

        from diffusers import UNet2DModel

        from ...checkpoints import quiet_loading

        checkpoint = config.model.checkpoint
        if checkpoint == SYNTHETIC:
            with quiet_loading(), torch.device("meta"):
                return UNet2DAdapter.info(build_synthetic())
        folder = Path(checkpoint).expanduser()
        if not folder.is_dir():
            if folder.exists() or checkpoint.startswith((".", "/", "~")):
                raise ModelLoadError(f"{checkpoint}: no such model folder")
            return UNet2DAdapter.info(UNet2DAdapter.load(config))
        if not (folder / "model_index.json").is_file():
            raise ModelLoadError(f"{checkpoint}: not a diffusers pipeline folder (no model_index.json)")
        try:
            pipeline = json.loads((folder / "model_index.json").read_text()).get("_class_name")
            with quiet_loading(), torch.device("meta"):
                unet = UNet2DModel.from_config(UNet2DModel.load_config(str(folder), subfolder="unet"))
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ModelLoadError(f"{folder / 'unet' / 'config.json'}: could not read a UNet2DModel config "
                                 f"({str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__})") from None
        return {**UNet2DAdapter.info(types.SimpleNamespace(unet=unet)), "pipeline": pipeline}

    @staticmethod
    def load(config: Any) -> Any:
        """The pipeline ``[model]`` names, its weights checked, as a DDIMPipeline or a
        DDPMPipeline (``scheduler``), on ``device``."""
        from diffusers import DDIMPipeline, DDPMPipeline, DDPMScheduler

        from ..pipelines import load_pipeline
        from ..schedulers import build_scheduler

        m, o = config.model, config.options
        pipe = load_pipeline(_source(), m.checkpoint, m.allow_pickle)
        if not UNet2DAdapter.accepts(pipe):
            raise ModelLoadError(f"checkpoint '{m.checkpoint}': its pipeline ({type(pipe).__name__}) has no "
                                 f"UNet2DModel (.unet); for UNet2DConditionModel pipelines use adapter = \"unet\"")
        if o.scheduler == "ddim":
            pipe = DDIMPipeline(unet=pipe.unet, scheduler=build_scheduler("ddim", pipe.scheduler, m.checkpoint, config.source))
        elif o.scheduler == "ddpm":
            pipe = DDPMPipeline(unet=pipe.unet, scheduler=DDPMScheduler.from_config(pipe.scheduler.config))
        elif o.scheduler != "checkpoint":
            from .solver import SolverPipeline

            pipe = SolverPipeline(unet=pipe.unet, scheduler=build_scheduler(o.scheduler, pipe.scheduler, m.checkpoint,
                                                                            config.source))
        try:
            dtype = torch_dtype(m.dtype)  # [model] dtype, checked before loading (diffaccel.runtime.placement)
            return pipe.to(m.device) if pipe.unet.dtype == dtype else pipe.to(m.device, dtype)
        except (RuntimeError, AssertionError) as exc:
            raise ModelLoadError(f"{config.source}: [model]: key 'device': '{m.device}' is not usable ({exc})") from None

    @staticmethod
    def run(pipe: Any, config: Any, seed: int, progress: bool = True, **extra: Any) -> Any:
        """One generation of ``config.model.batch`` images, row i from seed ``seed + i`` (or
        ``extra["seeds"][i]``); the output's ``report`` is the run's."""
        from ..pipelines import ImageOutput

        m, o = config.model, config.options
        extra = dict(extra)
        seeds = list(extra.pop("seeds", None) or [seed + i for i in range(m.batch)])
        if len(seeds) != m.batch:
            raise ValueError(f"seeds: {len(seeds)} given for {m.batch} rows")
        kwargs: dict[str, Any] = dict(batch_size=m.batch, generator=[torch.Generator().manual_seed(s) for s in seeds],
                                      num_inference_steps=m.steps or 50, output_type="pt")
        if type(pipe).__name__ == "DDIMPipeline":
            kwargs["eta"] = o.eta
        kwargs.update(extra)
        pipe.set_progress_bar_config(disable=not progress, leave=False, desc=m.checkpoint)
        result, run = call_pipeline(pipe, info={"seeds": seeds}, **kwargs)
        if run is None:  # no accelerator attached: nothing was counted
            run = RunState(adapter="unet2d", num_steps=kwargs["num_inference_steps"], batch_size=m.batch)
        return ImageOutput(images=result.images.detach().float().cpu(), prompts=[""] * m.batch, seeds=seeds,
                           labels=None, report=run.report(), grid_columns=o.grid_columns, grid_scale=o.grid_scale)

    @staticmethod
    def reference_run(pipe: Any, config: Any, seed: int) -> None:
        """No noise floor: PSNR against the baseline says it all."""
        return None

    @staticmethod
    def write(outputs: list[Any], out: str | None) -> str:
        """Every image of ``outputs`` in one PNG grid at ``out`` (written as ``out.partial``, then renamed)."""
        from PIL import Image

        if out is None:
            raise DiffaccelError("the unet2d adapter writes a PNG grid: pass --out FILE.png")
        images = torch.cat([o.images for o in outputs]).clamp(0, 1)
        cols, scale = max(1, min(outputs[0].grid_columns, len(images))), outputs[0].grid_scale
        B, C, H, W = images.shape
        grid = torch.ones(C, -(-B // cols) * H, cols * W)
        for i, img in enumerate(images):
            r, c = divmod(i, cols)
            grid[:, r * H:(r + 1) * H, c * W:(c + 1) * W] = img
        arr = (grid * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
        pic = Image.fromarray(arr[..., 0] if C == 1 else arr[..., :3])
        pic = pic.resize((pic.width * scale, pic.height * scale), Image.NEAREST)
        path = Path(out)
        tmp = path.with_name(path.name + ".partial")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        pic.save(tmp, format="PNG")
        tmp.replace(path)  # never a half-written file under the final name
        return str(path)

    @staticmethod
    def quality_keys(config: Any) -> list[str]:
        """What ``quality`` reports (``ReportsQuality``)."""
        return ["psnr", "psnr_min"]

    @staticmethod
    def quality(baseline: list[Any], outputs: list[Any], references: list[Any] | None = None) -> dict[str, float]:
        """Mean and lowest per-image PSNR (dB, images in [0, 1]) against the baseline of the same seeds."""
        psnr = []
        for b, o in zip(baseline, outputs):
            mse = ((o.images - b.images) ** 2).flatten(1).mean(1)
            psnr += [float("inf") if e == 0 else float(-10 * torch.log10(e)) for e in mse]
        return {"psnr": sum(psnr) / len(psnr), "psnr_min": min(psnr)}

    @staticmethod
    def peer_name(entry: Any) -> str:
        raise DiffaccelError("the unet2d adapter has no peers")

    @staticmethod
    def peer_context(pipe: Any, peer: Any):
        raise DiffaccelError("the unet2d adapter has no peers")
