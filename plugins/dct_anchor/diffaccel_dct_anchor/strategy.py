"""The ``dct-anchor`` strategy: reuse UNet blocks while a low-frequency DCT band holds still.

Before a listed block runs, the strategy compares the low-band DCT-II coefficients of a signal
now with those at the step the block was last computed (``signal``): ``x0``, the denoised
estimate of the last step (default); ``input``, the block's own input maps (``hidden_states``
and the skip samples it consumes); ``output``, the block's output, extrapolated from its last two
computations. Below ``threshold`` in every batch row, the block is *anchored*: the adapter's
cached output is returned and the block does not run. Everything used is known before the block
runs, so skipping saves its cost. Otherwise the strategy returns None and the block is computed
by the next strategy or the default.

With ``signal = "input"`` anchors cascade: a block fed by an anchored block gets the very tensors
of its cached step (recognised by identity, no DCT needed). The last up block is never served
whole (that would freeze the model's output): when anchored it runs its last ``tail_layers``
layers on the cached features entering them and the fresh skip samples (the layer's ``block-tail``
methods: ``tail_start``, ``capture_tail``, ``can_run_tail``, ``run_tail``).

Guards: ``warmup`` first steps and ``final_full`` last steps in full; a block reused
``max_reuse`` times in a row is recomputed. A block runs on the whole batch, so it is anchored
only when every row's change is below the threshold; the references keep their batch dimension.
State lives in ``run.state`` (one per guidance branch, fresh for every generation).
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from diffaccel import hookimpl
from diffaccel.contract.capabilities import BLOCK_STACK, IMAGE_STEPS, SPATIAL_FEATURES, describe, missing
from diffaccel.contract.errors import DiffaccelError
from diffaccel.kit.extrapolate import extrapolated, keep

from .config import DCTAnchorConfig, check_against_model, last_up
from .dct import CRITERIA, CRITERION_POWER, low_band
from .plot import plot_decisions

# one character per step and block in the decision trace
WARMUP, COMPUTED, REUSED, REFRESH, FINAL, NOT_ASKED = "W", "C", "R", "M", "F", "-"


@attrs.define(eq=False)
class BlockState:
    """One block's anchor state in one guidance branch."""

    inputs: list[torch.Tensor] | None = None
    """The input maps at the cached step (the same objects: no copy is kept)."""
    low: torch.Tensor | None = None
    """Their low-band DCT coefficients (B, C, band, band), concatenated over the maps."""
    reused: int = 0
    """Consecutive reuses since the block was last computed."""
    tail_h: torch.Tensor | None = None
    """Last up block: the features entering its tail layers at the cached step."""
    x0_ref: torch.Tensor | None = None
    """signal = "x0": the low band of the denoised estimate the block's cached output was computed from."""
    step: int | None = None
    """The step the block was last computed at (None: not yet)."""
    out_low: torch.Tensor | None = None
    """signal = "output": the low band of the block's output at the cached step."""
    rate: torch.Tensor | None = None
    """signal = "output": per row, the output's relative low-band change per step (to the power of the criterion) between its last two computations."""
    kept: list[tuple[int, Any]] = attrs.Factory(list)
    """extrapolate: (step, what the block kept) at its last two computations, oldest first."""


@attrs.define(eq=False)
class DCTState:
    """dct-anchor's state for one generation and guidance branch."""

    blocks: dict[str, BlockState]
    """Per anchored block, its state."""
    record: dict[str, dict[str, list[Any]]]
    """Per block, the decision (a character) and the measured change at each step."""
    x0_low: torch.Tensor | None = None
    """signal = "x0": the low band of the last step's denoised estimate."""
    memo: tuple[Any, Any, float] | None = None
    """(current, reference, change) measured once per step for blocks sharing a reference."""


NEEDS = (BLOCK_STACK, (SPATIAL_FEATURES, IMAGE_STEPS))
"""What dct-anchor needs of a model (its ``requires``): a block stack, and image steps (the
denoised estimate that signal x0 reads); signals input and output also need feature maps
(``spatial-features``), the last up block ``block-tail`` (checked in ``check_against_model``)."""


def predicted_change(bs: "BlockState", step: int, power: int) -> float | None:
    """signal = "output": the change of the block's output since its cached step, extrapolated from
    the rate measured between its last two computations (largest over rows)."""
    if bs.rate is None or bs.step is None:
        return None
    return float((bs.rate * float(step - bs.step) ** power).max())


def decide(step: int, num_steps: int, has_ref: bool, reused: int, change: float | None, c: DCTAnchorConfig) -> str:
    """The decision for one block at one step (a character of the trace), guards first."""
    if step < c.warmup:
        return WARMUP
    if num_steps and step >= num_steps - c.final_full:
        return FINAL
    if not has_ref or change is None:
        return COMPUTED
    if reused >= c.max_reuse:
        return REFRESH
    return REUSED if change < c.threshold else COMPUTED


