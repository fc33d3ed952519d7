"""time-anchor's policy for models with a ``block-stack``: skip the deep blocks once they settle.

Blocks are grouped by depth (``run.info.stack.depths``): a down block and its up counterpart share
depth d, the middle is deepest. At depth d, the up block's output (the middle's at the bottom) is
what the shallower computed blocks read. At each call, below the shallowest depth (from
``min_depth``) whose output block is anchored in every row (a block runs on the whole batch, both
batched guidance halves included), every block is skipped: the computed shallow blocks then read
one consistent set of deep features (DeepCache's layout, at an adaptive interval). A skipped block
returns ``layer.cached_output`` without running. With ``tail_layers`` (``block-tail``) the
outermost up block runs its last layers alone. Decisions are taken in ``pre_step`` from changes
seen at earlier steps.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from diffaccel.contract.errors import ConfigValueError
from diffaccel.kit.extrapolate import extrapolated, keep
from diffaccel.kit.hygiene import deliberate

from .cache import LatentCache
from .state import AnchorState, rel_change


@attrs.define(eq=False)
class BlockStackState(AnchorState):
    """The block policy's state for one generation and guidance branch."""

    skip: frozenset[str] = frozenset()
    """The blocks skipped at this call."""
    coords: dict[int, torch.Tensor] = attrs.Factory(dict)
    """Per block, the output coordinates sampled for the change test."""
    levels: list[tuple[int, list[int]]] = attrs.Factory(list)
    """Per depth from min_depth: (the block the shallower ones read, every block that deep or deeper)."""
    skipped: list[int] = attrs.Factory(list)
    """Calls skipped per block."""
    last_up: str | None = None
    """With tail_layers: the up block that runs its tail alone."""
    tail_h: torch.Tensor | None = None
    """The features entering its tail at its last full run."""
    tail_kept: list = attrs.Factory(list)
    """With extrapolate: (step, the features entering the tail) at its last two full runs."""
    tailed: int = 0
    kept: dict[int, list] = attrs.Factory(dict)
    """With extrapolate: per block, (step, what it kept) at its last two computations."""


