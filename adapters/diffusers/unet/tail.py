"""Run only the last layers of a UNet up block, on the cached features entering them.

Shared by the strategies that reuse the deep path of a UNet (``dct-anchor``, ``time-anchor``).

diffusers' ``UpBlock2D`` / ``CrossAttnUpBlock2D`` forward is a loop over layers ``i``: concatenate
the running features with the skip sample ``res_hidden_states_tuple[n-1-i]``, run
``resnets[i]`` (and ``attentions[i]``), then the upsamplers. In the last up block only the tail
layers see the shallowest skip samples (for the last layer: ``conv_in``'s output, fresh at every
step); the features entering the tail come from the deep path. Serving those from the cached
step and running the tail alone is DeepCache's shallow branch, decided here per step.

``capture_tail_input`` records the features entering layer ``start`` while the whole block runs
(a forward pre-hook on ``resnets[start]``, removed right after); ``run_tail`` runs layers
``start..n-1`` and the upsamplers. ``run_tail(block, hidden, h, 0)`` with ``h`` the block's input
equals the block's own forward (tested).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch


def n_layers(block: torch.nn.Module) -> int:
    return len(block.resnets)


def freeu_enabled(block: torch.nn.Module) -> bool:
    return bool(getattr(block, "s1", None) and getattr(block, "s2", None) and getattr(block, "b1", None) and getattr(block, "b2", None))


def tail_start(block: torch.nn.Module, tail_layers: int, name: str) -> int:
    """Index of the first of the block's last ``tail_layers`` layers; ValueError (naming the block
    ``name``) when it has fewer layers."""
    n = n_layers(block)
    if tail_layers > n:
        raise ValueError(f"{tail_layers} is more than the {n} layers of '{name}'; use 1 to {n}")
    return n - tail_layers


def can_run_tail(block: torch.nn.Module, hidden: dict[str, Any]) -> bool:
    """Whether ``run_tail`` can stand in for the block's forward on these arguments: not with
    positional extras it does not know, nor with FreeU's scaling of the skip samples."""
    return "*args" not in hidden and not freeu_enabled(block)


def skip_channels(block: torch.nn.Module, hidden: dict[str, Any], start: int) -> int:
    """Channels of the skip sample that layer ``start`` concatenates to the running features."""
    return hidden["res_hidden_states_tuple"][n_layers(block) - 1 - start].shape[1]


@contextmanager
def capture_tail_input(block: torch.nn.Module, start: int, res_channels: int, into: dict[str, Any]):
    """While the ``with`` body runs the whole block, store in ``into["h"]`` the running features
    entering layer ``start`` (the resnet's input without the ``res_channels`` skip channels)."""

    def pre_hook(_module, args, kwargs=None):
        x = args[0] if args else kwargs["input_tensor"]
        into["h"] = x[:, : x.shape[1] - res_channels]

    handle = block.resnets[start].register_forward_pre_hook(pre_hook)
    try:
        yield into
    finally:
        handle.remove()


def run_tail(block: torch.nn.Module, hidden: dict[str, Any], h: torch.Tensor, start: int) -> torch.Tensor:
    """Layers ``start..n-1`` of ``block`` and its upsamplers, from features ``h`` entering layer
    ``start``; the skip samples, temb and conditioning come from ``hidden`` (the block's arguments)."""
    res = hidden["res_hidden_states_tuple"]
    temb = hidden.get("temb")
    n = len(block.resnets)
    attentions = getattr(block, "attentions", None)
    for i in range(start, n):
        h = block.resnets[i](torch.cat([h, res[n - 1 - i]], dim=1), temb)
        if attentions is not None:
            h = attentions[i](
                h,
                encoder_hidden_states=hidden.get("encoder_hidden_states"),
                cross_attention_kwargs=hidden.get("cross_attention_kwargs"),
                attention_mask=hidden.get("attention_mask"),
                encoder_attention_mask=hidden.get("encoder_attention_mask"),
                return_dict=False,
            )[0]
    if block.upsamplers is not None:
        for up in block.upsamplers:
            h = up(h, hidden.get("upsample_size"))
    return h
