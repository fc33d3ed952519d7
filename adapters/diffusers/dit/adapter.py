"""The DiT adapter: drives diffusers pipelines whose denoiser is a diffusion transformer (``.transformer``).

Checkpoints (``[model] checkpoint``):

* ``dit-digits``: the shipped class-conditional digits DiT (``TextDiTPipeline`` around a
  ``PooledTextPixArtTransformer2DModel``, PixArt with the prompt also in its adaLN embedding, 32x32 grey, prompts ``"digit 7"`` or ``"7"``), trained by
  ``python -m diffaccel.adapters.diffusers.dit.digits train``;
* ``synthetic-dit-medium`` / ``synthetic-dit-tiny``: PixArt-like pipelines with seeded random
  weights, built offline (``synthetic.py``);
* a local folder saved by ``save_pretrained`` (a ``TextDiTPipeline``, or any diffusers pipeline
  with a ``.transformer``: PixArt-alpha/sigma, Stable Diffusion 3 ...), or a hub id, loaded with
  ``DiffusionPipeline.from_pretrained``.

Peers (``[[peer]]``): diffusers' own cache hooks (``peers.py``); ``steps``, the same pipeline at
fewer steps or under another scheduler (``diffaccel.adapters.diffusers.peers``).
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import DiffusionPipeline

from .. import peers as diffusers_peers
from ..pipelines import load_for_config, run_pipeline
from ..unet.adapter import UNetAdapter, UNetOutput
from ..unet.options import StepsPeer
from . import hooks, peers
from .loading import SOURCE, load_checkpoint  # noqa: F401 - load_checkpoint: importable from here as before
from .options import DiTOptions, DiTSpec  # noqa: F401 - DiTOptions importable from here as before


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
    output_suffix = DiTSpec.output_suffix
    Options = DiTSpec.Options
    capabilities = hooks.CAPABILITIES
    PEERS = {**peers.PEERS, "steps": StepsPeer}
    layer_types = (hooks.DiTBlock,)

    @staticmethod
    def accepts(pipe: Any) -> bool:
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
        return load_for_config(
            config, SOURCE, accepts=DiTAdapter.accepts, lacks="diffusion transformer (.transformer with transformer_blocks)",
            size_factor=patch_factor, factor_is="the model's patch size times its VAE downsampling",
            negative_refused="this pipeline's unconditional branch is the empty prompt")

    @staticmethod
    def run(pipe, config, seed: int, progress: bool = True, **extra) -> UNetOutput:
        return run_pipeline(pipe, config, seed, progress, extra, adapter="dit", labelled=is_digits(pipe))

    reference_run = UNetAdapter.reference_run
    write = UNetAdapter.write
    quality = UNetAdapter.quality
    quality_parts = UNetAdapter.quality_parts
    quality_of_parts = UNetAdapter.quality_of_parts
    quality_keys = UNetAdapter.quality_keys

    # -- peers: diffusers' cache hooks, fewer steps and other solvers (``steps``) ------------------
    peer_run_config = staticmethod(diffusers_peers.run_config)
    solver_peers = staticmethod(diffusers_peers.solver_peers)
    variant_peer = staticmethod(diffusers_peers.variant_peer)

    @staticmethod
    def peer_name(entry) -> str:
        if isinstance(entry.config, StepsPeer):
            return diffusers_peers.peer_name(entry.config)
        return peers.peer_name(entry.config)

    @staticmethod
    def peer_context(pipe, peer):
        if isinstance(peer, StepsPeer):
            return diffusers_peers.steps_context(pipe, peer)
        return peers.peer_context(pipe, peer, hooks.session_of)