class BlockPolicy:
    """The block-stack half of time-anchor; shares the strategy's config and gate."""

    def __init__(self, config, gate):
        self.config, self.gate = config, gate

    def new_state(self) -> BlockStackState:
        return BlockStackState()

    def run_start(self, run) -> None:
        pass

    def pre_step(self, st: BlockStackState, run):
        self._plan(st, run)
        return None

    def post_step(self, st: BlockStackState, run, output) -> None:
        pass

    def finish(self, st: BlockStackState) -> None:
        st.kept, st.tail_kept = {}, []  # the kept values are not needed after the run

    def add_metrics(self, m: dict[str, Any], states: list[BlockStackState], run) -> None:
        m["skipped_per_block"] = [sum(s.skipped[j] for s in states if s.skipped) for j in range(len(m["layers"]))]
        m["tail_only"] = sum(s.tailed for s in states)  # calls where the last up block ran its tail alone

    def _init(self, st: BlockStackState, run, rows: int, device, dtype: torch.dtype = torch.float32) -> None:
        cfg = self.config
        names, depth, kinds = run.info.layers, run.info.stack.depths, run.info.stack.kinds
        L = len(names)
        # depth d (from min_depth): the block whose output the shallower computed blocks read
        # (up block of depth d; the middle at the bottom) and every block of depth >= d below it
        outputs = {depth[j]: j for j in range(L) if kinds[j] != "down"}
        st.levels = [(outputs[d], [j for j in range(L) if depth[j] >= d]) for d in sorted(outputs) if d >= cfg.min_depth]
        st.keys = torch.arange(rows * L, device=device).view(rows, L)
        st.cache = LatentCache(rows * L, cfg.sketch, 1, max_entries=cfg.max_entries, max_bytes=cfg.max_bytes,
                               max_age=cfg.max_age, fp16=cfg.fp16, device=device, dtype=dtype)
        st.anchored = torch.zeros(L, run.num_steps, device=device)
        st.skipped = [0] * L
        st.tailed = 0
        ups = [n for n, k in zip(names, kinds) if k == "up"]
        st.last_up = ups[-1] if cfg.tail_layers and ups else None
        if self.gate is not None:
            st.gate_open = (self.gate.probs(run.num_steps) > cfg.gate_threshold).to(device)

    def _plan(self, st: BlockStackState, run) -> None:
        """Choose the blocks to skip at this call: below the shallowest depth whose output block
        is anchored in every row (and both batched guidance halves), everything."""
        st.skip = frozenset()
        if st.cache is None or run.step < self.config.warmup:
            return
        live = st.cache.live(st.keys, run.step)  # (rows, blocks)
        st.anchored[:, run.step] = live.float().mean(0)
        ok = live.all(0).tolist()
        names = run.info.layers
        for out_block, below in st.levels:
            if ok[out_block]:
                st.skip = frozenset(names[j] for j in below)
                return

    def layer_output(self, st: BlockStackState, run, layer, hidden):
        if st.cache is not None and run.step >= self.config.warmup:
            st.lookups += st.keys.shape[0]
            if layer.name in st.skip:
                if layer.name == st.last_up:
                    out = self._tail(st, run, layer, hidden)
                    if out is not None:
                        return out
                else:
                    kept = st.kept.get(layer.index, ())
                    if self.config.extrapolate and len(kept) == 2:
                        cached = layer.served(extrapolated(kept, run.step), (), hidden)
                    else:
                        cached = layer.cached_output
                    if cached is not None:
                        st.hits += st.keys.shape[0]
                        st.skipped[layer.index] += 1
                        return cached  # the block does not run
        if st.cache is not None and layer.name == st.last_up:
            # computed in full: keep the features entering its tail for the steps that run the tail only
            start = self._tail_start(layer)
            with layer.capture_tail(hidden, start) as got:
                out = layer.compute(hidden)
            st.tail_h = got.get("h")
            if self.config.extrapolate and st.tail_h is not None:
                st.tail_kept = keep(st.tail_kept, run.step, st.tail_h)
        else:
            out = layer.compute(hidden)
            if self.config.extrapolate:
                st.kept[layer.index] = keep(st.kept.get(layer.index, []), run.step, layer.kept)  # stored by compute()
        main = out[0] if isinstance(out, tuple) else out
        if st.cache is None:
            self._init(st, run, main.shape[0], main.device, main.dtype)
        self._record(st, layer.index, run.step, main)
        return out

    def _tail_start(self, layer) -> int:
        try:
            return layer.tail_start(self.config.tail_layers)
        except ValueError as exc:
            raise ConfigValueError("tail_layers", str(exc)) from None

    def _tail(self, st: BlockStackState, run, layer, hidden):
        """The last up block at an anchored outermost depth: its tail layers only, on the features
        that entered them at its last full run (None when there are none: it is computed)."""
        if st.tail_h is None or not layer.can_run_tail(hidden):
            return None
        # extrapolated no further than the span of its last two full runs (kit.extrapolate's reach)
        h = extrapolated(st.tail_kept, run.step, reach=1.0) if len(st.tail_kept) == 2 else st.tail_h
        out = layer.run_tail(hidden, h, self._tail_start(layer))
        st.hits += st.keys.shape[0]
        st.tailed += 1
        run.tally.computed_outside()  # the block ran, partly; its entry is not rewritten (the deep path was not)
        return out

    def _record(self, st: BlockStackState, j: int, step: int, main: torch.Tensor) -> None:
        flat = main.reshape(main.shape[0], -1)
        coords = st.coords.get(j)
        if coords is None:
            g = torch.Generator().manual_seed(7919 + j)
            n = min(flat.shape[1], self.config.sketch)
            with deliberate("sketch coordinates: drawn once per block and run from a CPU generator, the same on every device"):
                coords = st.coords[j] = torch.randperm(flat.shape[1], generator=g)[:n].sort().values.to(flat.device)
        sk = flat.new_zeros(flat.shape[0], self.config.sketch)  # in the model's dtype, like the cache
        sk[:, : coords.numel()] = flat[:, coords]
        keys = st.keys[:, j]
        cache = st.cache
        ref, has = cache.read(keys)
        if st.gate_open is not None:
            anchored = st.gate_open[j, step].expand(keys.numel()).clone()
        else:
            rate = rel_change(sk, ref) / cache.age(keys, step).clamp(min=1)
            anchored = has & (rate < self.config.threshold)
        cache.write(keys, step, anchored)
        cache.store(keys, sk)
