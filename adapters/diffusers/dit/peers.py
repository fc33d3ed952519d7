"""diffusers' own cache hooks (``diffusers.hooks.apply_*``) as ``[[peer]]`` kinds of the DiT adapter.

Each peer table names one hook and its setting; ``bench`` runs it on the bare pipeline (no
diffaccel hooks), on the same prompts and seeds, as an entry named
``diffusers-<hook>-<setting>``. Transformers without ``enable_cache`` (PixArt, SD3) get the hook
through the ``apply_*`` function; the hooks that keep state per denoising call want a cache
context, which is set here around every transformer call as ``CacheMixin.cache_context`` does
(context ``call0`` for the first call of a step, ``call1`` for the second under unbatched
guidance). Hooks are applied afresh on entering the peer's ``with`` block (so no state leaks
from one generation to the next) and removed on leaving it.

Which apply to which transformer (diffusers 0.42.1, checked by ``tests/test_dit.py``): on
``PixArtTransformer2DModel``: first-block-cache, pyramid-attention-broadcast, taylorseer;
faster-cache raises IndexError on PixArt's batched guidance layout (reported, not offered).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import attrs
import torch
from diffusers import hooks as dh
from diffusers.hooks import HookRegistry
from diffusers.hooks.first_block_cache import _FBC_BLOCK_HOOK, _FBC_LEADER_BLOCK_HOOK
from diffusers.hooks.hooks import CacheContext, _set_cache_context
from diffusers.hooks.pyramid_attention_broadcast import _PYRAMID_ATTENTION_BROADCAST_HOOK
from diffusers.hooks.taylorseer_cache import _TAYLORSEER_CACHE_HOOK

from diffaccel.contract.errors import DiffaccelError
from diffaccel.contract.validators import in_range, non_negative, positive


@attrs.frozen(kw_only=True)
class FirstBlockCachePeer:
    """Keys of ``[[peer]] use = "diffusers-fbcache"``: diffusers' FirstBlockCache (``apply_first_block_cache``)."""

    threshold: float = attrs.field(default=0.05, validator=positive)
    """The rest of the blocks is skipped (their cached residual added) while the first block's output changes relatively less than this."""
    name: str | None = None
    """Entry name in bench (default: diffusers-fbcache-t<threshold>)."""


@attrs.frozen(kw_only=True)
class PyramidAttentionBroadcastPeer:
    """Keys of ``[[peer]] use = "diffusers-pab"``: diffusers' PyramidAttentionBroadcast (``apply_pyramid_attention_broadcast``)."""

    skip_range: int = attrs.field(default=2, validator=positive)
    """Self-attention is computed every this many calls inside the timestep window, its last output broadcast in between."""
    timestep_low: int = attrs.field(default=100, validator=non_negative)
    """Lower end of the timestep window where attention may be broadcast."""
    timestep_high: int = attrs.field(default=800, validator=non_negative)
    """Upper end of the timestep window."""
    cross_skip_range: int | None = attrs.field(default=None, validator=attrs.validators.optional(positive))
    """Cross-attention's skip range too (None: cross-attention always runs)."""
    name: str | None = None
    """Entry name in bench (default: diffusers-pab-s<skip_range>[-c<cross_skip_range>])."""


@attrs.frozen(kw_only=True)
class TaylorSeerPeer:
    """Keys of ``[[peer]] use = "diffusers-taylorseer"``: diffusers' TaylorSeer cache (``apply_taylorseer_cache``)."""

    cache_interval: int = attrs.field(default=5, validator=positive)
    """Full computation every this many steps; in between, block outputs are Taylor-extrapolated."""
    disable_cache_before_step: int = attrs.field(default=3, validator=non_negative)
    """The first steps all compute in full."""
    max_order: int = attrs.field(default=1, validator=in_range(0, 4))
    """Order of the Taylor expansion."""
    cache_identifiers: list[str] = attrs.Factory(lambda: list(TAYLORSEER_MODULES))
    """Regular expressions (``re.fullmatch``) of the module names whose outputs are extrapolated. The default
    covers PixArt's ``attn1``/``attn2``/``ff``; diffusers' own default (``^transformer_blocks.*attn``) matches
    no module of a ``BasicTransformerBlock`` (its attentions are ``attn1``, ``attn2``), so it would do nothing."""
    name: str | None = None
    """Entry name in bench (default: diffusers-taylorseer-i<interval>-o<order>)."""


TAYLORSEER_MODULES = (r"(?:single_)?transformer_blocks\.\d+\.(?:attn\d*|ff)",)
"""TaylorSeer's default modules here: every attention and feed-forward of every block."""

PEERS = {"diffusers-fbcache": FirstBlockCachePeer, "diffusers-pab": PyramidAttentionBroadcastPeer,
         "diffusers-taylorseer": TaylorSeerPeer}


def _num(x: float) -> str:
    return f"{x:g}"


