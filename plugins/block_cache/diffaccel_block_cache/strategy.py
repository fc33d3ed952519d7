"""The ``block-cache`` strategy: Fast-dLLM's approximate dual cache (Wu et al. 2025, "Fast-dLLM:
Training-free Acceleration of Diffusion LLM by Enabling KV Cache and Parallel Decoding").

A bidirectional masked DLM sampled in semi-autoregressive blocks (``[model] block_size``) fills
one block at a time; the tokens outside the active block do not change until it is done, so their
keys and values change little while it fills. So each block's first step is a full pass (every
position, every layer: all keys and values refreshed), and the block's other steps compute only
the active block's positions, at every layer, their queries attending over the prefix's and the
suffix's keys and values as that full pass left them (the text adapter's partial computation:
``StepPlan.positions``; positions not computed are never run, and keep their cached keys, values
and logits). A step then costs about block_size / N of a full one plus the attention reads.

Unlike the masked sampler's exact ``prefix_cache`` (finished blocks attend among themselves only:
another attention pattern, exact for it), the attention pattern is the model's own; the
approximation is that the cached keys and values are those of the block's first step. ``refresh``
adds a full pass every so many steps within a block; ``mode = "prefix"`` recomputes the suffix at
every step too (Fast-dLLM's prefix cache: only the prefix is read from the cache).

Each row's active block is the block of its first masked position (blocks are filled in order),
so rows that leave their blocks at their own pace (``parallel``'s early commits) each get their
full pass when they enter a block; a row with nothing masked computes nothing. State is per run
with a leading batch dimension.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from diffaccel import hookimpl
from diffaccel.contract.capabilities import MASK_CONFIDENCES, TOKEN_POSITIONS
from diffaccel.contract.errors import ConfigError, ConfigValueError
from diffaccel.contract.state import StepPlan
from diffaccel.contract.validators import in_range, one_of

MODES = ("dual", "prefix")

NEEDS = (TOKEN_POSITIONS, MASK_CONFIDENCES)
"""What block-cache needs of a model: partial steps whose other positions serve cached keys and
values (``token-positions``), and an absorbing sampler whose tokens change only where committed
(``mask-confidences``): a bidirectional masked DLM. Continuous samplers, DiffusionGemma's block
sampler and image adapters do not offer both."""


@attrs.frozen(kw_only=True)
class BlockCacheConfig:
    """Keys of ``[[strategy]] use = "block-cache"``."""

    refresh: int = attrs.field(default=0, validator=in_range(0, None))
    """Within a block, a full pass every ``refresh`` steps (0: only at the block's first step; 1: every step, no cache)."""
    mode: str = attrs.field(default="dual", validator=one_of(MODES))
    """dual: the other steps compute the active block alone (prefix and suffix cached); prefix: the active block and everything after it (the prefix alone cached)."""


def active_blocks(masked: torch.Tensor, block_size: int) -> torch.Tensor:
    """(B,) long: each row's active block, the block of its first masked position; -1 where a
    row has nothing masked."""
    first = masked.int().argmax(1)  # the first True (0 where there is none)
    return torch.where(masked.any(1), torch.div(first, block_size, rounding_mode="floor"), -1)


def step_positions(blocks: torch.Tensor, full: torch.Tensor, block_size: int, length: int, mode: str) -> torch.Tensor:
    """(B, N) bool: what a step computes. A row in ``full`` computes every position; another row
    its active block (``dual``) or its active block and all after it (``prefix``); a row with no
    active block (-1) nothing."""
    pos = torch.arange(length, device=blocks.device)[None, :]
    lo = (blocks * block_size)[:, None]
    part = pos >= lo
    if mode == "dual":
        part &= pos < lo + block_size
    return (part & (blocks >= 0)[:, None]) | full[:, None]


@attrs.define(eq=False)
class BlockCacheState:
    """block-cache's state for one generation (tensors (B,) unless said)."""

    masked: torch.Tensor | None = None
    """(B, N) the positions still masked after the last step; None before the first."""
    blocks: torch.Tensor | None = None
    """Each row's active block at the last step (-1: none)."""
    since: torch.Tensor | None = None
    """Steps each row has run since its last full pass."""
    full_rows: int = 0
    """Row-steps computed in full (a block's first step, a refresh)."""
    cached_rows: int = 0
    """Row-steps computed on the active block (or the suffix too) from the cache."""
    computed: list[float] = attrs.Factory(list)
    """Per step, the share of the batch's positions the step asked for."""


class BlockCache:
    """Strategy instance; one per ``[[strategy]]`` table, reused across runs (state lives in the run)."""

    name = "block-cache"  # the core overwrites it from the config; set here for instances built by hand

    def __init__(self, config: BlockCacheConfig | None = None):
        self.config = config or BlockCacheConfig()

    @hookimpl
    def diffaccel_setup(self, info: dict[str, Any]) -> None:
        """Refuse a model or sampler the cache cannot serve (the adapter's facts; ``diffaccel check``
        gives the ``[model]`` options too, before any weights load)."""
        kind = info.get("kind")
        if kind is not None and kind != "masked":
            raise ConfigValueError("use", f"block-cache reads the keys and values of a bidirectional masked DLM; this model "
                                          f"is {kind}; use it with a masked model")
        if "block_size" in info:
            problem = blocks_problem(info.get("block_size"), info.get("length"), info.get("prefix_cache"))
            if problem:
                raise ConfigValueError(*problem)

    @hookimpl
    def diffaccel_new_state(self, run) -> BlockCacheState:
        return BlockCacheState()

    @hookimpl
    def diffaccel_run_start(self, run) -> None:
        # instances handed to apply(strategies=...) skip the config's checks
        lacking = [c for c in NEEDS if c not in run.capabilities]
        if lacking:
            raise ConfigError(f"strategy 'block-cache' needs a model with capability '{lacking[0]}'")
        problem = blocks_problem(run.info.tokens.block_size, run.info.tokens.length, False)
        if problem:
            raise ConfigError(f"strategy 'block-cache': [model] key '{problem[0]}': {problem[1]}")
        run.state(self)

    @hookimpl
    def diffaccel_pre_step(self, run) -> StepPlan | None:
        st, c = run.state(self), self.config
        if st.masked is None:
            return None  # the run's first step: a full pass
        bs = run.info.tokens.block_size
        blocks = active_blocks(st.masked, bs)
        live = blocks >= 0
        full = live & ((blocks != st.blocks) | (c.refresh > 0) & (st.since >= c.refresh))
        st.blocks = blocks
        st.since = torch.where(full, 1, st.since + 1)
        n_full, n_live = int(full.sum()), int(live.sum())
        st.full_rows += n_full
        st.cached_rows += n_live - n_full
        if n_full == blocks.numel():
            st.computed.append(1.0)
            return StepPlan()  # every row in full: the full path, no gathers
        positions = step_positions(blocks, full, bs, st.masked.shape[1], c.mode)
        st.computed.append(float(positions.float().mean()))
        return StepPlan(positions=positions)

    @hookimpl
    def diffaccel_post_step(self, run, output) -> None:
        st = run.state(self)
        if st.masked is None:  # the first step was a full pass in the block of each row's first generated position
            start = ~output.fixed if output.fixed is not None else torch.ones_like(output.masked)
            st.blocks = active_blocks(start, run.info.tokens.block_size)
            st.since = torch.ones_like(st.blocks)
            st.full_rows += int((st.blocks >= 0).sum())
            st.computed.append(1.0)
        st.masked = output.masked

    @hookimpl
    def diffaccel_finalize(self, run, final) -> None:
        st = run.state(self)
        steps = len(st.computed)
        run.metrics[self.name] = {
            "block_size": run.info.tokens.block_size, "refresh": self.config.refresh, "mode": self.config.mode,
            "full_row_steps": st.full_rows, "cached_row_steps": st.cached_rows,
            "mean_computed": sum(st.computed) / steps if steps else 1.0,
        }

    @hookimpl
    def diffaccel_run_end(self, run) -> None:
        st = run.state(self)
        st.masked = st.blocks = st.since = None


def blocks_problem(block_size: int | None, length: int | None, prefix_cache: bool | None) -> tuple[str, str] | None:
    """(key, message) when the sampler's blocks leave the cache nothing to do, else None. A last
    block shorter than the others is fine: the sampler fills it like the rest."""
    top = f"1 to {length - 1}" if length else "below length"
    if block_size is None or (length is not None and block_size >= length):
        shown = "not set" if block_size is None else f"{block_size}, not below length {length}"
        return "block_size", (f"[model] block_size is {shown}: block-cache needs the masked sampler's semi-autoregressive "
                              f"blocks (the cache holds the positions outside the active block); allowed: {top}")
    if prefix_cache:
        return "prefix_cache", ("block-cache reads the model's own attention from a cache; [model] prefix_cache changes "
                                "that attention (finished blocks among themselves): set one or the other")
    return None