def block_inputs(layer, hidden: dict[str, Any], tail_layers: int, is_last_up: bool) -> list[torch.Tensor]:
    """The maps a block's decision looks at: its ``hidden_states``, and for up blocks the skip
    samples it consumes (for the last up block only those of the layers that would be skipped)."""
    x = hidden.get("hidden_states")
    maps = [x] if isinstance(x, torch.Tensor) else []
    res = hidden.get("res_hidden_states_tuple")
    if res:
        maps += list(res[tail_layers:] if is_last_up else res)
    return maps


class DCTAnchor:
    """Strategy instance; one per ``[[strategy]]`` table, reused across runs (state lives in the run)."""

    name = "dct-anchor"  # the core overwrites it from the config; set here for instances built by hand

    def __init__(self, config: DCTAnchorConfig | None = None):
        self.config = config or DCTAnchorConfig()
        self._measure = CRITERIA[self.config.criterion]
        self._power = CRITERION_POWER[self.config.criterion]
        self._signal = self.config.signal
        self._blocks: frozenset[str] = frozenset()
        self._last_up: str | None = None
        self._order: list[str] = []

    # -- set-up --------------------------------------------------------------------------------------
    @hookimpl
    def diffaccel_setup(self, info: dict[str, Any]) -> None:
        """Reject block names, band and models that do not fit (ConfigValueError)."""
        check_against_model(self.config, info)
        layers = list(info.get("layers") or [])
        kinds = info.get("kinds")
        names = self.config.block_list(layers, kinds)
        self._blocks = frozenset(names)
        self._order = [n for n in layers if n in self._blocks]  # forward order, for the records and the plot
        self._last_up = last_up(layers, kinds)

    @hookimpl
    def diffaccel_new_state(self, run) -> "DCTState":
        steps = run.num_steps
        return DCTState(blocks={n: BlockState() for n in self._blocks},
                        record={n: {"decisions": [NOT_ASKED] * steps, "change": [None] * steps} for n in self._order})

    # -- hooks ---------------------------------------------------------------------------------------
    @hookimpl
    def diffaccel_run_start(self, run) -> None:
        lacking = missing(NEEDS, run.capabilities)
        if lacking:
            raise DiffaccelError(f"dct-anchor: key 'use': this model lacks capability {describe(lacking[0])}")
        self.diffaccel_setup(run.info.as_dict())  # instances given to apply(strategies=...) never went through build_strategies
        run.metrics[self.name] = {"branches": {}}

    @hookimpl
    def diffaccel_layer_output(self, run, layer, hidden):
        if layer.name not in self._blocks:
            return None
        c = self.config
        st = run.state(self)
        bs: BlockState = st.blocks[layer.name]
        is_last_up = layer.name == self._last_up
        start = self._tail_start(layer) if is_last_up else 0
        step = run.step
        low = None
        if self._signal == "x0":
            change = self._x0_change(bs, st.x0_low, st)
        elif self._signal == "input":
            maps = block_inputs(layer, hidden, c.tail_layers, is_last_up)
            low, change = self._change(bs, maps)
        else:
            change = predicted_change(bs, step, self._power)
        d = decide(step, run.num_steps, bs.step is not None, bs.reused, change, c)
        rec = st.record[layer.name]
        if 0 <= step < len(rec["decisions"]):
            rec["decisions"][step] = d
            rec["change"][step] = change
        if d == REUSED:
            out = self._reuse(run, layer, hidden, bs, start, is_last_up)
            if out is not None:
                bs.reused += 1
                run.tally.cache_hits()
                return out
            if 0 <= step < len(rec["decisions"]):
                rec["decisions"][step] = COMPUTED  # nothing cached in this branch yet
        # not anchored: this step becomes the reference
        computed_at = bs.step
        if self._signal == "input":
            bs.inputs, bs.low = maps, low if low is not None else self._low(maps)
        elif self._signal == "x0":
            bs.x0_ref = st.x0_low
        bs.step, bs.reused = step, 0
        if is_last_up:  # computed here, to keep the features entering its tail
            with layer.capture_tail(hidden, start) as got:
                out = layer.compute(hidden)
            bs.tail_h = got.get("h")
            if self._signal == "output":
                self._update_rate(bs, bs.tail_h, step, computed_at)
            return out
        if self._signal == "output" or c.extrapolate:  # the output is needed: computed here
            out = layer.compute(hidden)
            if self._signal == "output":
                self._update_rate(bs, out[0] if isinstance(out, tuple) else out, step, computed_at)
            if c.extrapolate:
                bs.kept = keep(bs.kept, step, layer.kept)  # what compute() just stored
            return out
        return None  # not anchored: the next strategy in the config, or the default, computes the block

    @hookimpl
    def diffaccel_post_step(self, run, output) -> None:
        st = run.state(self)
        if self._signal == "x0":
            x0 = output.pred_original if output.pred_original is not None else output.latents
            st.x0_low = self._low([x0])
        # branch names are final here (unbatched guidance renames 'main' to 'uncond' during step 0)
        run.metrics[self.name]["branches"][run.branch] = st.record

    @hookimpl
    def diffaccel_finalize(self, run, final) -> None:
        m = run.metrics[self.name]
        c = self.config
        per_block: dict[str, dict[str, int]] = {}
        for rec in m["branches"].values():
            for name, r in rec.items():
                agg = per_block.setdefault(name, {"computed": 0, "reused": 0})
                agg["reused"] += sum(d == REUSED for d in r["decisions"])
                agg["computed"] += sum(d in (WARMUP, COMPUTED, REFRESH, FINAL) for d in r["decisions"])
        m.update(threshold=c.threshold, band=c.band, criterion=c.criterion, blocks=per_block,
                 tail_block=self._last_up if self._last_up in self._blocks else None, tail_layers=c.tail_layers)

    @hookimpl
    def diffaccel_run_end(self, run) -> None:
        for st in run.states(self).values():  # drop our tensors in every branch
            for bs in st.blocks.values():
                bs.inputs = bs.low = bs.tail_h = bs.out_low = bs.rate = bs.x0_ref = None
                bs.kept = []
            st.x0_low = st.memo = None

    @hookimpl
    def diffaccel_bench_quality(self, outputs: list[Any], seeds: list[int]) -> dict[str, float]:
        """``deep_steps``: steps per run (mean over runs and guidance branches) whose first anchor
        block was not served from the cache: how often the deep path was computed. Only on the
        entries that ran this strategy (the baseline computes it at every step)."""
        counts = [sum(d != REUSED for d in next(iter(rec.values()))["decisions"])
                  for out in outputs for rec in out.report.get("strategies", {}).get(self.name, {}).get("branches", {}).values()
                  if rec]
        return {"deep_steps": sum(counts) / len(counts)} if counts else {}

    @hookimpl
    def diffaccel_bench_plot(self, reports: list[dict[str, Any]], path) -> None:
        """Called by ``diffaccel bench --plots DIR``: the decisions and changes over the steps."""
        plot_decisions(reports, path, self.name, self.config.threshold)

    # -- helpers -------------------------------------------------------------------------------------
    def _low(self, maps: list[torch.Tensor]) -> torch.Tensor:
        try:
            return torch.cat([low_band(x, self.config.band) for x in maps], dim=1)
        except ValueError as exc:
            raise DiffaccelError(f"dct-anchor: key 'band': {exc}; use a smaller band") from None

    def _change(self, bs: BlockState, maps: list[torch.Tensor]) -> tuple[torch.Tensor | None, float | None]:
        """(low band of ``maps`` or None when not needed, largest per-row relative change or None)."""
        ref = bs.inputs
        if ref is None:
            return None, None
        if len(ref) == len(maps) and all(a is b for a, b in zip(ref, maps)):
            return None, 0.0  # the very tensors of the cached step: nothing changed
        low = self._low(maps)
        if low.shape != bs.low.shape:
            return low, None  # another batch or map size: compute
        return low, float(self._measure(low, bs.low).max())

    def _x0_change(self, bs: BlockState, cur: torch.Tensor | None, st: "DCTState | None" = None) -> float | None:
        ref = bs.x0_ref
        if cur is None or ref is None or cur.shape != ref.shape:
            return None
        if cur is ref:
            return 0.0
        memo = st.memo if st is not None else None
        if memo is not None and memo[0] is cur and memo[1] is ref:
            return memo[2]  # blocks computed at the same step share the reference: measured once per step
        value = float(self._measure(cur, ref).max())
        if st is not None:
            st.memo = (cur, ref, value)
        return value

    def _update_rate(self, bs: BlockState, feature: torch.Tensor, step: int, before: int | None) -> None:
        low = self._low([feature])
        if bs.out_low is not None and before is not None and step > before and low.shape == bs.out_low.shape:
            bs.rate = self._measure(low, bs.out_low) / float(step - before) ** self._power
        bs.out_low = low

    def _tail_start(self, layer) -> int:
        try:
            return layer.tail_start(self.config.tail_layers)
        except ValueError as exc:
            raise DiffaccelError(f"dct-anchor: key 'tail_layers': {exc}") from None

    def _reuse(self, run, layer, hidden, bs: BlockState, start: int, is_last_up: bool):
        """The anchored block's output without running it (the last up block: its tail only)."""
        if not is_last_up:
            if self.config.extrapolate and len(bs.kept) == 2:
                return layer.served(extrapolated(bs.kept, run.step), (), hidden)
            return layer.cached_output
        if bs.tail_h is None or not layer.can_run_tail(hidden):
            return None
        out = layer.run_tail(hidden, bs.tail_h, start)
        run.tally.computed_outside()  # the block ran, partly
        return out


__all__ = ["BlockState", "DCTAnchor", "DCTState", "block_inputs", "decide"]