def peer_name(config: Any) -> str:
    if config.name:
        return config.name
    if isinstance(config, FirstBlockCachePeer):
        return f"diffusers-fbcache-t{_num(config.threshold)}"
    if isinstance(config, PyramidAttentionBroadcastPeer):
        return f"diffusers-pab-s{config.skip_range}" + (f"-c{config.cross_skip_range}" if config.cross_skip_range else "")
    return f"diffusers-taylorseer-i{config.cache_interval}-o{config.max_order}"


def _hook_names(config: Any) -> tuple[str, ...]:
    if isinstance(config, FirstBlockCachePeer):
        return (_FBC_LEADER_BLOCK_HOOK, _FBC_BLOCK_HOOK)
    if isinstance(config, PyramidAttentionBroadcastPeer):
        return (_PYRAMID_ATTENTION_BROADCAST_HOOK,)
    return (_TAYLORSEER_CACHE_HOOK,)


class _Clock:
    """The transformer call in progress: its timestep and its index within the step."""

    def __init__(self):
        self.t: float | None = None
        self.calls = 0
        self.step = -1


def _apply(transformer, config: Any, clock: _Clock) -> None:
    if isinstance(config, FirstBlockCachePeer):
        dh.apply_first_block_cache(transformer, dh.FirstBlockCacheConfig(threshold=config.threshold))
    elif isinstance(config, PyramidAttentionBroadcastPeer):
        window = (config.timestep_low, config.timestep_high)
        dh.apply_pyramid_attention_broadcast(transformer, dh.PyramidAttentionBroadcastConfig(
            spatial_attention_block_skip_range=config.skip_range, spatial_attention_timestep_skip_range=window,
            cross_attention_block_skip_range=config.cross_skip_range, cross_attention_timestep_skip_range=window,
            current_timestep_callback=lambda: clock.t))
    else:
        dh.apply_taylorseer_cache(transformer, dh.TaylorSeerCacheConfig(
            cache_interval=config.cache_interval, disable_cache_before_step=config.disable_cache_before_step,
            max_order=config.max_order, taylor_factors_dtype=None,
            cache_identifiers=list(config.cache_identifiers)))


def _timestep(args: tuple, kwargs: dict) -> float | None:
    t = kwargs.get("timestep", args[2] if len(args) > 2 else None)
    if isinstance(t, torch.Tensor):
        return float(t.reshape(-1)[0]) if t.numel() else None
    return None if t is None else float(t)


@contextmanager
def peer_context(pipe, config: Any, session_of):
    """Apply the diffusers hook ``config`` names to ``pipe.transformer`` for a ``with`` block."""
    if type(config) not in PEERS.values():
        raise DiffaccelError(f"dit adapter: unknown peer {type(config).__name__}")
    if session_of(pipe) is not None:
        raise DiffaccelError("a peer runs on the bare pipeline: leave diffaccel.apply first")
    transformer = pipe.transformer
    clock = _Clock()
    try:
        _apply(transformer, config, clock)
    except Exception as exc:  # an incompatible transformer: one line naming the hook
        _remove(transformer, config)
        raise DiffaccelError(f"[[peer]] {peer_name(config)}: diffusers' hook does not attach to "
                             f"{type(transformer).__name__} ({type(exc).__name__}: {exc})") from None
    hooked = transformer.forward  # the registry's wrapper

    def forward(*args, **kwargs):
        t = _timestep(args, kwargs)
        if clock.t is not None and t is not None and t > clock.t:
            # the timestep rose: a new generation. Stateful hooks (TaylorSeer's expansions,
            # FirstBlockCache's residuals) start afresh, as CacheMixin transformers get from the
            # pipeline's maybe_free_model_hooks; PixArt and SD3 have no CacheMixin
            HookRegistry.check_if_exists_or_initialize(transformer).reset_stateful_hooks(recurse=True)
            clock.step = -1
        if t != clock.t or clock.step < 0:
            clock.t, clock.calls = t, 0
            clock.step += 1
        name = f"call{clock.calls}"
        clock.calls += 1
        _set_cache_context(transformer, CacheContext(name, step_index=clock.step, timestep=t))
        try:
            return hooked(*args, **kwargs)
        finally:
            _set_cache_context(transformer, None)

    transformer.forward = forward
    try:
        yield pipe
    finally:
        if transformer.__dict__.get("forward") is forward:
            transformer.forward = hooked
        _remove(transformer, config)


def _remove(transformer, config: Any) -> None:
    registry = HookRegistry.check_if_exists_or_initialize(transformer)
    for hook in _hook_names(config):
        registry.remove_hook(hook, recurse=True)
    invalidate = getattr(registry, "invalidate_child_registries_cache", None)
    if invalidate is not None:
        invalidate()
    # the registry may leave the originals as instance attributes (bound methods): drop those
    for mod in [transformer, *transformer.modules()]:
        fwd = mod.__dict__.get("forward")
        if fwd is not None and getattr(fwd, "__self__", None) is mod and getattr(fwd, "__func__", None) is type(mod).forward:
            del mod.__dict__["forward"]
