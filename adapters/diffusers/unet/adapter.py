"""The UNet adapter: drives diffusers pipelines whose ``.unet`` is a ``UNet2DConditionModel``.

Checkpoints (``[model] checkpoint``):

* ``digits`` (alias ``default``): the shipped class-conditional digits model (``DigitsPipeline``,
  32x32 grey, prompts ``"digit 7"`` or ``"7"``), trained by ``diffaccel train digits``;
* ``synthetic-sd-medium`` / ``synthetic-sd-tiny``: Stable Diffusion pipelines with seeded random
  weights, built offline (see ``synthetic.py``);
* a local folder saved by ``save_pretrained`` (a ``DigitsPipeline`` or a Stable Diffusion
  pipeline, after its model_index.json), or a hub id, loaded with
  ``StableDiffusionPipeline.from_pretrained``.

Peers (``[[peer]]`` tables, run by ``diffaccel bench`` beside the strategies): ``deepcache``,
DeepCache 0.1.1's ``DeepCacheSDHelper`` applied to the same pipeline; ``steps``, the same
pipeline at fewer steps or under another scheduler (``diffusers_peers``).
"""

from __future__ import annotations

import json
import os
import types
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from diffusers import DiffusionPipeline, UNet2DConditionModel
from PIL import Image

from diffaccel.contract.errors import DiffaccelError, ModelLoadError
from diffaccel.kit.checkpoints import shipped_checkpoint

from .. import peers as diffusers_peers
from ...checkpoints import quiet_loading
from ..pipelines import ImageOutput, PipelineSource, check_pipeline, load_for_config, load_pipeline, run_pipeline
from ..pipelines import first_line as _first_line
from ..digits import class_accuracy, classify
from . import hooks
from .loading import SHIPPED, SOURCE, load_checkpoint  # noqa: F401 - load_checkpoint: importable from here as before
from .metrics import psnr_per_image, ssim_per_image
from .options import SCHEDULERS, DeepCachePeer, StepsPeer, UNetOptions, UNetSpec  # noqa: F401 - importable from here as before
from .synthetic import SYNTHETIC, build


UNetOutput = ImageOutput  # what ``run`` returns (shared with the DiT adapter)


def unet_downsampling(pipe) -> int:
    """Pixels per latent pixel times the UNet's total downsampling: image sizes must be multiples."""
    vae = getattr(pipe, "vae", None)
    vae_factor = getattr(pipe, "vae_scale_factor", None) or (2 ** (len(vae.config.block_out_channels) - 1) if vae is not None else 1)
    levels = sum(1 for b in pipe.unet.down_blocks if getattr(b, "downsamplers", None))
    return vae_factor * 2**levels


