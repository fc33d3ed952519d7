"""The ``time-anchor`` strategy: skip the (layer, position) states that have settled.

After ``warmup`` full steps, each computed state is compared with its reference in the latent
cache (its output when last computed): if the relative change per step since then is below
``threshold`` (or, with a learned gate, if the layer's gate is open at this time), the entry is
written *anchored*. While an anchored entry is younger than ``max_age`` steps its state is not
computed:

* text: the layer runs on the other positions only (``layer.compute(hidden, positions=idx)``);
  anchored positions keep the adapter's in-place outputs and serve keys/values from its cache.
  A position whose input changed (its token was committed at the last step, within
  ``neighbors`` positions of one, or the layer below recomputed it and found it moved) is
  recomputed even when anchored, so a new token climbs the layers at once instead of waiting
  ``max_age`` steps. With the masked sampler, ``pre_step`` also narrows the whole step
  (``StepPlan.positions``) to the positions some layer must compute: the others are not
  embedded, and their logits are kept (the sampler draws them again from its cached cumulative
  distribution, without an exponential over the vocabulary). Another strategy's positions
  OR into that plan (the core's merge rule); each layer then computes the plan's positions that
  are not anchored in it.
* UNet: blocks are grouped by depth: ``down_blocks.d`` and its up counterpart share depth d,
  ``mid_block`` is deepest. At depth d, the up block's output (the mid block's at the bottom) is
  what the shallower computed blocks read. At each call, below the shallowest depth (from
  ``min_depth``) whose output block is anchored in every row (a block runs on the whole batch,
  both batched guidance halves included), every block is skipped: the computed shallow blocks
  then read one consistent set of deep features (DeepCache's layout, at an adaptive interval).
  A skipped block returns ``layer.cached_output`` without running. Decisions are taken in
  ``pre_step`` from changes seen at earlier steps.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch

from diffaccel import StepPlan, hookimpl
from diffaccel.adapters.text.positions import Positions
from diffaccel.adapters.unet import tail
from diffaccel.errors import ConfigValueError

from .cache import LatentCache
from .config import TimeAnchorConfig, load_clusters
from .gate import Gate

BRANCHES = ("main", "uncond", "cond")


def depth_of(name: str, n_down: int) -> int:
    """UNet block depth: down_blocks.d and up_blocks.(n_down-1-d) share depth d; mid_block is n_down."""
    m = re.fullmatch(r"(down|up)_blocks\.(\d+)", name)
    if m is None:
        return n_down
    i = int(m.group(2))
    return i if m.group(1) == "down" else n_down - 1 - i


class _State:
    """One generation, one guidance branch (``run.state``): the cache and what the metrics need."""

    def __init__(self):
        self.cache: LatentCache | None = None
        self.keys = self.ranks = None
        self.all_valid = False
        self.gate_open: torch.Tensor | None = None  # (L, steps) bool
        self.anchored: torch.Tensor | None = None  # (L, steps) share of states served
        self.hits = 0
        self.lookups = 0
        # text
        self.dirty: torch.Tensor | None = None  # (B, N) positions the layer below moved this step
        self.h0_ref: torch.Tensor | None = None
        self.input_moved: torch.Tensor | None = None  # (B, N) positions whose input embedding moved
        self.tokens: torch.Tensor | None = None  # masked sampler: the sequence after the last step
        self.token_moved: torch.Tensor | None = None  # positions committed at the last step, widened
        self.live: torch.Tensor | None = None  # (L, B, N) entries that may be served at this step
        self.planned = 0.0  # sum over narrowed steps of the share of positions planned
        self.planned_steps = 0
        self.served: list[tuple[int, torch.Tensor]] = []  # this step's (layer, served mask), counted at its last layer
        self.pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # this step's cache writes
        self.pending_step = -1  # the step they belong to
        # unet
        self.skip: frozenset[str] = frozenset()
        self.coords: dict[int, torch.Tensor] = {}
        self.levels: list[tuple[int, list[int]]] = []
        self.skipped: list[int] = []
        self.last_up: str | None = None  # with tail_layers: the up block that runs its tail alone
        self.tail_h: torch.Tensor | None = None  # the features entering its tail at its last full run
        self.tailed = 0


class TimeAnchor:
    name = "time-anchor"

    def __init__(self, config: TimeAnchorConfig):
        self.config = config
        self.gate = Gate.load(config.gate) if config.gate else None
        self.clusters = load_clusters(config.clusters) if config.clusters else None

    def setup(self, info: dict[str, Any]) -> None:
        if self.gate is not None:
            self.gate.check(info)
        if self.clusters is not None:
            if info.get("adapter") == "unet":
                raise ConfigValueError("clusters", "position clusters apply to text models; UNet blocks are keyed per row")
            max_len = info.get("max_len")
            if max_len is not None and len(self.clusters["assign"]) > max_len:
                raise ConfigValueError("clusters", f"the file assigns {len(self.clusters['assign'])} positions but the model has {max_len}")

    def new_state(self, run) -> _State:
        return _State()

    # -- hooks -------------------------------------------------------------------------------
    @hookimpl
    def diffaccel_run_start(self, run):
        if self.clusters is not None and run.adapter == "text":
            n, have = run.info.get("length", 0), len(self.clusters["assign"])
            if n > have:
                raise ConfigValueError("clusters", f"the file assigns {have} positions but the run generates {n}")

    @hookimpl
    def diffaccel_pre_step(self, run):
        if run.adapter == "unet":
            self._unet_plan(run.state(self), run)
            return None
        return self._text_plan(run.state(self), run)

    @hookimpl
    def diffaccel_post_step(self, run, output):
        if run.adapter == "text" and output.masked is not None:
            st = run.state(self)
            tokens = output.tokens
            if st.tokens is not None:
                st.token_moved = self._widen(tokens != st.tokens)
            else:  # the first input was [MASK] wherever the sequence is not fixed
                moved = ~output.masked if output.fixed is None else ~output.masked & ~output.fixed
                st.token_moved = self._widen(moved)
            st.tokens = tokens.clone()  # the sampler edits its sequence in place

    @hookimpl
    def diffaccel_layer_output(self, run, layer, hidden):
        if run.adapter == "text":
            return self._text_layer(run, layer, hidden)
        return self._unet_block(run, layer, hidden)

    @hookimpl
    def diffaccel_finalize(self, run, final):
        states = _branch_states(run, self)
        for st in states:
            if st.cache is not None and run.adapter == "text":
                self._end_text_step(st)
        if not states:
            return
        m = self.metrics(states, run)
        run.metrics[self.name] = m
        run.counters.cache_hits += m["hits"]

    # -- text --------------------------------------------------------------------------------
    def _init_text(self, st: _State, run, hidden: torch.Tensor) -> None:
        cfg = self.config
        B, N, D = hidden.shape
        L = run.info["n_layers"]
        dev = hidden.device
        pos = torch.arange(N, device=dev)
        if self.clusters is not None:
            slot = torch.tensor(self.clusters["assign"][:N], dtype=torch.long, device=dev)
            S = self.clusters["n_clusters"]
            # rank of each position inside its cluster: where its reference state sits in the entry
            same = slot[:, None] == slot[None, :]
            rank = (same & (pos[None, :] < pos[:, None])).sum(1)
            P = int(rank.max()) + 1
        else:
            S = math.ceil(N / cfg.stride)
            slot = torch.where(pos % cfg.stride == 0, pos // cfg.stride, torch.full_like(pos, -1))
            rank = torch.zeros_like(pos)
            P = 1
        rows = torch.arange(B, device=dev)[:, None]
        st.keys = torch.stack([torch.where(slot >= 0, (rows * L + i) * S + slot, -1) for i in range(L)])  # (L, B, N)
        st.ranks = rank
        st.all_valid = bool((slot >= 0).all())
        st.cache = LatentCache(B * L * S, D, P, max_entries=cfg.max_entries, max_bytes=cfg.max_bytes,
                               max_age=cfg.max_age, fp16=cfg.fp16, device=dev)
        st.anchored = torch.zeros(L, run.num_steps, device=dev)
        if self.gate is not None:
            st.gate_open = (self.gate.probs(run.num_steps) > cfg.gate_threshold).to(dev)

    def _widen(self, moved: torch.Tensor) -> torch.Tensor:
        """Add the ``neighbors`` positions on each side of every True position (B, N)."""
        r = self.config.neighbors
        if not r:
            return moved
        return torch.nn.functional.max_pool1d(moved[:, None].float(), 2 * r + 1, stride=1, padding=r)[:, 0] > 0

    def _text_plan(self, st: _State, run):
        """Which entries may be served at this step, for every layer at once; with the masked
        sampler, the step is narrowed to the positions some layer must compute (the others are
        anchored at every layer: not embedded, not run, their logits kept)."""
        st.live = None
        self._end_text_step(st)  # what a step whose last layer another strategy answered left
        if st.cache is None or run.step < self.config.warmup:
            return None
        live = st.cache.live(st.keys, run.step)  # (L, B, N)
        if st.token_moved is not None:
            live &= ~st.token_moved
        st.live = live
        if run.info.get("sampler") != "masked" or not self.config.narrow_step:
            return None  # continuous inputs move at every position: layer 0 tests them itself
        need = (~live).any(0)
        st.planned += need.float().mean()
        st.planned_steps += 1
        return StepPlan(positions=need)

    def _text_layer(self, run, layer, hidden: torch.Tensor) -> torch.Tensor:
        st = run.state(self)
        if st.cache is None:
            self._init_text(st, run, hidden)
        i, step = layer.index, run.step
        step_sel = layer.step_positions  # None: every position
        if i == 0:
            st.dirty = st.input_moved = self._input_moved(st, run, hidden)
        computed = step_sel
        if st.live is not None and layer.cached_output is not None:
            live = st.live[i]
            if st.dirty is not None:
                live &= ~st.dirty
            st.served.append((i, live))
            if bool(live.any()):
                computed = Positions(~live if step_sel is None else step_sel.mask() & ~live)
                out = layer.compute(hidden, positions=computed)
            else:  # nothing to serve: the plain path, exactly the default's
                out = layer.compute(hidden)
        else:
            out = layer.compute(hidden)  # the adapter narrows it to the step's positions itself
        self._record_text(st, i, step, out, computed)
        st.pending_step = step
        if i == run.info["n_layers"] - 1:
            self._end_text_step(st)
        return out

    def _end_text_step(self, st: _State) -> None:
        """After the last layer (or, if another strategy answered for it, at the next step's
        plan and at the end of the run): the step's statistics and cache writes, each in one go
        (per layer they were a fifth of the strategy's cost). Writes can wait: a layer reads only
        its own keys."""
        step = st.pending_step
        if st.served:
            layers = torch.tensor([i for i, _ in st.served], device=st.anchored.device)
            served = torch.stack([m for _, m in st.served])
            st.anchored[layers, step] = served.flatten(1).float().mean(1)
            st.hits += served.sum()
            st.lookups += served.numel()
            st.served.clear()
        if st.pending:
            keys, anchored, values = (torch.cat(t) for t in zip(*st.pending))
            st.pending.clear()
            if keys.numel():
                st.cache.put(keys, step, anchored, values)

    def _input_moved(self, st: _State, run, h0: torch.Tensor) -> torch.Tensor | None:
        """Positions whose input embedding moved by more than the threshold since the last step.
        With the masked sampler an input moves exactly where a token was committed, which
        ``post_step`` recorded already: no comparison of the embeddings is needed."""
        if run.info.get("sampler") == "masked":
            return st.token_moved
        prev, st.h0_ref = st.h0_ref, h0.clone()
        if prev is None:
            return None
        return self._widen(_rel_change(h0, prev) >= self.config.threshold)

    def _record_text(self, st: _State, i: int, step: int, out: torch.Tensor, computed: Positions | None) -> None:
        """Compare the computed states (``computed``, None: all) with their references, write
        the entries, mark movers."""
        cache = st.cache
        B, N, D = out.shape
        single = self.clusters is None  # one state per key: every rank is 0
        if computed is None:
            new, keys, ranks = out.reshape(B * N, D), st.keys[i].reshape(-1), 0 if single else st.ranks.repeat(B)
            flat = None
        else:
            flat = computed.flat
            new, keys = computed.gather(out), st.keys[i].reshape(-1).index_select(0, flat)
            ranks = 0 if single else st.ranks.index_select(0, computed.pos)
        new = new.float()
        ref, has = cache.read(keys, ranks)
        age = cache.age(keys, step).clamp(min=1)
        d2 = (new - ref).square_().sum(-1)
        r2 = ref.square().sum(-1).clamp_(min=1e-12)
        # per-position change: positions that moved make the layer above recompute them
        moved = ~has | (torch.sqrt(d2 / r2) / age >= self.config.threshold)
        dirty = moved.view(B, N) if flat is None else torch.zeros(B * N, dtype=torch.bool, device=out.device).index_put_((flat,), moved).view(B, N)
        # what the next layer must recompute: what moved here, and every position whose input
        # token moved this step (a committed token is seen by every layer at once)
        st.dirty = dirty if st.input_moved is None else dirty | st.input_moved
        if self.clusters is None:
            # one position per key: the per-position test is the key's test
            if st.all_valid:
                u, v, anchored = keys, new, ~moved
            else:
                valid = keys >= 0
                u, v, anchored = keys[valid], new[valid], ~moved[valid]
            if st.gate_open is not None:
                anchored = st.gate_open[i, step].expand(u.numel())
            st.pending.append((u, anchored, v))
            return
        valid = keys >= 0
        u, anchored = self._cluster_test(st, i, step, keys[valid], d2[valid], r2[valid], has[valid])
        if u.numel():
            cache.write(u, step, anchored)
            cache.store(keys, new, ranks)

    def _cluster_test(self, st: _State, i: int, step: int, flat, d2, r2, has):
        """A cluster key aggregates its computed positions: the relative change of the group."""
        cache, dev = st.cache, flat.device
        K = cache.n_keys
        touched = torch.zeros(K, dtype=torch.bool, device=dev)
        touched[flat] = True
        u = touched.nonzero().squeeze(1)
        if st.gate_open is not None:
            return u, st.gate_open[i, step].expand(u.numel())
        D2 = torch.zeros(K, device=dev).index_add_(0, flat, d2)
        R2 = torch.zeros(K, device=dev).index_add_(0, flat, r2)
        miss = torch.zeros(K, device=dev).index_add_(0, flat, (~has).float())
        rate = torch.sqrt(D2[u] / R2[u]) / cache.age(u, step).clamp(min=1)
        return u, (miss[u] == 0) & (rate < self.config.threshold)

    # -- unet --------------------------------------------------------------------------------
    def _init_unet(self, st: _State, run, rows: int, device) -> None:
        cfg = self.config
        names = run.info["layers"]
        L = len(names)
        n_down = sum(1 for n in names if n.startswith("down_blocks."))
        depth = [depth_of(n, n_down) for n in names]
        # depth d (from min_depth): the block whose output the shallower computed blocks read
        # (up block of depth d; mid_block at the bottom) and every block of depth >= d below it
        outputs = {depth[j]: j for j in range(L) if not names[j].startswith("down_blocks.")}
        st.levels = [(outputs[d], [j for j in range(L) if depth[j] >= d]) for d in sorted(outputs) if d >= cfg.min_depth]
        st.keys = torch.arange(rows * L, device=device).view(rows, L)
        st.cache = LatentCache(rows * L, cfg.sketch, 1, max_entries=cfg.max_entries, max_bytes=cfg.max_bytes,
                               max_age=cfg.max_age, fp16=cfg.fp16, device=device)
        st.anchored = torch.zeros(L, run.num_steps, device=device)
        st.skipped = [0] * L
        st.tailed = 0
        ups = [n for n in names if n.startswith("up_blocks.")]
        st.last_up = ups[-1] if cfg.tail_layers and ups else None
        if self.gate is not None:
            st.gate_open = (self.gate.probs(run.num_steps) > cfg.gate_threshold).to(device)

    def _unet_plan(self, st: _State, run) -> None:
        """Choose the blocks to skip at this call: below the shallowest depth whose output block
        is anchored in every row (and both batched guidance halves), everything."""
        st.skip = frozenset()
        if st.cache is None or run.step < self.config.warmup:
            return
        live = st.cache.live(st.keys, run.step)  # (rows, blocks)
        st.anchored[:, run.step] = live.float().mean(0)
        ok = live.all(0).tolist()
        names = run.info["layers"]
        for out_block, below in st.levels:
            if ok[out_block]:
                st.skip = frozenset(names[j] for j in below)
                return

    def _unet_block(self, run, layer, hidden):
        st = run.state(self)
        if st.cache is not None and run.step >= self.config.warmup:
            st.lookups += st.keys.shape[0]
            if layer.name in st.skip:
                if layer.name == st.last_up:
                    out = self._unet_tail(st, run, layer, hidden)
                    if out is not None:
                        return out
                else:
                    cached = layer.cached_output
                    if cached is not None:
                        st.hits += st.keys.shape[0]
                        st.skipped[layer.index] += 1
                        return cached  # the block does not run
        if st.cache is not None and layer.name == st.last_up:
            # computed in full: keep the features entering its tail for the steps that run the tail only
            start = self._tail_start(layer)
            with tail.capture_tail_input(layer.module, start, tail.skip_channels(layer.module, hidden, start), {}) as got:
                out = layer.compute(hidden)
            st.tail_h = got.get("h")
        else:
            out = layer.compute(hidden)
        main = out[0] if isinstance(out, tuple) else out
        if st.cache is None:
            self._init_unet(st, run, main.shape[0], main.device)
        self._record_unet(st, layer.index, run.step, main)
        return out

    def _tail_start(self, layer) -> int:
        try:
            return tail.tail_start(layer.module, self.config.tail_layers, layer.name)
        except ValueError as exc:
            raise ConfigValueError("tail_layers", str(exc)) from None

    def _unet_tail(self, st: _State, run, layer, hidden):
        """The last up block at an anchored outermost depth: its tail layers only, on the features
        that entered them at its last full run (None when there are none: it is computed)."""
        if st.tail_h is None or not tail.can_run_tail(layer.module, hidden):
            return None
        out = tail.run_tail(layer.module, hidden, st.tail_h, self._tail_start(layer))
        st.hits += st.keys.shape[0]
        st.tailed += 1
        c = run.counters  # the block ran, partly; its entry is not rewritten (the deep path was not)
        c.layers_computed += 1
        c.positions_computed += run.positions_per_layer
        return out

    def _record_unet(self, st: _State, j: int, step: int, main: torch.Tensor) -> None:
        flat = main.reshape(main.shape[0], -1)
        coords = st.coords.get(j)
        if coords is None:
            g = torch.Generator().manual_seed(7919 + j)
            n = min(flat.shape[1], self.config.sketch)
            coords = st.coords[j] = torch.randperm(flat.shape[1], generator=g)[:n].sort().values.to(flat.device)
        sk = torch.zeros(flat.shape[0], self.config.sketch, device=flat.device)
        sk[:, : coords.numel()] = flat[:, coords].float()
        keys = st.keys[:, j]
        cache = st.cache
        ref, has = cache.read(keys)
        if st.gate_open is not None:
            anchored = st.gate_open[j, step].expand(keys.numel()).clone()
        else:
            rate = _rel_change(sk, ref) / cache.age(keys, step).clamp(min=1)
            anchored = has & (rate < self.config.threshold)
        cache.write(keys, step, anchored)
        cache.store(keys, sk)

    # -- reporting ---------------------------------------------------------------------------
    def metrics(self, states: list[_State], run) -> dict[str, Any]:
        hits = sum(int(s.hits) for s in states)
        lookups = sum(s.lookups for s in states)
        per_step = torch.stack([s.anchored.float().cpu() for s in states if s.anchored is not None]).mean(0)
        stats = [s.cache.stats() for s in states if s.cache is not None]
        layers = run.info.get("layers") or [f"block.{i}" for i in range(per_step.shape[0])]
        m = {
            "hit_rate": hits / lookups if lookups else 0.0,
            "hits": hits,
            "layers": list(layers),
            "anchored_per_layer": [round(float(x), 4) for x in per_step.mean(1)],
            "anchored_by_step": [[round(float(x), 4) for x in row] for row in per_step],
            "peak_entries": sum(s["peak_entries"] for s in stats),
            "peak_bytes": sum(s["peak_bytes"] for s in stats),
            "max_age_recomputes": sum(s["stale"] for s in stats),
            "evictions": sum(s["evictions"] for s in stats),
            "dropped": sum(s["dropped"] for s in stats),
            "branches": len(states),
        }
        planned = sum(s.planned_steps for s in states)
        if run.adapter == "text":
            # share of positions the narrowed steps embedded and ran in some layer (after warm-up)
            m["step_positions"] = round(float(sum(s.planned for s in states)) / planned, 4) if planned else 1.0
        if run.adapter == "unet":
            m["skipped_per_block"] = [sum(s.skipped[j] for s in states if s.skipped) for j in range(len(layers))]
            m["tail_only"] = sum(s.tailed for s in states)  # calls where the last up block ran its tail alone
        return m

    def bench_plot(self, reports: list[dict[str, Any]], path) -> None:
        from .plot import plot_anchored

        plot_anchored(reports, self.name, path)


def _rel_change(new: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """||new - ref|| / ||ref|| over the last dimension."""
    new = new.float()
    return torch.linalg.vector_norm(new - ref, dim=-1) / torch.linalg.vector_norm(ref, dim=-1).clamp(min=1e-6)


def _branch_states(run, strategy) -> list[_State]:
    """This strategy's states of every guidance branch that ran (without creating any)."""
    found, branch = [], run.branch
    for b in BRANCHES:
        run.branch = b
        st = run.state(strategy, factory=lambda _run: None)
        if st is not None:
            found.append(st)
    run.branch = branch
    return [s for s in found if s.cache is not None]