class UNetAdapter:
    """The ``unet`` adapter (entry point ``diffaccel.adapters: unet``): diffusers pipelines whose
    ``.unet`` is a ``UNet2DConditionModel``."""

    name = "unet"
    Options = UNetSpec.Options
    capabilities = hooks.CAPABILITIES
    PEERS = {"deepcache": DeepCachePeer, "steps": StepsPeer}
    layer_types = (hooks.UNetBlock,)
    output_suffix = UNetSpec.output_suffix
    """``generate`` writes one PNG grid: ``--out`` must end in .png (default ``<config name>.png``)."""

    @staticmethod
    def accepts(pipe: Any) -> bool:
        return isinstance(pipe, DiffusionPipeline) and isinstance(getattr(pipe, "unet", None), UNet2DConditionModel)

    @staticmethod
    def attach(pipe, accelerator) -> None:
        hooks.attach(pipe, accelerator)

    @staticmethod
    def detach(pipe) -> None:
        hooks.detach(pipe)

    @staticmethod
    def info(pipe) -> dict[str, Any]:
        unet = pipe.unet
        specs = hooks.block_specs(unet)
        n_down = sum(1 for _, kind, _ in specs if kind == "down")
        return {
            "adapter": "unet", "n_layers": len(specs), "layers": [name for name, _, _ in specs],
            "depths": [hooks.depth_of(name, n_down) for name, _, _ in specs], "kinds": [kind for _, kind, _ in specs],
            "capabilities": sorted(UNetAdapter.capabilities),
            "modules": [name for name, _, _ in hooks.module_specs(unet)],
            "blocks": [{"name": name, "kind": kind, "type": type(mod).__name__,
                        "cross_attention": bool(getattr(mod, "has_cross_attention", False))} for name, kind, mod in specs],
            "sample_size": unet.config.sample_size, "in_channels": unet.config.in_channels,
            "time_conditioned": True, "pipeline": type(pipe).__name__,
            "parameters": sum(p.numel() for p in unet.parameters()),
        }

    @staticmethod
    def facts(config) -> dict[str, Any]:
        """``info`` of the pipeline ``config`` names, without its weights: a shipped or local
        pipeline folder's UNet is built from its unet/config.json, a synthetic model from its
        spec, on the meta device (no memory, no weights read). A hub id loads as ``generate``
        loads it (its own refusals included: offline and not cached, the same line)."""
        checkpoint = config.model.checkpoint
        folder = shipped_checkpoint(SHIPPED[checkpoint]) if checkpoint in SHIPPED else Path(checkpoint).expanduser()
        if checkpoint in SYNTHETIC:  # built from its spec on the meta device: shapes only
            with quiet_loading(), torch.device("meta"):
                return UNetAdapter.info(build(checkpoint))
        if not folder.is_dir():
            if folder.exists() or checkpoint.startswith((".", "/", "~")):
                raise ModelLoadError(f"{checkpoint}: no such model folder")
            return UNetAdapter.info(UNetAdapter.load(config))
        index, unet_config = folder / "model_index.json", folder / "unet" / "config.json"
        if not index.is_file():
            raise ModelLoadError(f"{checkpoint}: not a diffusers pipeline folder (no model_index.json)")
        try:
            cls_name = json.loads(index.read_text()).get("_class_name")
            with quiet_loading(), torch.device("meta"):
                unet = UNet2DConditionModel.from_config(UNet2DConditionModel.load_config(str(folder), subfolder="unet"))
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise ModelLoadError(f"{unet_config}: could not read the UNet's config ({_first_line(exc)})") from None
        info = UNetAdapter.info(types.SimpleNamespace(unet=unet))
        info["pipeline"] = cls_name
        return info

    @staticmethod
    def load(config):
        return load_for_config(
            config, SOURCE, accepts=UNetAdapter.accepts, lacks="UNet2DConditionModel (.unet)",
            size_factor=unet_downsampling, factor_is="the model's downsampling",
            negative_refused="the digits model's unconditional branch is the empty prompt")

    @staticmethod
    def run(pipe, config, seed: int, progress: bool = True, **extra) -> UNetOutput:
        return run_pipeline(pipe, config, seed, progress, extra, adapter="unet",
                            labelled=type(pipe).__name__ == "DigitsPipeline")

    @staticmethod
    def reference_run(pipe, config, seed: int) -> None:
        """No noise floor for images: PSNR and SSIM against the baseline say it all."""
        return None

    @staticmethod
    def write(outputs: list[UNetOutput], out: str | None) -> str:
        """Write every image of ``outputs`` into one PNG grid (via ``out.partial``, then renamed)."""
        if out is None:
            raise DiffaccelError("the unet adapter writes a PNG grid: pass --out FILE.png")
        images = torch.cat([o.images for o in outputs])
        cols = max(1, min(outputs[0].grid_columns, len(images)))
        scale = outputs[0].grid_scale
        B, C, H, W = images.shape
        rows = -(-B // cols)
        grid = torch.ones(C, rows * H, cols * W)
        for i, img in enumerate(images):
            r, c = divmod(i, cols)
            grid[:, r * H:(r + 1) * H, c * W:(c + 1) * W] = img
        arr = (grid.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
        pic = Image.fromarray(arr[..., 0] if C == 1 else arr[..., :3])  # L or RGB
        if scale > 1:
            pic = pic.resize((pic.width * scale, pic.height * scale), Image.NEAREST)
        path = Path(out)
        tmp = path.with_name(path.name + ".partial")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        pic.save(tmp, format="PNG")
        tmp.replace(path)  # never leave a half-written file under the final name
        return str(path)

    @staticmethod
    def write_item(output: UNetOutput, out_dir: Path, stem: str) -> dict[str, Any]:
        """``generate --prompts``: one item's image as ``out_dir/stem.png`` at its native size (via a
        temporary name, then renamed); its fields of results.jsonl."""
        img = output.images[0]
        arr = (img.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
        pic = Image.fromarray(arr[..., 0] if img.shape[0] == 1 else arr[..., :3])
        path = Path(out_dir) / f"{stem}.png"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
        pic.save(tmp, format="PNG")
        os.replace(tmp, path)
        return {"image": path.name}

    @staticmethod
    def quality_keys(config) -> list[str]:
        """What ``quality`` reports (``ReportsQuality``): PSNR and SSIM against the baseline, and
        for the shipped digits models the conditioning accuracy."""
        return ["psnr", "psnr_min", "ssim", *(["cond_acc"] if config.model.checkpoint in ("digits", "dit-digits") else [])]

    @staticmethod
    def quality(baseline: list[UNetOutput], outputs: list[UNetOutput], references: list[UNetOutput] | None = None) -> dict[str, float]:
        """Mean per-image PSNR (dB) and SSIM against the unaccelerated ``baseline`` of the same seeds;
        for digits, the conditioning accuracy of ``outputs``."""
        return UNetAdapter.quality_of_parts(UNetAdapter.quality_parts(baseline, outputs, references))

    @staticmethod
    def quality_parts(baseline: list[UNetOutput], outputs: list[UNetOutput], references: list[UNetOutput] | None = None) -> list[dict]:
        """Per seed (``PoolsQuality``): its images' PSNR and SSIM against the baseline's, and with
        labels the classifier's predictions (per image, so the same as on all images at once)."""
        labelled = all(o.labels is not None for o in outputs) and any(y is not None for o in outputs for y in o.labels)
        return [{"psnr": psnr_per_image(o.images, b.images), "ssim": ssim_per_image(o.images, b.images),
                 "pred": classify(o.images) if labelled else None, "labels": o.labels}
                for b, o in zip(baseline, outputs)]

    @staticmethod
    def quality_of_parts(parts: list[dict]) -> dict[str, float]:
        p = [x for part in parts for x in part["psnr"]]
        s = [x for part in parts for x in part["ssim"]]
        q = {"psnr": sum(p) / len(p), "psnr_min": min(p), "ssim": sum(s) / len(s)}
        if all(part["pred"] is not None for part in parts):
            pred = [y for part in parts for y in part["pred"]]
            q["cond_acc"] = class_accuracy(pred, [y for part in parts for y in part["labels"]])["overall"]
        return q

    # -- peers ------------------------------------------------------------------------------------
    peer_run_config = staticmethod(diffusers_peers.run_config)
    solver_peers = staticmethod(diffusers_peers.solver_peers)
    variant_peer = staticmethod(diffusers_peers.variant_peer)

    @staticmethod
    def peer_name(entry) -> str:
        c = entry.config
        if isinstance(c, StepsPeer):
            return diffusers_peers.peer_name(c)
        if c.name:
            return c.name
        return f"deepcache-i{c.cache_interval}" + (f"-b{c.cache_branch_id}" if c.cache_branch_id else "")

    @staticmethod
    @contextmanager
    def peer_context(pipe, peer):
        """Apply a peer accelerator (a ``DeepCachePeer``, or a ``StepsPeer``'s scheduler) to ``pipe`` for a ``with`` block."""
        if isinstance(peer, StepsPeer):
            with diffusers_peers.steps_context(pipe, peer):
                yield pipe
            return
        if not isinstance(peer, DeepCachePeer):
            raise DiffaccelError(f"unet adapter: unknown peer {type(peer).__name__}")
        try:
            from DeepCache import DeepCacheSDHelper  # optional: the deepcache extra
        except ImportError:
            raise DiffaccelError("[[peer]] use = \"deepcache\" needs DeepCache: pip install 'diffaccel[deepcache]' "
                                 "(or pip install --no-deps deepcache==0.1.1)") from None
        branches = 3 * len(pipe.unet.down_blocks)
        if peer.cache_branch_id >= branches:
            raise DiffaccelError(f"[[peer]] deepcache: cache_branch_id {peer.cache_branch_id} is beyond this UNet's "
                                 f"{branches} branches (0 to {branches - 1})")
        if hooks.session_of(pipe) is not None:
            raise DiffaccelError("a peer runs on the bare pipeline: leave diffaccel.apply first")
        helper = DeepCacheSDHelper(pipe=pipe)
        helper.set_params(cache_interval=peer.cache_interval, cache_branch_id=peer.cache_branch_id)
        helper.enable()
        try:
            yield pipe
        finally:
            helper.disable()
            # DeepCache puts the originals back as instance attributes (bound methods): drop those
            for mod in [pipe.unet, *pipe.unet.modules()]:
                fwd = mod.__dict__.get("forward")
                if fwd is not None and getattr(fwd, "__self__", None) is mod and getattr(fwd, "__func__", None) is type(mod).forward:
                    del mod.__dict__["forward"]
